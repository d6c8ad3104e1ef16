//! What one handle (one replica) of a networked backend decided, counted for [`Stats`]: the
//! same statistics on Redis and PostgreSQL (a scraper sums the replicas). Each backend fills in
//! the gauges it observes of the registry (live workers, retained claims, the snapshot's age,
//! missed events) after [`Counters::read`].
//!
//! Plain atomic counters: a networked call costs a round trip, so the striping the in-memory
//! backend needs against cache-line contention would buy nothing here.

use std::time::Duration;

use crate::sync::{AtomicU64, Ordering};

use crate::api::stats::{Stats, SweepDurations, SWEEP_DURATION_BUCKETS};
use crate::api::status::DeadReason;

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// One counter per statistic of [`Stats`] that a networked backend counts per handle.
        #[derive(Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: Counter,)*
            deaths: [Counter; DeadReason::ALL.len()],
            sweep_buckets: [Counter; SWEEP_DURATION_BUCKETS.len() + 1],
            sweep_nanos: Counter,
        }

        impl Counters {
            /// The counters, with the gauges filled in by the caller.
            pub(crate) fn read(&self) -> Stats {
                let mut s = Stats::default();
                $(s.$name = self.$name.get();)*
                s.deaths_missed_heartbeats = self.death(DeadReason::MissedHeartbeats).get();
                s.deaths_exited = self.death(DeadReason::Exited).get();
                s.deaths_deregistered = self.death(DeadReason::Deregistered).get();
                s.deaths_drain_timed_out = self.death(DeadReason::DrainTimedOut).get();
                let mut h = SweepDurations::default();
                for (i, b) in self.sweep_buckets.iter().enumerate() {
                    h.buckets[i] = b.get();
                }
                h.sum = Duration::from_nanos(self.sweep_nanos.get());
                s.sweep_durations = h;
                s
            }
        }
    };
}

counters!(
    admitted_new,
    admitted_sticky,
    duplicates,
    rejected_capacity,
    rejected_draining,
    heartbeats,
    heartbeats_refused,
    claims_completed,
    claims_released,
    claims_stuck,
    claims_expired,
    claims_evicted,
    workers_purged,
    released_expired,
    sweeps,
    brake_engaged,
    suspected,
    parked,
    promoted,
    waiting_expired,
    rejected_payload_budget,
    payloads_too_large,
);

impl Counters {
    /// The death counter for `reason`.
    pub(crate) fn death(&self, reason: DeadReason) -> &Counter {
        let i = DeadReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        &self.deaths[i]
    }

    /// Records the duration of a sweep that did the maintenance work.
    pub(crate) fn observe_sweep(&self, took: Duration) {
        self.sweep_nanos
            .add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        self.sweep_buckets[SweepDurations::bucket_of(took)].inc();
    }
}

/// One statistic.
pub(crate) struct Counter(AtomicU64);

impl Default for Counter {
    fn default() -> Self {
        Self(AtomicU64::new(0))
    }
}

impl Counter {
    pub(crate) fn inc(&self) {
        self.add(1);
    }

    pub(crate) fn add(&self, n: u64) {
        // Relaxed: a statistics total; nothing is published through it.
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        // Relaxed: a statistics total; see `add`.
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_lands_in_its_field() {
        let c = Counters::default();
        c.duplicates.add(3);
        c.death(DeadReason::DrainTimedOut).inc();
        c.observe_sweep(Duration::from_millis(3));
        let s = c.read();
        assert_eq!(s.duplicates, 3);
        assert_eq!(s.deaths_drain_timed_out, 1);
        assert_eq!(s.deaths(DeadReason::Exited), 0);
        assert_eq!(s.sweep_durations.count(), 1);
        assert_eq!(s.sweep_durations.sum, Duration::from_millis(3));
    }
}
