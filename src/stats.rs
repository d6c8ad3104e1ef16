//! [`Stats`]: cumulative counters of what the registry decided, for metrics and for tests that check
//! the registry's own accounting against what callers observed.

use std::time::Duration;

use crate::state::DeadReason;
use crate::sync::Counter;

/// The registry's counters (striped so hot paths never contend on one cache line).
pub(crate) struct Counters {
    pub(crate) admitted_new: Counter,
    pub(crate) admitted_sticky: Counter,
    pub(crate) duplicates: Counter,
    pub(crate) rejected_capacity: Counter,
    pub(crate) rejected_draining: Counter,
    pub(crate) heartbeats: Counter,
    pub(crate) heartbeats_refused: Counter,
    pub(crate) deaths: [Counter; 3],
    pub(crate) claims_completed: Counter,
    pub(crate) claims_released: Counter,
    pub(crate) claims_expired: Counter,
    pub(crate) claims_evicted: Counter,
    pub(crate) workers_purged: Counter,
    pub(crate) sweeps: Counter,
    pub(crate) brake_engaged: Counter,
    pub(crate) suspected: Counter,
    pub(crate) sweep_time: SweepTimes,
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
            deaths: [Counter::new(), Counter::new(), Counter::new()],
            claims_completed: Counter::new(),
            claims_released: Counter::new(),
            claims_expired: Counter::new(),
            claims_evicted: Counter::new(),
            workers_purged: Counter::new(),
            sweeps: Counter::new(),
            brake_engaged: Counter::new(),
            suspected: Counter::new(),
            sweep_time: SweepTimes::new(),
        }
    }

    pub(crate) fn death(&self, reason: DeadReason) -> &Counter {
        &self.deaths[death_index(reason)]
    }

    pub(crate) fn read(&self, live_workers: usize, retained_claims: usize) -> Stats {
        Stats {
            admitted_new: self.admitted_new.get(),
            admitted_sticky: self.admitted_sticky.get(),
            duplicates: self.duplicates.get(),
            rejected_capacity: self.rejected_capacity.get(),
            rejected_draining: self.rejected_draining.get(),
            heartbeats: self.heartbeats.get(),
            heartbeats_refused: self.heartbeats_refused.get(),
            deaths_missed_heartbeats: self.death(DeadReason::MissedHeartbeats).get(),
            deaths_exited: self.death(DeadReason::Exited).get(),
            deaths_deregistered: self.death(DeadReason::Deregistered).get(),
            claims_completed: self.claims_completed.get(),
            claims_released: self.claims_released.get(),
            claims_expired: self.claims_expired.get(),
            claims_evicted: self.claims_evicted.get(),
            workers_purged: self.workers_purged.get(),
            sweeps: self.sweeps.get(),
            brake_engaged: self.brake_engaged.get(),
            suspected: self.suspected.get(),
            live_workers,
            retained_claims,
        }
    }
}

/// Upper bounds (seconds) of the sweep-duration histogram buckets; a last, unbounded bucket follows.
pub(crate) const SWEEP_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// A histogram of sweep durations, for the metrics endpoint. Written only by sweeps.
pub(crate) struct SweepTimes {
    /// Per-bucket (not cumulative) counts; the last is the unbounded bucket.
    buckets: [Counter; SWEEP_BUCKETS.len() + 1],
    sum_nanos: Counter,
}

/// A histogram read: `(sum in seconds, count, (upper bound, count) per bucket)`. Bucket counts are
/// per bucket, not cumulative, and the last bound is `f64::MAX` (prometheus-client's `+Inf`).
#[cfg_attr(not(feature = "http"), allow(dead_code))] // read by the metrics collector
pub(crate) type HistogramRead = (f64, u64, Vec<(f64, u64)>);

impl SweepTimes {
    fn new() -> Self {
        Self {
            buckets: std::array::from_fn(|_| Counter::new()),
            sum_nanos: Counter::new(),
        }
    }

