//! The contract traits for [`RedisRegistry`]: each method runs its script (one round trip, one
//! atomic step on the server) and decodes the reply. Semantics are the contract's; what is
//! particular here is documented on the module.

use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;

use super::codec::{self, bad, bad_outcome, Fields, Reply};
use super::counters::C;
use super::error;
use super::payloads;
use super::scripts::{Call, Function, SCRIPTS};
use super::RedisRegistry;
use crate::api::contract::{Maintenance, Subscribe, WorkerRegistry};
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, FencingToken, Target, WorkerId};
use crate::api::outcome::{
    Admission, AlreadyClaimed, AssignOutcome, Assignment, ClaimOutcome, DrainAll, HeartbeatAck,
    Rejection,
};
use crate::api::payload::Payload;
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::snapshot::{StatusSnapshot, WorkerInfo};
use crate::api::stats::Stats;
use crate::api::status::{DeadReason, Status};
use crate::clock::millis;
use crate::config::RegistryConfig;
use crate::remote::vocab::{self, ReplyError};

/// Receipts one `acknowledge` script call takes (three commands each).
const ACK_CHUNK: usize = 64;

/// The `COUNT` hint of one `ZSCAN` step of `drain_all_within`'s walk of `{n}:live`, and so
/// about the number of workers one `drain` call takes.
const DRAIN_ALL_SCAN: usize = 128;

/// What a placement script answered (admit after its duplicate check, assign).
enum Placed {
    Assigned(Assignment),
    Rejected(Rejection),
}

impl RedisRegistry {
    /// A call of `function` with the arguments every function takes (the offset key, the
    /// prefix, this replica's id).
    pub(crate) fn prepare(&self, function: &Function) -> Call {
        let mut inv = function.key(&self.inner.keys.clock);
        inv.arg(&self.inner.keys.prefix).arg(&self.inner.replica);
        inv
    }

    pub(crate) async fn invoke(&self, inv: &Call) -> Result<Value, RegistryError> {
        let mut conn = self.inner.conn.clone();
        inv.invoke_async(&mut conn).await.map_err(error::backend)
    }

    /// Invokes a script that may publish events (its reply is `{events, reply, epoch}`) and
    /// returns the reply once this handle's subscribers have had the events, in order, as the
    /// in-memory registry's would (see `events.rs`).
    pub(crate) async fn invoke_emitting(&self, inv: &Call) -> Result<Value, RegistryError> {
        let (v, promoted) = self.invoke_sweeping(inv).await?;
        if promoted {
            self.inner.wake.notify();
        }
        Ok(v)
    }

