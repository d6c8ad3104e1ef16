//! [`Maintenance`] for [`PostgresRegistry`]: the sweep (the maintenance lease; for its holder the
//! maintenance in bounded steps, `maintain.rs`; on every replica its share of the outbox and the
//! worker rows changed since its snapshot) and the acknowledgement of released events.

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::delta::{Collected, SnapshotDelta};
use super::error::{decode, Failure};
use super::maintain::Maintained;
use super::rows::{self, col, OutboxRow};
use super::PostgresRegistry;
use crate::api::contract::{Maintenance, Subscribe};
use crate::api::error::RegistryError;
use crate::api::events::{Event, RecvError};
use crate::api::ids::DeliveryId;
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::waiting::{ExpireReason, ExpiredWaiting};

const COLLECT: &str = "SELECT wr_sweep_collect($1, $2, $3, $4, $5)::text AS body";
const ACKNOWLEDGE: &str = "SELECT wr_acknowledge($1, $2) AS n";
const SNAPSHOT_SINCE: &str = "SELECT wr_snapshot_since($1, $2)::text AS body";

fn parse<T: for<'de> Deserialize<'de>>(what: &str, text: &str) -> Result<T, Failure> {
    serde_json::from_str(text).map_err(|e| decode(format!("{what}: {e}")))
}

impl PostgresRegistry {
    /// Brings the cached snapshot up to the published version: reads the worker rows versioned
    /// since the cache's version (all of them the first time) and applies them.
    pub(super) async fn refresh_snapshot(&self) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        let known = i64::try_from(inner.snapshot.version()).unwrap_or(i64::MAX);
        let delta: SnapshotDelta = self
            .call(SNAPSHOT_SINCE, &[&inner.id, &known], |row| {
                parse("snapshot", &col::<String>(row, "body")?)
            })
            .await?;
        delta
            .apply_to(&inner.snapshot)
            .map_err(Failure::into_registry)
    }

    /// This replica's share of the outbox, and the registry's time; the snapshot's changes
    /// since the cache's version applied to it (one round trip for both).
    async fn collect(&self) -> Result<(i64, Vec<ReleasedEvent>), RegistryError> {
        let inner = &*self.inner;
        let p = &inner.params;
        let known = i64::try_from(inner.snapshot.version()).unwrap_or(i64::MAX);
        let c: Collected = self
            .call(
                COLLECT,
                &[&inner.id, &inner.replica, &p.ack_timeout, &p.batch, &known],
                |row| parse("outbox", &col::<String>(row, "body")?),
            )
            .await?;
        self.take_collected(c)
    }

    /// Applies a collected snapshot delta; the events as the contract's.
    pub(super) fn take_collected(
        &self,
        c: Collected,
    ) -> Result<(i64, Vec<ReleasedEvent>), RegistryError> {
        let events = c
            .events
            .iter()
            .map(OutboxRow::event)
            .collect::<Result<Vec<_>, _>>()
            .map_err(Failure::into_registry)?;
        // A promotion is counted by the replica that first hands it over (not on a re-offer).
        let promoted = c
            .events
            .iter()
            .filter(|e| e.first && e.is_promoted())
            .count();
        self.inner.counters.promoted.add(promoted as u64);
        c.snapshot
            .apply_to(&self.inner.snapshot)
            .map_err(Failure::into_registry)?;
        Ok((c.now, events))
    }
}

impl PostgresRegistry {
    /// The deliveries the maintenance dropped from the waiting room, as the report lists them
    /// (how long each waited by the sweep's instant `now`).
    fn expired_waiting(
        &self,
        now: i64,
        m: &Maintained,
    ) -> Result<Vec<ExpiredWaiting>, RegistryError> {
        let limit = self.config_ref().max_wait();
        m.expired_waiting
            .iter()
            .map(|(repo, number, delivery, at)| {
                let delivery = DeliveryId::new(delivery)
                    .map_err(|e| decode(format!("delivery {delivery:?}: {e}")).into_registry())?;
                Ok(ExpiredWaiting::new(
                    rows::target(repo, *number).map_err(Failure::into_registry)?,
                    delivery,
                    Duration::from_millis(u64::try_from(now.saturating_sub(*at)).unwrap_or(0)),
                    ExpireReason::WaitedTooLong { limit },
                ))
            })
            .collect()
    }
}

