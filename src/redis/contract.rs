//! The contract traits for [`RedisRegistry`]: each method runs its script (one round trip, one
//! atomic step on the server) and decodes the reply. Semantics are the contract's; what is
//! particular here is documented on the module.

use std::sync::Arc;
use std::time::Duration;

use ::redis::{Script, ScriptInvocation, Value};

use super::codec::{self, bad, Reply};
use super::counters::C;
use super::error;
use super::scripts::SCRIPTS;
use super::RedisRegistry;
use crate::api::contract::{Maintenance, Subscribe, WorkerRegistry};
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, FencingToken, Target, WorkerId};
use crate::api::outcome::{
    Admission, AlreadyClaimed, AssignOutcome, Assignment, ClaimOutcome, ClaimState, DrainAll,
    HeartbeatAck, Rejection,
};
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::snapshot::{StatusSnapshot, WorkerInfo};
use crate::api::stats::Stats;
use crate::api::status::{DeadReason, Status};
use crate::clock::millis;
use crate::config::RegistryConfig;

/// Receipts one `acknowledge` script call takes (three commands each).
const ACK_CHUNK: usize = 128;

/// What a placement script answered (admit after its duplicate check, assign).
enum Placed {
    Assigned(Assignment),
    Rejected(Rejection),
}

impl RedisRegistry {
    /// An invocation of `script` with the arguments every script takes (the offset key, the
    /// prefix, this replica's id).
    pub(crate) fn prepare(&self, script: &'static Script) -> ScriptInvocation<'static> {
        let mut inv = script.key(&self.inner.keys.offset);
        inv.arg(&self.inner.keys.prefix).arg(&self.inner.replica);
        inv
    }

    pub(crate) async fn invoke(&self, inv: &ScriptInvocation<'_>) -> Result<Value, RegistryError> {
        let mut conn = self.inner.conn.clone();
        inv.invoke_async(&mut conn).await.map_err(error::backend)
    }

    /// Invokes a script that may publish events (its reply is `{events, reply, epoch}`) and
    /// returns the reply once this handle's subscribers have had the events, in order, as the
    /// in-memory registry's would (see `events.rs`).
    pub(crate) async fn invoke_emitting(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<Value, RegistryError> {
        let v = self.invoke(inv).await?;
        let Value::Array(mut parts) = v else {
            return Err(bad(format!("expected {{events, reply, epoch}}, got {v:?}")));
        };
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
        while events.remaining() > 0 {
            own.push(codec::decode_event(&events.text()?)?);
        }
        self.inner.events.settle(epoch.as_deref(), own).await;
        Ok(reply)
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

    /// Decodes `{'assigned', id, n, new, live, now} | {'rejected', kind, id}` (the tag read).
    fn placed(&self, tag: &str, r: &mut Reply<'_>) -> Result<Placed, RegistryError> {
        let p = match tag {
            "assigned" => {
                let worker = codec::worker_id(&r.text()?)?;
                let seq = r.uint()?;
                let new = r.int()? == 1;
                self.observe_live(r)?;
                let token =
                    FencingToken::new(worker, seq).map_err(|e| bad(format!("worker id: {e}")))?;
                Placed::Assigned(Assignment::new(worker, token, new))
            }
            "rejected" => {
                let kind = r.text()?;
                let worker = r.text()?;
                Placed::Rejected(match &*kind {
                    "capacity" => Rejection::CapacityFull {
                        limit: self.inner.config.max_workers(),
                    },
                    "draining" => Rejection::TargetDraining {
                        worker: codec::worker_id(&worker)?,
                    },
                    other => return Err(bad(format!("rejection {other:?}"))),
                })
            }
            other => return Err(bad(format!("placement answer {other:?}"))),
        };
        self.count_placed(&p);
        Ok(p)
    }

    /// Decodes the rest of `{'dup', holder, claimed_at, state, unstarted}`.
    fn duplicate(&self, r: &mut Reply<'_>) -> Result<AlreadyClaimed, RegistryError> {
        let holder = codec::opt_worker_id(&r.text()?)?;
        let since = codec::wall(r.uint()?);
        let state = match &*r.text()? {
            "in_flight" => ClaimState::InFlight,
            "completed" => ClaimState::Completed,
            other => return Err(bad(format!("claim state {other:?}"))),
        };
        let unstarted = r.int()? == 1;
        self.inner.counters.inc(C::Duplicates);
        Ok(AlreadyClaimed::new(holder, since, state).with_unstarted(unstarted))
    }

    /// Decodes the refusals every worker call shares: `{'unknown'}` and `{'dead', reason}`.
    fn worker_refusal(tag: &str, id: WorkerId, r: &mut Reply<'_>) -> RegistryError {
        match tag {
            "unknown" => RegistryError::UnknownWorker { id },
            "dead" => match r.int().and_then(codec::dead_reason) {
                Ok(reason) => RegistryError::WorkerDead { id, reason },
                Err(e) => e,
            },
            other => bad(format!("worker answer {other:?}")),
        }
    }

    /// Reads a worker call's first field: `ok`, or one of the refusals of [`Self::worker_refusal`].
    fn worker_ok(r: &mut Reply<'_>, id: WorkerId) -> Result<(), RegistryError> {
        let tag = r.text()?;
        if tag == "ok" {
            Ok(())
        } else {
            Err(Self::worker_refusal(&tag, id, r))
        }
    }

    fn status_code(code: i64) -> Result<Status, RegistryError> {
        match code {
            0 => Ok(Status::Active),
            1 => Ok(Status::Draining),
            2 => Ok(Status::Dead(DeadReason::Exited)),
            other => Err(bad(format!("status code {other}"))),
        }
    }

    /// Records a live count a script answered (`-1`: unchanged) at registry time `now`.
    fn observe_live(&self, r: &mut Reply<'_>) -> Result<(), RegistryError> {
        let live = r.int()?;
        let now = r.uint()?;
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
        inv.arg(target.to_string())
            .arg(delivery.as_str())
            .arg(by.map(|w| w.to_string()).unwrap_or_default())
            .arg(l.timeout_ms)
            .arg(l.retention_ms)
            .arg(l.max_retained)
            .arg(l.claim_key_ttl_ms);
        let v = self.invoke(&inv).await?;
        let mut r = Reply::of(&v)?;
        match &*r.text()? {
            "ok" => {
                let changed = r.int()? == 1;
                let evicted = r.uint()?;
                let retained = r.int()?;
                let now = r.uint()?;
                let c = &self.inner.counters;
                if changed {
                    c.inc(C::ClaimsCompleted);
                }
                c.add(C::ClaimsEvicted, evicted);
                if let Ok(retained) = u64::try_from(retained) {
                    c.observe_retained(now, retained);
                }
                Ok(())
            }
            "unknown" => Err(RegistryError::UnknownClaim {
                target: target.clone(),
                delivery: delivery.clone(),
            }),
            "not_holder" => Err(RegistryError::NotHolder {
                target: target.clone(),
                delivery: delivery.clone(),
                holder: codec::opt_worker_id(&r.text()?)?,
                worker: by.ok_or_else(|| bad("not_holder without a worker"))?,
            }),
            "released" => Err(RegistryError::ClaimReleased {
                target: target.clone(),
                delivery: delivery.clone(),
                holder: codec::opt_worker_id(&r.text()?)?,
                reason: codec::release_reason(r.int()?)?,
            }),
            other => Err(bad(format!("complete answer {other:?}"))),
        }
    }

    /// Runs the drain script on `ids` (none: every live worker).
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
        let mut r = Reply::of(&v)?;
        let n = r.remaining().saturating_sub(2);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let answer = r.text()?;
            // An answer naming a worker needs one asked about (drain-all's live workers answer
            // only "1" or "2"): anything else is an impossible reply, not worker 0.
            let id = || {
                ids.get(i).copied().ok_or_else(|| {
                    bad(format!("drain answer {answer:?} for no worker asked about"))
                })
            };
            out.push(match &*answer {
                "1" => Ok(Status::Draining),
                "2" => {
                    self.inner.counters.death(DeadReason::Exited);
                    Ok(Status::Dead(DeadReason::Exited))
                }
                "unknown" => Err(RegistryError::UnknownWorker { id: id()? }),
                dead if dead.starts_with("dead:") => {
                    let code = dead[5..]
                        .parse()
                        .map_err(|_| bad(format!("drain answer {dead:?}")))?;
                    Err(RegistryError::WorkerDead {
                        id: id()?,
                        reason: codec::dead_reason(code)?,
                    })
                }
                other => return Err(bad(format!("drain answer {other:?}"))),
            });
        }
        self.observe_live(&mut r)?;
        Ok(out)
    }
}

impl WorkerRegistry for RedisRegistry {
    async fn admit(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<Admission, RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.admit);
        inv.arg(target.to_string())
            .arg(delivery.as_str())
            .arg(l.max_workers)
            .arg(l.timeout_ms)
            .arg(l.startup_grace_ms)
            .arg(l.retention_ms)
            .arg(l.max_in_flight_ms);
        let v = self.invoke_emitting(&inv).await?;
        let mut r = Reply::of(&v)?;
        let tag = r.text()?;
        if tag == "dup" {
            return Ok(Admission::Duplicate(self.duplicate(&mut r)?));
        }
        let placed = self.placed(&tag, &mut r)?;
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

