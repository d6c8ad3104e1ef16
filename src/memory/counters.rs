//! The in-memory registry's counters: one striped [`Counter`] per statistic, so that router threads
//! bumping them never contend on one cache line, read together into the contract's [`Stats`].

use std::time::Duration;

use crate::api::stats::{Stats, SweepDurations, SWEEP_DURATION_BUCKETS};
use crate::api::status::DeadReason;
use crate::sync::Counter;

/// Every counter of one registry.
pub(crate) struct Counters {
    pub(crate) admitted_new: Counter,
    pub(crate) admitted_sticky: Counter,
    /// Duplicates of bare claims and of parked deliveries (`admit`'s are counted per claims
    /// shard, see `Gauges::shard_duplicates`).
    pub(crate) duplicates: Counter,
    pub(crate) rejected_capacity: Counter,
    pub(crate) rejected_draining: Counter,
    pub(crate) heartbeats: Counter,
    pub(crate) heartbeats_refused: Counter,
    deaths: [Counter; DeadReason::ALL.len()],
    pub(crate) claims_completed: Counter,
    pub(crate) claims_released: Counter,
    pub(crate) claims_stuck: Counter,
    pub(crate) claims_expired: Counter,
    pub(crate) claims_evicted: Counter,
    pub(crate) workers_purged: Counter,
    pub(crate) sweeps: Counter,
    pub(crate) brake_engaged: Counter,
    pub(crate) suspected: Counter,
    pub(crate) parked: Counter,
    pub(crate) promoted: Counter,
    pub(crate) waiting_expired: Counter,
    pub(crate) rejected_payload_budget: Counter,
    pub(crate) payloads_too_large: Counter,
    pub(crate) sweep_time: SweepTimes,
}

/// The gauges and counters a `Stats` read needs that do not live in [`Counters`].
pub(crate) struct Gauges {
    pub(crate) live_workers: usize,
    pub(crate) retained_claims: usize,
    pub(crate) events_missed: u64,
    pub(crate) snapshot_age: Duration,
    pub(crate) waiting: usize,
    /// Duplicates `admit` counted in the claims shards (the rest are in `Counters::duplicates`).
    pub(crate) shard_duplicates: u64,
    pub(crate) payloads_held: usize,
    pub(crate) payload_bytes_held: u64,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Self {
            admitted_new: Counter::new(),
            admitted_sticky: Counter::new(),
            duplicates: Counter::new(),
            rejected_capacity: Counter::new(),
            rejected_draining: Counter::new(),
            heartbeats: Counter::new(),
            heartbeats_refused: Counter::new(),
            deaths: std::array::from_fn(|_| Counter::new()),
            claims_completed: Counter::new(),
            claims_released: Counter::new(),
            claims_stuck: Counter::new(),
            claims_expired: Counter::new(),
            claims_evicted: Counter::new(),
            workers_purged: Counter::new(),
            sweeps: Counter::new(),
            brake_engaged: Counter::new(),
            suspected: Counter::new(),
            parked: Counter::new(),
            promoted: Counter::new(),
            waiting_expired: Counter::new(),
            rejected_payload_budget: Counter::new(),
            payloads_too_large: Counter::new(),
            sweep_time: SweepTimes::new(),
        }
    }

    pub(crate) fn death(&self, reason: DeadReason) -> &Counter {
        let i = DeadReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        &self.deaths[i]
    }

    pub(crate) fn read(&self, g: Gauges) -> Stats {
        Stats {
            admitted_new: self.admitted_new.get(),
            admitted_sticky: self.admitted_sticky.get(),
            duplicates: self.duplicates.get().wrapping_add(g.shard_duplicates),
            rejected_capacity: self.rejected_capacity.get(),
            rejected_draining: self.rejected_draining.get(),
            heartbeats: self.heartbeats.get(),
            heartbeats_refused: self.heartbeats_refused.get(),
            deaths_missed_heartbeats: self.death(DeadReason::MissedHeartbeats).get(),
            deaths_exited: self.death(DeadReason::Exited).get(),
            deaths_deregistered: self.death(DeadReason::Deregistered).get(),
            deaths_drain_timed_out: self.death(DeadReason::DrainTimedOut).get(),
            claims_completed: self.claims_completed.get(),
            claims_released: self.claims_released.get(),
            claims_stuck: self.claims_stuck.get(),
            claims_expired: self.claims_expired.get(),
            claims_evicted: self.claims_evicted.get(),
            workers_purged: self.workers_purged.get(),
            released_expired: 0, // released deliveries are handed out once, nothing is kept
            sweeps: self.sweeps.get(),
            brake_engaged: self.brake_engaged.get(),
            suspected: self.suspected.get(),
            sweep_durations: self.sweep_time.read(),
            live_workers: g.live_workers,
            retained_claims: g.retained_claims,
            events_missed: g.events_missed,
            data_losses: 0, // the registry's data is this process's memory
            snapshot_age: g.snapshot_age,
            parked: self.parked.get(),
            promoted: self.promoted.get(),
            waiting_expired: self.waiting_expired.get(),
            waiting: g.waiting,
            rejected_payload_budget: self.rejected_payload_budget.get(),
            payloads_too_large: self.payloads_too_large.get(),
            payloads_held: g.payloads_held,
            payload_bytes_held: g.payload_bytes_held,
        }
    }
}

/// A histogram of sweep durations. Written only by sweeps.
pub(crate) struct SweepTimes {
    /// Per-bucket (not cumulative) counts; the last is the unbounded bucket.
    buckets: [Counter; SWEEP_DURATION_BUCKETS.len() + 1],
    sum_nanos: Counter,
}

impl SweepTimes {
    fn new() -> Self {
        Self {
            buckets: std::array::from_fn(|_| Counter::new()),
            sum_nanos: Counter::new(),
        }
    }

    pub(crate) fn observe(&self, took: Duration) {
        self.sum_nanos
            .add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        self.buckets[SweepDurations::bucket_of(took)].inc();
    }

    fn read(&self) -> SweepDurations {
        let mut h = SweepDurations::default();
        for (i, b) in self.buckets.iter().enumerate() {
            h.buckets[i] = b.get();
        }
        h.sum = Duration::from_nanos(self.sum_nanos.get());
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_times_bucket_by_upper_bound_and_sum() {
        let h = SweepTimes::new();
        h.observe(Duration::from_micros(100)); // exactly a bound: its own bucket
        h.observe(Duration::from_millis(3)); // (2.5ms, 5ms]
        h.observe(Duration::from_secs(20)); // beyond the last bound
        let r = h.read();
        assert_eq!(r.count(), 3);
        assert_eq!(r.sum, Duration::from_micros(20_003_100));
        assert_eq!(r.buckets[3], 1, "{:?}", r.buckets);
        assert_eq!(r.buckets[8], 1, "{:?}", r.buckets);
        assert_eq!(r.buckets[SWEEP_DURATION_BUCKETS.len()], 1);
    }
}
