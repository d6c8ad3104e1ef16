//! The sweep in bounded steps: [`Maintenance::sweep`](crate::Maintenance::sweep) runs the
//! `sweep` script a step at a time (each its own atomic script call, so other commands run
//! between them), merging their answers into one [`SweepReport`], then the lease holder
//! publishes the snapshot in bounded steps (`publish.rs`) and every handle brings its copy up to
//! date from the change log.
//!
//! A step does at most about [`SWEEP_STEP_BUDGET`] commands of work on the server (see
//! `scripts/sweep.lua` for how it spends them); the sweep repeats steps until one answers that
//! nothing more is due, at most [`MAX_SWEEP_STEPS`] per call (the next sweep continues where a
//! call that ran out stopped: everything a step leaves is still in the sorted sets it came from).
//! All steps of one sweep judge at the first step's time, so the report reads as one sweep at one
//! instant, as the in-memory registry's does.

use std::time::{Duration, Instant};

use super::codec::{self, bad, Fields};
use super::counters::C;
use super::scripts::SCRIPTS;
use super::stream::HANDOUT_BATCH;
use super::RedisRegistry;
use crate::api::error::RegistryError;
use crate::api::report::SweepReport;

/// About how many commands one sweep step runs on the server (kills cost more than one each;
/// see `scripts/sweep.lua`). At roughly a microsecond per command, a step stays near a
/// millisecond of server time.
pub const SWEEP_STEP_BUDGET: usize = 200;

/// The most steps one sweep call runs (enough for a mass death of tens of thousands of workers);
/// a call that runs out reports what it did and the next sweep continues.
pub const MAX_SWEEP_STEPS: usize = 4_096;

/// The most released entries one step hands out.
const STEP_HANDOUT: usize = 128;

/// The most unacknowledged released entries one sweep expires (the rest in the next sweeps).
const EXPIRE_RELEASED_BATCH: usize = 128;

/// What the steps carry from one to the next.
struct Cursor {
    at: u64,
    mode: String,
    skip: u64,
    brake: bool,
}

