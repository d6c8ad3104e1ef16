//! [`RegistryConfig`]: every timing and limit, with named `DEFAULT_*` values and a validating builder.

use std::fmt;
use std::time::Duration;

/// How often a worker heartbeats (the worker-pool document: every 30 s).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
/// How many consecutive intervals a worker may miss before it is dead: 4 x 30 s = 2 min, the pool's
/// stale threshold.
pub const DEFAULT_MISSED_HEARTBEATS: u32 = 4;
/// How often the maintenance task sweeps (and so the most a `status()` snapshot can lag).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// How many non-dead workers may exist at once (draining ones count).
pub const DEFAULT_MAX_WORKERS: usize = 64;
/// How long a completed claim is remembered, so a late redelivery is still recognised. GitHub lets a
/// delivery be redelivered for three days.
pub const DEFAULT_CLAIM_RETENTION: Duration = Duration::from_secs(3 * 24 * 60 * 60);
/// How many completed claims are remembered at most (oldest evicted first).
pub const DEFAULT_MAX_RETAINED_CLAIMS: usize = 100_000;
/// How long a dead worker's record stays visible in `status()` before it is purged.
pub const DEFAULT_DEAD_RETENTION: Duration = Duration::from_secs(10 * 60);
/// Extra time a new worker gets for its first heartbeat (container start-up).
pub const DEFAULT_STARTUP_GRACE: Duration = Duration::from_secs(30);
/// The mass-staleness brake engages when a sweep would kill more than this fraction of live workers...
pub const DEFAULT_BRAKE_FRACTION: f64 = 0.5;
/// ...and there are at least this many live workers (as Kubernetes' unhealthy-zone rule).
pub const DEFAULT_BRAKE_MIN_WORKERS: usize = 3;
/// How long a worker may stay suspect (silent while the brake is engaged) before it is dead after all.
pub const DEFAULT_SUSPECT_GRACE: Duration = Duration::from_secs(2 * 60);
/// Shards per map of the in-memory backend (a power of two; more shards, less contention, more
/// memory).
pub const DEFAULT_SHARDS: usize = 64;
/// How long a drained worker's current loop may take before the worker is declared dead with
/// `DrainTimedOut` (Nomad's drain deadline, Kubernetes' termination grace period).
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(30 * 60);
/// How long a delivery may stay in flight before it is released for re-dispatch (the worker-pool
/// document requeues tasks running longer than 30 minutes without completion).
pub const DEFAULT_MAX_IN_FLIGHT: Duration = Duration::from_secs(30 * 60);
/// How long a shared backend waits for a replica to acknowledge a released event before it offers
/// the event to another replica.
pub const DEFAULT_RELEASE_ACK_TIMEOUT: Duration = Duration::from_secs(60);
/// How many deliveries may wait for room at once (see [`RegistryConfig::max_waiting`]); 0 turns the
/// waiting room off, which is the default: an admission that finds no room is rejected, as it
/// always was.
pub const DEFAULT_MAX_WAITING: usize = 0;
/// How many deliveries of one repository owner may wait at once (see
/// [`RegistryConfig::max_waiting_per_owner`]).
pub const DEFAULT_MAX_WAITING_PER_OWNER: usize = 256;
/// How long a delivery may wait for room before it is dropped with
/// [`ExpireReason::WaitedTooLong`](crate::ExpireReason::WaitedTooLong). GitHub gives up on a
/// delivery's response after 10 s, but a parked delivery has been answered already; an hour keeps
/// a burst of new PRs served without keeping forgotten work around.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(60 * 60);
/// The most live workers one repository owner may hold at once; 0 (the default) means no cap
/// beyond `max_workers`.
pub const DEFAULT_MAX_WORKERS_PER_OWNER: usize = 0;
/// The largest payload one delivery may carry ([`Payload::size`](crate::Payload::size): body plus
/// metadata): GitHub's cap on a webhook's body, 25 MB (taken as 25 MiB), plus the most metadata a
/// payload can have ([`MAX_PAYLOAD_META_LEN`](crate::limits::MAX_PAYLOAD_META_LEN)), so that every
/// delivery GitHub can send fits whatever headers ride with it.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u64 =
    25 * 1024 * 1024 + crate::limits::MAX_PAYLOAD_META_LEN as u64;
