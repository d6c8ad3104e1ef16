//! The JSON bodies `POST /webhook` and the debug endpoint answer with, and their OpenAPI schemas
//! (derived from the same types, so they cannot drift).

use serde::Serialize;
use utoipa::ToSchema;
use worker_registry::{ClaimState, Rejection, Target, WorkerId};

use crate::outcome::{Dispatch, Outcome};
use crate::policy::Decision;

/// A claim's state, for a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClaimStateName {
    /// Being handled.
    InFlight,
    /// Handled.
    Completed,
    /// Waiting for room.
    Waiting,
}

/// What happened to one pull request of a delivery.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TargetAnswer {
    /// The pull request, `owner/repo#number` (lower-cased).
    #[schema(example = "octo-org/api#42")]
    pub target: String,
    /// What the router did with it.
    pub outcome: Outcome,
    /// The worker that has it (assigned, duplicate, drained), or that refused it (draining, a full
    /// queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 17592186044415_u64, example = 7)]
    pub worker: Option<u64>,
    /// Whether a new worker (container) was started for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<bool>,
    /// The assignment's fencing token.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub token: Option<u64>,
    /// A duplicate's claim state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<ClaimStateName>,
    /// The capacity limit (capacity).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub limit: Option<u64>,
    /// Why (ignored, refused, waiting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Waiting: how many deliveries waited, this one included, when it was parked (in the
    /// registry's waiting room, or in the worker's overflow when `worker` and `token` are set).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub position: Option<u64>,
}

impl TargetAnswer {
    /// `target`'s answer from what the router did with it; `event` is the delivery's
    /// `X-GitHub-Event` and `action`, which an ignored answer names.
    pub fn new(target: &Target, d: &Dispatch, event: (&str, Option<&str>)) -> Self {
        let assignment = match d {
            Dispatch::Assigned(a)
            | Dispatch::Overflowed { assignment: a, .. }
            | Dispatch::Drained { assignment: a } => Some(a),
            _ => None,
        };
        let worker = match d {
            Dispatch::Duplicate(dup) => dup.holder,
            Dispatch::Waiting(w) => draining_worker(&w.reason),
            Dispatch::Rejected(r) | Dispatch::RoomFull(r) => draining_worker(r),
            Dispatch::Backlog { worker }
            | Dispatch::Unreachable { worker, .. }
            | Dispatch::AlreadyDraining { worker } => Some(*worker),
            _ => assignment.map(|a| a.worker),
        };
        let limit = match d {
            Dispatch::Rejected(r) | Dispatch::RoomFull(r) => capacity_limit(r),
            Dispatch::Waiting(w) => capacity_limit(&w.reason),
            _ => None,
        };
        let position = match d {
            Dispatch::Waiting(w) => Some(w.position),
            Dispatch::Overflowed { position, .. } => Some(*position),
            _ => None,
        };
        let state = match d {
            Dispatch::Duplicate(dup) => Some(match dup.state {
                ClaimState::Completed => ClaimStateName::Completed,
                ClaimState::Waiting => ClaimStateName::Waiting,
                _ => ClaimStateName::InFlight,
            }),
            _ => None,
        };
        Self {
            target: target.to_string(),
            outcome: d.outcome(),
            worker: worker.map(WorkerId::get),
            new: assignment.map(|a| a.new),
            token: assignment.map(|a| a.token.get()),
            state,
            limit: limit.map(|l| l as u64),
            reason: reason(target, d, event),
            position: position.map(|p| p as u64),
        }
    }
}

/// The draining worker a refusal or a wait names.
fn draining_worker(r: &Rejection) -> Option<WorkerId> {
    match r {
        Rejection::TargetDraining { worker } => Some(*worker),
        _ => None,
    }
}

/// The capacity limit a refusal or a wait names.
fn capacity_limit(r: &Rejection) -> Option<usize> {
    match r {
        Rejection::CapacityFull { limit } => Some(*limit),
        _ => None,
    }
}

