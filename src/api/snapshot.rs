//! [`StatusSnapshot`]: the immutable picture of all workers that `status()` returns, and
//! [`WorkerInfo`], one worker in it.

use std::time::{Duration, SystemTime};

use super::ids::{FencingToken, Target, WorkerId};
use super::status::{Activity, PoolStatus, Status, WorkerKind};

/// Every tracked worker with its state, as of one sweep.
///
/// Built by a [`sweep`](crate::Maintenance::sweep) and published as one value, so the counts
/// always agree with the list, and a reader never waits for (or blocks) a sweep. Each worker's
/// entry is one consistent read of that worker; the snapshot is at most about one sweep interval
/// old. A backend outside this crate builds one with [`StatusSnapshot::new`].
///
/// # Examples
///
/// ```
/// use worker_registry::{DeliveryId, memory::Direct, Target};
///
/// let registry = Direct::default();
/// registry.admit(&Target::new("o/r", 1).unwrap(), &DeliveryId::new("d").unwrap());
/// registry.sweep();
/// let s = registry.status();
/// assert_eq!(s.workers.len(), 1);
/// assert_eq!(s.counts.active, 1);
/// assert_eq!(s.capacity.used, 1);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StatusSnapshot {
    /// Increases with every published snapshot (0 is the empty one a registry starts with).
    pub version: u64,
    /// When it was taken (wall clock).
    pub taken_at: SystemTime,
    /// When it was taken (the registry's monotonic clock).
    pub taken_at_monotonic: Duration,
    /// Every tracked worker, in no particular order (dead ones until their retention ends).
    pub workers: Vec<WorkerInfo>,
    /// Counts by status, computed from `workers`.
    pub counts: StatusCounts,
    /// Live workers against the limit, computed from `workers`.
    pub capacity: Capacity,
    /// Whether the mass-staleness brake held back deaths in the sweep that took this snapshot.
    pub brake_engaged: bool,
    /// Claims in the map when it was taken: in flight and retained (completed).
    pub claims: ClaimCounts,
    /// Deliveries parked in the waiting room when it was taken (always 0 with the room off).
    pub waiting: usize,
    /// Payloads the registry held when it was taken, against its budget.
    pub payloads: PayloadUsage,
}

impl StatusSnapshot {
    /// The empty snapshot a registry starts with (version 0).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use worker_registry::StatusSnapshot;
    ///
    /// let s = StatusSnapshot::empty(8, SystemTime::UNIX_EPOCH);
    /// assert_eq!((s.version, s.capacity.limit, s.workers.len()), (0, 8, 0));
    /// ```
    pub fn empty(limit: usize, taken_at: SystemTime) -> Self {
        Self {
            version: 0,
            taken_at,
            taken_at_monotonic: Duration::ZERO,
            workers: Vec::new(),
            counts: StatusCounts::default(),
            capacity: Capacity { used: 0, limit },
            brake_engaged: false,
            claims: ClaimCounts::default(),
            waiting: 0,
            payloads: PayloadUsage::default(),
        }
    }

    /// A snapshot of `workers`, with the counts and the capacity computed from the list.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use worker_registry::{ClaimCounts, StatusSnapshot, WorkerId, WorkerInfo, WorkerKind};
    ///
    /// let w = WorkerInfo::new(WorkerId::new(1), None, WorkerKind::Registered, SystemTime::UNIX_EPOCH);
    /// let s = StatusSnapshot::new(5, SystemTime::UNIX_EPOCH, Duration::ZERO, vec![w], 4, false,
    ///     ClaimCounts::default());
    /// assert_eq!((s.counts.active, s.capacity.used), (1, 1));
    /// ```
    pub fn new(
        version: u64,
        taken_at: SystemTime,
        taken_at_monotonic: Duration,
        workers: Vec<WorkerInfo>,
        limit: usize,
        brake_engaged: bool,
        claims: ClaimCounts,
    ) -> Self {
        let counts = StatusCounts::of(&workers);
        Self {
            version,
            taken_at,
            taken_at_monotonic,
            capacity: Capacity {
                used: counts.active + counts.draining,
                limit,
            },
            workers,
            counts,
            brake_engaged,
            claims,
            waiting: 0,
            payloads: PayloadUsage::default(),
        }
    }

    /// The entry for one worker, if it is in this snapshot.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use worker_registry::{StatusSnapshot, WorkerId};
    ///
    /// assert!(StatusSnapshot::empty(1, SystemTime::UNIX_EPOCH).worker(WorkerId::new(1)).is_none());
    /// ```
    pub fn worker(&self, id: WorkerId) -> Option<&WorkerInfo> {
        self.workers.iter().find(|w| w.id == id)
    }
}

/// Workers by status (`active + draining + dead == workers.len()`), with activity and suspicion
/// among the live ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatusCounts {
    /// Active workers.
    pub active: usize,
    /// Draining workers.
    pub draining: usize,
    /// Dead workers still retained.
    pub dead: usize,
    /// Live workers that are idle.
    pub idle: usize,
    /// Live workers that are busy.
    pub busy: usize,
    /// Live workers marked suspect by the brake.
    pub suspect: usize,
}

