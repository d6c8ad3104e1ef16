//! The contract traits for [`RedisRegistry`]: each method runs its script (one round trip, one
//! atomic step on the server) and decodes the reply. Semantics are the contract's; what is
//! particular here is documented on the module.

use std::sync::Arc;
use std::time::Duration;

use super::codec::{self, bad, bad_outcome, Fields};
use super::counters::C;
use super::error;
use super::placement::Placed;
use super::scripts::SCRIPTS;
use super::RedisRegistry;
use crate::api::contract::{Maintenance, Subscribe, WorkerRegistry};
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{
    Admission, AssignOutcome, ClaimOutcome, DrainAll, HeartbeatAck, Rejection,
};
use crate::api::payload::Payload;
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::snapshot::{StatusSnapshot, WorkerInfo};
use crate::api::stats::Stats;
use crate::api::status::{DeadReason, Status};
use crate::config::RegistryConfig;
use crate::remote::vocab;

/// Receipts one `acknowledge` script call takes (three commands each).
const ACK_CHUNK: usize = 64;

/// The `COUNT` hint of one `ZSCAN` step of `drain_all_within`'s walk of `{n}:live`, and so
/// about the number of workers one `drain` call takes.
const DRAIN_ALL_SCAN: usize = 128;

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
        let carried = payload.map(|p| self.carry(p)).transpose()?;
        self.admit_carrying(target, delivery, carried.as_ref())
            .await
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
            vocab::UNKNOWN => Err(RegistryError::unknown_claim(target, delivery)),
            vocab::COMPLETED => Err(RegistryError::claim_completed(target, delivery)),
            other => Err(bad_outcome("release", other)),
        }
    }

    async fn complete_as(
        &self,
        holder: Option<WorkerId>,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<(), RegistryError> {
        let l = &self.inner.limits;
        let mut inv = self.prepare(&SCRIPTS.complete);
        inv.text(target)
            .arg(delivery.as_str())
            .arg(holder.map(|w| w.to_string()).unwrap_or_default())
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
            vocab::UNKNOWN => Err(RegistryError::unknown_claim(target, delivery)),
            vocab::NOT_HOLDER => Err(RegistryError::NotHolder {
                target: target.clone(),
                delivery: delivery.clone(),
                holder: f.opt_worker("holder")?,
                worker: holder.ok_or_else(|| bad_outcome("complete", &word))?,
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
        Ok(match self.placed_settled("assign", &word, &f).await? {
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