/// How many bytes of payloads the registry holds at most, all deliveries together (in flight,
/// waiting, released and not yet re-admitted): 256 MiB. GitHub's payloads are typically tens of KB
/// (a `pull_request` event is 20 to 60 KB), so this holds about 8 000 of 30 KB, far more than the
/// default 64 workers have in flight, or ten of the largest GitHub sends at once; and it keeps an
/// in-memory registry's payloads, or a Redis server's, at a size a router's container or a cache
/// server has room for.
pub const DEFAULT_PAYLOAD_BUDGET: u64 = 256 * 1024 * 1024;
/// The largest [`max_payload_bytes`](RegistryConfig::max_payload_bytes) accepted: 512 MiB, the
/// largest string Redis stores, so that every backend can hold any payload the limit lets in.
pub const MAX_PAYLOAD_LIMIT: u64 = 512 * 1024 * 1024;
/// The largest [`payload_budget`](RegistryConfig::payload_budget) accepted: 1 TiB (a bound that
/// keeps every sum of sizes far from overflow).
pub const MAX_PAYLOAD_BUDGET: u64 = 1 << 40;
/// The longest any duration setting may be: a year. Longer values are almost certainly a unit
/// mistake, and bounding them keeps every sum of durations far from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// Every timing and limit of a registry, for every backend. Build one with
/// [`RegistryConfig::builder`] (the defaults follow the worker-pool document); the builder
/// validates, so a `RegistryConfig` in hand is always valid, and its fields are read through
/// getters.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use worker_registry::config::DEFAULT_MISSED_HEARTBEATS;
/// use worker_registry::RegistryConfig;
///
/// let config = RegistryConfig::builder()
///     .heartbeat_interval(Duration::from_secs(10))
///     .max_workers(8)
///     .build()
///     .unwrap();
/// assert_eq!(config.heartbeat_timeout(), Duration::from_secs(10) * DEFAULT_MISSED_HEARTBEATS);
///
/// let err = RegistryConfig::builder().missed_heartbeats(1).build().unwrap_err();
/// assert!(err.to_string().contains("missed_heartbeats"));
///
/// let err = RegistryConfig::builder().shards(3).build().unwrap_err();
/// assert!(err.to_string().contains("shards"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RegistryConfig {
    heartbeat_interval: Duration,
    missed_heartbeats: u32,
    sweep_interval: Duration,
    max_workers: usize,
    claim_retention: Duration,
    max_retained_claims: usize,
    dead_retention: Duration,
    startup_grace: Duration,
    brake_fraction: f64,
    brake_min_workers: usize,
    suspect_grace: Duration,
    shards: usize,
    drain_deadline: Duration,
    max_in_flight: Duration,
    release_ack_timeout: Duration,
    max_waiting: usize,
    max_waiting_per_owner: usize,
    max_wait: Duration,
    max_workers_per_owner: usize,
    max_payload_bytes: u64,
    payload_budget: u64,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            missed_heartbeats: DEFAULT_MISSED_HEARTBEATS,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            max_workers: DEFAULT_MAX_WORKERS,
            claim_retention: DEFAULT_CLAIM_RETENTION,
            max_retained_claims: DEFAULT_MAX_RETAINED_CLAIMS,
            dead_retention: DEFAULT_DEAD_RETENTION,
            startup_grace: DEFAULT_STARTUP_GRACE,
            brake_fraction: DEFAULT_BRAKE_FRACTION,
            brake_min_workers: DEFAULT_BRAKE_MIN_WORKERS,
            suspect_grace: DEFAULT_SUSPECT_GRACE,
            shards: DEFAULT_SHARDS,
            drain_deadline: DEFAULT_DRAIN_DEADLINE,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            release_ack_timeout: DEFAULT_RELEASE_ACK_TIMEOUT,
            max_waiting: DEFAULT_MAX_WAITING,
            max_waiting_per_owner: DEFAULT_MAX_WAITING_PER_OWNER,
            max_wait: DEFAULT_MAX_WAIT,
            max_workers_per_owner: DEFAULT_MAX_WORKERS_PER_OWNER,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            payload_budget: DEFAULT_PAYLOAD_BUDGET,
        }
    }
}

