//! The words both networked backends answer a decision with (the Redis functions' `outcome`
//! field, PostgreSQL's `o_outcome` column), their reason fields, and their decoding into the
//! contract's types. One spelling: a Lua reply and a PL/pgSQL row say `duplicate`, `capacity`,
//! `draining`, `refused_dead` with a separate reason, and so on.
//!
//! A word outside the vocabulary, or a field a reply must have and lacks, is a [`ReplyError`]
//! naming the field and what was observed.

use std::fmt;

use crate::api::outcome::ClaimState;
use crate::api::report::ReleaseReason;
use crate::api::status::DeadReason;

/// An admission or assignment placed the target on a worker.
pub(crate) const ASSIGNED: &str = "assigned";
/// The pair is claimed already (in flight or retained as completed).
pub(crate) const DUPLICATE: &str = "duplicate";
/// Refused: the capacity limit is reached.
pub(crate) const CAPACITY: &str = "capacity";
/// Refused: the target's worker drains (also a worker's status word).
pub(crate) const DRAINING: &str = "draining";
/// A bare claim was recorded.
pub(crate) const CLAIMED: &str = "claimed";
/// A claim was completed by this call.
pub(crate) const COMPLETED: &str = "completed";
/// A claim was completed already (a repeated completion).
pub(crate) const ALREADY: &str = "already";
/// The claim (or worker) is not known.
pub(crate) const UNKNOWN: &str = "unknown";
/// A fenced completion by a worker that does not hold the claim.
pub(crate) const NOT_HOLDER: &str = "not_holder";
/// The claim was released (the reason in `reason`, a dead reason in `dead_reason`).
pub(crate) const RELEASED: &str = "released";
/// Refused: the worker is dead (its dead reason in `reason`).
pub(crate) const REFUSED_DEAD: &str = "refused_dead";
/// Refused: no worker id is left.
pub(crate) const EXHAUSTED: &str = "exhausted";
/// A worker was registered (its id in `worker`).
pub(crate) const REGISTERED: &str = "registered";
/// Done, nothing more to say.
pub(crate) const OK: &str = "ok";
/// A worker's status: active.
pub(crate) const ACTIVE: &str = "active";
/// A worker's status: dead (the reason in `reason`).
pub(crate) const DEAD: &str = "dead";
/// A draining or idle worker exited because of this call.
pub(crate) const EXITED: &str = "exited";
/// A claim's state: in flight.
pub(crate) const IN_FLIGHT: &str = "in_flight";
/// A claim's state: parked in the waiting room (also an admission's outcome: parked).
pub(crate) const WAITING: &str = "waiting";

/// A reply that does not fit the schema: a missing field, or a value outside its vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum ReplyError {
    /// The reply has no field `field`.
    Missing {
        /// The field.
        field: &'static str,
    },
    /// The field holds what its schema does not allow.
    Invalid {
        /// The field.
        field: &'static str,
        /// What it held.
        observed: String,
    },
}

impl ReplyError {
    /// `field` held `observed`.
    pub(crate) fn invalid(field: &'static str, observed: impl fmt::Debug) -> Self {
        Self::Invalid {
            field,
            observed: format!("{observed:?}"),
        }
    }
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { field } => write!(f, "reply has no field {field:?}"),
            Self::Invalid { field, observed } => {
                write!(f, "reply field {field:?} holds {observed}")
            }
        }
    }
}

impl std::error::Error for ReplyError {}

/// A dead reason from its word (`reason` field).
pub(crate) fn dead_reason(word: &str) -> Result<DeadReason, ReplyError> {
    DeadReason::parse(word).ok_or_else(|| ReplyError::invalid("reason", word))
}

/// A claim's state from its word (`state` field).
pub(crate) fn claim_state(word: &str) -> Result<ClaimState, ReplyError> {
    match word {
        IN_FLIGHT => Ok(ClaimState::InFlight),
        COMPLETED => Ok(ClaimState::Completed),
        WAITING => Ok(ClaimState::Waiting),
        other => Err(ReplyError::invalid("state", other)),
    }
}

/// A release reason from its word (`reason`: `worker_died`, `stuck`, `unbound`) and, for a death,
/// the dead reason's word (`dead_reason`).
pub(crate) fn release_reason(word: &str, dead: Option<&str>) -> Result<ReleaseReason, ReplyError> {
    match word {
        "worker_died" => {
            let dead = dead.ok_or(ReplyError::Missing {
                field: "dead_reason",
            })?;
            DeadReason::parse(dead)
                .map(ReleaseReason::WorkerDied)
                .ok_or_else(|| ReplyError::invalid("dead_reason", dead))
        }
        "stuck" => Ok(ReleaseReason::Stuck),
        "unbound" => Ok(ReleaseReason::Unbound),
        other => Err(ReplyError::invalid("reason", other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_decode_and_anything_else_names_its_field() {
        assert_eq!(dead_reason("exited"), Ok(DeadReason::Exited));
        assert_eq!(claim_state("in_flight"), Ok(ClaimState::InFlight));
        assert_eq!(
            release_reason("worker_died", Some("drain_timed_out")),
            Ok(ReleaseReason::WorkerDied(DeadReason::DrainTimedOut))
        );
        assert_eq!(release_reason("stuck", None), Ok(ReleaseReason::Stuck));
        let e = release_reason("worker_died", Some("bored")).unwrap_err();
        assert_eq!(e.to_string(), "reply field \"dead_reason\" holds \"bored\"");
        assert_eq!(
            release_reason("worker_died", None),
            Err(ReplyError::Missing {
                field: "dead_reason"
            })
        );
        assert!(dead_reason("3").unwrap_err().to_string().contains("reason"));
    }
}