    /// [`invoke_emitting`](Self::invoke_emitting) for the sweep's own steps (which hand out what
    /// they promote themselves): also whether the call promoted waiting deliveries.
    pub(crate) async fn invoke_sweeping(&self, inv: &Call) -> Result<(Value, bool), RegistryError> {
        let v = self.invoke(inv).await?;
        let mut parts = match v {
            Value::Array(parts) => parts,
            // A call that emitted nothing answers its reply bare; a packed one is a string.
            packed @ Value::BulkString(_) => return Ok((packed, false)),
            other => {
                return Err(bad(format!(
                    "expected {{events, reply, epoch}}, got {other:?}"
                )))
            }
        };
        // A bare name/value array's first element is a name, where {events, reply, epoch} starts
        // with an array (scripts/lib_base.lua `finish`).
        if matches!(
            parts.first(),
            Some(Value::BulkString(_) | Value::SimpleString(_))
        ) {
            return Ok((Value::Array(parts), false));
        }
        if parts.len() != 3 {
            return Err(bad(format!(
                "expected {{events, reply, epoch}}, got {} parts",
                parts.len()
            )));
        }
        let epoch = match parts.pop() {
            Some(Value::BulkString(b)) => {
                Some(String::from_utf8(b).map_err(|e| bad(format!("epoch: {e}")))?)
            }
            _ => None,
        };
        let reply = parts.pop().unwrap_or(Value::Nil);
        let mut events = Reply::of(&parts[0])?;
        let mut own = Vec::with_capacity(events.remaining());
        let mut promoted = false;
        while events.remaining() > 0 {
            let text = events.text()?;
            let event = codec::decode_event(&text)?;
            if let crate::Event::DeliveryPromoted { .. } = event.1 {
                // This replica's promotion (at a death of its call, or in its sweep's waiting
                // step), counted as the admission it is (the event's last field: a new worker).
                promoted = true;
                let c = &self.inner.counters;
                c.inc(C::Promoted);
                c.inc(if text.ends_with("\t1") {
                    C::AdmittedNew
                } else {
                    C::AdmittedSticky
                });
            }
            own.push(event);
        }
        self.inner.events.settle(epoch.as_deref(), own).await;
        Ok((reply, promoted))
    }

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
    fn placed(&self, word: &str, f: &Fields<'_>) -> Result<Option<Placed>, RegistryError> {
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

    /// Decodes a `duplicate` outcome's holder, since, state and unstarted.
    fn duplicate(&self, f: &Fields<'_>) -> Result<AlreadyClaimed, RegistryError> {
        let holder = f.opt_worker("holder")?;
        let since = codec::wall(f.uint("since")?);
        let state = vocab::claim_state(&f.text("state")?).map_err(codec::schema)?;
        let unstarted = f.flag("unstarted")?;
        self.inner.counters.inc(C::Duplicates);
        Ok(AlreadyClaimed::new(holder, since, state).with_unstarted(unstarted))
    }

    /// Decodes the refusals every worker call shares: `unknown` and `refused_dead` (reason).
    fn worker_refusal(decision: &str, word: &str, id: WorkerId, f: &Fields<'_>) -> RegistryError {
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
    fn worker_status(decision: &str, v: &Value, id: WorkerId) -> Result<Status, RegistryError> {
        let (word, f) = codec::outcome(v)?;
        match &*word {
            vocab::ACTIVE => Ok(Status::Active),
            vocab::DRAINING => Ok(Status::Draining),
            other => Err(Self::worker_refusal(decision, other, id, &f)),
        }
    }

    /// Records a live count a decision answered (`live`, `-1`: unchanged) at registry time `now`.
    fn observe_live(&self, f: &Fields<'_>) -> Result<(), RegistryError> {
        let live = f.int("live")?;
        let now = f.uint("now")?;
        if let Ok(live) = u64::try_from(live) {
            self.inner.counters.observe_live(now, live);
        }
        Ok(())
    }

    async fn complete_inner(
        &self,
        by: Option<WorkerId>,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<(), RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.complete);
        inv.text(target)
            .arg(delivery.as_str())
            .arg(by.map(|w| w.to_string()).unwrap_or_default())
            .arg(l.timeout_ms)
            .arg(l.retention_ms)
            .arg(l.max_retained)
            .arg(l.claim_key_ttl_ms);
        let v = self.invoke(&inv).await?;
        let (word, f) = codec::outcome(&v)?;
        match &*word {
            vocab::COMPLETED => {
                let evicted = f.uint("evicted")?;
                let retained = f.uint("retained")?;
                let now = f.uint("now")?;
                let c = &self.inner.counters;
                c.inc(C::ClaimsCompleted);
                c.add(C::ClaimsEvicted, evicted);
                c.observe_retained(now, retained);
                Ok(())
            }
            vocab::ALREADY => Ok(()),
            vocab::UNKNOWN => Err(RegistryError::UnknownClaim {
                target: target.clone(),
                delivery: delivery.clone(),
            }),
            vocab::NOT_HOLDER => Err(RegistryError::NotHolder {
                target: target.clone(),
                delivery: delivery.clone(),
                holder: f.opt_worker("holder")?,
                worker: by.ok_or_else(|| bad_outcome("complete", &word))?,
            }),
            vocab::RELEASED => {
                let dead = f.text("dead_reason")?;
                let dead = Some(&*dead).filter(|d| !d.is_empty());
                Err(RegistryError::ClaimReleased {
                    target: target.clone(),
                    delivery: delivery.clone(),
                    holder: f.opt_worker("holder")?,
                    reason: vocab::release_reason(&f.text("reason")?, dead)
                        .map_err(codec::schema)?,
                })
            }
            other => Err(bad_outcome("complete", other)),
        }
    }

    /// Runs the drain script on `ids`, one answer per id in order.
    async fn drain_ids(
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

/// A payload on its way into an admission's call: its size, the budget, and its encoding.
pub(crate) struct Carried {
    size: u64,
    budget: u64,
    encoded: Vec<u8>,
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
    async fn admit_carrying(
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
        let placed = self
            .placed(word, f)?
            .ok_or_else(|| bad_outcome("admit", word))?;
        if let Placed::Assigned(a) = &placed {
            if a.new {
                self.wait_created(a.worker).await;
            }
        }
        Ok(match placed {
            Placed::Assigned(a) => Admission::Assigned(a),
            Placed::Rejected(rej) => Admission::Rejected(rej),
        })
    }
}

impl WorkerRegistry for RedisRegistry {
    /// The size is checked here, before any round trip; the payload then travels in the
    /// admission's own call, which checks the budget and stores it with the claim (or the parked
    /// delivery). See `docs::redis`, "Payloads".
    async fn admit_with(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
    ) -> Result<Admission, RegistryError> {
        let Some(p) = payload else {
            return self.admit_carrying(target, delivery, None).await;
        };
        let limit = self.inner.config.max_payload_bytes();
        if p.size() > limit {
            self.inner.counters.inc(C::PayloadsTooLarge);
            return Err(RegistryError::PayloadTooLarge {
                size: p.size(),
                limit,
            });
        }
        let carried = Carried {
            size: p.size(),
            budget: self.inner.config.payload_budget(),
            encoded: payloads::encode(p),
        };
        self.admit_carrying(target, delivery, Some(&carried)).await
    }
    async fn payload(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<Option<Payload>, RegistryError> {
        self.lookup(target, delivery).await
    }

    async fn claim(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<ClaimOutcome, RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.claim);
        inv.text(target)
            .arg(delivery.as_str())
            .arg(l.timeout_ms)
            .arg(l.retention_ms);
        let v = self.invoke(&inv).await?;
        let (word, f) = codec::outcome(&v)?;
        match &*word {
            vocab::CLAIMED => Ok(ClaimOutcome::Claimed),
            vocab::DUPLICATE => Ok(ClaimOutcome::AlreadyClaimed(self.duplicate(&f)?)),
            other => Err(bad_outcome("claim", other)),
        }
    }

    async fn release(&self, target: &Target, delivery: &DeliveryId) -> Result<(), RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.release);
        inv.text(target)
            .arg(delivery.as_str())
            .arg(l.timeout_ms)
            .arg(l.retention_ms);
        let v = self.invoke(&inv).await?;
        let (word, _) = codec::outcome(&v)?;
        match &*word {
            vocab::OK => Ok(()),
            vocab::UNKNOWN => Err(RegistryError::UnknownClaim {
                target: target.clone(),
                delivery: delivery.clone(),
            }),
            vocab::COMPLETED => Err(RegistryError::ClaimCompleted {
                target: target.clone(),
                delivery: delivery.clone(),
            }),
            other => Err(bad_outcome("release", other)),
        }
    }

    async fn complete_as(
        &self,
        holder: Option<WorkerId>,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<(), RegistryError> {
        self.complete_inner(holder, target, delivery).await
    }

    async fn assign(&self, target: &Target) -> Result<AssignOutcome, RegistryError> {
        let l = &self.inner.limits;
        let mut inv = match &l.room {
            None => self.prepare(&SCRIPTS.assign),
            Some(_) => self.prepare(&SCRIPTS.assign_waiting),
        };
        inv.text(target)
            .arg(l.max_workers)
            .arg(l.timeout_ms)
            .arg(l.startup_grace_ms);
        if let Some(room) = &l.room {
            inv.arg(room.max_workers_per_owner).arg(room.max_waiting);
        }
        let v = self.invoke_emitting(&inv).await?;
        let (word, f) = codec::outcome(&v)?;
        let placed = self
            .placed(&word, &f)?
            .ok_or_else(|| bad_outcome("assign", &word))?;
        if let Placed::Assigned(a) = &placed {
            if a.new {
                self.wait_created(a.worker).await;
            }
        }
        Ok(match placed {
            Placed::Assigned(a) => AssignOutcome::Assigned(a),
            Placed::Rejected(rej) => AssignOutcome::Rejected(rej),
        })
    }

    async fn heartbeat(&self, worker: WorkerId) -> Result<HeartbeatAck, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.heartbeat);
        inv.arg(worker.get()).arg(self.inner.limits.timeout_ms);
        let v = self.invoke(&inv).await?;
        let c = &self.inner.counters;
        match Self::worker_status("heartbeat", &v, worker) {
            Ok(status) => {
                c.inc(C::Heartbeats);
                Ok(if status == Status::Draining {
                    HeartbeatAck::Draining
                } else {
                    HeartbeatAck::Active
                })
            }
            Err(e) => {
                c.inc(C::HeartbeatsRefused);
                Err(e)
            }
        }
    }