/// Why a pull request was not simply assigned (or is a duplicate): `None` for those.
fn reason(target: &Target, d: &Dispatch, (event, action): (&str, Option<&str>)) -> Option<String> {
    let event = || {
        format!(
            "{event}{}",
            action.map(|a| format!(".{a}")).unwrap_or_default()
        )
    };
    Some(match d {
        Dispatch::Assigned(_) | Dispatch::Drained { .. } | Dispatch::Duplicate(_) => return None,
        Dispatch::Overflowed { assignment, .. } => format!(
            "its worker {}'s mailbox is full: queued behind it, in order",
            assignment.worker
        ),
        Dispatch::Waiting(w) => match w.reason {
            Rejection::CapacityFull { limit } => {
                format!("{limit} live workers is the limit: waiting for room")
            }
            Rejection::TargetDraining { worker } => {
                format!("its worker {worker} is draining: waiting for its successor")
            }
            r => format!("{r}: waiting for room"),
        },
        Dispatch::Rejected(Rejection::CapacityFull { limit }) => {
            format!("{limit} live workers is the limit")
        }
        Dispatch::Rejected(Rejection::TargetDraining { worker }) => {
            format!("its worker {worker} is draining")
        }
        Dispatch::Rejected(r @ Rejection::PayloadBudget { .. }) => format!(
            "{r}: the registry holds as many payloads as it may; send it again once work completes"
        ),
        Dispatch::Rejected(r) => r.to_string(),
        Dispatch::RoomFull(r) => format!("{r}, and the waiting room is full"),
        Dispatch::Backlog { .. } => {
            "the worker's queue (its mailbox and overflow) is full".to_owned()
        }
        Dispatch::Closing => "the router is shutting down".to_owned(),
        Dispatch::Unavailable(e) => e.to_string(),
        Dispatch::Unreachable { reason, .. } => reason.clone(),
        Dispatch::AlreadyDraining { worker } => format!("its worker {worker} is already draining"),
        Dispatch::NoWorker(decision) => format!(
            "no live worker serves {target}, and {} events ({decision}) start none",
            event()
        ),
        Dispatch::Ignored => format!("the routing policy ignores {} events", event()),
    })
}

/// The answer to `POST /webhook` (every status but 400, 401, 404, 413 and 415).
///
/// `outcome` sums up the delivery: a refusal of any of its pull requests (503: send it again; the
/// pull requests already placed are then duplicates), else `assigned`, `drained`, `duplicate` or
/// `ignored`. For a delivery with exactly one pull request, that pull request's fields are repeated
/// at the top level.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeliveryAnswer {
    /// The delivery as a whole.
    pub outcome: Outcome,
    /// The routing policy's decision for this event and action (absent when the payload names no
    /// pull request).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// `X-GitHub-Event` (absent if the delivery was refused before it was read).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "pull_request")]
    pub event: Option<String>,
    /// The payload's `action`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "opened")]
    pub action: Option<String>,
    /// As in [`TargetAnswer`], for a delivery with one pull request.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 17592186044415_u64)]
    pub worker: Option<u64>,
    /// As in [`TargetAnswer`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<bool>,
    /// As in [`TargetAnswer`].
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub token: Option<u64>,
    /// As in [`TargetAnswer`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<ClaimStateName>,
    /// As in [`TargetAnswer`].
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub limit: Option<u64>,
    /// Why the delivery (or its one pull request) was ignored or refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Waiting (one pull request): its position when it was parked.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub position: Option<u64>,
    /// Every pull request the delivery concerns, in payload order.
    pub targets: Vec<TargetAnswer>,
}

/// An error: what was refused and why (400, 401, 404, 405, 413, 415).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = RouterError)]
pub struct ErrorAnswer {
    /// What was wrong.
    #[schema(example = "missing X-GitHub-Event header")]
    pub error: String,
}

/// The answer to `POST /debug/workers/{id}/crash`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CrashAnswer {
    /// The worker.
    #[schema(minimum = 0, maximum = 17592186044415_u64)]
    pub worker: u64,
    /// Always true: its container stopped heartbeating.
    pub crashed: bool,
}
