//! What the router did with a delivery, and who asked: the types that the dispatch, re-dispatch,
//! shutdown and HTTP layers all speak, and the metrics count. They sit below the code that
//! produces them, so none of it has to import another layer to name an outcome.
//!
//! One (target, delivery) pair's outcome is a [`Dispatch`], from the routing policy and the
//! registry's admission to the HTTP answer ([`TargetAnswer`](crate::http::answer::TargetAnswer) is built from it); its
//! name is an [`Outcome`], the one list of names the answers' JSON, their OpenAPI schema and the
//! metrics' labels share.

use std::fmt;

use serde::Serialize;
use utoipa::ToSchema;
use worker_registry::{
    AlreadyClaimed, Assignment, DeliveryId, RegistryError, Rejection, ReleaseReason, Status,
    Target, Waiting, WorkerId,
};

use crate::policy::Decision;

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
    /// `drain`: the worker got the event as its last one and is draining.
    Drained {
        /// The assignment of that last event.
        assignment: Assignment,
    },
    /// `drain` of a worker that already drains: nothing more to do (recorded as handled).
    AlreadyDraining {
        /// The worker.
        worker: WorkerId,
    },
    /// `reach` or `drain`, and the pull request has no live worker: nothing is started (recorded
    /// as handled).
    NoWorker(Decision),
    /// The routing policy ignores this event.
    Ignored,
}

impl Dispatch {
    /// The outcome as the delivery's answer names it (see [`Outcome`]): an overflowed delivery is
    /// `waiting` (queued behind its worker's full mailbox), an unreachable owner `unavailable`,
    /// a worker that already drains or no worker to reach `ignored`.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Assigned(_) => Outcome::Assigned,
            Self::Overflowed { .. } | Self::Waiting(_) => Outcome::Waiting,
            Self::Duplicate(_) => Outcome::Duplicate,
            Self::Rejected(Rejection::PayloadBudget { .. }) => Outcome::PayloadBudget,
            Self::Rejected(Rejection::TargetDraining { .. }) => Outcome::Draining,
            Self::Rejected(_) => Outcome::Capacity,
            Self::RoomFull(_) => Outcome::WaitingRoomFull,
            Self::Backlog { .. } => Outcome::OverflowFull,
            Self::Closing => Outcome::Closing,
            Self::Unavailable(_) | Self::Unreachable { .. } => Outcome::Unavailable,
            Self::Drained { .. } => Outcome::Drained,
            Self::AlreadyDraining { .. } | Self::NoWorker(_) | Self::Ignored => Outcome::Ignored,
        }
    }

    /// The outcome as the registry decided it, which the `webhook_router_admissions_total`
    /// metric and the dispatch span count: [`outcome`](Self::outcome), except that an
    /// overflowed delivery is `assigned` (the registry admitted it and its worker holds it; only
    /// the router's mailbox made it wait).
    pub fn admission(&self) -> Outcome {
        match self {
            Self::Overflowed { .. } => Outcome::Assigned,
            other => other.outcome(),
        }
    }
}

/// What the router did with a delivery, or with one of its pull requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Placed on the pull request's worker (202).
    Assigned,
    /// A redelivery of something in flight or recently completed (200).
    Duplicate,
    /// The pull request's worker got the event as its last one and is draining (202).
    Drained,
    /// Nothing to do: no pull request, no worker to reach or drain, or the policy ignores it (202).
    Ignored,
    /// No room now: the delivery waits, claimed, and is processed when room appears (202, with
    /// its position). No capacity, or the pull request's worker draining: in the registry's
    /// waiting room. The worker's mailbox full: in order in the overflow behind it (`worker`
    /// and `token` say which worker has it).
    Waiting,
    /// No capacity for a new worker, and the waiting room off (503, no claim left behind).
    Capacity,
    /// The pull request's worker is draining, and the waiting room off; it gets no new event
    /// (503).
    Draining,
    /// No capacity, or the pull request's worker draining, and the registry's waiting room (in
    /// total or for the repository's owner) full (503, no claim left behind).
    WaitingRoomFull,
    /// The worker's mailbox and the overflow behind it are full (503, no claim left behind).
    OverflowFull,
    /// The registry holds as many bytes of payloads as its `payload_budget` allows (503, no claim
    /// left behind; room appears as work completes).
    PayloadBudget,
    /// The router is shutting down (503).
    Closing,
    /// The registry's backend could not answer; nothing was accepted (503).
    Unavailable,
}

impl Outcome {
    /// Every outcome, in declaration order.
    pub const ALL: [Self; 12] = [
        Self::Assigned,
        Self::Duplicate,
        Self::Drained,
        Self::Ignored,
        Self::Waiting,
        Self::Capacity,
        Self::Draining,
        Self::WaitingRoomFull,
        Self::OverflowFull,
        Self::PayloadBudget,
        Self::Closing,
        Self::Unavailable,
    ];

    /// The name in answers and metric labels (the JSON name: a test holds them equal).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Assigned => "assigned",
            Self::Duplicate => "duplicate",
            Self::Drained => "drained",
            Self::Ignored => "ignored",
            Self::Waiting => "waiting",
            Self::Capacity => "capacity",
            Self::Draining => "draining",
            Self::WaitingRoomFull => "waiting_room_full",
            Self::OverflowFull => "overflow_full",
            Self::PayloadBudget => "payload_budget",
            Self::Closing => "closing",
            Self::Unavailable => "unavailable",
        }
    }

    /// Whether the delivery must be sent again later (answered 503).
    pub fn is_refusal(self) -> bool {
        matches!(
            self,
            Self::Capacity
                | Self::Draining
                | Self::WaitingRoomFull
                | Self::OverflowFull
                | Self::PayloadBudget
                | Self::Closing
                | Self::Unavailable
        )
    }

    /// Whether an admission can come to this ([`Dispatch::admission`]): every outcome but the
    /// routing policy's `drained` and `ignored`, which no admission decides. The
    /// `webhook_router_admissions_total` metric has a series for each.
    pub fn is_admission(self) -> bool {
        !matches!(self, Self::Drained | Self::Ignored)
    }
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

#[cfg(test)]
mod tests {
    use super::Outcome;

    #[test]
    fn every_outcome_is_named_as_serde_names_it() {
        for o in Outcome::ALL {
            let json = serde_json::to_string(&o).expect("a unit variant serialises");
            assert_eq!(json, format!("\"{}\"", o.as_str()), "{o:?}");
        }
        let mut names: Vec<_> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names.len(),
            Outcome::ALL.len(),
            "ALL lists each outcome once"
        );
    }

    /// The README's "## Answers" table names every outcome's JSON name, and no other.
    #[test]
    fn the_readme_answers_table_names_every_outcome() {
        let readme = include_str!("../README.md");
        let start = readme
            .find("\n## Answers\n")
            .expect("the README has ## Answers");
        let section = &readme[start + 1..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
        for o in Outcome::ALL {
            let name = format!("\"{}\"", o.as_str());
            assert!(section.contains(&name), "## Answers does not name {name}");
        }
        for named in section.split("\"outcome\":\"").skip(1) {
            let name = &named[..named.find('"').unwrap_or(named.len())];
            assert!(
                Outcome::ALL.iter().any(|o| o.as_str() == name),
                "## Answers names an outcome the router does not have: {name:?}"
            );
        }
    }
}
