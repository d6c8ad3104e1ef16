//! What the registry's decisions return: [`Admission`], [`AssignOutcome`], [`ClaimOutcome`],
//! [`HeartbeatAck`].

use crate::claim::AlreadyClaimed;
use crate::ids::{Generation, WorkerId};

/// A target placed on a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Assignment {
    /// The worker that owns the target.
    pub worker: WorkerId,
    /// The fencing token of this assignment.
    pub generation: Generation,
    /// True if the worker was created by this assignment (the router must spawn it).
    pub new: bool,
}

/// Why a target could not be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// `max_workers` live workers exist already.
    CapacityFull {
        /// The configured limit.
        limit: usize,
    },
    /// The target's worker is draining; the target gets no second worker until that one is dead.
    TargetDraining {
        /// The draining worker.
        worker: WorkerId,
    },
}

impl Rejection {
    /// `"capacity"` or `"draining"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CapacityFull { .. } => "capacity",
            Self::TargetDraining { .. } => "draining",
        }
    }
}

/// The answer of [`assign`](crate::Registry::assign) (AC3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignOutcome {
    /// Placed (on the target's existing worker, or a new one).
    Assigned(Assignment),
    /// Not placed.
    Rejected(Rejection),
}

/// The answer of [`claim`](crate::Registry::claim) (AC2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This delivery is new: the caller owns it.
    Claimed,
    /// The same (target, delivery) is in flight or was completed recently: skip it.
    AlreadyClaimed(AlreadyClaimed),
}

/// The answer of [`admit`](crate::Registry::admit): what a router does with one webhook delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// New delivery, placed on a worker; the claim is held by that worker.
    Assigned(Assignment),
    /// A redelivery of something in flight or recently completed: skip it.
    Duplicate(AlreadyClaimed),
    /// Not placed; no claim was left behind, so a later redelivery can be admitted.
    Rejected(Rejection),
}

/// What a live worker learns from its heartbeat (as Faktory's `BEAT` reply tells a worker to quiet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeartbeatAck {
    /// Carry on.
    Active,
    /// Finish the current loop, take nothing new, then exit.
    Draining,
}