    async fn claim(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<ClaimOutcome, RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.claim);
        inv.arg(target.to_string())
            .arg(delivery.as_str())
            .arg(l.timeout_ms)
            .arg(l.retention_ms);
        let v = self.invoke(&inv).await?;
        let mut r = Reply::of(&v)?;
        match &*r.text()? {
            "claimed" => Ok(ClaimOutcome::Claimed),
            "dup" => Ok(ClaimOutcome::AlreadyClaimed(self.duplicate(&mut r)?)),
            other => Err(bad(format!("claim answer {other:?}"))),
        }
    }

    async fn release(&self, target: &Target, delivery: &DeliveryId) -> Result<(), RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.release);
        inv.arg(target.to_string())
            .arg(delivery.as_str())
            .arg(l.timeout_ms)
            .arg(l.retention_ms);
        let v = self.invoke(&inv).await?;
        let mut r = Reply::of(&v)?;
        match &*r.text()? {
            "ok" => Ok(()),
            "unknown" => Err(RegistryError::UnknownClaim {
                target: target.clone(),
                delivery: delivery.clone(),
            }),
            "completed" => Err(RegistryError::ClaimCompleted {
                target: target.clone(),
                delivery: delivery.clone(),
            }),
            other => Err(bad(format!("release answer {other:?}"))),
        }
    }

    async fn complete(&self, target: &Target, delivery: &DeliveryId) -> Result<(), RegistryError> {
        self.complete_inner(None, target, delivery).await
    }

    async fn complete_by(
        &self,
        worker: WorkerId,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<(), RegistryError> {
        self.complete_inner(Some(worker), target, delivery).await
    }

    async fn assign(&self, target: &Target) -> Result<AssignOutcome, RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.assign);
        inv.arg(target.to_string())
            .arg(l.max_workers)
            .arg(l.timeout_ms)
            .arg(l.startup_grace_ms);
        let v = self.invoke_emitting(&inv).await?;
        let mut r = Reply::of(&v)?;
        let tag = r.text()?;
        let placed = self.placed(&tag, &mut r)?;
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
        let mut r = Reply::of(&v)?;
        let tag = r.text()?;
        let c = &self.inner.counters;
        if tag != "ok" {
            c.inc(C::HeartbeatsRefused);
            return Err(Self::worker_refusal(&tag, worker, &mut r));
        }
        c.inc(C::Heartbeats);
        match r.int()? {
            0 => Ok(HeartbeatAck::Active),
            1 => Ok(HeartbeatAck::Draining),
            other => Err(bad(format!("heartbeat status {other}"))),
        }
    }

    async fn loop_started(&self, worker: WorkerId) -> Result<Status, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.loop_started);
        inv.arg(worker.get());
        let v = self.invoke(&inv).await?;
        let mut r = Reply::of(&v)?;
        Self::worker_ok(&mut r, worker)?;
        Self::status_code(r.int()?)
    }

    async fn loop_finished(&self, worker: WorkerId) -> Result<Status, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.loop_finished);
        inv.arg(worker.get());
        let v = self.invoke_emitting(&inv).await?;
        let mut r = Reply::of(&v)?;
        Self::worker_ok(&mut r, worker)?;
        let status = Self::status_code(r.int()?)?;
        if let Status::Dead(reason) = status {
            self.inner.counters.death(reason);
        }
        self.observe_live(&mut r)?;
        Ok(status)
    }

    async fn register(&self) -> Result<WorkerId, RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.register);
        inv.arg(l.max_workers)
            .arg(l.timeout_ms)
            .arg(l.startup_grace_ms);
        let v = self.invoke_emitting(&inv).await?;
        let mut r = Reply::of(&v)?;
        match &*r.text()? {
            "ok" => {
                let id = codec::worker_id(&r.text()?)?;
                self.observe_live(&mut r)?;
                self.wait_created(id).await;
                Ok(id)
            }
            "full" => Err(RegistryError::Rejected(Rejection::CapacityFull {
                limit: self.inner.config.max_workers(),
            })),
            "exhausted" => Err(RegistryError::IdsExhausted),
            other => Err(bad(format!("register answer {other:?}"))),
        }
    }

    async fn deregister(&self, worker: WorkerId) -> Result<DeadReason, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.deregister);
        inv.arg(worker.get());
        let v = self.invoke_emitting(&inv).await?;
        let mut r = Reply::of(&v)?;
        Self::worker_ok(&mut r, worker)?;
        let reason = codec::dead_reason(r.int()?)?;
        self.inner.counters.death(reason);
        self.observe_live(&mut r)?;
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

    async fn drain_all_within(&self, deadline: Duration) -> Result<DrainAll, RegistryError> {
        let mut out = DrainAll::default();
        for r in self.drain_ids(&[], deadline).await? {
            match r {
                Ok(Status::Draining) => out.draining += 1,
                Ok(Status::Dead(_)) => out.exited += 1,
                _ => {}
            }
        }
        Ok(out)
    }

    async fn worker(&self, worker: WorkerId) -> Result<Option<WorkerInfo>, RegistryError> {
        let mut inv = self.prepare(&SCRIPTS.worker);
        inv.arg(worker.get());
        let v = self.invoke(&inv).await?;
        let mut r = Reply::of(&v)?;
        let now = r.uint()?;
        if r.remaining() == 0 {
            return Ok(None);
        }
        codec::decode_worker(&r.text()?, now).map(Some)
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

    /// Not yet: this backend behaves as a waiting room of size 0 (every admission that cannot be
    /// placed is rejected, whatever `max_waiting` says; see [`WorkerRegistry::parks`]).
    fn parks(&self) -> bool {
        false
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
}

impl Subscribe for RedisRegistry {
    fn subscribe(&self) -> crate::Subscription {
        self.inner.events.sender.subscribe()
    }
}
