//! The JSON bodies `POST /webhook` and the debug endpoint answer with, and their OpenAPI schemas
//! (derived from the same types, so they cannot drift).

use serde::Serialize;
use utoipa::ToSchema;

use crate::policy::Decision;

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
    /// The name in answers and metric labels.
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
}

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