impl RedisRegistry {
    /// One sweep: its steps, then (lease holder) the publish, then this handle's snapshot.
    pub(crate) async fn sweep_steps(&self) -> Result<SweepReport, RegistryError> {
        let started = Instant::now();
        let i = &*self.inner;
        let l = &i.limits;
        let mut report = SweepReport::default();
        let mut cur = Cursor {
            at: 0,
            mode: "judge".to_owned(),
            skip: 0,
            brake: false,
        };
        let (mut released, mut stuck, mut live, mut adj) = (0, 0, 0, 0);
        let mut handed = 0;
        // Before the steps, so that an entry expired is not handed out by them (a no-op unless
        // this replica holds the lease).
        let released_expired = self.expire_released().await?;
        // The waiting room's expiry and catch-up promotion, before the steps hand out.
        if let Some(room) = &l.room {
            self.waiting_steps(room, &mut report).await?;
        }
        let mut promoted_seen = i.counters.get(C::Promoted);
        for step in 0..MAX_SWEEP_STEPS {
            let handout = STEP_HANDOUT.min(HANDOUT_BATCH.saturating_sub(handed));
            let mut inv = self.prepare(&SCRIPTS.sweep);
            inv.arg(cur.at)
                .arg(&cur.mode)
                .arg(cur.skip)
                .arg(u8::from(cur.brake))
                .arg(l.timeout_ms)
                .arg(l.startup_grace_ms)
                .arg(l.retention_ms)
                .arg(l.dead_retention_ms)
                .arg(l.suspect_grace_ms)
                .arg(&l.brake_fraction)
                .arg(l.brake_min_workers)
                .arg(l.max_retained)
                .arg(l.lease_ttl_ms)
                .arg(l.ack_timeout_ms)
                .arg(handout)
                .arg(SWEEP_STEP_BUDGET)
                .arg(l.sweep_interval_ms)
                .arg(l.max_in_flight_ms)
                .arg(l.drain_deadline_ms)
                .arg(l.stall_horizon_ms);
            let (v, _) = self.invoke_sweeping(&inv).await?;
            let f = Fields::of(&v)?;
            let swept = f.int("swept")? == 1;
            let now = f.uint("now")?;
            if step == 0 {
                report.swept = swept;
                report.at = Duration::from_millis(now);
                report.stall_credited = Duration::from_millis(f.uint("stall_ms")?);
                cur.at = now;
            } else if report.swept && !swept {
                // Another replica took the lease between two steps (this one's lapsed): it
                // continues the work; what this call did is reported.
                break;
            }
            cur.mode = f.text("mode")?.into_owned();
            cur.skip = f.uint("skip")?;
            cur.brake = f.int("brake")? == 1;
            report.brake_engaged |= f.int("engaged")? == 1;
            let mut died = f.array("died")?;
            while died.remaining() > 0 {
                let id = codec::worker_id(&died.text()?)?;
                let reason = codec::dead_reason(died.int()?)?;
                report.died.push((id, reason));
            }
            let mut suspected = f.array("suspected")?;
            while suspected.remaining() > 0 {
                report.suspected.push(codec::worker_id(&suspected.text()?)?);
            }
            let mut targets = f.array("released_targets")?;
            while targets.remaining() > 0 {
                let t = targets.text()?;
                report
                    .released_targets
                    .push(t.parse().map_err(|e| bad(format!("target {t:?}: {e}")))?);
            }
            report.expired_claims += f.uint("expired")? as usize;
            report.evicted_claims += f.uint("evicted")? as usize;
            report.purged_workers += f.uint("purged")? as usize;
            released += f.uint("released")?;
            let got = codec::decode_released(f.array("collected")?)?;
            handed += got.len();
            report.released.extend(got);
            live = f.uint("live")?;
            stuck += f.uint("stuck")?;
            adj += f.uint("in_flight_adj")?;
            let mut drained = f.array("drained_stuck")?;
            while drained.remaining() > 0 {
                report
                    .drained_stuck
                    .push(codec::worker_id(&drained.text()?)?);
            }
            let more = f.int("more")? == 1;
            let more_handout = handout > 0 && f.uint("handed")? as usize == handout;
            // Deliveries this step's deaths promoted are handed out by one more step.
            let promoted = i.counters.get(C::Promoted);
            let more_promoted = promoted > promoted_seen;
            promoted_seen = promoted;
            // A replica without the lease only takes its share of released events.
            if !((swept && more) || more_handout || more_promoted) {
                break;
            }
        }
        if report.swept {
            self.publish(cur.at, report.brake_engaged, adj).await?;
        }
        self.refresh_snapshot().await?;
        if l.room.is_some() {
            self.waiting_now(&mut report).await?;
        }
        report.version = i.snapshot.version();

        let c = &i.counters;
        c.observe_live(cur.at, live);
        if report.swept {
            for (_, reason) in &report.died {
                c.death(*reason);
            }
            c.add(C::Suspected, report.suspected.len() as u64);
            c.add(C::ClaimsReleased, released);
            c.add(C::ClaimsStuck, stuck);
            c.add(C::ClaimsExpired, report.expired_claims as u64);
            c.add(C::ClaimsEvicted, report.evicted_claims as u64);
            c.add(C::WorkersPurged, report.purged_workers as u64);
            c.add(C::ReleasedExpired, released_expired);
            if report.brake_engaged {
                c.inc(C::BrakeEngaged);
            }
            c.inc(C::Sweeps);
        }
        report.took = started.elapsed();
        if report.swept {
            c.observe_sweep(report.took);
        }
        Ok(report)
    }

    /// One bounded step (at most [`EXPIRE_RELEASED_BATCH`]) deleting released entries nobody
    /// acknowledged within `claim_retention` of their release, each logged; how many.
    async fn expire_released(&self) -> Result<u64, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.expire_released);
        inv.arg(self.inner.limits.retention_ms)
            .arg(EXPIRE_RELEASED_BATCH);
        let v = self.invoke(&inv).await?;
        let pairs: Vec<String> = redis::from_redis_value(v).map_err(|e| bad(e.to_string()))?;
        for p in pairs.chunks(2) {
            if let [target, delivery] = p {
                tracing::warn!(
                    released_target = %target,
                    delivery = %delivery,
                    "released delivery never acknowledged within claim_retention; expired"
                );
            }
        }
        Ok((pairs.len() / 2) as u64)
    }
}
