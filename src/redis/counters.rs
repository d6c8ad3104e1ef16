//! This handle's own counters: what this replica decided (a scraper sums replicas), read into the
//! contract's [`Stats`] with gauges from the freshest observation of the registry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::api::stats::{Stats, SweepDurations};
use crate::api::status::DeadReason;

/// One counter per statistic.
#[derive(Clone, Copy)]
pub(crate) enum C {
    AdmittedNew,
    AdmittedSticky,
    Duplicates,
    RejectedCapacity,
    RejectedDraining,
    Heartbeats,
    HeartbeatsRefused,
    DeathsMissed,
    DeathsExited,
    DeathsDeregistered,
    DeathsDrainTimedOut,
    ClaimsCompleted,
    ClaimsReleased,
    ClaimsStuck,
    ClaimsExpired,
    ClaimsEvicted,
    WorkersPurged,
    Sweeps,
    BrakeEngaged,
    Suspected,
}

const N: usize = C::Suspected as usize + 1;

/// A gauge observed at a registry time: the later observation wins.
#[derive(Default)]
struct Gauge {
    /// (registry time of the observation in ms, value).
    seen: Mutex<(u64, u64)>,
}

impl Gauge {
    fn observe(&self, at_ms: u64, value: u64) {
        // A poisoned lock only means another thread panicked mid-update of two integers.
        let mut g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if at_ms >= g.0 {
            *g = (at_ms, value);
        }
    }

    fn get(&self) -> u64 {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

/// Every counter of one handle.
pub(crate) struct Counters {
    counts: [AtomicU64; N],
    sweep_times: Mutex<SweepDurations>,
    live: Gauge,
    retained: Gauge,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sweep_times: Mutex::new(SweepDurations::default()),
            live: Gauge::default(),
            retained: Gauge::default(),
        }
    }

    pub(crate) fn add(&self, c: C, n: u64) {
        // Relaxed: statistics totals; nothing is published through them.
        self.counts[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn inc(&self, c: C) {
        self.add(c, 1);
    }

    pub(crate) fn death(&self, reason: DeadReason) {
        self.inc(match reason {
            DeadReason::MissedHeartbeats => C::DeathsMissed,
            DeadReason::Exited => C::DeathsExited,
            DeadReason::Deregistered => C::DeathsDeregistered,
            DeadReason::DrainTimedOut => C::DeathsDrainTimedOut,
        });
    }

    pub(crate) fn observe_sweep(&self, took: Duration) {
        self.sweep_times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(took);
    }

    /// Live workers as seen at registry time `at_ms` (a script reply, a snapshot).
    pub(crate) fn observe_live(&self, at_ms: u64, live: u64) {
        self.live.observe(at_ms, live);
    }

    /// Retained claims as seen at registry time `at_ms`.
    pub(crate) fn observe_retained(&self, at_ms: u64, retained: u64) {
        self.retained.observe(at_ms, retained);
    }

    fn get(&self, c: C) -> u64 {
        // Relaxed: see `add`.
        self.counts[c as usize].load(Ordering::Relaxed)
    }

    pub(crate) fn read(&self, events_missed: u64, snapshot_age: Duration) -> Stats {
        Stats {
            admitted_new: self.get(C::AdmittedNew),
            admitted_sticky: self.get(C::AdmittedSticky),
            duplicates: self.get(C::Duplicates),
            rejected_capacity: self.get(C::RejectedCapacity),
            rejected_draining: self.get(C::RejectedDraining),
            heartbeats: self.get(C::Heartbeats),
            heartbeats_refused: self.get(C::HeartbeatsRefused),
            deaths_missed_heartbeats: self.get(C::DeathsMissed),
            deaths_exited: self.get(C::DeathsExited),
            deaths_deregistered: self.get(C::DeathsDeregistered),
            deaths_drain_timed_out: self.get(C::DeathsDrainTimedOut),
            claims_completed: self.get(C::ClaimsCompleted),
            claims_released: self.get(C::ClaimsReleased),
            claims_stuck: self.get(C::ClaimsStuck),
            claims_expired: self.get(C::ClaimsExpired),
            claims_evicted: self.get(C::ClaimsEvicted),
            workers_purged: self.get(C::WorkersPurged),
            sweeps: self.get(C::Sweeps),
            brake_engaged: self.get(C::BrakeEngaged),
            suspected: self.get(C::Suspected),
            events_missed,
            data_losses: 0, // set by the caller, from the handle's loss watch
            sweep_durations: *self.sweep_times.lock().unwrap_or_else(|p| p.into_inner()),
            live_workers: usize::try_from(self.live.get()).unwrap_or(usize::MAX),
            retained_claims: usize::try_from(self.retained.get()).unwrap_or(usize::MAX),
            snapshot_age,
            // Redis does not park (see `WorkerRegistry::parks`): the waiting room is always empty.
            parked: 0,
            promoted: 0,
            waiting_expired: 0,
            waiting: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_keep_the_latest_observation_and_counters_sum() {
        let c = Counters::new();
        c.observe_live(10, 3);
        c.observe_live(5, 9); // older: ignored
        c.add(C::Duplicates, 2);
        c.death(DeadReason::DrainTimedOut);
        let s = c.read(0, Duration::ZERO);
        assert_eq!(
            (s.live_workers, s.duplicates, s.deaths_drain_timed_out),
            (3, 2, 1)
        );
    }
}