impl StatusCounts {
    /// Counts a list of workers.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::StatusCounts;
    ///
    /// assert_eq!(StatusCounts::of(&[]), StatusCounts::default());
    /// ```
    pub fn of(workers: &[WorkerInfo]) -> Self {
        let mut c = Self::default();
        for w in workers {
            match w.status {
                Status::Active => c.active += 1,
                Status::Draining => c.draining += 1,
                Status::Dead(_) => {
                    c.dead += 1;
                    continue;
                }
            }
            match w.activity {
                Activity::Idle => c.idle += 1,
                Activity::Busy => c.busy += 1,
            }
            if w.suspect {
                c.suspect += 1;
            }
        }
        c
    }
}

/// Payloads held with deliveries (in flight, waiting, released and not yet admitted again)
/// against [`payload_budget`](crate::RegistryConfig::payload_budget).
///
/// # Examples
///
/// ```
/// let p = worker_registry::PayloadUsage::new(2, 60_000, 1 << 20);
/// assert_eq!((p.held, p.bytes, p.budget), (2, 60_000, 1 << 20));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PayloadUsage {
    /// Payloads held.
    pub held: usize,
    /// Their bytes, as [`Payload::size`](crate::Payload::size) counts them.
    pub bytes: u64,
    /// The configured budget.
    pub budget: u64,
}

impl PayloadUsage {
    /// `held` payloads of `bytes` bytes in all, against `budget`.
    pub fn new(held: usize, bytes: u64, budget: u64) -> Self {
        Self {
            held,
            bytes,
            budget,
        }
    }
}

/// Live (non-dead) workers against `max_workers`.
///
/// # Examples
///
/// ```
/// let c = worker_registry::Capacity::default();
/// assert_eq!((c.used, c.limit), (0, 0));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capacity {
    /// Live workers (active + draining).
    pub used: usize,
    /// `max_workers`.
    pub limit: usize,
}

/// Claims by standing, as counted by a sweep.
///
/// # Examples
///
/// ```
/// let mut c = worker_registry::ClaimCounts::default();
/// c.in_flight = 3;
/// assert_eq!(c.retained, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimCounts {
    /// Claims that are neither completed nor released: their worker is alive, or (a bare claim)
    /// they are within the heartbeat timeout.
    pub in_flight: usize,
    /// Completed claims remembered for redelivery detection.
    pub retained: usize,
}

/// A point-in-time copy of one worker, as shown by [`status`](crate::WorkerRegistry::status) and
/// [`worker`](crate::WorkerRegistry::worker).
///
/// A backend outside this crate builds one with [`WorkerInfo::new`] and sets the fields.
///
/// # Examples
///
/// ```
/// use std::time::SystemTime;
/// use worker_registry::{PoolStatus, Status, WorkerId, WorkerInfo, WorkerKind};
///
/// let mut w = WorkerInfo::new(WorkerId::new(1), None, WorkerKind::Registered, SystemTime::UNIX_EPOCH);
/// assert_eq!(w.pool_status(), PoolStatus::Idle);
/// w.status = Status::Draining;
/// assert_eq!(w.pool_status(), PoolStatus::Draining);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// The worker's id.
    pub id: WorkerId,
    /// Its target (none for a self-registered pool worker).
    pub target: Option<Target>,
    /// Spawned for a target, or registered by itself.
    pub kind: WorkerKind,
    /// Active, draining or dead (with the reason).
    pub status: Status,
    /// Idle or busy.
    pub activity: Activity,
    /// Marked suspect by the mass-staleness brake (silent, but not yet declared dead).
    pub suspect: bool,
    /// When it was created (wall clock, display only).
    pub started_at: SystemTime,
    /// Its last heartbeat (its creation, if it has not beaten yet), on the wall clock.
    pub last_heartbeat: SystemTime,
    /// How long ago that was, on the registry's time base.
    pub heartbeat_age: Duration,
    /// Whether it has heartbeated at all.
    pub has_heartbeated: bool,
    /// When it died, if dead.
    pub died_at: Option<SystemTime>,
    /// When a draining worker's drain deadline passes (wall clock), if it is draining.
    pub drain_deadline: Option<SystemTime>,
    /// The latest fencing token it was given.
    pub token: FencingToken,
    /// How long it has existed.
    pub uptime: Duration,
}

impl WorkerInfo {
    /// An active, idle worker that was just created at `started_at`, with no heartbeat yet and
    /// token sequence 0: set the fields that differ.
    pub fn new(
        id: WorkerId,
        target: Option<Target>,
        kind: WorkerKind,
        started_at: SystemTime,
    ) -> Self {
        Self {
            id,
            target,
            kind,
            status: Status::Active,
            activity: Activity::Idle,
            suspect: false,
            started_at,
            last_heartbeat: started_at,
            heartbeat_age: Duration::ZERO,
            has_heartbeated: false,
            died_at: None,
            drain_deadline: None,
            token: FencingToken::from_raw(id.get() << FencingToken::SEQ_BITS),
            uptime: Duration::ZERO,
        }
    }

    /// The worker-pool document's view: idle, busy, draining or offline.
    pub fn pool_status(&self) -> PoolStatus {
        PoolStatus::of(self.status, self.activity)
    }
}
