//! [`RegistryError`]: what a registry call refused, with what it observed.

use std::fmt;

use crate::ids::{EventId, Target, WorkerId};
use crate::state::{DeadReason, Status};

/// Why a registry call was refused. Every variant carries what the registry observed, so a caller
/// can log or map it (the HTTP API maps `UnknownWorker` to 404 and `WorkerDead` to 409).
///
/// # Examples
///
/// ```
/// use worker_registry::{Registry, RegistryError, WorkerId};
///
/// let registry = Registry::default();
/// let err = registry.heartbeat(WorkerId::new(99)).unwrap_err();
/// assert_eq!(err, RegistryError::UnknownWorker { id: WorkerId::new(99) });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegistryError {
    /// No worker with this id (never existed, or dead and purged after the retention window).
    UnknownWorker {
        /// The id asked for.
        id: WorkerId,
    },
    /// The worker is dead: it is fenced and must stop.
    WorkerDead {
        /// The worker.
        id: WorkerId,
        /// How it died.
        reason: DeadReason,
    },
    /// No claim for this (target, event) pair, or it was forgotten.
    UnknownClaim {
        /// The target.
        target: Target,
        /// The delivery id.
        event: EventId,
    },
    /// The claim was released because its worker died; its completion is refused (the event will
    /// be, or was, dispatched again).
    ClaimReleased {
        /// The target.
        target: Target,
        /// The delivery id.
        event: EventId,
        /// The worker that held it.
        holder: Option<WorkerId>,
    },
    /// A worker tried to complete a claim it does not hold (it was declared dead and the delivery was
    /// re-admitted onto another worker, or it never held it).
    NotHolder {
        /// The target.
        target: Target,
        /// The delivery id.
        event: EventId,
        /// The claim's actual holder (none for a bare claim).
        holder: Option<WorkerId>,
        /// The worker that tried.
        worker: WorkerId,
    },
    /// The claim is completed; it cannot be released.
    ClaimCompleted {
        /// The target.
        target: Target,
        /// The delivery id.
        event: EventId,
    },
    /// Registering a worker would exceed `max_workers`.
    CapacityFull {
        /// The configured limit.
        limit: usize,
    },
    /// This registry has handed out every worker id it can (2^32 - 1).
    IdsExhausted,
    /// A networked backend could not be reached or answered badly (not produced in memory).
    Unavailable {
        /// What went wrong.
        detail: String,
    },
}

impl RegistryError {
    /// The status the worker was seen in, for errors about a worker.
    pub fn observed_status(&self) -> Option<Status> {
        match self {
            Self::WorkerDead { reason, .. } => Some(Status::Dead(*reason)),
            _ => None,
        }
    }
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownWorker { id } => write!(f, "unknown worker {id}"),
            Self::WorkerDead { id, reason } => write!(f, "worker {id} is dead ({reason})"),
            Self::UnknownClaim { target, event } => {
                write!(f, "no claim for event {event} on {target}")
            }
            Self::ClaimReleased {
                target,
                event,
                holder,
            } => match holder {
                Some(h) => write!(
                    f,
                    "claim for event {event} on {target} was released: worker {h} died"
                ),
                None => write!(f, "claim for event {event} on {target} was released"),
            },
            Self::NotHolder {
                target,
                event,
                holder,
                worker,
            } => match holder {
                Some(h) => write!(
                    f,
                    "worker {worker} does not hold event {event} on {target}: worker {h} does"
                ),
                None => write!(
                    f,
                    "worker {worker} does not hold event {event} on {target}: no worker does"
                ),
            },
            Self::ClaimCompleted { target, event } => {
                write!(
                    f,
                    "claim for event {event} on {target} is already completed"
                )
            }
            Self::CapacityFull { limit } => {
                write!(f, "capacity full: {limit} live workers is the limit")
            }
            Self::IdsExhausted => write!(f, "worker ids exhausted"),
            Self::Unavailable { detail } => write!(f, "registry unavailable: {detail}"),
        }
    }
}

impl std::error::Error for RegistryError {}
