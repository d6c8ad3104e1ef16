//! What an admission or an assignment answers, decoded and counted: a placement (assigned, or
//! refused for capacity or a draining worker), a parked delivery's place, a duplicate's claim, a
//! refusal for the payload budget.

use tokio_postgres::Row;

use super::error::{decode, Failure};
use super::rows::{self, col};
use super::PostgresRegistry;
use crate::api::outcome::{Admission, AlreadyClaimed, Assignment, ClaimState, Rejection, Waiting};
use crate::api::payload::Payload;
use crate::remote::vocab;

/// `wr_admit`'s refusal when the payload would take the bytes held past the budget.
const PAYLOAD_BUDGET: &str = "payload_budget";
/// `wr_place`'s refusal when the target's owner holds `max_workers_per_owner` live workers.
const OWNER_FULL: &str = "owner_full";
/// The claim state of a parked pair.
const WAITING: &str = "waiting";

impl PostgresRegistry {
    /// A `duplicate` answer's holder, since, state and unstarted.
    pub(super) fn duplicate(row: &Row) -> Result<AlreadyClaimed, Failure> {
        let holder = col::<Option<i64>>(row, "o_worker")?
            .map(rows::worker_id)
            .transpose()?;
        let since: i64 = col(row, "o_since")?;
        let state = match col::<String>(row, "o_state")?.as_str() {
            vocab::IN_FLIGHT => ClaimState::InFlight,
            vocab::COMPLETED => ClaimState::Completed,
            WAITING => ClaimState::Waiting,
            other => return Err(decode(format!("claim state {other:?}"))),
        };
        let unstarted = col::<Option<bool>>(row, "o_unstarted")?.unwrap_or(false);
        Ok(AlreadyClaimed::new(holder, rows::wall(since), state).with_unstarted(unstarted))
    }

    /// The placement the row's `o_outcome` names.
    pub(super) fn placement(&self, row: &Row) -> Result<Result<Assignment, Rejection>, Failure> {
        let outcome: String = col(row, "o_outcome")?;
        self.placed(row, &outcome)
    }

    /// The placement `outcome` names (the row's worker, token and novelty if assigned).
    fn placed(&self, row: &Row, outcome: &str) -> Result<Result<Assignment, Rejection>, Failure> {
        match outcome {
            // As on every backend: the owner at its cap is a full registry, named by its limit.
            OWNER_FULL => Ok(Err(Rejection::CapacityFull {
                limit: self.config_ref().max_workers(),
            })),
            vocab::ASSIGNED => {
                let worker = rows::worker_id(col(row, "o_worker")?)?;
                let token = rows::token(worker, col(row, "o_seq")?)?;
                Ok(Ok(Assignment::new(worker, token, col(row, "o_new")?)))
            }
            vocab::CAPACITY => Ok(Err(Rejection::CapacityFull {
                limit: self.config_ref().max_workers(),
            })),
            vocab::DRAINING => Ok(Err(Rejection::TargetDraining {
                worker: rows::worker_id(col(row, "o_worker")?)?,
            })),
            other => Err(decode(format!("placement outcome {other:?}"))),
        }
    }

    /// `wr_admit`'s answer (`payload`: what was given, for a budget refusal's figures).
    pub(super) fn admission(
        &self,
        row: &Row,
        payload: Option<&Payload>,
    ) -> Result<Admission, Failure> {
        let outcome = col::<String>(row, "o_outcome")?;
        if outcome == vocab::DUPLICATE {
            return Ok(Admission::Duplicate(Self::duplicate(row)?));
        }
        if outcome == WAITING {
            let reason: String = col(row, "o_reason")?;
            let Err(reason) = self.placed(row, &reason)? else {
                return Err(decode(format!("parked with reason {reason:?}")));
            };
            let position: i64 = col(row, "o_position")?;
            return Ok(Admission::Waiting(Waiting::new(
                usize::try_from(position).unwrap_or(0),
                reason,
            )));
        }
        if outcome == PAYLOAD_BUDGET {
            let held: Option<i64> = col(row, "o_held")?;
            return Ok(Admission::Rejected(Rejection::PayloadBudget {
                held: held.and_then(|h| u64::try_from(h).ok()).unwrap_or(0),
                needed: payload
                    .map(Payload::size)
                    .ok_or_else(|| decode("a budget refusal of an admission without a payload"))?,
                limit: self.config_ref().payload_budget(),
            }));
        }
        Ok(match self.placement(row)? {
            Ok(a) => Admission::Assigned(a),
            Err(r) => Admission::Rejected(r),
        })
    }

    /// Counts a placement in this handle's admission counters.
    pub(super) fn count_placement(&self, r: &Result<Assignment, Rejection>) {
        let c = &self.inner.counters;
        match r {
            Ok(a) if a.new => c.admitted_new.inc(),
            Ok(_) => c.admitted_sticky.inc(),
            Err(Rejection::CapacityFull { .. }) => c.rejected_capacity.inc(),
            Err(Rejection::TargetDraining { .. }) => c.rejected_draining.inc(),
            Err(Rejection::PayloadBudget { .. }) => c.rejected_payload_budget.inc(),
        }
    }
}
