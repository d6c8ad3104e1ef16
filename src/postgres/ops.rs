//! [`PostgresRegistry`] and the contract's per-call methods: each is one call of its function in
//! `functions/*.sql`, decoded into the contract's answer, and counted.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Row;

use super::error::{decode, Failure};
use super::payload;
use super::rows::{self, col, number_param, worker_param, WorkerRow};
use super::Inner;
use crate::api::contract::{Subscribe, WorkerRegistry};
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{
    Admission, AssignOutcome, ClaimOutcome, DrainAll, HeartbeatAck, Rejection,
};
use crate::api::payload::Payload;
use crate::api::report::ReleaseReason;
use crate::api::snapshot::{StatusSnapshot, WorkerInfo};
use crate::api::stats::Stats;
use crate::api::status::{DeadReason, Status};
use crate::config::RegistryConfig;
use crate::remote::vocab;

const ADMIT: &str = "SELECT o_outcome, o_worker, o_seq, o_new, o_since, o_state, o_unstarted, \
                     o_position, o_reason, o_held FROM wr_admit($1, $2, $3, $4, $5, $6, $7, $8, \
                     $9, $10, $11, $12, $13, $14, $15, $16, $17)";
const ASSIGN: &str = "SELECT o_outcome, o_worker, o_seq, o_new FROM wr_assign($1, $2, $3, $4)";
const CLAIM: &str = "SELECT o_outcome, o_worker, o_since, o_state, o_unstarted \
                     FROM wr_claim($1, $2, $3, $4, $5, $6)";
const RELEASE: &str = "SELECT wr_release($1, $2, $3, $4, $5) AS o_outcome";
const COMPLETE: &str = "SELECT o_outcome, o_holder, o_reason, o_dead_reason \
                        FROM wr_complete($1, $2, $3, $4, $5, $6, $7)";
const HEARTBEAT: &str = "SELECT o_outcome, o_reason FROM wr_heartbeat($1, $2)";
const LOOP_STARTED: &str = "SELECT o_outcome, o_reason FROM wr_loop_started($1, $2)";
const LOOP_FINISHED: &str = "SELECT o_outcome, o_reason FROM wr_loop_finished($1, $2)";
const DRAIN: &str = "SELECT o_outcome, o_reason FROM wr_drain($1, $2, $3)";
const DRAIN_ALL: &str = "SELECT o_draining, o_exited FROM wr_drain_all($1, $2)";
const REGISTER: &str = "SELECT o_id, o_refused FROM wr_register($1, $2)";
const DEREGISTER: &str = "SELECT o_reason, o_refused FROM wr_deregister($1, $2)";
const AUDIT: &str = "SELECT * FROM wr_audit($1)";
const WORKER: &str = "SELECT wr_now($1) AS now_ms, w.* FROM wr_workers w \
                      RIGHT JOIN (SELECT 1) one ON w.registry = $1 AND w.id = $2";

/// What a worker-state function answered: the worker's status (with whether this call killed
/// it), or why it was refused.
fn worker_outcome(
    row: &Row,
    id: WorkerId,
) -> Result<Result<(Status, bool), RegistryError>, Failure> {
    let outcome: String = col(row, "o_outcome")?;
    let reason: Option<String> = col(row, "o_reason")?;
    Ok(match outcome.as_str() {
        vocab::UNKNOWN => Err(RegistryError::UnknownWorker { id }),
        vocab::REFUSED_DEAD => Err(dead(id, rows::dead_reason(reason.as_deref())?)),
        vocab::DEAD | vocab::EXITED => {
            let reason = match reason.as_deref() {
                None => DeadReason::Exited,
                r => rows::dead_reason(r)?,
            };
            Ok((Status::Dead(reason), true))
        }
        other => Ok((rows::status(other, None)?, false)),
    })
}

/// The refusal for a worker that is dead already.
fn dead(id: WorkerId, reason: DeadReason) -> RegistryError {
    RegistryError::WorkerDead { id, reason }
}

