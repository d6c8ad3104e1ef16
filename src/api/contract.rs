//! The contract every backend implements: [`WorkerRegistry`] (what a router calls per webhook and a
//! worker calls about itself), [`Maintenance`] (the sweep, run by one task at a time) and, with the
//! `tokio` feature, [`Subscribe`] (lifecycle events).
//!
//! The semantics are written here, once. A backend's own documentation adds only what is particular
//! to it: how it locks, what a call costs, where its time comes from. Every backend runs the same
//! conformance suite (`testkit`, feature `testkit`), so what is written here is what is tested.
//!
//! # Why three traits
//!
//! A router replica needs the per-webhook calls on every request, and every replica needs them. The
//! sweep is different: in a shared backend it is one replica's job at a time (it holds a lease), it
//! hands out released work that must be re-dispatched exactly once, and a process that only serves
//! the admin API need not run it. Lifecycle events need a runtime and a fan-out channel, which a
//! dependency-light embedding may not want. Splitting them lets a type say what it can do and lets
//! the [`Sweeper`](crate::Sweeper) ask for [`Maintenance`] alone.
//!
//! # Time
//!
//! Every liveness decision is taken on one time base per registry: the in-memory backend's
//! [`Clock`](crate::Clock), a networked backend's server clock. A replica's own clock is never
//! consulted for liveness, so replicas with skewed clocks agree on who is dead.
//!
//! # Errors
//!
//! Every call is fallible. Refusals that are part of the state machine (an unknown or dead worker, a
//! claim held by another worker, ...) are [`RegistryError`] variants that carry what was observed. A
//! backend that cannot answer (a lost connection, a timeout, a script error) returns
//! [`RegistryError::Backend`], saying whether a retry can help; it never guesses an answer and never
//! panics. After such an error the operation may or may not have taken effect: every call is
//! idempotent or answers a retry truthfully (a retried `admit` of a delivery that did land is a
//! [`Admission::Duplicate`] naming the worker that holds it, and saying whether that worker
//! never started: [`AlreadyClaimed::unstarted`](crate::AlreadyClaimed::unstarted), so that the
//! retry starts the worker a lost reply would have started).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::error::RegistryError;
use super::ids::{DeliveryId, Target, WorkerId};
use super::outcome::{Admission, AssignOutcome, ClaimOutcome, DrainAll, HeartbeatAck};
use super::payload::Payload;
use super::report::{ReleasedEvent, SweepReport};
use super::snapshot::{StatusSnapshot, WorkerInfo};
use super::stats::{Audit, Stats};
use super::status::{DeadReason, Status};
use crate::config::RegistryConfig;

