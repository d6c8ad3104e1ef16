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
use super::scripts::{Call, SCRIPTS};
use super::stream::HANDOUT_BATCH;
use super::RedisRegistry;
use crate::api::error::RegistryError;
use crate::api::report::SweepReport;

/// About how many commands one sweep step runs on the server (kills cost more than one each;
/// see `scripts/sweep.lua`). At one to two microseconds per command, a step stays well under a
/// millisecond of server time (the scale bench: 200 gave steps up to 2.9 ms; see
/// `docs::redis`, "How long another client waits").
pub(crate) const SWEEP_STEP_BUDGET: usize = 100;

/// The most steps one sweep call runs (enough for a mass death of tens of thousands of workers);
/// a call that runs out reports what it did and the next sweep continues.
pub(crate) const MAX_SWEEP_STEPS: usize = 4_096;

/// The most released entries one step hands out.
const STEP_HANDOUT: usize = 64;

/// The most unacknowledged released entries one sweep expires (the rest in the next sweeps).
const EXPIRE_RELEASED_BATCH: usize = 128;

/// What the steps carry from one to the next.
struct Cursor {
    at: u64,
    mode: String,
    skip: u64,
    /// The walk of the live candidates: the last score read (`-inf` at the start of a mode) and
    /// the candidates at that score left in place.
    score: String,
    ties: u64,
    brake: bool,
}

/// What the steps' answers add up to besides the report.
#[derive(Default)]
struct Totals {
    released: u64,
    stuck: u64,
    live: u64,
    in_flight_adj: u64,
    handed: usize,
}

impl RedisRegistry {
    /// One sweep: its steps, then (lease holder) the publish, then this handle's snapshot.
    pub(crate) async fn sweep_steps(&self) -> Result<SweepReport, RegistryError> {
        let started = Instant::now();
        let mut report = SweepReport::default();
        let mut cur = Cursor {
            at: 0,
            mode: "judge".to_owned(),
            skip: 0,
            score: "-inf".to_owned(),
            ties: 0,
            brake: false,
        };
        let mut totals = Totals::default();
        // Before the steps, so that an entry expired is not handed out by them (a no-op unless
        // this replica holds the lease).
        let released_expired = self.expire_released().await?;
        // The waiting room's expiry and catch-up promotion, before the steps hand out.
        if let Some(room) = &self.inner.limits.room {
            self.waiting_steps(room, &mut report).await?;
        }
        let mut promoted_seen = self.inner.counters.get(C::Promoted);
        for step in 0..MAX_SWEEP_STEPS {
            let handout = STEP_HANDOUT.min(HANDOUT_BATCH.saturating_sub(totals.handed));
            let (v, _) = self.invoke_sweeping(&self.step_call(&cur, handout)).await?;
            let f = Fields::of(&v)?;
            let Some(more) = merge_step(step, &f, handout, &mut cur, &mut report, &mut totals)?
            else {
                break;
            };
            // Deliveries this step's deaths promoted are handed out by one more step.
            let promoted = self.inner.counters.get(C::Promoted);
            let more_promoted = promoted > promoted_seen;
            promoted_seen = promoted;
            if !(more || more_promoted) {
                break;
            }
        }
        if report.swept {
            self.publish(cur.at, report.brake_engaged, totals.in_flight_adj)
                .await?;
        }
        self.refresh_snapshot().await?;
        if self.inner.limits.room.is_some() {
            self.waiting_now(&mut report).await?;
        }
        self.attach_payloads(&mut report.released).await?;
        self.payloads_now(cur.at).await?;
        report.version = self.inner.snapshot.version();
        self.count_sweep(&report, cur.at, &totals, released_expired);
        report.took = started.elapsed();
        if report.swept {
            self.inner.counters.observe_sweep(report.took);
        }
        Ok(report)
    }

