//! What an admission or an assignment answers, decoded and counted: a placement (assigned, or
//! refused for capacity or a draining worker), a duplicate's claim, the payload an admission
//! carries into its call, and the live count a decision reports.

use super::codec::{self, bad_outcome, Fields};
use super::counters::C;
use super::payloads;
use super::scripts::{Call, SCRIPTS};
use super::RedisRegistry;
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, FencingToken, Target};
use crate::api::outcome::{Admission, AlreadyClaimed, Assignment, Rejection};
use crate::api::payload::Payload;
use crate::remote::vocab::{self, ReplyError};

/// What a placement script answered (admit after its duplicate check, assign).
pub(super) enum Placed {
    Assigned(Assignment),
    Rejected(Rejection),
}

impl RedisRegistry {
    fn count_placed(&self, p: &Placed) {
        let c = &self.inner.counters;
        c.inc(match p {
            Placed::Assigned(a) if a.new => C::AdmittedNew,
            Placed::Assigned(_) => C::AdmittedSticky,
            Placed::Rejected(Rejection::CapacityFull { .. }) => C::RejectedCapacity,
            Placed::Rejected(_) => C::RejectedDraining,
        });
    }

    /// Decodes a placement's outcome: `assigned` (worker, seq, new, live, now), `capacity` or
    /// `draining` (worker); any other word is `None`.
    pub(super) fn placed(
        &self,
        word: &str,
        f: &Fields<'_>,
    ) -> Result<Option<Placed>, RegistryError> {
        let p = match word {
            vocab::ASSIGNED => {
                let worker = f.worker("worker")?;
                let seq = f.uint("seq")?;
                let new = f.flag("new")?;
                self.observe_live(f)?;
                let token = FencingToken::new(worker, seq)
                    .map_err(|_| codec::schema(ReplyError::invalid("seq", seq)))?;
                Placed::Assigned(Assignment::new(worker, token, new))
            }
            vocab::CAPACITY => Placed::Rejected(Rejection::CapacityFull {
                limit: self.inner.config.max_workers(),
            }),
            vocab::DRAINING => Placed::Rejected(Rejection::TargetDraining {
                worker: f.worker("worker")?,
            }),
            _ => return Ok(None),
        };
        self.count_placed(&p);
        Ok(Some(p))
    }

    /// [`placed`](Self::placed), where any other word is a bad outcome of `decision`, once a new
    /// worker's creation has replicated (see `wait_created`).
    pub(super) async fn placed_settled(
        &self,
        decision: &str,
        word: &str,
        f: &Fields<'_>,
    ) -> Result<Placed, RegistryError> {
        let placed = self
            .placed(word, f)?
            .ok_or_else(|| bad_outcome(decision, word))?;
        if let Placed::Assigned(a) = &placed {
            if a.new {
                self.wait_created(a.worker).await;
            }
        }
        Ok(placed)
    }

    /// Decodes a `duplicate` outcome's holder, since, state and unstarted.
    pub(super) fn duplicate(&self, f: &Fields<'_>) -> Result<AlreadyClaimed, RegistryError> {
        let holder = f.opt_worker("holder")?;
        let since = codec::wall(f.uint("since")?);
        let state = vocab::claim_state(&f.text("state")?).map_err(codec::schema)?;
        let unstarted = f.flag("unstarted")?;
        self.inner.counters.inc(C::Duplicates);
        Ok(AlreadyClaimed::new(holder, since, state).with_unstarted(unstarted))
    }

    /// Records a live count a decision answered (`live`, `-1`: unchanged) at registry time `now`.
    pub(super) fn observe_live(&self, f: &Fields<'_>) -> Result<(), RegistryError> {
        let live = f.int("live")?;
        let now = f.uint("now")?;
        if let Ok(live) = u64::try_from(live) {
            self.inner.counters.observe_live(now, live);
        }
        Ok(())
    }
}

/// A payload on its way into an admission's call: its size, the budget, and its encoding.
pub(crate) struct Carried {
    size: u64,
    budget: u64,
    encoded: Vec<u8>,
}

impl RedisRegistry {
    /// A payload, checked against the size limit before any round trip, ready to travel in the
    /// admission's own call (which checks the budget and stores it with the claim or the parked
    /// delivery).
    pub(super) fn carry(&self, p: &Payload) -> Result<Carried, RegistryError> {
        let limit = self.inner.config.max_payload_bytes();
        if p.size() > limit {
            self.inner.counters.inc(C::PayloadsTooLarge);
            return Err(RegistryError::PayloadTooLarge {
                size: p.size(),
                limit,
            });
        }
        Ok(Carried {
            size: p.size(),
            budget: self.inner.config.payload_budget(),
            encoded: payloads::encode(p),
        })
    }
}

impl Carried {
    /// Appends the admission script's payload arguments (size, budget, encoded payload).
    pub(crate) fn args(&self, inv: &mut Call) {
        inv.arg(self.size).arg(self.budget).arg(&self.encoded[..]);
    }
}

impl RedisRegistry {
    /// `admit` or `admit_with`: one call of `admit` (`admit_waiting` with the room on), with the
    /// payload's arguments if one is carried.
    pub(super) async fn admit_carrying(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        carried: Option<&Carried>,
    ) -> Result<Admission, RegistryError> {
        let l = &self.inner.limits;
        if let Some(room) = &l.room {
            return self.admit_waiting(room, target, delivery, carried).await;
        }
        let mut inv = self.prepare(&SCRIPTS.admit);
        inv.text(target)
            .arg(delivery.as_str())
            .arg(l.max_workers)
            .arg(l.timeout_ms)
            .arg(l.startup_grace_ms)
            .arg(l.retention_ms);
        if let Some(c) = carried {
            c.args(&mut inv);
        }
        let v = self.invoke_emitting(&inv).await?;
        let (word, f) = codec::outcome(&v)?;
        self.decode_admission(&word, &f).await
    }

    /// Decodes an admission's outcome (`duplicate`, a refusal for the payload budget, or a
    /// placement) and waits for a new worker's replication when asked to.
    pub(super) async fn decode_admission(
        &self,
        word: &str,
        f: &Fields<'_>,
    ) -> Result<Admission, RegistryError> {
        if word == vocab::DUPLICATE {
            return Ok(Admission::Duplicate(self.duplicate(f)?));
        }
        if word == payloads::PAYLOAD_BUDGET {
            self.inner.counters.inc(C::RejectedPayloadBudget);
            return Ok(Admission::Rejected(Rejection::PayloadBudget {
                held: f.uint("held")?,
                needed: f.uint("needed")?,
                limit: f.uint("limit")?,
            }));
        }
        Ok(match self.placed_settled("admit", word, f).await? {
            Placed::Assigned(a) => Admission::Assigned(a),
            Placed::Rejected(rej) => Admission::Rejected(rej),
        })
    }
}