    async fn loop_started(&self, worker: WorkerId) -> Result<Status, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.loop_started);
        inv.arg(worker.get());
        let v = self.invoke(&inv).await?;
        Self::worker_status("loop_started", &v, worker)
    }

    async fn loop_finished(&self, worker: WorkerId) -> Result<Status, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.loop_finished);
        inv.arg(worker.get());
        let v = self.invoke_emitting(&inv).await?;
        let (word, f) = codec::outcome(&v)?;
        let status = match &*word {
            vocab::ACTIVE => Status::Active,
            vocab::EXITED => {
                self.inner.counters.death(DeadReason::Exited);
                Status::Dead(DeadReason::Exited)
            }
            other => return Err(Self::worker_refusal("loop_finished", other, worker, &f)),
        };
        self.observe_live(&f)?;
        Ok(status)
    }

    async fn register(&self) -> Result<WorkerId, RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.register);
        inv.arg(l.max_workers)
            .arg(l.timeout_ms)
            .arg(l.startup_grace_ms);
        let v = self.invoke_emitting(&inv).await?;
        let (word, f) = codec::outcome(&v)?;
        match &*word {
            vocab::REGISTERED => {
                let id = f.worker("worker")?;
                self.observe_live(&f)?;
                self.wait_created(id).await;
                Ok(id)
            }
            vocab::CAPACITY => Err(RegistryError::Rejected(Rejection::CapacityFull {
                limit: self.inner.config.max_workers(),
            })),
            vocab::EXHAUSTED => Err(RegistryError::IdsExhausted),
            other => Err(bad_outcome("register", other)),
        }
    }

    async fn deregister(&self, worker: WorkerId) -> Result<DeadReason, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.deregister);
        inv.arg(worker.get());
        let v = self.invoke_emitting(&inv).await?;
        let (word, f) = codec::outcome(&v)?;
        if word != vocab::DEAD {
            return Err(Self::worker_refusal("deregister", &word, worker, &f));
        }
        let reason = vocab::dead_reason(&f.text("reason")?).map_err(codec::schema)?;
        self.inner.counters.death(reason);
        self.observe_live(&f)?;
        Ok(reason)
    }

    async fn drain_within(
        &self,
        worker: WorkerId,
        deadline: Duration,
    ) -> Result<Status, RegistryError> {
        self.drain_ids(&[worker], deadline)
            .await?
            .pop()
            .unwrap_or_else(|| Err(bad("drain answered nothing")))
    }

    /// Walks `{n}:live` with `ZSCAN` (about 128 ids a step) and drains each
    /// batch with one `drain` call, so no call's work grows with the registry. Not one atomic
    /// step: a worker admitted or registered during the walk may be missed (as the in-memory
    /// backend misses one created after its shard visit), and one that died meanwhile is not
    /// counted.
    async fn drain_all_within(&self, deadline: Duration) -> Result<DrainAll, RegistryError> {
        let mut out = DrainAll::default();
        // ZSCAN may return an id twice (the set was resized between steps): drain it once.
        let mut seen = std::collections::HashSet::new();
        let mut cursor: u64 = 0;
        loop {
            let mut conn = self.inner.conn.clone();
            let (next, page): (u64, Vec<String>) = ::redis::cmd("ZSCAN")
                .arg(&self.inner.keys.live)
                .arg(cursor)
                .arg("COUNT")
                .arg(DRAIN_ALL_SCAN)
                .query_async(&mut conn)
                .await
                .map_err(error::backend)?;
            // The page alternates member, score.
            let mut ids = Vec::with_capacity(page.len() / 2);
            for member in page.iter().step_by(2) {
                let id = member
                    .parse::<u64>()
                    .map_err(|e| bad(format!("live member {member:?}: {e}")))?;
                if seen.insert(id) {
                    ids.push(WorkerId::new(id));
                }
            }
            if !ids.is_empty() {
                for r in self.drain_ids(&ids, deadline).await? {
                    match r {
                        Ok(Status::Draining) => out.draining += 1,
                        Ok(Status::Dead(_)) => out.exited += 1,
                        // Died or purged since the scan saw it.
                        _ => {}
                    }
                }
            }
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }

    async fn worker(&self, worker: WorkerId) -> Result<Option<WorkerInfo>, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.worker);
        inv.arg(worker.get());
        let v = self.invoke(&inv).await?;
        let f = Fields::of(&v)?;
        let now = f.uint("now")?;
        if !f.has("line") {
            return Ok(None);
        }
        codec::decode_worker(&f.text("line")?, now).map(Some)
    }

    /// One read-only function call (`scripts/audit.lua`): five O(1) counts of the registry's
    /// keys, in one atomic step.
    async fn audit(&self) -> Result<crate::Audit, RegistryError> {
        let inv = self.prepare(&SCRIPTS.audit);
        let v = self.invoke(&inv).await?;
        let f = Fields::of(&v)?;
        Ok(crate::Audit {
            live_workers: f.uint("live")?,
            in_flight: f.uint("in_flight")?,
            released: f.uint("released")?,
            waiting: f.uint("waiting")?,
        })
    }

    /// This handle's cached snapshot. **Locking behaviour:** no lock and no I/O: one `ArcSwap`
    /// load.
    fn status(&self) -> Arc<StatusSnapshot> {
        self.inner.snapshot.load()
    }

    /// This handle's counters; its gauges are the freshest values this handle observed.
    /// **Locking behaviour:** no I/O; two short mutexes around the gauges and the sweep
    /// histogram.
    fn stats(&self) -> Stats {
        let mut s = self
            .inner
            .counters
            .read(self.inner.events.sender.missed(), self.inner.snapshot.age());
        s.data_losses = self.inner.loss.losses();
        s
    }

    fn config(&self) -> &RegistryConfig {
        &self.inner.config
    }
}