/// The worker registry in PostgreSQL, shared by every handle (every router replica) connected to
/// the same database under the same registry name. See [`docs::postgres`](crate::docs::postgres)
/// for how it is kept: the schema, locks, sweep and outbox.
///
/// Each handle has its own connection pool and its own event listener; cloning a handle shares
/// them (it is an `Arc` inside). [`connect_replica`](Self::connect_replica) makes another handle on the same
/// registry with connections of its own, as another router process would have.
///
/// **Locking behaviour:** every call but `status`, `stats` and `config` is one function call in
/// its own transaction, on one pooled connection (waiting for one if all are busy, up to the call
/// timeout); the locks it takes are listed on its function in `functions/*.sql`.
/// `status` and `stats` take no lock and do no I/O.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), worker_registry::RegistryError> {
/// use worker_registry::postgres::PostgresRegistry;
/// use worker_registry::{Admission, DeliveryId, Target, WorkerRegistry, WorkerRegistryExt};
///
/// let registry = PostgresRegistry::builder("postgres://router@db.internal/registry")
///     .name("webhooks")
///     .connect()
///     .await?;
/// let (t, d) = (Target::new("octo/repo", 42).unwrap(), DeliveryId::new("d-1").unwrap());
/// match registry.admit(&t, &d).await? {
///     Admission::Assigned(a) if a.new => { /* start a container for a.worker */ }
///     Admission::Assigned(_) => { /* hand the delivery to the running worker */ }
///     Admission::Duplicate(_) => { /* a redelivery: skip it */ }
///     Admission::Waiting(_) => { /* parked: handed over by a sweep once promoted */ }
///     Admission::Rejected(_) => { /* answer 503 */ }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresRegistry {
    pub(super) inner: Arc<Inner>,
}

impl WorkerRegistry for PostgresRegistry {
    async fn admit_with(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
    ) -> Result<Admission, RegistryError> {
        let p = &self.inner.params;
        if let Some(given) = payload {
            if given.size() > p.max_payload_bytes {
                self.inner.counters.payloads_too_large.inc();
                return Err(RegistryError::PayloadTooLarge {
                    size: given.size(),
                    limit: p.max_payload_bytes,
                });
            }
        }
        let y = payload::Params::of(payload);
        let (reg, number) = (self.inner.id, number_param(target));
        let admission = self
            .call(
                ADMIT,
                &[
                    &reg,
                    &target.repo(),
                    &number,
                    &delivery.as_str(),
                    &p.max_workers,
                    &p.retention,
                    &p.timeout,
                    &p.owner_cap,
                    &p.max_waiting,
                    &p.per_owner,
                    &y.event,
                    &y.action,
                    &y.content_type,
                    &y.headers,
                    &y.body,
                    &y.size,
                    &p.payload_budget,
                ],
                |row| self.admission(row, payload),
            )
            .await?;
        match &admission {
            Admission::Duplicate(_) => self.inner.counters.duplicates.inc(),
            Admission::Assigned(a) => {
                self.count_placement(&Ok(*a));
                if a.new {
                    self.settle().await;
                }
            }
            Admission::Rejected(r) => self.count_placement(&Err(*r)),
            // Parked: not a rejection (see `Stats::parked`).
            Admission::Waiting(_) => self.inner.counters.parked.inc(),
        }
        Ok(admission)
    }