impl PostgresRegistry {
    /// Counts what the lease holder's sweep did.
    fn count_sweep(&self, report: &SweepReport, m: &Maintained) {
        let c = &self.inner.counters;
        c.sweeps.inc();
        for (_, reason) in &report.died {
            c.death(*reason).inc();
        }
        c.suspected.add(report.suspected.len() as u64);
        if report.brake_engaged {
            c.brake_engaged.inc();
        }
        c.claims_released.add(m.released_count);
        c.claims_stuck.add(m.stuck_count);
        c.claims_expired.add(m.expired);
        c.claims_evicted.add(m.evicted);
        c.workers_purged.add(m.purged);
        c.released_expired.add(m.released_expired);
        c.waiting_expired.add(report.expired_waiting.len() as u64);
        c.observe_sweep(report.took);
    }
}

impl Maintenance for PostgresRegistry {
    async fn sweep(&self) -> Result<SweepReport, RegistryError> {
        let started = Instant::now();
        let inner = &*self.inner;
        // Before the sweep refreshes the snapshot: the workers it lists are what a loss lost.
        self.check_loss().await?;
        let begun = self.sweep_begin().await?;
        let m = if begun.swept {
            Some(self.maintain(&begun).await?)
        } else {
            None
        };
        // The holder's last step collected already (unless more work followed it).
        let (now, collected) = match m.as_ref().and_then(|m| m.collected) {
            Some(now) => (now, Vec::new()),
            None => self.collect().await?,
        };
        // The deliveries of this sweep's deaths first (the death steps claimed them for this
        // replica as they moved them to the outbox), then this replica's share of the rest.
        let mut released = Vec::new();
        if let Some(m) = &m {
            released.extend(m.events.iter().cloned());
        }
        released.extend(collected);

        let mut report = SweepReport {
            swept: begun.swept,
            at: rows::since_epoch(if begun.swept { begun.now } else { now }),
            released,
            stall_credited: Duration::from_millis(u64::try_from(begun.stall_ms).unwrap_or(0)),
            ..SweepReport::default()
        };
        report.version = inner.snapshot.version();
        report.waiting = inner.snapshot.load().waiting;
        let Some(m) = m else {
            report.took = started.elapsed();
            return Ok(report);
        };
        let ids = |raw: &[i64]| -> Result<Vec<_>, RegistryError> {
            raw.iter()
                .map(|id| rows::worker_id(*id).map_err(Failure::into_registry))
                .collect()
        };
        for (id, reason) in &m.died {
            let id = rows::worker_id(*id).map_err(Failure::into_registry)?;
            let reason = rows::dead_reason(Some(reason)).map_err(Failure::into_registry)?;
            report.died.push((id, reason));
        }
        report.suspected = ids(&m.suspected)?;
        report.drained_stuck = ids(&m.drained_stuck)?;
        for (repo, number) in &m.dead_targets {
            report
                .released_targets
                .push(rows::target(repo, *number).map_err(Failure::into_registry)?);
        }
        report.brake_engaged = m.held || !m.suspected.is_empty();
        report.expired_claims = m.expired as usize;
        report.evicted_claims = m.evicted as usize;
        report.purged_workers = m.purged as usize;
        report.expired_waiting = self.expired_waiting(begun.now, &m)?;
        report.took = started.elapsed();

        self.count_sweep(&report, &m);
        self.settle().await;
        Ok(report)
    }

    /// Resolves when this handle's event stream announces a promotion (any replica's: the
    /// delivery waits in the outbox for the next sweep of whichever replica collects first);
    /// never with the waiting room off.
    fn wake(&self) -> impl std::future::Future<Output = ()> + Send {
        let mut events = (self.inner.params.max_waiting > 0).then(|| self.subscribe());
        async move {
            let Some(events) = events.as_mut() else {
                return std::future::pending().await;
            };
            loop {
                match events.recv().await {
                    Ok(Event::DeliveryPromoted { .. }) | Err(RecvError::Lagged { .. }) => return,
                    Ok(_) => {}
                    Err(RecvError::Closed) => return std::future::pending().await,
                }
            }
        }
    }

    async fn acknowledge(&self, released: &[ReleasedEvent]) -> Result<(), RegistryError> {
        // Events without a receipt of ours (none, or not a row id) were not handed out by this
        // backend: nothing to acknowledge.
        let ids: Vec<i64> = released
            .iter()
            .filter_map(|e| e.receipt()?.as_str().parse().ok())
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        self.call(ACKNOWLEDGE, &[&self.inner.id, &ids], |row| {
            col::<i32>(row, "n")
        })
        .await
        .map(|_| ())
    }
}