impl RegistryConfig {
    /// How often workers are expected to heartbeat.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.heartbeat_interval(), worker_registry::config::DEFAULT_HEARTBEAT_INTERVAL);
    /// ```
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
    }

    /// Consecutive missed intervals after which a worker is dead (at least 2).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.missed_heartbeats(), worker_registry::config::DEFAULT_MISSED_HEARTBEATS);
    /// ```
    pub fn missed_heartbeats(&self) -> u32 {
        self.missed_heartbeats
    }

    /// How often the maintenance task sweeps (and so the most a snapshot lags).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.sweep_interval(), worker_registry::config::DEFAULT_SWEEP_INTERVAL);
    /// ```
    pub fn sweep_interval(&self) -> Duration {
        self.sweep_interval
    }

    /// Non-dead workers allowed at once (draining ones count).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.max_workers(), worker_registry::config::DEFAULT_MAX_WORKERS);
    /// ```
    pub fn max_workers(&self) -> usize {
        self.max_workers
    }

    /// How long completed claims are retained.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.claim_retention(), worker_registry::config::DEFAULT_CLAIM_RETENTION);
    /// ```
    pub fn claim_retention(&self) -> Duration {
        self.claim_retention
    }

    /// How many completed claims are retained at most.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.max_retained_claims(), worker_registry::config::DEFAULT_MAX_RETAINED_CLAIMS);
    /// ```
    pub fn max_retained_claims(&self) -> usize {
        self.max_retained_claims
    }

    /// How long dead records stay visible.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.dead_retention(), worker_registry::config::DEFAULT_DEAD_RETENTION);
    /// ```
    pub fn dead_retention(&self) -> Duration {
        self.dead_retention
    }

    /// Extra time before a new worker's first heartbeat is due.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.startup_grace(), worker_registry::config::DEFAULT_STARTUP_GRACE);
    /// ```
    pub fn startup_grace(&self) -> Duration {
        self.startup_grace
    }

    /// Fraction of live workers that, silent in one sweep, engages the brake (0 < f <= 1; 1 disables).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.brake_fraction(), worker_registry::config::DEFAULT_BRAKE_FRACTION);
    /// ```
    pub fn brake_fraction(&self) -> f64 {
        self.brake_fraction
    }

    /// The brake only engages with at least this many live workers.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.brake_min_workers(), worker_registry::config::DEFAULT_BRAKE_MIN_WORKERS);
    /// ```
    pub fn brake_min_workers(&self) -> usize {
        self.brake_min_workers
    }

    /// How long a suspect may stay silent before it is dead.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.suspect_grace(), worker_registry::config::DEFAULT_SUSPECT_GRACE);
    /// ```
    pub fn suspect_grace(&self) -> Duration {
        self.suspect_grace
    }

    /// Shards per map (in-memory backend only).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.shards(), worker_registry::config::DEFAULT_SHARDS);
    /// ```
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// How long a drained worker's loop may take by default before it is dead (`DrainTimedOut`).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.drain_deadline(), worker_registry::config::DEFAULT_DRAIN_DEADLINE);
    /// ```
    pub fn drain_deadline(&self) -> Duration {
        self.drain_deadline
    }

    /// How long a delivery may stay in flight before it is released as stuck.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.max_in_flight(), worker_registry::config::DEFAULT_MAX_IN_FLIGHT);
    /// ```
    pub fn max_in_flight(&self) -> Duration {
        self.max_in_flight
    }

    /// How long a shared backend waits for a released event's acknowledgement before offering it to another replica.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.release_ack_timeout(), worker_registry::config::DEFAULT_RELEASE_ACK_TIMEOUT);
    /// ```
    pub fn release_ack_timeout(&self) -> Duration {
        self.release_ack_timeout
    }

    /// How many deliveries may wait for room at once, across all owners: an admission that finds
    /// no capacity, or its target's worker draining, is parked while fewer wait (see
    /// [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with)). 0 turns the waiting
    /// room off.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.max_waiting(), worker_registry::config::DEFAULT_MAX_WAITING);
    /// ```
    pub fn max_waiting(&self) -> usize {
        self.max_waiting
    }

    /// How many deliveries of one repository owner (the part of the repository before `/`) may
    /// wait at once, so one organisation's burst cannot fill the waiting room.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.max_waiting_per_owner(), worker_registry::config::DEFAULT_MAX_WAITING_PER_OWNER);
    /// ```
    pub fn max_waiting_per_owner(&self) -> usize {
        self.max_waiting_per_owner
    }

    /// How long a parked delivery may wait (registry time) before it is dropped with a reason.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.max_wait(), worker_registry::config::DEFAULT_MAX_WAIT);
    /// ```
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The most live workers one repository owner may hold at once (0: no cap beyond
    /// `max_workers`). An admission of a new target whose owner is at the cap is treated as one
    /// that found no capacity (parked, or rejected with
    /// [`Rejection::CapacityFull`](crate::Rejection::CapacityFull), whose `limit` is
    /// [`max_workers`](Self::max_workers) on every backend). Only a backend that parks
    /// enforces it.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.max_workers_per_owner(), worker_registry::config::DEFAULT_MAX_WORKERS_PER_OWNER);
    /// ```
    pub fn max_workers_per_owner(&self) -> usize {
        self.max_workers_per_owner
    }

    /// The largest payload one admission may carry, as [`Payload::size`](crate::Payload::size)
    /// counts it: a larger one is refused with [`RegistryError::PayloadTooLarge`](crate::RegistryError::PayloadTooLarge)
    /// and leaves no claim (see [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with)).
    /// At least 1, at most [`MAX_PAYLOAD_LIMIT`] and at most the budget.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.max_payload_bytes(), worker_registry::config::DEFAULT_MAX_PAYLOAD_BYTES);
    /// ```
    pub fn max_payload_bytes(&self) -> u64 {
        self.max_payload_bytes
    }

    /// How many bytes of payloads (as [`Payload::size`](crate::Payload::size) counts them) the
    /// registry holds at most, every delivery's together: an admission whose payload would take
    /// it past this is refused with [`Rejection::PayloadBudget`](crate::Rejection::PayloadBudget)
    /// and leaves no claim (see [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with)).
    /// At least [`max_payload_bytes`](Self::max_payload_bytes) (so any payload the limit lets in
    /// can be admitted into an empty registry), at most [`MAX_PAYLOAD_BUDGET`].
    ///
    /// # Examples
    ///
    /// ```
    /// let c = worker_registry::RegistryConfig::default();
    /// assert_eq!(c.payload_budget(), worker_registry::config::DEFAULT_PAYLOAD_BUDGET);
    /// ```
    pub fn payload_budget(&self) -> u64 {
        self.payload_budget
    }

    /// A builder starting from the defaults.
    pub fn builder() -> RegistryConfigBuilder {
        RegistryConfigBuilder {
            config: Self::default(),
        }
    }

    /// `heartbeat_interval x missed_heartbeats`: silence longer than this kills a worker.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::RegistryConfig;
    ///
    /// let c = RegistryConfig::builder()
    ///     .heartbeat_interval(Duration::from_secs(10))
    ///     .missed_heartbeats(3)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(c.heartbeat_timeout(), Duration::from_secs(30));
    /// ```
    pub fn heartbeat_timeout(&self) -> Duration {
        self.heartbeat_interval
            .saturating_mul(self.missed_heartbeats)
    }

    /// Checks every constraint, in a fixed order (the first broken one is reported);
    /// [`RegistryConfigBuilder::build`] calls this, so a config in hand is always valid.
    fn validate(&self) -> Result<(), ConfigError> {
        self.check_durations()?;
        self.check_liveness()?;
        self.check_capacity_and_retention()?;
        self.check_brake_and_deadlines()?;
        self.check_waiting_owners_and_shards()?;
        self.check_payloads()
    }

    /// No duration above [`MAX_DURATION`], the heartbeat timeout included.
    fn check_durations(&self) -> Result<(), ConfigError> {
        for (field, d) in [
            ("heartbeat_interval", self.heartbeat_interval),
            ("sweep_interval", self.sweep_interval),
            ("claim_retention", self.claim_retention),
            ("dead_retention", self.dead_retention),
            ("startup_grace", self.startup_grace),
            ("suspect_grace", self.suspect_grace),
            ("drain_deadline", self.drain_deadline),
            ("max_in_flight", self.max_in_flight),
            ("release_ack_timeout", self.release_ack_timeout),
            ("max_wait", self.max_wait),
            (
                "heartbeat_interval x missed_heartbeats",
                self.heartbeat_timeout(),
            ),
        ] {
            if d > MAX_DURATION {
                return bad(field, format!("{d:?}"), "at most a year (MAX_DURATION)");
            }
        }
        Ok(())
    }

    /// Heartbeats and the sweep that judges them.
    fn check_liveness(&self) -> Result<(), ConfigError> {
        if self.heartbeat_interval < Duration::from_millis(1) {
            return bad(
                "heartbeat_interval",
                format!("{:?}", self.heartbeat_interval),
                "at least 1 ms",
            );
        }
        if self.missed_heartbeats < 2 {
            return bad(
                "missed_heartbeats",
                self.missed_heartbeats.to_string(),
                "at least 2 (one late heartbeat must not kill a worker)",
            );
        }
        if self.sweep_interval < Duration::from_millis(1) {
            return bad(
                "sweep_interval",
                format!("{:?}", self.sweep_interval),
                "at least 1 ms",
            );
        }
        if self.sweep_interval > self.heartbeat_timeout() {
            return bad(
                "sweep_interval",
                format!("{:?}", self.sweep_interval),
                "at most heartbeat_interval x missed_heartbeats",
            );
        }
        Ok(())
    }

    /// The capacity limit and how long claims and dead workers are kept.
    fn check_capacity_and_retention(&self) -> Result<(), ConfigError> {
        if self.max_workers == 0 || self.max_workers as u64 > u64::from(u32::MAX) {
            return bad(
                "max_workers",
                self.max_workers.to_string(),
                "between 1 and 2^32 - 1",
            );
        }
        if self.claim_retention < self.sweep_interval {
            return bad(
                "claim_retention",
                format!("{:?}", self.claim_retention),
                "at least sweep_interval",
            );
        }
        if self.max_retained_claims == 0 {
            return bad("max_retained_claims", "0".into(), "at least 1");
        }
        if self.dead_retention < self.sweep_interval {
            return bad(
                "dead_retention",
                format!("{:?}", self.dead_retention),
                "at least sweep_interval",
            );
        }
        Ok(())
    }

    /// The mass-staleness brake, stuck deliveries and the release acknowledgement.
    fn check_brake_and_deadlines(&self) -> Result<(), ConfigError> {
        if !(self.brake_fraction > 0.0 && self.brake_fraction <= 1.0) {
            return bad(
                "brake_fraction",
                self.brake_fraction.to_string(),
                "greater than 0 and at most 1",
            );
        }
        if self.brake_min_workers == 0 {
            return bad("brake_min_workers", "0".into(), "at least 1");
        }
        if self.suspect_grace < self.sweep_interval {
            return bad(
                "suspect_grace",
                format!("{:?}", self.suspect_grace),
                "at least sweep_interval",
            );
        }
        if self.max_in_flight < self.sweep_interval {
            return bad(
                "max_in_flight",
                format!("{:?}", self.max_in_flight),
                "at least sweep_interval",
            );
        }
        if self.release_ack_timeout < Duration::from_millis(1) {
            return bad(
                "release_ack_timeout",
                format!("{:?}", self.release_ack_timeout),
                "at least 1 ms",
            );
        }
        Ok(())
    }

    /// The waiting room, the per-owner caps and the shard count.
    fn check_waiting_owners_and_shards(&self) -> Result<(), ConfigError> {
        if self.max_waiting > 1 << 20 {
            return bad(
                "max_waiting",
                self.max_waiting.to_string(),
                "at most 2^20 (0 turns the waiting room off)",
            );
        }
        if self.max_waiting > 0 && self.max_waiting_per_owner == 0 {
            return bad(
                "max_waiting_per_owner",
                "0".into(),
                "at least 1 while the waiting room is on",
            );
        }
        if self.max_waiting > 0 && self.max_wait < self.sweep_interval {
            return bad(
                "max_wait",
                format!("{:?}", self.max_wait),
                "at least sweep_interval (promotion and expiry happen in sweeps)",
            );
        }
        if self.max_workers_per_owner > self.max_workers {
            return bad(
                "max_workers_per_owner",
                self.max_workers_per_owner.to_string(),
                "at most max_workers (0 for no cap)",
            );
        }
        if !self.shards.is_power_of_two() || self.shards < 2 || self.shards > 4096 {
            return bad(
                "shards",
                self.shards.to_string(),
                "a power of two from 2 to 4096",
            );
        }
        Ok(())
    }
}

