//! What worker calls share: their refusals (`unknown`, `refused_dead`), a status answer, and the
//! `drain` function over a batch of ids (behind `drain_within` and `drain_all_within`).

use std::time::Duration;

use ::redis::Value;

use super::codec::{self, bad_outcome, Fields};
use super::scripts::SCRIPTS;
use super::RedisRegistry;
use crate::api::error::RegistryError;
use crate::api::ids::WorkerId;
use crate::api::status::{DeadReason, Status};
use crate::clock::millis;
use crate::remote::vocab::{self, ReplyError};

impl RedisRegistry {
    /// Decodes the refusals every worker call shares: `unknown` and `refused_dead` (reason).
    pub(super) fn worker_refusal(
        decision: &str,
        word: &str,
        id: WorkerId,
        f: &Fields<'_>,
    ) -> RegistryError {
        match word {
            vocab::UNKNOWN => RegistryError::UnknownWorker { id },
            vocab::REFUSED_DEAD => match f
                .text("reason")
                .and_then(|r| vocab::dead_reason(&r).map_err(codec::schema))
            {
                Ok(reason) => RegistryError::WorkerDead { id, reason },
                Err(e) => e,
            },
            other => bad_outcome(decision, other),
        }
    }

    /// A worker call's status outcome (`active`, `draining`), or its refusal.
    pub(super) fn worker_status(
        decision: &str,
        v: &Value,
        id: WorkerId,
    ) -> Result<Status, RegistryError> {
        let (word, f) = codec::outcome(v)?;
        match &*word {
            vocab::ACTIVE => Ok(Status::Active),
            vocab::DRAINING => Ok(Status::Draining),
            other => Err(Self::worker_refusal(decision, other, id, &f)),
        }
    }

    /// Runs the drain script on `ids`, one answer per id in order.
    pub(super) async fn drain_ids(
        &self,
        ids: &[WorkerId],
        deadline: Duration,
    ) -> Result<Vec<Result<Status, RegistryError>>, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.drain);
        inv.arg(millis(deadline));
        for id in ids {
            inv.arg(id.get());
        }
        let v = self.invoke_emitting(&inv).await?;
        let f = Fields::of(&v)?;
        let mut outcomes = f.array("outcomes")?;
        let mut reasons = f.array("reasons")?;
        if outcomes.remaining() != ids.len() {
            return Err(codec::schema(ReplyError::invalid(
                "outcomes",
                format!("{} answers for {} workers", outcomes.remaining(), ids.len()),
            )));
        }
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let word = outcomes.text()?;
            let reason = reasons.text()?;
            out.push(match &*word {
                vocab::DRAINING => Ok(Status::Draining),
                vocab::EXITED => {
                    self.inner.counters.death(DeadReason::Exited);
                    Ok(Status::Dead(DeadReason::Exited))
                }
                vocab::UNKNOWN => Err(RegistryError::UnknownWorker { id }),
                vocab::REFUSED_DEAD => Err(RegistryError::WorkerDead {
                    id,
                    reason: vocab::dead_reason(&reason).map_err(codec::schema)?,
                }),
                other => return Err(bad_outcome("drain", other)),
            });
        }
        self.observe_live(&f)?;
        Ok(out)
    }
}
