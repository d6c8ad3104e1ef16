//! The waiting room on Redis (the contract's "The waiting room" on
//! [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with); the design, keys and bounds in
//! `docs::redis`): a handle with the room on admits through `admit_waiting` (the room-off
//! `admit` is not touched), a death promotes into the slot it freed (`lib_waiting.lua`, from
//! the dying call's `finish`), and each sweep runs the `waiting` step first (expiry, then the
//! promotion of whatever fits) and reads the room's size last.

use std::time::Duration;

use super::codec::{self, bad_outcome, Fields};
use super::counters::C;
use super::placement::Carried;
use super::scripts::SCRIPTS;
use super::{RedisRegistry, RoomLimits};
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target};
use crate::api::outcome::{Admission, Rejection, Waiting};
use crate::api::report::{ReleaseReason, SweepReport};
use crate::api::waiting::{ExpireReason, ExpiredWaiting};
use crate::remote::vocab;

/// The most deliveries one `waiting` step expires, and the most targets it promotes (each with
/// its deliveries, at most `max_waiting_per_owner`).
const WAITING_STEP: usize = 64;

/// The most `waiting` steps one sweep runs (the next sweep continues).
const MAX_WAITING_STEPS: usize = 64;

impl RedisRegistry {
    /// [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with) with the room on: one
    /// `admit_waiting` call (parking, the owner's cap and the queue for capacity decided in it).
    pub(crate) async fn admit_waiting(
        &self,
        room: &RoomLimits,
        target: &Target,
        delivery: &DeliveryId,
        carried: Option<&Carried>,
    ) -> Result<Admission, RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.admit_waiting);
        inv.arg(target.to_string())
            .arg(delivery.as_str())
            .arg(l.max_workers)
            .arg(l.timeout_ms)
            .arg(l.startup_grace_ms)
            .arg(l.retention_ms)
            .arg(l.max_in_flight_ms)
            .arg(room.max_workers_per_owner)
            .arg(room.max_waiting)
            .arg(room.max_waiting_per_owner);
        if let Some(c) = carried {
            c.args(&mut inv);
        }
        let v = self.invoke_emitting(&inv).await?;
        let (word, f) = codec::outcome(&v)?;
        if word == vocab::WAITING {
            return self.parked(&f).map(Admission::Waiting);
        }
        self.decode_admission(&word, &f).await
    }

    /// Decodes a `waiting` outcome (position, reason, worker) and counts the parking.
    fn parked(&self, f: &Fields<'_>) -> Result<Waiting, RegistryError> {
        let position = f.uint("position")?;
        let reason = match &*f.text("reason")? {
            vocab::DRAINING => Rejection::TargetDraining {
                worker: f.worker("worker")?,
            },
            vocab::CAPACITY => Rejection::CapacityFull {
                limit: self.inner.config.max_workers(),
            },
            other => return Err(bad_outcome("admit_waiting reason", other)),
        };
        let c = &self.inner.counters;
        c.inc(C::Parked);
        Ok(Waiting::new(
            usize::try_from(position).unwrap_or(usize::MAX),
            reason,
        ))
    }

    /// The sweep's waiting-room steps (a handle with the room on): expiry past `max_wait` and
    /// promotion of what fits, each step bounded, into `report`.
    pub(crate) async fn waiting_steps(
        &self,
        room: &RoomLimits,
        report: &mut SweepReport,
    ) -> Result<(), RegistryError> {
        let l = &self.inner.limits;
        let limit = Duration::from_millis(room.max_wait_ms);
        for _ in 0..MAX_WAITING_STEPS {
            let mut inv = self.prepare(&SCRIPTS.waiting);
            inv.arg(l.max_workers)
                .arg(l.timeout_ms)
                .arg(l.startup_grace_ms)
                .arg(l.retention_ms)
                .arg(l.max_in_flight_ms)
                .arg(room.max_workers_per_owner)
                .arg(room.max_waiting)
                .arg(room.max_waiting_per_owner)
                .arg(room.max_wait_ms)
                .arg(WAITING_STEP);
            let (v, _) = self.invoke_sweeping(&inv).await?;
            let f = Fields::of(&v)?;
            let mut expired = f.array("expired")?;
            let before = report.expired_waiting.len();
            while expired.remaining() > 0 {
                let t = expired.text()?;
                let target = t
                    .parse()
                    .map_err(|e| codec::bad(format!("target {t:?}: {e}")))?;
                let delivery = DeliveryId::new(&expired.text()?)
                    .map_err(|e| codec::bad(format!("waiting delivery: {e}")))?;
                let waited = Duration::from_millis(expired.uint()?);
                report.expired_waiting.push(ExpiredWaiting::new(
                    target,
                    delivery,
                    waited,
                    ExpireReason::WaitedTooLong { limit },
                ));
            }
            let c = &self.inner.counters;
            c.add(
                C::WaitingExpired,
                (report.expired_waiting.len() - before) as u64,
            );
            let waiting = f.uint("waiting")?;
            c.observe_waiting(f.uint("now")?, waiting);
            report.waiting = usize::try_from(waiting).unwrap_or(usize::MAX);
            if f.int("more")? != 1 {
                break;
            }
        }
        Ok(())
    }

    /// The end of a sweep with the room on: the room's size now (`ZCARD {n}:worder`) for the
    /// report, the gauge and the cached snapshot; promoted deliveries ordered last.
    pub(crate) async fn waiting_now(&self, report: &mut SweepReport) -> Result<(), RegistryError> {
        let mut conn = self.inner.conn.clone();
        let n: u64 = ::redis::cmd("ZCARD")
            .arg(format!("{}worder", self.inner.keys.prefix))
            .query_async(&mut conn)
            .await
            .map_err(super::error::backend)?;
        // Promoted deliveries last, as the in-memory registry reports them (a death's promotion
        // is in the stream before the releases the sweep writes for it).
        report
            .released
            .sort_by_key(|e| e.reason == ReleaseReason::Promoted);
        let at = crate::clock::millis(report.at);
        self.inner.counters.observe_waiting(at, n);
        report.waiting = usize::try_from(n).unwrap_or(usize::MAX);
        self.inner.snapshot.set_waiting(report.waiting);
        Ok(())
    }
}