    /// One primary-key read: the payload of the pair's claim in flight, its parked delivery, or
    /// its released copy (they share the row).
    async fn payload(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<Option<Payload>, RegistryError> {
        let (reg, number) = (self.inner.id, number_param(target));
        self.call(
            payload::LOOKUP,
            &[&reg, &target.repo(), &number, &delivery.as_str()],
            payload::from_row,
        )
        .await
    }

    async fn claim(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<ClaimOutcome, RegistryError> {
        let p = &self.inner.params;
        let (reg, number) = (self.inner.id, number_param(target));
        let outcome = self
            .call(
                CLAIM,
                &[
                    &reg,
                    &target.repo(),
                    &number,
                    &delivery.as_str(),
                    &p.retention,
                    &p.timeout,
                ],
                |row| match col::<String>(row, "o_outcome")?.as_str() {
                    vocab::CLAIMED => Ok(ClaimOutcome::Claimed),
                    vocab::DUPLICATE => Ok(ClaimOutcome::AlreadyClaimed(Self::duplicate(row)?)),
                    other => Err(decode(format!("claim outcome {other:?}"))),
                },
            )
            .await?;
        if let ClaimOutcome::AlreadyClaimed(_) = outcome {
            self.inner.counters.duplicates.inc();
        }
        Ok(outcome)
    }

    async fn release(&self, target: &Target, delivery: &DeliveryId) -> Result<(), RegistryError> {
        let (reg, number) = (self.inner.id, number_param(target));
        let retention = &self.inner.params.retention;
        let outcome: String = self
            .call(
                RELEASE,
                &[&reg, &target.repo(), &number, &delivery.as_str(), retention],
                |row| col(row, "o_outcome"),
            )
            .await?;
        match outcome.as_str() {
            vocab::OK => Ok(()),
            vocab::UNKNOWN => Err(RegistryError::unknown_claim(target, delivery)),
            vocab::COMPLETED => Err(RegistryError::claim_completed(target, delivery)),
            other => Err(decode(format!("release outcome {other:?}")).into_registry()),
        }
    }

    async fn complete_as(
        &self,
        holder: Option<WorkerId>,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<(), RegistryError> {
        let p = &self.inner.params;
        let (reg, number) = (self.inner.id, number_param(target));
        let by_param = holder.map(worker_param);
        let r = self
            .call(
                COMPLETE,
                &[
                    &reg,
                    &target.repo(),
                    &number,
                    &delivery.as_str(),
                    &by_param,
                    &p.retention,
                    &p.timeout,
                ],
                |row| {
                    let outcome: String = col(row, "o_outcome")?;
                    let held_by = col::<Option<i64>>(row, "o_holder")?
                        .map(rows::worker_id)
                        .transpose()?;
                    Ok(match outcome.as_str() {
                        vocab::COMPLETED => Ok(true),
                        vocab::ALREADY => Ok(false),
                        vocab::UNKNOWN => Err(RegistryError::unknown_claim(target, delivery)),
                        // Only a completion by a worker can be refused as not its holder's.
                        vocab::NOT_HOLDER => Err(RegistryError::NotHolder {
                            target: target.clone(),
                            delivery: delivery.clone(),
                            holder: held_by,
                            worker: holder.ok_or_else(|| {
                                decode("complete answered not_holder to a completion by no worker")
                            })?,
                        }),
                        vocab::RELEASED => {
                            let reason: Option<String> = col(row, "o_reason")?;
                            let dead_reason: Option<String> = col(row, "o_dead_reason")?;
                            let reason = match reason.as_deref() {
                                Some("worker_died") => ReleaseReason::WorkerDied(
                                    rows::dead_reason(dead_reason.as_deref())?,
                                ),
                                Some("stuck") => ReleaseReason::Stuck,
                                Some("unbound") => ReleaseReason::Unbound,
                                other => return Err(decode(format!("release reason {other:?}"))),
                            };
                            Err(RegistryError::ClaimReleased {
                                target: target.clone(),
                                delivery: delivery.clone(),
                                holder: held_by,
                                reason,
                            })
                        }
                        other => return Err(decode(format!("complete outcome {other:?}"))),
                    })
                },
            )
            .await?;
        if let Ok(true) = r {
            self.inner.counters.claims_completed.inc();
        }
        r.map(|_| ())
    }

    async fn assign(&self, target: &Target) -> Result<AssignOutcome, RegistryError> {
        let p = &self.inner.params;
        let (reg, number) = (self.inner.id, number_param(target));
        let placed = self
            .call(
                ASSIGN,
                &[&reg, &target.repo(), &number, &p.max_workers],
                |row| self.placement(row),
            )
            .await?;
        self.count_placement(&placed);
        if matches!(placed, Ok(a) if a.new) {
            self.settle().await;
        }
        Ok(match placed {
            Ok(a) => AssignOutcome::Assigned(a),
            Err(r) => AssignOutcome::Rejected(r),
        })
    }

    async fn heartbeat(&self, worker: WorkerId) -> Result<HeartbeatAck, RegistryError> {
        let (reg, id) = (self.inner.id, worker_param(worker));
        let r = self
            .call(HEARTBEAT, &[&reg, &id], |row| {
                Ok(match worker_outcome(row, worker)? {
                    Ok((Status::Active, _)) => Ok(HeartbeatAck::Active),
                    Ok((Status::Draining, _)) => Ok(HeartbeatAck::Draining),
                    Ok((other, _)) => {
                        return Err(decode(format!("heartbeat answered {other}")));
                    }
                    Err(e) => Err(e),
                })
            })
            .await?;
        let c = &self.inner.counters;
        if r.is_ok() {
            c.heartbeats.inc();
        } else {
            c.heartbeats_refused.inc();
        }
        r
    }

    async fn loop_started(&self, worker: WorkerId) -> Result<Status, RegistryError> {
        let (reg, id) = (self.inner.id, worker_param(worker));
        self.call(LOOP_STARTED, &[&reg, &id], |row| {
            Ok(worker_outcome(row, worker)?.map(|(s, _)| s))
        })
        .await?
    }

    async fn loop_finished(&self, worker: WorkerId) -> Result<Status, RegistryError> {
        let (reg, id) = (self.inner.id, worker_param(worker));
        let r = self
            .call(LOOP_FINISHED, &[&reg, &id], |row| {
                worker_outcome(row, worker)
            })
            .await?;
        self.count_kill(&r);
        if matches!(r, Ok((_, true))) {
            self.settle().await;
        }
        r.map(|(s, _)| s)
    }

    async fn register(&self) -> Result<WorkerId, RegistryError> {
        let p = &self.inner.params;
        let reg = self.inner.id;
        let limit = self.config_ref().max_workers();
        let r = self
            .call(REGISTER, &[&reg, &p.max_workers], |row| {
                let refused: Option<String> = col(row, "o_refused")?;
                Ok(match refused.as_deref() {
                    None => Ok(rows::worker_id(col(row, "o_id")?)?),
                    Some("capacity") => {
                        Err(RegistryError::Rejected(Rejection::CapacityFull { limit }))
                    }
                    Some("exhausted") => Err(RegistryError::IdsExhausted),
                    Some(other) => return Err(decode(format!("register refusal {other:?}"))),
                })
            })
            .await?;
        if r.is_ok() {
            self.settle().await;
        }
        r
    }

    async fn deregister(&self, worker: WorkerId) -> Result<DeadReason, RegistryError> {
        let (reg, id) = (self.inner.id, worker_param(worker));
        let r = self
            .call(DEREGISTER, &[&reg, &id], |row| {
                let refused: Option<String> = col(row, "o_refused")?;
                let reason: Option<String> = col(row, "o_reason")?;
                Ok(match refused.as_deref() {
                    None => Ok(rows::dead_reason(reason.as_deref())?),
                    Some("unknown") => Err(RegistryError::UnknownWorker { id: worker }),
                    Some("refused_dead") => {
                        Err(dead(worker, rows::dead_reason(reason.as_deref())?))
                    }
                    Some(other) => return Err(decode(format!("deregister refusal {other:?}"))),
                })
            })
            .await?;
        if let Ok(reason) = &r {
            self.inner.counters.death(*reason).inc();
            self.settle().await;
        }
        r
    }

    async fn drain_within(
        &self,
        worker: WorkerId,
        deadline: Duration,
    ) -> Result<Status, RegistryError> {
        let (reg, id, ms) = (self.inner.id, worker_param(worker), rows::ms(deadline));
        let r = self
            .call(DRAIN, &[&reg, &id, &ms], |row| worker_outcome(row, worker))
            .await?;
        self.count_kill(&r);
        if r.is_ok() {
            self.settle().await;
        }
        r.map(|(s, _)| s)
    }

    async fn drain_all_within(&self, deadline: Duration) -> Result<DrainAll, RegistryError> {
        let (reg, ms) = (self.inner.id, rows::ms(deadline));
        let (draining, exited) = self
            .call(DRAIN_ALL, &[&reg, &ms], |row| {
                Ok((col::<i32>(row, "o_draining")?, col::<i32>(row, "o_exited")?))
            })
            .await?;
        let out = DrainAll {
            draining: usize::try_from(draining).unwrap_or(0),
            exited: usize::try_from(exited).unwrap_or(0),
        };
        self.inner
            .counters
            .death(DeadReason::Exited)
            .add(out.exited as u64);
        if out.draining + out.exited > 0 {
            self.settle().await;
        }
        Ok(out)
    }

    async fn worker(&self, worker: WorkerId) -> Result<Option<WorkerInfo>, RegistryError> {
        let (reg, id) = (self.inner.id, worker_param(worker));
        self.call(WORKER, &[&reg, &id], |row| {
            if col::<Option<i64>>(row, "id")?.is_none() {
                return Ok(None);
            }
            let now: i64 = col(row, "now_ms")?;
            WorkerRow::from_row(row)?.info(now).map(Some)
        })
        .await
    }

    /// One call of `wr_audit` (`functions/snapshot.sql`): counts on the partial indexes of the
    /// claims in flight and released, plus three one-row reads; no lock.
    async fn audit(&self) -> Result<crate::Audit, RegistryError> {
        let reg = self.inner.id;
        self.call(AUDIT, &[&reg], |row| {
            let n = |c: &str| col::<i64>(row, c).map(|v| u64::try_from(v).unwrap_or(0));
            Ok(crate::Audit {
                live_workers: n("o_live")?,
                in_flight: n("o_in_flight")?,
                released: n("o_released")?,
                waiting: n("o_waiting")?,
            })
        })
        .await
    }

    fn status(&self) -> Arc<StatusSnapshot> {
        self.inner.snapshot.load()
    }

    fn stats(&self) -> Stats {
        let inner = &*self.inner;
        let snapshot = inner.snapshot.load();
        let mut s = inner.counters.read();
        s.live_workers = snapshot.capacity.used;
        s.retained_claims = snapshot.claims.retained;
        s.events_missed = inner.events.missed();
        s.data_losses = inner.loss.losses();
        s.snapshot_age = inner.snapshot.age();
        s.waiting = snapshot.waiting;
        s.payloads_held = snapshot.payloads.held;
        s.payload_bytes_held = snapshot.payloads.bytes;
        s
    }

    fn config(&self) -> &RegistryConfig {
        self.config_ref()
    }
}

impl PostgresRegistry {
    fn count_kill(&self, r: &Result<(Status, bool), RegistryError>) {
        if let Ok((Status::Dead(reason), true)) = r {
            self.inner.counters.death(*reason).inc();
        }
    }
}

impl Subscribe for PostgresRegistry {
    fn subscribe(&self) -> crate::Subscription {
        self.inner.events.subscribe()
    }
}
