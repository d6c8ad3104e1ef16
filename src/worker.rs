//! A worker's record (what the registry keeps) and [`WorkerInfo`] (what it shows).

use std::time::{Duration, SystemTime};

use crate::ids::{Generation, Target, WorkerId};
use crate::state::{Activity, PoolStatus, StateCell, Status, Word};
use crate::sync::{AtomicU64, Ordering};

/// How a worker came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerKind {
    /// Created by an assignment for one target (a container the router spawns).
    Spawned,
    /// Registered by itself, with no target (a pool worker that pulls work elsewhere).
    Registered,
}

impl WorkerKind {
    /// `"spawned"` or `"registered"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Spawned => "spawned",
            Self::Registered => "registered",
        }
    }
}

/// What the registry keeps per worker. Shared as an `Arc` between the worker map, the target map,
/// the claims it holds and any [`WorkerHandle`](crate::WorkerHandle); immutable but for its atomics.
pub(crate) struct WorkerRecord {
    pub(crate) id: WorkerId,
    pub(crate) target: Option<Target>,
    pub(crate) started_wall: SystemTime,
    pub(crate) started_ms: u64,
    pub(crate) state: StateCell,
    /// Assignments received (the low half of the [`Generation`]).
    assignments: AtomicU64,
    /// 1 + the time of death in ms, or 0 while alive or before the killer recorded it.
    died_at: AtomicU64,
    /// 1 + when the brake last marked it suspect, in ms.
    suspect_since: AtomicU64,
}

impl WorkerRecord {
    pub(crate) fn new(
        id: WorkerId,
        target: Option<Target>,
        now_ms: u64,
        wall: SystemTime,
        assigned: bool,
    ) -> Self {
        Self {
            id,
            target,
            started_wall: wall,
            started_ms: now_ms,
            state: StateCell::new(Word::new(now_ms, assigned)),
            assignments: AtomicU64::new(u64::from(assigned)),
            died_at: AtomicU64::new(0),
            suspect_since: AtomicU64::new(0),
        }
    }

    /// Records one more assignment and returns its token. Relaxed: a counter whose uniqueness comes
    /// from the read-modify-write itself; it publishes nothing.
    pub(crate) fn next_generation(&self) -> Generation {
        let seq = self.assignments.fetch_add(1, Ordering::Relaxed) + 1;
        Generation::new(self.id, seq)
    }

    /// The latest token handed out (seq 0 if none yet). Relaxed: display only.
    pub(crate) fn generation(&self) -> Generation {
        Generation::new(self.id, self.assignments.load(Ordering::Relaxed))
    }

    /// Called once, by the thread whose CAS made the worker dead. Release: pairs with the Acquire in
    /// `died_at`, so a sweeper that sees the time also sees the death (it reads the word after).
    pub(crate) fn record_death(&self, now_ms: u64) {
        self.died_at
            .store(now_ms.saturating_add(1), Ordering::Release);
    }

    /// When it died, if the killer has recorded it yet. Acquire: see `record_death`.
    pub(crate) fn died_at(&self) -> Option<u64> {
        match self.died_at.load(Ordering::Acquire) {
            0 => None,
            t => Some(t - 1),
        }
    }

    /// Called by the (serialised) sweeper after its CAS set the suspect flag. Relaxed: only the
    /// sweeper reads or writes it, and sweeps are serialised by the sweep mutex.
    pub(crate) fn mark_suspect_since(&self, now_ms: u64) {
        self.suspect_since
            .store(now_ms.saturating_add(1), Ordering::Relaxed);
    }

    /// When the brake marked it suspect. Relaxed: see `mark_suspect_since`.
    pub(crate) fn suspect_since(&self) -> Option<u64> {
        match self.suspect_since.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t - 1),
        }
    }

    pub(crate) fn kind(&self) -> WorkerKind {
        if self.target.is_some() {
            WorkerKind::Spawned
        } else {
            WorkerKind::Registered
        }
    }

    /// A display copy of this record as of `w` (a word read once by the caller).
    pub(crate) fn info(&self, w: Word, now_ms: u64, wall_origin: SystemTime) -> WorkerInfo {
        let at = |ms: u64| wall_origin + Duration::from_millis(ms);
        WorkerInfo {
            id: self.id,
            target: self.target.clone(),
            kind: self.kind(),
            status: w.status(),
            activity: w.activity(),
            suspect: w.is_suspect(),
            started_at: self.started_wall,
            last_heartbeat: at(w.ts()),
            heartbeat_age: Duration::from_millis(now_ms.saturating_sub(w.ts())),
            has_heartbeated: w.has_beaten(),
            died_at: if w.is_dead() {
                self.died_at().map(at)
            } else {
                None
            },
            generation: self.generation(),
            uptime: Duration::from_millis(now_ms.saturating_sub(self.started_ms)),
        }
    }
}

/// A point-in-time copy of one worker, as shown by [`status()`](crate::Registry::status) and
/// [`worker()`](crate::Registry::worker).
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
    /// How long ago that was, on the monotonic clock.
    pub heartbeat_age: Duration,
    /// Whether it has heartbeated at all.
    pub has_heartbeated: bool,
    /// When it died, if dead.
    pub died_at: Option<SystemTime>,
    /// The latest fencing token it was given.
    pub generation: Generation,
    /// How long it has existed.
    pub uptime: Duration,
}

impl WorkerInfo {
    /// The worker-pool document's view: idle, busy, draining or offline.
    pub fn pool_status(&self) -> PoolStatus {
        match (self.status, self.activity) {
            (Status::Active, Activity::Idle) => PoolStatus::Idle,
            (Status::Active, Activity::Busy) => PoolStatus::Busy,
            (Status::Draining, _) => PoolStatus::Draining,
            (Status::Dead(_), _) => PoolStatus::Offline,
        }
    }
}