/// The registry as a router and its workers see it: admission of deliveries, assignment of targets
/// to workers under a capacity limit, heartbeats, drain, and reads of the state.
///
/// # The model
///
/// A **worker** is a container (or a pool process) with an id that is never reused: not after
/// a restart of the process (in memory), nor after the server of a shared backend lost or
/// rewound the registry's data (ids follow the clock, see `docs::redis` and `docs::postgres`,
/// section Failures; such a loss is reported as [`Event::DataLost`](crate::Event::DataLost)). It is `Active`,
/// `Draining` or `Dead(reason)`, forward only, and `Idle` or `Busy`. A worker **spawned** by an
/// assignment owns one [`Target`] (a pull request); a worker that [`register`](Self::register)s
/// itself owns none. Live (non-dead) workers never exceed
/// [`max_workers`](RegistryConfig::max_workers); draining ones count.
///
/// A **claim** records that one (target, delivery) pair is being handled (in flight, held by a
/// worker) or was handled recently (completed, retained for
/// [`claim_retention`](RegistryConfig::claim_retention), at most
/// [`max_retained_claims`](RegistryConfig::max_retained_claims), oldest forgotten first). While a
/// claim is in flight or retained, the same pair is a duplicate. A claim whose worker dies is
/// **released**: from that instant a redelivery of the pair is admitted again, and the next
/// [`sweep`](Maintenance::sweep) reports it for re-dispatch (unless it was admitted again before
/// that sweep: then it is in flight again, and there is nothing to re-dispatch).
///
/// Assignment is **sticky**: a target whose worker is active goes to that worker; a target whose
/// worker is draining gets no second worker until the first is dead; a target without a live worker
/// gets a new one if capacity allows.
///
/// Every assignment carries a [`FencingToken`](crate::FencingToken) that increases with every
/// assignment of a target, across its successive workers; a dead worker is **fenced**: its
/// heartbeats and its completions are refused, whichever replica they reach.
///
/// # Linearizability
///
/// Each method is one atomic step against the registry's state: two calls never observe each
/// other half-done, on one process or across replicas. In particular `admit` decides "duplicate?",
/// "which worker?", "capacity?" and records the claim in one step, so two deliveries of one pair
/// racing anywhere get one [`Admission::Assigned`] and one [`Admission::Duplicate`], and two new
/// targets racing for the last slot get one worker and one [`Rejection::CapacityFull`]
/// (`crate::Rejection`).
///
/// # The minimal set
///
/// The trait holds only what a backend must answer itself, each call one atomic step. The calls
/// that are compositions of these ([`admit`](crate::WorkerRegistryExt::admit),
/// [`complete`](crate::WorkerRegistryExt::complete), [`complete_by`](crate::WorkerRegistryExt::complete_by),
/// [`drain`](crate::WorkerRegistryExt::drain)) are [`WorkerRegistryExt`](crate::WorkerRegistryExt)'s, implemented once for every
/// registry. The dynamic surface ([`DynBackend`](crate::dynamic::DynBackend), its blanket impl
/// and [`DynRegistry`](crate::DynRegistry)'s delegation) and the impls of this trait for the two
/// synchronous registries (the in-memory one over its `Direct` core, `testkit::ReferenceRegistry`
/// over the model) are generated from one method list in `api/methods.rs`, which the compiler
/// holds to this trait. So a new contract method is written here, as one line of that list, in
/// each backend (the in-memory `Direct`, Redis, PostgreSQL) and in the model, and nowhere else.
///
/// # Examples
///
/// A router written against the trait runs on any backend:
///
/// ```
/// use worker_registry::{Admission, DeliveryId, InMemoryRegistry, Target, WorkerRegistry, WorkerRegistryExt};
///
/// async fn on_webhook<R: WorkerRegistry>(r: &R, t: &Target, d: &DeliveryId) -> u16 {
///     match r.admit(t, d).await {
///         Ok(Admission::Assigned(_)) => 202,
///         Ok(Admission::Duplicate(_)) => 200,
///         Ok(Admission::Waiting(_)) => 202, // parked: promoted by a sweep when room appears
///         Ok(Admission::Rejected(_)) => 503,
///         Err(e) if e.is_retryable() => 503,
///         Err(_) => 500,
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let registry = InMemoryRegistry::default();
/// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
/// assert_eq!(on_webhook(&registry, &t, &d).await, 202);
/// assert_eq!(on_webhook(&registry, &t, &d).await, 200);
/// # }
/// ```
///
/// [`Rejection::CapacityFull`]: crate::Rejection::CapacityFull
pub trait WorkerRegistry: Send + Sync {
    /// Claims the delivery and places its target, carrying what GitHub sent with it (its
    /// [`Payload`], or `None`), in one atomic step: what a router calls per webhook.
    /// [`admit`](crate::WorkerRegistryExt::admit) is this call without a payload.
    ///
    /// * A redelivery of a pair that is in flight or retained is [`Admission::Duplicate`], naming
    ///   the worker that holds it (none for a bare [`claim`](Self::claim)) and its state.
    /// * Otherwise the target is placed as by [`assign`](Self::assign), and the claim is recorded,
    ///   held by that worker: [`Admission::Assigned`]. If the assignment created the worker
    ///   (`new`), the caller starts it.
    /// * If the target cannot be placed, and the waiting room is off (or full):
    ///   [`Admission::Rejected`] and **no claim is left behind**, so a later redelivery is admitted
    ///   normally.
    /// * Otherwise it is **parked**: [`Admission::Waiting`], described below.
    ///
    /// # The waiting room
    ///
    /// With [`max_waiting`](RegistryConfig::max_waiting) above 0, an admission that finds no
    /// capacity (or its owner at
    /// [`max_workers_per_owner`](RegistryConfig::max_workers_per_owner)), or its target's worker
    /// draining, is parked instead of rejected, while fewer than `max_waiting` deliveries wait and
    /// fewer than [`max_waiting_per_owner`](RegistryConfig::max_waiting_per_owner) of its
    /// repository owner. Past either bound the answer is the rejection, as without the room.
    ///
    /// * A parked delivery is **claimed**: its redelivery is [`Admission::Duplicate`] in
    ///   [`ClaimState::Waiting`](crate::ClaimState::Waiting) (no holder).
    /// * While targets wait for capacity, an admission that would create a worker for another
    ///   target is parked behind them (arrivals do not overtake the waiting), or placed after all
    ///   if the room is full and capacity allows; an admission onto an existing active worker
    ///   (sticky) is not affected.
    /// * **Promotion** happens when capacity is freed by a death, an exit or the end of a drain
    ///   (at that call itself, as all three backends do, one freed slot at a time; and in any
    ///   case as a catch-up, in [`Maintenance::sweep`]): the room goes to waiting targets, first
    ///   to those whose draining worker has died since (the target's successor takes its slot),
    ///   then one target per owner in turn
    ///   (round-robin across owners, each owner's targets in arrival order). A target is promoted
    ///   with all of its waiting deliveries, in arrival order, onto one worker. A draining target's
    ///   deliveries are promoted only once that worker is dead: never two live workers for one
    ///   target. A completion frees no slot (the worker lives on) and promotes nothing.
    /// * A promoted delivery is **placed** by the promotion (its claim is in flight on the
    ///   worker, so a redelivery is a duplicate) and handed to exactly one sweep caller (of the
    ///   next sweep, which [`Maintenance::wake`] asks for at once) in
    ///   [`SweepReport::released`] as a [`ReleasedEvent`] with
    ///   [`ReleaseReason::Promoted`](crate::ReleaseReason::Promoted) and its
    ///   [`assignment`](ReleasedEvent::assignment): the caller starts the worker if the
    ///   assignment is `new`, delivers the event to it (with its
    ///   [`payload`](ReleasedEvent::payload)), and acknowledges it like a released event.
    ///   If the caller never delivers it, the worker never heartbeats, dies, and the delivery is
    ///   released for re-dispatch: nothing is lost.
    /// * A delivery still waiting [`max_wait`](RegistryConfig::max_wait) after it was parked is
    ///   **dropped** by a sweep, listed in [`SweepReport::expired_waiting`] with its
    ///   [`ExpireReason`](crate::ExpireReason), counted, and published as
    ///   [`Event::WaitingExpired`](crate::Event::WaitingExpired); its claim is gone.
    /// * Every parked delivery is promoted or dropped exactly once (or, if its redelivery was
    ///   admitted in the instant between its refusal and its parking, left to that redelivery).
    /// * Waiting deliveries are counted in [`StatusSnapshot::waiting`] and [`Stats`] (`parked`,
    ///   `promoted`, `waiting_expired`, the `waiting` gauge).
    ///
    /// With `max_waiting` 0 (the default) none of this happens: a refused admission is rejected.
    ///
    /// A pair whose claim was released (its worker died) or forgotten (retention ended) is admitted
    /// again as new.
    ///
    /// # Payloads
    ///
    /// The registry keeps a delivery's payload for as long as the delivery has work left, so
    /// that whichever worker runs it (again) gets the bytes GitHub sent, and drops it when the
    /// work is done:
    ///
    /// * **Bad input first.** A payload larger than
    ///   [`max_payload_bytes`](RegistryConfig::max_payload_bytes) (by
    ///   [`Payload::size`]) is refused with [`RegistryError::PayloadTooLarge`], before anything
    ///   else is looked at (a duplicate included): nothing is claimed or placed.
    /// * **A duplicate keeps what it has.** A redelivery of a pair in flight, waiting or retained
    ///   is [`Admission::Duplicate`], as without a payload; the payload stored with the pair (or
    ///   none) stays, the one given is not stored.
    /// * **Stored in the same atomic step as the claim.** Otherwise the payload's size is counted
    ///   against [`payload_budget`](RegistryConfig::payload_budget) and stored with the claim
    ///   ([`Admission::Assigned`]) or with the parked delivery ([`Admission::Waiting`]) in the
    ///   one step that decides the admission (the same script, transaction or shard lock): there
    ///   is no instant at which the claim exists without its payload. If the bytes held would go
    ///   past the budget, the answer is [`Admission::Rejected`] with
    ///   [`Rejection::PayloadBudget`], decided before the placement (so whatever capacity says,
    ///   and never parked: a parked delivery holds its payload too), and **no claim is left
    ///   behind**, as for every rejection.
    /// * **Handed out with the delivery.** A released delivery (its worker died, deregistered or
    ///   ran out its drain deadline, or it was stuck) and a promoted one carry it in their
    ///   [`ReleasedEvent::payload`]: the re-dispatcher admits it again with
    ///   `admit_with(&e.target, &e.delivery, e.payload.as_ref())`, and a promoted one is delivered
    ///   with it to its assignment's worker. While the claim is in flight or waiting,
    ///   [`payload`](Self::payload) answers it by (target, delivery).
    /// * **Kept across the re-dispatch.** A released delivery's payload stays held (and counted)
    ///   until the delivery is admitted again, its released event is acknowledged, or the release
    ///   expires (after [`claim_retention`](RegistryConfig::claim_retention), counted in
    ///   [`Stats::released_expired`](crate::Stats::released_expired)), whichever comes first; a
    ///   backend that hands each released event over once and keeps nothing after (the in-memory
    ///   one) holds it until that hand-over, after which the event's copy is the only one. The
    ///   admission that takes a released pair back frees the released copy in the same step, and
    ///   its own payload (or none) replaces it: re-dispatching a delivery never needs more budget
    ///   than its released copy frees, so released payloads cannot keep their own re-dispatch out.
    /// * **Dropped when the work is done.** Completion deletes the payload in the same step: a
    ///   retained (completed) claim keeps only ids, so
    ///   [`max_retained_claims`](RegistryConfig::max_retained_claims) costs what it costs without
    ///   payloads. So does [`release`](Self::release). A waiting delivery dropped after
    ///   [`max_wait`](RegistryConfig::max_wait) loses its payload with it (reported in
    ///   [`SweepReport::expired_waiting`], counted and published as before, without the bytes).
    /// * **Accounted.** The payloads held and their bytes are in [`Stats::payloads_held`] and
    ///   [`Stats::payload_bytes_held`] and in [`StatusSnapshot::payloads`]; refusals in
    ///   [`Stats::rejected_payload_budget`] and [`Stats::payloads_too_large`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{Admission, DeliveryId, InMemoryRegistry, Payload, Target, WorkerRegistry, WorkerRegistryExt};
    ///
    /// let r = InMemoryRegistry::default();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d-1").unwrap());
    /// let p = Payload::builder("pull_request", &br#"{"action":"opened"}"#[..]).action("opened").build().unwrap();
    /// assert!(matches!(r.admit_with(&t, &d, Some(&p)).await, Ok(Admission::Assigned(_))));
    /// assert_eq!(r.payload(&t, &d).await, Ok(Some(p.clone())));
    /// assert_eq!(r.stats().payload_bytes_held, p.size());
    /// r.complete(&t, &d).await.unwrap();
    /// assert_eq!(r.payload(&t, &d).await, Ok(None)); // the work is done: the bytes are gone
    /// assert_eq!(r.stats().payload_bytes_held, 0);
    /// # }
    /// ```
    ///
    /// [`Rejection::PayloadBudget`]: crate::Rejection::PayloadBudget
    fn admit_with(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send;

    /// The payload stored with the pair's delivery (see [`admit_with`](Self::admit_with)): while
    /// its claim is in flight or it waits; `None` if there is no claim, it is completed, or it was
    /// admitted without one. A released delivery's payload is answered as long as the registry
    /// still holds it (see "Kept across the re-dispatch" there); its [`ReleasedEvent`] carries it
    /// anyway. One atomic read: a delivery moving from the waiting room onto a worker is found in
    /// one place or the other, never in neither.
    fn payload(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Payload>, RegistryError>> + Send;

    /// Records that this pair is being handled, bound to no worker, unless it already is (the
    /// duplicate check of [`admit_with`](Self::admit_with) without the assignment). A parked pair
    /// (the waiting room) is claimed already: [`ClaimOutcome::AlreadyClaimed`] in
    /// [`ClaimState::Waiting`](crate::ClaimState::Waiting), no holder, and it stays parked.
    ///
    /// A bare claim that is neither completed nor released within
    /// [`heartbeat_timeout`](RegistryConfig::heartbeat_timeout) is released as if its worker had
    /// died, so nothing is lost.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{ClaimOutcome, DeliveryId, InMemoryRegistry, Target, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// let (t, d) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// assert_eq!(r.claim(&t, &d).await, Ok(ClaimOutcome::Claimed));
    /// assert!(matches!(r.claim(&t, &d).await, Ok(ClaimOutcome::AlreadyClaimed(_))));
    /// # }
    /// ```
    fn claim(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send;

    /// Removes an in-flight claim (the router could not hand the delivery over), so a redelivery is
    /// admitted again. The worker the claim was placed on is not touched.
    ///
    /// Refused with [`RegistryError::UnknownClaim`] if there is no claim, and
    /// [`RegistryError::ClaimCompleted`] if it is completed (a completed claim stays until its
    /// retention ends).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{ClaimOutcome, DeliveryId, InMemoryRegistry, Target, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// let (t, d) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// r.claim(&t, &d).await.unwrap();
    /// r.release(&t, &d).await.unwrap();
    /// assert_eq!(r.claim(&t, &d).await, Ok(ClaimOutcome::Claimed));
    /// # }
    /// ```
    fn release(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send;

    /// Marks a claim completed. With `holder` `None`, on behalf of whoever holds it (for bare
    /// claims, or a router that completes for its workers):
    /// [`complete`](crate::WorkerRegistryExt::complete). With `Some(worker)`, fenced: only `worker`, the
    /// claim's holder, may complete it: [`complete_by`](crate::WorkerRegistryExt::complete_by), which is
    /// how workers complete.
    ///
    /// Idempotent on a completed claim. Refused with [`RegistryError::ClaimReleased`] if the claim
    /// was released first (its worker died: exactly one of the completion and the release wins),
    /// and [`RegistryError::UnknownClaim`] if there is none.
    ///
    /// Fenced, a worker declared dead whose delivery was admitted again onto another worker gets
    /// [`RegistryError::NotHolder`]; one whose claim was released and not yet re-admitted gets
    /// [`RegistryError::ClaimReleased`] until a sweep hands the delivery over for re-dispatch, and
    /// [`RegistryError::UnknownClaim`] after. A live worker whose delivery was released as stuck
    /// (see [`Maintenance::sweep`]) gets `ClaimReleased` with
    /// [`ReleaseReason::Stuck`](crate::ReleaseReason::Stuck) until the delivery is admitted again,
    /// then `NotHolder`. None of them completes anything.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{
    ///     Admission, ClaimState, DeliveryId, InMemoryRegistry, RegistryError, Target, WorkerId,
    ///     WorkerRegistry,
    /// };
    ///
    /// let r = InMemoryRegistry::default();
    /// let (t, d) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// let Ok(Admission::Assigned(a)) = r.admit_with(&t, &d, None).await else { panic!() };
    /// let stranger = WorkerId::new(a.worker.get() + 1);
    /// let err = r.complete_as(Some(stranger), &t, &d).await.unwrap_err();
    /// assert!(matches!(err, RegistryError::NotHolder { .. }));
    /// r.complete_as(Some(a.worker), &t, &d).await.unwrap();
    /// r.complete_as(None, &t, &d).await.unwrap(); // idempotent
    /// let Ok(Admission::Duplicate(dup)) = r.admit_with(&t, &d, None).await else { panic!() };
    /// assert_eq!(dup.state, ClaimState::Completed);
    /// # }
    /// ```
    fn complete_as(
        &self,
        holder: Option<WorkerId>,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send;

    /// Places `target` on a worker without claiming a delivery: its worker while that one is
    /// active (the worker becomes busy, `new: false`), [`Rejection::TargetDraining`] while it
    /// drains, otherwise a new worker (`new: true`) if fewer than `max_workers` are alive, else
    /// [`Rejection::CapacityFull`]. Each assignment gets a larger
    /// [`FencingToken`](crate::FencingToken) than the target's previous one.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{AssignOutcome, InMemoryRegistry, RegistryConfig, Rejection, Target, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::new(RegistryConfig::builder().max_workers(1).build().unwrap());
    /// let a = Target::new("o/a", 1).unwrap();
    /// let Ok(AssignOutcome::Assigned(first)) = r.assign(&a).await else { panic!() };
    /// let Ok(AssignOutcome::Assigned(again)) = r.assign(&a).await else { panic!() };
    /// assert_eq!(first.worker, again.worker);
    /// assert!(again.token > first.token);
    /// assert_eq!(
    ///     r.assign(&Target::new("o/b", 1).unwrap()).await,
    ///     Ok(AssignOutcome::Rejected(Rejection::CapacityFull { limit: 1 }))
    /// );
    /// # }
    /// ```
    ///
    /// [`Rejection::TargetDraining`]: crate::Rejection::TargetDraining
    /// [`Rejection::CapacityFull`]: crate::Rejection::CapacityFull
    fn assign(
        &self,
        target: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send;

    /// Records a heartbeat now (on the registry's time base) and tells a live worker whether to
    /// carry on ([`HeartbeatAck::Active`]) or finish its loop and exit ([`HeartbeatAck::Draining`]).
    /// A heartbeat clears suspicion (see [`Maintenance::sweep`]).
    ///
    /// Refused with [`RegistryError::WorkerDead`] for a dead worker (it is fenced: its target may
    /// already be on another worker; it must stop) and [`RegistryError::UnknownWorker`] for an
    /// unknown id. A heartbeat racing the sweep that declares the worker dead either lands (the
    /// worker lives) or is refused (it is dead), never both.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{HeartbeatAck, InMemoryRegistry, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// let w = r.register().await.unwrap();
    /// assert_eq!(r.heartbeat(w).await, Ok(HeartbeatAck::Active));
    /// # }
    /// ```
    fn heartbeat(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send;

    /// The worker reports that it started a loop: it is busy. Returns its status; refused for a
    /// dead or unknown worker.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{InMemoryRegistry, Status, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// let w = r.register().await.unwrap();
    /// assert_eq!(r.loop_started(w).await, Ok(Status::Active));
    /// # }
    /// ```
    fn loop_started(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send;

    /// The worker reports that its loop finished: an active worker becomes idle; a draining one is
    /// dead with [`DeadReason::Exited`], its target unassigned and its capacity slot freed.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{AssignOutcome, DeadReason, InMemoryRegistry, Status, Target, WorkerRegistry, WorkerRegistryExt};
    ///
    /// let r = InMemoryRegistry::default();
    /// let Ok(AssignOutcome::Assigned(a)) = r.assign(&Target::new("o/r", 1).unwrap()).await
    /// else { panic!() };
    /// assert_eq!(r.drain(a.worker).await, Ok(Status::Draining));
    /// assert_eq!(r.loop_finished(a.worker).await, Ok(Status::Dead(DeadReason::Exited)));
    /// # }
    /// ```
    fn loop_finished(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send;

    /// Registers a worker that started by itself and pulls work elsewhere (the worker-pool model):
    /// no target, counts against `max_workers`, shares heartbeats, drain, sweep and status with
    /// spawned workers. Its first heartbeat is due within the heartbeat timeout plus
    /// [`startup_grace`](RegistryConfig::startup_grace).
    ///
    /// Refused with [`RegistryError::Rejected`] ([`Rejection::CapacityFull`]) when `max_workers`
    /// are alive.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{DeadReason, InMemoryRegistry, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// let w = r.register().await.unwrap();
    /// assert_eq!(r.deregister(w).await, Ok(DeadReason::Deregistered));
    /// # }
    /// ```
    ///
    /// [`Rejection::CapacityFull`]: crate::Rejection::CapacityFull
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send;

    /// A clean exit: dead with [`DeadReason::Exited`] if it was draining,
    /// [`DeadReason::Deregistered`] if it was active. Its in-flight claims are released.
    fn deregister(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send;

    /// Sets a worker draining, giving its current loop until `deadline` from now to finish: it
    /// gets no new assignment, its heartbeats are still accepted (answered
    /// [`HeartbeatAck::Draining`]), and when its loop finishes (or it deregisters) it is dead with
    /// [`DeadReason::Exited`]. A worker still draining past the deadline is declared dead with
    /// [`DeadReason::DrainTimedOut`] by the next sweep (whatever the brake says), its target
    /// unassigned and its in-flight claims released; its later heartbeats and completions are
    /// refused. The deadline is on registry running time: a stall of the registry moves it out
    /// (see the stall rule on [`Maintenance::sweep`]). An idle worker has no loop to finish and
    /// exits at once.
    ///
    /// Idempotent: draining a draining worker keeps the earlier of the two deadlines. Refused for
    /// a dead or unknown worker.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use worker_registry::{AssignOutcome, InMemoryRegistry, Status, Target, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// let Ok(AssignOutcome::Assigned(a)) = r.assign(&Target::new("o/r", 1).unwrap()).await
    /// else { panic!() };
    /// let status = r.drain_within(a.worker, Duration::from_secs(60)).await;
    /// assert_eq!(status, Ok(Status::Draining));
    /// # }
    /// ```
    fn drain_within(
        &self,
        worker: WorkerId,
        deadline: Duration,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send;

    /// Drains every live worker with the given deadline (router shutdown): busy ones drain, idle
    /// ones exit at once. In a shared backend this drains the workers of every replica; a replica
    /// that shuts down alone drains its own workers one by one instead.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use worker_registry::{InMemoryRegistry, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// r.register().await.unwrap();
    /// let done = r.drain_all_within(Duration::from_secs(10)).await.unwrap();
    /// assert_eq!((done.draining, done.exited), (0, 1));
    /// # }
    /// ```
    fn drain_all_within(
        &self,
        deadline: Duration,
    ) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send;

    /// One worker's current state, read now (not from the snapshot); `Ok(None)` for an unknown id
    /// (never existed, or dead and purged after
    /// [`dead_retention`](RegistryConfig::dead_retention)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{InMemoryRegistry, Status, WorkerId, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// let w = r.register().await.unwrap();
    /// assert_eq!(r.worker(w).await.unwrap().unwrap().status, Status::Active);
    /// assert_eq!(r.worker(WorkerId::new(999_999)).await, Ok(None));
    /// # }
    /// ```
    fn worker(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send;

    /// The latest published snapshot of every worker. **Never blocks and does no I/O**: it is the
    /// snapshot the last sweep published (in a shared backend, as this replica last fetched it,
    /// which its own sweeps keep fresh), at most about one
    /// [`sweep_interval`](RegistryConfig::sweep_interval) old while a
    /// [`Sweeper`](crate::Sweeper) runs. A sweep's snapshot shows the registry after that sweep:
    /// the workers its promotion out of the waiting room created, or placed deliveries on, are
    /// listed as they are then. Its counts always agree with its list, and its
    /// [`version`](StatusSnapshot::version) never goes backwards, with one exception: a shared
    /// backend's handle that finds the server lost or rewound the registry's data
    /// ([`Event::DataLost`](crate::Event::DataLost)) starts its copy over.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{InMemoryRegistry, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// assert_eq!(r.status().version, 0); // nothing swept yet
    /// ```
    fn status(&self) -> Arc<StatusSnapshot>;

    /// This handle's cumulative counters and gauges, for metrics. **Never blocks and does no I/O.**
    /// A shared backend counts what this replica decided (a scraper sums replicas); its gauges come
    /// from the latest snapshot.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{InMemoryRegistry, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// assert_eq!(r.stats().admitted_new, 0);
    /// ```
    fn stats(&self) -> Stats;

    /// What the registry's storage holds unfinished now ([`Audit`]): live workers, claims in
    /// flight, released deliveries not yet handed over for good, deliveries waiting. Unlike
    /// [`stats`](Self::stats) it reads the backend's storage: one consistent read (one atomic step
    /// on a shared backend, taking no lock a decision waits for), whose cost each backend states
    /// (it may be proportional to the unfinished work). For audits, tests and operators: keep it
    /// off a hot path. The default answers [`RegistryError::Unsupported`] (`"audit"`), for a
    /// backend of your own that does not offer it yet; every backend of this crate does.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{DeliveryId, InMemoryRegistry, Target, WorkerRegistry, WorkerRegistryExt};
    ///
    /// let r = InMemoryRegistry::default();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
    /// r.admit(&t, &d).await.unwrap();
    /// let a = r.audit().await.unwrap();
    /// assert_eq!((a.live_workers, a.in_flight, a.unfinished()), (1, 1, 1));
    /// # }
    /// ```
    fn audit(&self) -> impl Future<Output = Result<Audit, RegistryError>> + Send {
        std::future::ready(Err(RegistryError::Unsupported {
            backend: "unknown",
            feature: "audit",
        }))
    }

    /// The configuration this registry runs with.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::config::DEFAULT_MAX_WORKERS;
    /// use worker_registry::{InMemoryRegistry, WorkerRegistry};
    ///
    /// let r = InMemoryRegistry::default();
    /// assert_eq!(r.config().max_workers(), DEFAULT_MAX_WORKERS);
    /// ```
    fn config(&self) -> &RegistryConfig;
}

/// The maintenance pass: liveness, release of dead workers' work, retention, and publication of the
/// status snapshot. Run it on an interval with a [`Sweeper`](crate::Sweeper).
///
/// In a shared backend every replica calls `sweep`; one at a time holds the maintenance lease and
/// does the work, and a replica whose sweeps stop (it died, it stalled) loses the lease to another
/// after the lease's expiry. Every replica's `sweep` also receives released events (below) and
/// refreshes its copy of the snapshot.
///
/// # Released events
///
/// A released event is an in-flight delivery whose worker died, that stayed in flight longer than
/// [`max_in_flight`](RegistryConfig::max_in_flight), or a bare claim that nobody completed. Each
/// is handed to exactly one caller of `sweep` in [`SweepReport::released`], with the payload its
/// delivery was admitted with; that caller re-dispatches it (with
/// [`WorkerRegistry::admit_with`] and that payload, which treats a released pair as new and so
/// makes a second re-dispatch a harmless duplicate) and then calls
/// [`acknowledge`](Self::acknowledge). A shared
/// backend offers an event that was not acknowledged within
/// [`release_ack_timeout`](RegistryConfig::release_ack_timeout) to another replica, so a replica
/// that dies between the two loses nothing. An event nobody acknowledges within
/// [`claim_retention`](RegistryConfig::claim_retention) of its release (its claim is gone by then,
/// so a redelivery is admitted as new anyway) is deleted by the sweeping replica, a bounded number
/// per sweep, counted in [`Stats::released_expired`](crate::Stats::released_expired) and logged with
/// `tracing::warn!` naming its target and delivery: never silently, and never offered again
/// (Redis may drop it up to one sweep interval late). The
/// in-memory backend hands each event over once, in the report of the sweep that released it,
/// and keeps nothing to expire.
pub trait Maintenance: Send + Sync {
    /// Runs one maintenance pass (or, in a shared backend whose lease another replica holds, only
    /// collects this replica's share of released events and refreshes the snapshot; the report says
    /// which with [`SweepReport::swept`]).
    ///
    /// * A live worker silent for longer than
    ///   [`heartbeat_timeout`](RegistryConfig::heartbeat_timeout) (before its first heartbeat: plus
    ///   [`startup_grace`](RegistryConfig::startup_grace)) is declared dead with
    ///   [`DeadReason::MissedHeartbeats`]: its target is unassigned, its capacity slot freed, its
    ///   in-flight claims released. A draining worker past its drain deadline is dead with
    ///   [`DeadReason::DrainTimedOut`].
    /// * **Mass-staleness brake:** when more than
    ///   [`brake_fraction`](RegistryConfig::brake_fraction) of at least
    ///   [`brake_min_workers`](RegistryConfig::brake_min_workers) live workers are silent at once,
    ///   the registry suspects itself (a stall, a paused VM) rather than them: they are marked
    ///   suspect instead of dead. A suspect that heartbeats recovers; one still silent
    ///   [`suspect_grace`](RegistryConfig::suspect_grace) after it was first suspected dies.
    /// * **Stall rule:** time during which the registry itself was not running is never counted
    ///   against its workers. A sweep that comes more than two
    ///   [`sweep_interval`](RegistryConfig::sweep_interval)s after the previous one (of any
    ///   replica; a registry's first sweep has none) measures a stall of everything after the
    ///   first interval, and reports it in [`SweepReport::stall_credited`]. From then on every
    ///   duration a sweep judges leaves out the stalled time it overlaps: a worker's silence since
    ///   its last heartbeat, a delivery's time in flight, a suspect's time under suspicion; a drain
    ///   deadline that had not passed when the stall began moves out by the stall's length. So a
    ///   worker whose heartbeat is simply not due yet when the registry resumes is not dead, and a
    ///   worker that really crashed dies once it has been silent for the timeout of registry
    ///   running time.
    /// * **Stuck deliveries:** a delivery in flight on a live worker for longer than
    ///   [`max_in_flight`](RegistryConfig::max_in_flight) (of registry running time) is released
    ///   for re-dispatch with [`ReleaseReason::Stuck`](crate::ReleaseReason::Stuck), counted in
    ///   [`Stats::claims_stuck`], published as
    ///   [`Event::DeliveryStuck`](crate::Event::DeliveryStuck), and its worker is **drained** with
    ///   the configured [`drain_deadline`](RegistryConfig::drain_deadline) (listed in
    ///   [`SweepReport::drained_stuck`]; an idle one exits at once). The worker is not killed: it
    ///   still heartbeats and may finish its other deliveries, but it takes no new work, is
    ///   replaced once its loop ends, and its drain deadline bounds how long that may take. Its
    ///   late completion of the stuck delivery is refused (see
    ///   [`complete_as`](WorkerRegistry::complete_as)).
    /// * Completed claims past `claim_retention` are forgotten, the oldest beyond
    ///   `max_retained_claims` evicted (among claims completed in the same millisecond, in no
    ///   particular order); dead workers past `dead_retention` are purged.
    /// * A new snapshot is published.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::WorkerRegistryExt;
    /// use std::time::Duration;
    /// use worker_registry::{Admission, DeliveryId, InMemoryRegistry, Maintenance, ManualClock,
    ///     RegistryConfig, Target, WorkerRegistry};
    ///
    /// let clock = ManualClock::new();
    /// let config = RegistryConfig::builder().startup_grace(Duration::ZERO).build().unwrap();
    /// let r = InMemoryRegistry::with_clock(config, clock.clone());
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
    /// r.admit(&t, &d).await.unwrap();
    ///
    /// clock.advance(r.config().heartbeat_timeout() + Duration::from_millis(1));
    /// let report = r.sweep().await.unwrap();
    /// assert_eq!(report.died.len(), 1);
    /// assert_eq!(report.released[0].delivery, d); // re-dispatch it, then:
    /// r.acknowledge(&report.released).await.unwrap();
    /// # }
    /// ```
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send;

    /// Confirms that these released events (from this handle's sweep reports) were re-dispatched
    /// or otherwise accounted for: they are not offered again. Acknowledging an event twice, or one
    /// another replica already acknowledged, is not an error.
    fn acknowledge(
        &self,
        released: &[ReleasedEvent],
    ) -> impl Future<Output = Result<(), RegistryError>> + Send;

    /// Resolves when the next sweep has work that should not wait for its interval: deliveries
    /// promoted out of the waiting room by a death or an exit (placed already, handed over in the
    /// next report). The [`Sweeper`](crate::Sweeper) sweeps at once when it resolves. A backend
    /// without such work never resolves it (the default).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use worker_registry::{
    ///     Admission, DeliveryId, InMemoryRegistry, Maintenance, RegistryConfig, Target, WorkerRegistry,
    ///     WorkerRegistryExt,
    /// };
    ///
    /// let config = RegistryConfig::builder().max_workers(1).max_waiting(8).build().unwrap();
    /// let r = InMemoryRegistry::new(config);
    /// let holder = r.register().await.unwrap();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
    /// assert!(matches!(r.admit(&t, &d).await.unwrap(), Admission::Waiting(_)));
    /// r.deregister(holder).await.unwrap(); // the slot is the waiting delivery's at once
    /// tokio::time::timeout(Duration::from_secs(5), r.wake()).await.unwrap();
    /// assert_eq!(r.sweep().await.unwrap().released.len(), 1);
    /// # }
    /// ```
    fn wake(&self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// Lifecycle events (feature `tokio`): every handle's subscribers see every event of the registry,
/// whichever replica caused it.
///
/// Events about one worker arrive in the order of its transitions (`WorkerCreated` first,
/// `WorkerDied` last). Publishing never waits for a subscriber; one that falls more than
/// [`EVENT_BUFFER`](crate::events::EVENT_BUFFER) events behind loses the oldest and is told how many. A
/// shared backend may lose events while its connection is down; it reports those as missed too.
#[cfg(feature = "tokio")]
pub trait Subscribe: Send + Sync {
    /// Subscribes to every event published from now on.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Event, InMemoryRegistry, Subscribe, WorkerRegistry};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let r = InMemoryRegistry::default();
    /// let mut events = r.subscribe();
    /// let w = r.register().await.unwrap();
    /// assert_eq!(events.recv().await, Ok(Event::WorkerCreated { worker: w, target: None }));
    /// # }
    /// ```
    fn subscribe(&self) -> crate::Subscription;
}
