//! [`Stats`]: cumulative counters of what a registry decided, plus gauges, for metrics and for
//! tests that check a backend's accounting against what callers observed.

use std::time::Duration;

/// Upper bounds, in seconds, of the sweep-duration histogram's buckets (from 10 µs to 10 s: a
/// sweep of a handful of workers takes microseconds, one over a remote store of thousands up to
/// seconds); a last, unbounded bucket follows.
pub const SWEEP_DURATION_BUCKETS: [f64; 19] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A histogram of sweep durations: per-bucket (not cumulative) counts for the bounds in
/// [`SWEEP_DURATION_BUCKETS`] plus the unbounded bucket, and the sum.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use worker_registry::SweepDurations;
///
/// let mut h = SweepDurations::default();
/// h.observe(Duration::from_micros(30));
/// h.observe(Duration::from_secs(60));
/// assert_eq!(h.count(), 2);
/// assert_eq!(h.buckets[2], 1); // (25 µs, 50 µs]
/// assert_eq!(h.buckets[19], 1); // beyond 10 s
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepDurations {
    /// Observations per bucket; index `i < 19` counts those in `(bound[i-1], bound[i]]`, index 19
    /// those above the last bound.
    pub buckets: [u64; SWEEP_DURATION_BUCKETS.len() + 1],
    /// The sum of every observation.
    pub sum: Duration,
}

impl SweepDurations {
    /// The bucket index a duration falls in.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::SweepDurations;
    ///
    /// assert_eq!(SweepDurations::bucket_of(Duration::from_micros(10)), 0);
    /// ```
    pub fn bucket_of(took: Duration) -> usize {
        let secs = took.as_secs_f64();
        SWEEP_DURATION_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(SWEEP_DURATION_BUCKETS.len())
    }

    /// Adds one observation.
    pub fn observe(&mut self, took: Duration) {
        self.buckets[Self::bucket_of(took)] += 1;
        self.sum = self.sum.saturating_add(took);
    }

    /// Observations in all buckets.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// Cumulative counts since the registry handle was made, plus gauges.
///
/// Read without stopping writers, so while calls are in flight the fields may be a few operations
/// apart; once callers are quiet they are exact. A shared backend counts what this handle (this
/// replica) decided; its gauges are the registry's.
///
/// # Examples
///
/// ```
/// use worker_registry::{DeliveryId, memory::Direct, Target};
///
/// let registry = Direct::default();
/// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
/// registry.admit(&t, &d);
/// registry.admit(&t, &d);
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
    /// Deliveries and assignments refused for capacity (a registration refused for capacity is
    /// an error to its caller and is not counted here). A delivery parked in the waiting room is
    /// not refused: it is counted in `parked`, not here.
    pub rejected_capacity: u64,
    /// Deliveries or assignments refused because the target's worker is draining (a parked
    /// delivery is counted in `parked` instead).
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
    /// Workers still draining at their drain deadline.
    pub deaths_drain_timed_out: u64,
    /// Claims completed.
    pub claims_completed: u64,
    /// In-flight claims released for re-dispatch (their worker died, or they were unbound).
    pub claims_released: u64,
    /// In-flight claims released because they were stuck longer than `max_in_flight`.
    pub claims_stuck: u64,
    /// Completed claims forgotten after the retention window.
    pub claims_expired: u64,
    /// Completed claims evicted early to stay under `max_retained_claims`.
    pub claims_evicted: u64,
    /// Dead worker records purged after their retention.
    pub workers_purged: u64,
    /// Released deliveries never acknowledged, dropped `claim_retention` after their release
    /// (each also logged with `tracing::warn!`).
    pub released_expired: u64,
    /// Sweeps run (that did the maintenance work).
    pub sweeps: u64,
    /// Sweeps in which the mass-staleness brake held back deaths.
    pub brake_engaged: u64,
    /// Times a worker was marked suspect.
    pub suspected: u64,
    /// Lifecycle events dropped for subscribers that fell behind.
    pub events_missed: u64,
    /// Times this handle found that a shared backend's server lost the registry's data or went
    /// back in time ([`Event::DataLost`](crate::Event::DataLost)); always 0 in memory.
    pub data_losses: u64,
    /// Deliveries parked in the waiting room (not counted as rejected: a parked delivery is
    /// admitted later, or dropped and counted in `waiting_expired`).
    pub parked: u64,
    /// Parked deliveries promoted onto a worker and handed over.
    pub promoted: u64,
    /// Parked deliveries dropped without promotion (see
    /// [`ExpiredWaiting`](crate::ExpiredWaiting)).
    pub waiting_expired: u64,
    /// Gauge: deliveries waiting now.
    pub waiting: usize,
    /// Deliveries refused because their payload would have taken the payloads held past
    /// [`payload_budget`](crate::RegistryConfig::payload_budget)
    /// ([`Rejection::PayloadBudget`](crate::Rejection::PayloadBudget)).
    pub rejected_payload_budget: u64,
    /// Admissions refused because their payload was larger than
    /// [`max_payload_bytes`](crate::RegistryConfig::max_payload_bytes)
    /// ([`RegistryError::PayloadTooLarge`](crate::RegistryError::PayloadTooLarge)).
    pub payloads_too_large: u64,
    /// Gauge: payloads the registry holds now (with deliveries in flight, waiting, or released
    /// and not yet admitted again; see
    /// [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with)).
    pub payloads_held: usize,
    /// Gauge: their bytes, as [`Payload::size`](crate::Payload::size) counts them (what the
    /// budget is measured against).
    pub payload_bytes_held: u64,
    /// How long sweeps took.
    pub sweep_durations: SweepDurations,
    /// Gauge: live (non-dead) workers now.
    pub live_workers: usize,
    /// Gauge: completed claims retained now.
    pub retained_claims: usize,
    /// Gauge: how old the snapshot [`status`](crate::WorkerRegistry::status) returns is.
    pub snapshot_age: Duration,
}

