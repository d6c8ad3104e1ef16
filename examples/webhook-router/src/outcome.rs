//! What the router did with a delivery, and who asked: the types that the dispatch, re-dispatch,
//! shutdown and HTTP layers all speak, and the metrics count. They sit below the code that
//! produces them, so none of it has to import another layer to name an outcome.

use std::fmt;

use worker_registry::{
    AlreadyClaimed, Assignment, DeliveryId, RegistryError, Rejection, ReleaseReason, Status,
    Target, Waiting, WorkerId,
};

/// Who asked for an admission (a label of the `webhook_router_admissions_total` metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A webhook delivery.
    Webhook,
    /// A released event placed again by the sweeper callback.
    Redispatch,
    /// A delivery promoted out of the registry's waiting room, delivered by the sweeper callback.
    Promotion,
}

impl Source {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Webhook => "webhook",
            Self::Redispatch => "redispatch",
            Self::Promotion => "promotion",
        }
    }
}

/// What the router did with one (target, delivery) pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatch {
    /// Placed on a worker, which has it queued.
    Assigned(Assignment),
    /// Placed on a worker whose mailbox is full: queued in order in the overflow behind it (see
    /// [`crate::mailbox`]), `position` deep. Admitted and claimed like [`Assigned`](Self::Assigned)
    /// (counted as `assigned`); answered `202 waiting` with the position.
    Overflowed {
        /// The assignment.
        assignment: Assignment,
        /// Its place in the worker's overflow when it was queued (from 1).
        position: usize,
    },
    /// A redelivery of something in flight or recently completed.
    Duplicate(AlreadyClaimed),
    /// The registry refused it and its waiting room is off (no claim is left behind).
    Rejected(Rejection),
    /// The registry refused it although its waiting room is on: the room (in total, or for the
    /// delivery's owner) is full (no claim is left behind).
    RoomFull(Rejection),
    /// The registry parked it: it is claimed, and a sweep hands it to the re-dispatch path when
    /// room appears (see [`crate::redispatch`]).
    Waiting(Waiting),
    /// The worker's mailbox and the overflow behind it are full; the claim was released again
    /// (`overflow_full`, told apart from a full waiting room).
    Backlog {
        /// The worker.
        worker: WorkerId,
    },
    /// The worker's container (on another replica) could not be reached; the claim was released
    /// again.
    Unreachable {
        /// The worker.
        worker: WorkerId,
        /// Why.
        reason: String,
    },
    /// The router is shutting down.
    Closing,
    /// The registry's backend could not answer: the delivery was not accepted.
    Unavailable(RegistryError),
}

impl Dispatch {
    /// The outcome as the registry decided it and the router counts it: `assigned` (an
    /// overflowed delivery included: the registry admitted it), `duplicate`, `waiting`, `capacity`
    /// (no capacity, the waiting room off), `draining` (the room off), `waiting_room_full` (no
    /// capacity or the worker draining, and the room full), `overflow_full` (the worker's mailbox
    /// and overflow are full), `payload_budget` (the registry's payload budget is full),
    /// `closing` or `unavailable`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Assigned(_) | Self::Overflowed { .. } => "assigned",
            Self::Duplicate(_) => "duplicate",
            Self::Waiting(_) => "waiting",
            Self::Rejected(Rejection::CapacityFull { .. }) => "capacity",
            Self::Rejected(Rejection::PayloadBudget { .. }) => "payload_budget",
            Self::Rejected(_) => "draining",
            Self::RoomFull(_) => "waiting_room_full",
            Self::Backlog { .. } => "overflow_full",
            Self::Closing => "closing",
            Self::Unavailable(_) | Self::Unreachable { .. } => "unavailable",
        }
    }

    /// Every value of [`outcome`](Self::outcome).
    pub const OUTCOMES: [&'static str; 10] = [
        "assigned",
        "duplicate",
        "waiting",
        "capacity",
        "draining",
        "waiting_room_full",
        "overflow_full",
        "payload_budget",
        "closing",
        "unavailable",
    ];
}

/// Why an accepted delivery was not completed before the router stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnfinishedWhy {
    /// Its worker was still busy (or had it queued) at the shutdown deadline: the worker was
    /// stopped and deregistered, which released the claim through the registry.
    StoppedAtDeadline {
        /// The worker.
        worker: WorkerId,
    },
    /// Its worker died and the registry released it; it was not placed again before the router
    /// stopped.
    Released {
        /// Why the registry released it.
        reason: ReleaseReason,
    },
    /// It was parked in the registry's waiting room and not promoted before the router stopped.
    StillWaiting,
}

impl fmt::Display for UnfinishedWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StoppedAtDeadline { worker } => {
                write!(f, "worker {worker} was stopped at the shutdown deadline")
            }
            Self::Released { reason } => {
                write!(f, "released ({reason}) and not re-dispatched before exit")
            }
            Self::StillWaiting => write!(f, "still parked in the waiting room at exit"),
        }
    }
}

/// An accepted delivery that was not completed before the router stopped. Its claim is released in
/// the registry: a shared backend's other replicas re-dispatch it (or the next start, if the
/// backend outlives the process); with the in-memory backend it is gone with the process, and
/// GitHub does not redeliver on its own: redeliver it by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// The target.
    pub target: Target,
    /// The delivery (`X-GitHub-Delivery`).
    pub delivery: DeliveryId,
    /// Why it was not completed.
    pub why: UnfinishedWhy,
}

/// Why a crash request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashError {
    /// No such worker (404).
    Unknown(WorkerId),
    /// The worker is dead already (409).
    Dead(WorkerId, Status),
    /// The worker has no container in this router (409).
    NoContainer(WorkerId),
    /// Its container has stopped already (409).
    AlreadyStopped(WorkerId),
    /// The registry's backend could not answer (503).
    Unavailable(RegistryError),
}

impl fmt::Display for CrashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(id) => write!(f, "unknown worker {id}"),
            Self::Dead(id, status) => write!(f, "worker {id} is {status}"),
            Self::NoContainer(id) => write!(f, "worker {id} has no container in this router"),
            Self::AlreadyStopped(id) => write!(f, "worker {id}'s container has stopped already"),
            Self::Unavailable(e) => write!(f, "{e}"),
        }
    }
}