impl RegistryConfig {
    /// The payload limit and the payload budget.
    fn check_payloads(&self) -> Result<(), ConfigError> {
        if self.max_payload_bytes == 0 || self.max_payload_bytes > MAX_PAYLOAD_LIMIT {
            return bad(
                "max_payload_bytes",
                self.max_payload_bytes.to_string(),
                "between 1 and 512 MiB (MAX_PAYLOAD_LIMIT)",
            );
        }
        if self.payload_budget < self.max_payload_bytes {
            return bad(
                "payload_budget",
                self.payload_budget.to_string(),
                "at least max_payload_bytes (the largest payload must fit an empty registry)",
            );
        }
        if self.payload_budget > MAX_PAYLOAD_BUDGET {
            return bad(
                "payload_budget",
                self.payload_budget.to_string(),
                "at most 1 TiB (MAX_PAYLOAD_BUDGET)",
            );
        }
        Ok(())
    }
}

/// A [`ConfigError::Invalid`] for `field`.
fn bad(field: &'static str, found: String, expected: &'static str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        field,
        found,
        expected,
    })
}

/// Builds a [`RegistryConfig`] and validates it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use worker_registry::RegistryConfig;
///
/// let c = RegistryConfig::builder()
///     .heartbeat_interval(Duration::from_millis(200))
///     .missed_heartbeats(3)
///     .sweep_interval(Duration::from_millis(100))
///     .build()
///     .unwrap();
/// assert_eq!(c.heartbeat_timeout(), Duration::from_millis(600));
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct RegistryConfigBuilder {
    config: RegistryConfig,
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.config.$name = value;
                self
            }
        )*
    };
}

