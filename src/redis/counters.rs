//! This handle's own counters: what this replica decided (a scraper sums replicas), read into the
//! contract's [`Stats`] with gauges from the freshest observation of the registry. The counters
//! are the networked backends' shared ones ([`crate::remote::counters`]), named here by [`C`].

use std::sync::Mutex;
use std::time::Duration;

use crate::api::stats::Stats;
use crate::api::status::DeadReason;
use crate::remote::counters::{Counter, Counters as Shared};

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
    ReleasedExpired,
    Sweeps,
    BrakeEngaged,
    Suspected,
    Parked,
    Promoted,
    WaitingExpired,
    RejectedPayloadBudget,
    PayloadsTooLarge,
}

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
    shared: Shared,
    live: Gauge,
    retained: Gauge,
    waiting: Gauge,
    payloads: Gauge,
    payload_bytes: Gauge,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Self {
            shared: Shared::default(),
            live: Gauge::default(),
            retained: Gauge::default(),
            waiting: Gauge::default(),
            payloads: Gauge::default(),
            payload_bytes: Gauge::default(),
        }
    }

    fn counter(&self, c: C) -> &Counter {
        let s = &self.shared;
        match c {
            C::AdmittedNew => &s.admitted_new,
            C::AdmittedSticky => &s.admitted_sticky,
            C::Duplicates => &s.duplicates,
            C::RejectedCapacity => &s.rejected_capacity,
            C::RejectedDraining => &s.rejected_draining,
            C::Heartbeats => &s.heartbeats,
            C::HeartbeatsRefused => &s.heartbeats_refused,
            C::DeathsMissed => s.death(DeadReason::MissedHeartbeats),
            C::DeathsExited => s.death(DeadReason::Exited),
            C::DeathsDeregistered => s.death(DeadReason::Deregistered),
            C::DeathsDrainTimedOut => s.death(DeadReason::DrainTimedOut),
            C::ClaimsCompleted => &s.claims_completed,
            C::ClaimsReleased => &s.claims_released,
            C::ClaimsStuck => &s.claims_stuck,
            C::ClaimsExpired => &s.claims_expired,
            C::ClaimsEvicted => &s.claims_evicted,
            C::WorkersPurged => &s.workers_purged,
            C::ReleasedExpired => &s.released_expired,
            C::Sweeps => &s.sweeps,
            C::BrakeEngaged => &s.brake_engaged,
            C::Suspected => &s.suspected,
            C::Parked => &s.parked,
            C::Promoted => &s.promoted,
            C::WaitingExpired => &s.waiting_expired,
            C::RejectedPayloadBudget => &s.rejected_payload_budget,
            C::PayloadsTooLarge => &s.payloads_too_large,
        }
    }

    pub(crate) fn add(&self, c: C, n: u64) {
        self.counter(c).add(n);
    }

    /// The count of `c` so far.
    pub(crate) fn get(&self, c: C) -> u64 {
        self.counter(c).get()
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
        self.shared.observe_sweep(took);
    }

    /// Live workers as seen at registry time `at_ms` (a script reply, a snapshot).
    pub(crate) fn observe_live(&self, at_ms: u64, live: u64) {
        self.live.observe(at_ms, live);
    }

    /// Deliveries waiting as seen at registry time `at_ms` (a parking, a sweep's waiting step).
    pub(crate) fn observe_waiting(&self, at_ms: u64, waiting: u64) {
        self.waiting.observe(at_ms, waiting);
    }

    /// Payloads held (count, bytes) as seen at registry time `at_ms` (a sweep's end).
    pub(crate) fn observe_payloads(&self, at_ms: u64, held: u64, bytes: u64) {
        self.payloads.observe(at_ms, held);
        self.payload_bytes.observe(at_ms, bytes);
    }

    /// Retained claims as seen at registry time `at_ms`.
    pub(crate) fn observe_retained(&self, at_ms: u64, retained: u64) {
        self.retained.observe(at_ms, retained);
    }

    pub(crate) fn read(&self, events_missed: u64, snapshot_age: Duration) -> Stats {
        // `data_losses` is set by the caller, from the handle's loss watch.
        let mut s = self.shared.read();
        s.waiting = usize::try_from(self.waiting.get()).unwrap_or(usize::MAX);
        s.events_missed = events_missed;
        s.live_workers = usize::try_from(self.live.get()).unwrap_or(usize::MAX);
        s.retained_claims = usize::try_from(self.retained.get()).unwrap_or(usize::MAX);
        s.snapshot_age = snapshot_age;
        s.payloads_held = usize::try_from(self.payloads.get()).unwrap_or(usize::MAX);
        s.payload_bytes_held = self.payload_bytes.get();
        s
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
