//! [`StatusSnapshot`]: the immutable picture of all workers that `status()` returns (AC6).

use std::time::{Duration, SystemTime};

use crate::ids::WorkerId;
use crate::state::{Activity, Status};
use crate::worker::WorkerInfo;

/// Every tracked worker with its state, as of one sweep.
///
/// Built by [`sweep()`](crate::Registry::sweep) from one pass over the workers and published
/// atomically, so the counts always agree with the list, and a reader never waits for (or blocks)
/// a sweep. Each worker's entry is one read of its state word; the snapshot is at most one sweep
/// interval old.
///
/// # Examples
///
/// ```
/// use worker_registry::{Registry, Target, EventId};
///
/// let registry = Registry::default();
/// registry.admit(&Target::new("o/r", 1).unwrap(), &EventId::new("d").unwrap());
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
    pub generation: u64,
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
}

impl StatusSnapshot {
    pub(crate) fn empty(limit: usize, taken_at: SystemTime) -> Self {
        Self {
            generation: 0,
            taken_at,
            taken_at_monotonic: Duration::ZERO,
            workers: Vec::new(),
            counts: StatusCounts::default(),
            capacity: Capacity { used: 0, limit },
            brake_engaged: false,
            claims: ClaimCounts::default(),
        }
    }

    /// Builds the derived fields from the list.
    pub(crate) fn from_workers(
        generation: u64,
        taken_at: SystemTime,
        taken_at_monotonic: Duration,
        workers: Vec<WorkerInfo>,
        limit: usize,
        brake_engaged: bool,
        claims: ClaimCounts,
    ) -> Self {
        let counts = StatusCounts::of(&workers);
        Self {
            generation,
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
        }
    }

    /// The entry for one worker, if it is in this snapshot.
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

/// Live (non-dead) workers against `max_workers`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capacity {
    /// Live workers (active + draining).
    pub used: usize,
    /// `max_workers`.
    pub limit: usize,
}

/// Claims by standing, as counted by a sweep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimCounts {
    /// Claims whose worker is alive and that are not completed.
    pub in_flight: usize,
    /// Completed claims remembered for redelivery detection.
    pub retained: usize,
}