/// What the registry's storage holds unfinished, read from the storage itself when asked
/// ([`WorkerRegistry::audit`](crate::WorkerRegistry::audit)), not from a snapshot: for
/// simulations, tests and operators checking that accepted work was completed, handed on or is
/// still waiting.
///
/// A promoted delivery counts twice until its hand-over is acknowledged: in flight on its
/// worker, and released (the hand-over to re-dispatch). A stuck claim's tombstone is not in
/// flight; its release is released until acknowledged.
///
/// # Examples
///
/// ```
/// use worker_registry::Audit;
///
/// let mut a = Audit::default();
/// (a.in_flight, a.waiting) = (2, 1);
/// assert_eq!(a.unfinished(), 3);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Audit {
    /// Live (non-dead) workers.
    pub live_workers: u64,
    /// Claims in flight: neither completed nor released, bound to a worker or bare.
    pub in_flight: u64,
    /// Deliveries released (their worker died, they were stuck or unbound) or promoted out of
    /// the waiting room, whose hand-over is not finished: not yet in a sweep's report, or, on a
    /// shared backend, reported and not yet [acknowledged](crate::Maintenance::acknowledge). A
    /// claim whose worker died counts here from the death on, swept or not.
    pub released: u64,
    /// Deliveries parked in the waiting room.
    pub waiting: u64,
}

impl Audit {
    /// Everything accepted and not finished: in flight, released or waiting. 0 means every
    /// delivery the registry accepted was completed (or, if expired from the waiting room,
    /// reported as such).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{DeliveryId, InMemoryRegistry, Target, WorkerRegistry, WorkerRegistryExt};
    ///
    /// let registry = InMemoryRegistry::default();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
    /// registry.admit(&t, &d).await.unwrap();
    /// assert_eq!(registry.audit().await.unwrap().unfinished(), 1);
    /// registry.complete(&t, &d).await.unwrap();
    /// assert_eq!(registry.audit().await.unwrap().unfinished(), 0);
    /// # }
    /// ```
    pub fn unfinished(&self) -> u64 {
        self.in_flight + self.released + self.waiting
    }
}

impl Stats {
    /// Deaths for one reason.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeadReason, Stats};
    ///
    /// assert_eq!(Stats::default().deaths(DeadReason::Exited), 0);
    /// ```
    pub fn deaths(&self, reason: super::status::DeadReason) -> u64 {
        use super::status::DeadReason as R;
        match reason {
            R::MissedHeartbeats => self.deaths_missed_heartbeats,
            R::Exited => self.deaths_exited,
            R::Deregistered => self.deaths_deregistered,
            R::DrainTimedOut => self.deaths_drain_timed_out,
        }
    }
}