    /// One step's call: its arguments by name (`scripts/sweep.lua` reads them by name, and a
    /// missing one is an error naming it), the cursor first, then the settings.
    fn step_call(&self, cur: &Cursor, handout: usize) -> Call {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.sweep);
        inv.named("at", cur.at)
            .named("mode", &cur.mode)
            .named("skip", cur.skip)
            .named("cursor", &cur.score)
            .named("ties", cur.ties)
            .named("brake", u8::from(cur.brake))
            .named("timeout_ms", l.timeout_ms)
            .named("startup_grace_ms", l.startup_grace_ms)
            .named("retention_ms", l.retention_ms)
            .named("dead_retention_ms", l.dead_retention_ms)
            .named("suspect_grace_ms", l.suspect_grace_ms)
            .named("brake_fraction", &l.brake_fraction)
            .named("brake_min_workers", l.brake_min_workers)
            .named("max_retained_claims", l.max_retained)
            .named("lease_ttl_ms", l.lease_ttl_ms)
            .named("release_ack_timeout_ms", l.ack_timeout_ms)
            .named("handout", handout)
            .named("budget", SWEEP_STEP_BUDGET)
            .named("sweep_interval_ms", l.sweep_interval_ms)
            .named("max_in_flight_ms", l.max_in_flight_ms)
            .named("drain_deadline_ms", l.drain_deadline_ms)
            .named("stall_horizon_ms", l.stall_horizon_ms);
        inv
    }

    /// The counters of a finished sweep (the lease holder's deaths and claim work; every
    /// handle's live gauge).
    fn count_sweep(&self, report: &SweepReport, at: u64, totals: &Totals, released_expired: u64) {
        let c = &self.inner.counters;
        c.observe_live(at, totals.live);
        if !report.swept {
            return;
        }
        for (_, reason) in &report.died {
            c.death(*reason);
        }
        c.add(C::Suspected, report.suspected.len() as u64);
        c.add(C::ClaimsReleased, totals.released);
        c.add(C::ClaimsStuck, totals.stuck);
        c.add(C::ClaimsExpired, report.expired_claims as u64);
        c.add(C::ClaimsEvicted, report.evicted_claims as u64);
        c.add(C::WorkersPurged, report.purged_workers as u64);
        c.add(C::ReleasedExpired, released_expired);
        if report.brake_engaged {
            c.inc(C::BrakeEngaged);
        }
        c.inc(C::Sweeps);
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

/// Merges step `step`'s answer into the report, the cursor and the totals; whether another step
/// is due for its own work, or `None` if another replica took the lease between two steps.
fn merge_step(
    step: usize,
    f: &Fields<'_>,
    handout: usize,
    cur: &mut Cursor,
    report: &mut SweepReport,
    totals: &mut Totals,
) -> Result<Option<bool>, RegistryError> {
    let swept = f.int("swept")? == 1;
    let now = f.uint("now")?;
    if step == 0 {
        report.swept = swept;
        report.at = Duration::from_millis(now);
        report.stall_credited = Duration::from_millis(f.uint("stall_ms")?);
        cur.at = now;
    } else if report.swept && !swept {
        // Another replica took the lease between two steps (this one's lapsed): it continues
        // the work; what this call did is reported.
        return Ok(None);
    }
    cur.mode = f.text("mode")?.into_owned();
    cur.skip = f.uint("skip")?;
    cur.score = f.text("cursor")?.into_owned();
    cur.ties = f.uint("ties")?;
    cur.brake = f.int("brake")? == 1;
    report.brake_engaged |= f.int("engaged")? == 1;
    merge_workers(f, report)?;
    report.expired_claims += f.uint("expired")? as usize;
    report.evicted_claims += f.uint("evicted")? as usize;
    report.purged_workers += f.uint("purged")? as usize;
    totals.released += f.uint("released")?;
    let got = codec::decode_released(f.array("collected")?)?;
    totals.handed += got.len();
    report.released.extend(got);
    totals.live = f.uint("live")?;
    totals.stuck += f.uint("stuck")?;
    totals.in_flight_adj += f.uint("in_flight_adj")?;
    let more = f.int("more")? == 1;
    let more_handout = handout > 0 && f.uint("handed")? as usize == handout;
    // A replica without the lease only takes its share of released events.
    Ok(Some((swept && more) || more_handout))
}

/// A step's lists of workers and targets: died (id, reason), suspected, released targets,
/// drained for a stuck delivery.
fn merge_workers(f: &Fields<'_>, report: &mut SweepReport) -> Result<(), RegistryError> {
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
    let mut drained = f.array("drained_stuck")?;
    while drained.remaining() > 0 {
        report
            .drained_stuck
            .push(codec::worker_id(&drained.text()?)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The names `step_call` sends, in its order.
    fn sent() -> Vec<&'static str> {
        let src = include_str!("sweep.rs");
        src.split(".named(\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect()
    }

    #[test]
    fn the_sweep_reads_every_argument_it_is_sent_by_name_and_no_other() {
        let lua = include_str!("scripts/sweep.lua");
        let sent = sent();
        assert_eq!(sent.len(), 22);
        for name in &sent {
            let read =
                lua.contains(&format!("num('{name}')")) || lua.contains(&format!("arg('{name}')"));
            assert!(read, "sweep.lua does not read {name}");
        }
        let reads = lua.split("num('").skip(1).chain(lua.split("arg('").skip(1));
        for read in reads {
            let name = read.split('\'').next().unwrap();
            assert!(sent.contains(&name), "sweep.lua reads {name}, never sent");
        }
    }
}