impl RegistryConfigBuilder {
    setters! {
        /// Sets [`RegistryConfig::heartbeat_interval`].
        heartbeat_interval: Duration,
        /// Sets [`RegistryConfig::missed_heartbeats`].
        missed_heartbeats: u32,
        /// Sets [`RegistryConfig::sweep_interval`].
        sweep_interval: Duration,
        /// Sets [`RegistryConfig::max_workers`].
        max_workers: usize,
        /// Sets [`RegistryConfig::claim_retention`].
        claim_retention: Duration,
        /// Sets [`RegistryConfig::max_retained_claims`].
        max_retained_claims: usize,
        /// Sets [`RegistryConfig::dead_retention`].
        dead_retention: Duration,
        /// Sets [`RegistryConfig::startup_grace`].
        startup_grace: Duration,
        /// Sets [`RegistryConfig::brake_fraction`].
        brake_fraction: f64,
        /// Sets [`RegistryConfig::brake_min_workers`].
        brake_min_workers: usize,
        /// Sets [`RegistryConfig::suspect_grace`].
        suspect_grace: Duration,
        /// Sets [`RegistryConfig::shards`].
        shards: usize,
        /// Sets [`RegistryConfig::drain_deadline`].
        drain_deadline: Duration,
        /// Sets [`RegistryConfig::max_in_flight`].
        max_in_flight: Duration,
        /// Sets [`RegistryConfig::release_ack_timeout`].
        release_ack_timeout: Duration,
        /// Sets [`RegistryConfig::max_waiting`].
        max_waiting: usize,
        /// Sets [`RegistryConfig::max_waiting_per_owner`].
        max_waiting_per_owner: usize,
        /// Sets [`RegistryConfig::max_wait`].
        max_wait: Duration,
        /// Sets [`RegistryConfig::max_workers_per_owner`].
        max_workers_per_owner: usize,
        /// Sets [`RegistryConfig::max_payload_bytes`].
        max_payload_bytes: u64,
        /// Sets [`RegistryConfig::payload_budget`].
        payload_budget: u64,
    }

    /// Validates and returns the configuration.
    pub fn build(self) -> Result<RegistryConfig, ConfigError> {
        self.config.validate()?;
        Ok(self.config)
    }
}

/// A configuration value outside its allowed range.
///
/// # Examples
///
/// ```
/// use worker_registry::{ConfigError, RegistryConfig};
///
/// let ConfigError::Invalid { field, .. } =
///     RegistryConfig::builder().max_workers(0).build().unwrap_err() else { unreachable!() };
/// assert_eq!(field, "max_workers");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `field` was `found`, but must be `expected`.
    Invalid {
        /// The field's name.
        field: &'static str,
        /// The value given.
        found: String,
        /// The constraint.
        expected: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid {
                field,
                found,
                expected,
            } => write!(f, "invalid {field}: {found}; expected {expected}"),
        }
    }
}

impl std::error::Error for ConfigError {}