    pub(crate) fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let i = SWEEP_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(SWEEP_BUCKETS.len());
        self.sum_nanos
            .add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        self.buckets[i].inc();
    }

    /// Reads the histogram (for the metrics collector). The count is the sum of the buckets read, so it always agrees with them.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn read(&self) -> HistogramRead {
        let mut count = 0u64;
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for (i, b) in self.buckets.iter().enumerate() {
            let n = b.get();
            count += n;
            buckets.push((SWEEP_BUCKETS.get(i).copied().unwrap_or(f64::MAX), n));
        }
        let sum = Duration::from_nanos(self.sum_nanos.get()).as_secs_f64();
        (sum, count, buckets)
    }
}

fn death_index(reason: DeadReason) -> usize {
    match reason {
        DeadReason::MissedHeartbeats => 0,
        DeadReason::Exited => 1,
        DeadReason::Deregistered => 2,
    }
}

/// Cumulative counts since the registry was made, plus two gauges.
///
/// Read without stopping writers, so while calls are in flight the fields may be a few operations
/// apart; once callers are quiet they are exact.
///
/// # Examples
///
/// ```
/// use worker_registry::{Registry, Target, EventId};
///
/// let registry = Registry::default();
/// let (t, e) = (Target::new("o/r", 1).unwrap(), EventId::new("d").unwrap());
/// registry.admit(&t, &e);
/// registry.admit(&t, &e);
/// let s = registry.stats();
/// assert_eq!((s.admitted_new, s.duplicates, s.live_workers), (1, 1, 1));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Deliveries admitted onto a newly created worker.
    pub admitted_new: u64,
    /// Deliveries admitted onto the target's existing worker.
    pub admitted_sticky: u64,
    /// Deliveries refused as duplicates (by `admit` or `claim`).
    pub duplicates: u64,
    /// Deliveries or assignments refused for capacity.
    pub rejected_capacity: u64,
    /// Deliveries or assignments refused because the target's worker is draining.
    pub rejected_draining: u64,
    /// Heartbeats accepted.
    pub heartbeats: u64,
    /// Heartbeats refused (dead or unknown worker).
    pub heartbeats_refused: u64,
    /// Workers declared dead for missed heartbeats.
    pub deaths_missed_heartbeats: u64,
    /// Workers that exited after draining.
    pub deaths_exited: u64,
    /// Workers that deregistered while active.
    pub deaths_deregistered: u64,
    /// Claims completed.
    pub claims_completed: u64,
    /// In-flight claims released because their worker died (reported for re-dispatch).
    pub claims_released: u64,
    /// Completed claims forgotten after the retention window.
    pub claims_expired: u64,
    /// Completed claims evicted early to stay under `max_retained_claims`.
    pub claims_evicted: u64,
    /// Dead worker records purged after their retention.
    pub workers_purged: u64,
    /// Sweeps run.
    pub sweeps: u64,
    /// Sweeps in which the mass-staleness brake held back deaths.
    pub brake_engaged: u64,
    /// Times a worker was marked suspect.
    pub suspected: u64,
    /// Gauge: live (non-dead) workers now.
    pub live_workers: usize,
    /// Gauge: completed claims retained now.
    pub retained_claims: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_times_bucket_by_upper_bound_and_sum() {
        let h = SweepTimes::new();
        h.observe(Duration::from_micros(100)); // exactly the first bound: first bucket
        h.observe(Duration::from_millis(3)); // (2.5ms, 5ms]
        h.observe(Duration::from_secs(2)); // beyond the last bound
        let (sum, count, buckets) = h.read();
        assert_eq!(count, 3);
        assert!((sum - 2.0031).abs() < 1e-9, "{sum}");
        assert_eq!(buckets.len(), SWEEP_BUCKETS.len() + 1);
        assert_eq!(buckets[0], (0.000_1, 1));
        assert_eq!(buckets[5], (0.005, 1));
        assert_eq!(buckets[SWEEP_BUCKETS.len()], (f64::MAX, 1));
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 3);
    }
}