impl Maintenance for RedisRegistry {
    async fn sweep(&self) -> Result<SweepReport, RegistryError> {
        // Before the sweep refreshes the snapshot: the workers it lists are what a loss lost.
        self.check_loss().await?;
        self.sweep_steps().await
    }

    async fn acknowledge(&self, released: &[ReleasedEvent]) -> Result<(), RegistryError> {
        // A bounded number per script call: a sweep hands out up to HANDOUT_BATCH at once.
        let receipts: Vec<&str> = released
            .iter()
            .filter_map(|e| e.receipt().map(|r| r.as_str()))
            .collect();
        for chunk in receipts.chunks(ACK_CHUNK) {
            let mut inv = self.prepare(&SCRIPTS.acknowledge);
            for receipt in chunk {
                inv.arg(*receipt);
            }
            self.invoke(&inv).await?;
        }
        Ok(())
    }

    /// Resolves when a call of this handle promoted waiting deliveries at a death (handed over
    /// by the next sweep); see `docs::redis`, "The waiting room".
    fn wake(&self) -> impl std::future::Future<Output = ()> + Send {
        self.inner.wake.wait()
    }
}

impl Subscribe for RedisRegistry {
    fn subscribe(&self) -> crate::Subscription {
        self.inner.events.sender.subscribe()
    }
}
