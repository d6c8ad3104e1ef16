//! The router's state and its decisions, over any registry backend.
//!
//! * [`App`] owns a [`DynRegistry`] (the backend chosen at start, see [`crate::backend`]), its
//!   [`Platform`] (where the containers run: [`crate::containers`], and [`crate::remote`] for
//!   replicas in other processes), and the router's metrics. [`App::dispatch`] is the whole
//!   decision for one (target, delivery) pair: `admit`, then hand the event to the worker by id,
//!   starting its container (a tokio task) only if this admission created the worker
//!   (`new: true`), so that no worker ever has two containers, whichever replicas its events
//!   reach.
//! * [`App::after_sweep`] is the [`Sweeper`](worker_registry::Sweeper)'s callback: released events
//!   (their worker died) are admitted again, those that cannot be placed yet are kept (and not
//!   acknowledged, so a shared backend may offer them to another replica).
//! * Shutdown ([`crate::server::Server::shutdown`]) refuses new deliveries, drains every worker
//!   with a deadline, lets draining workers finish their queues, stops what is still running at the
//!   deadline (its claims are released through the registry) and accounts for every delivery that
//!   was accepted but not completed: [`Unfinished`].
//!
//! Every registry call is awaited; a backend that cannot answer is a typed error, answered 503 with
//! `Retry-After` (a delivery whose admission failed was not accepted), never a panic.

use crate::backend::RegistryChoice;
use crate::body::BodyLimits;
use crate::containers::{Containers, CrashOutcome, Handed, ReplicaTag};
use crate::metrics::RouterMetrics;
use crate::remote::{Handover, Remote};
use crate::routing::{Decision, Policy};
use crate::store::Store;
use crate::worker::{self, Exit, Job, Timings};

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::AbortHandle;
use worker_registry::metrics::Metrics;
use worker_registry::{
    Admission, AlreadyClaimed, Assignment, ClaimOutcome, Deferred, DeliveryId, DrainAll,
    DynRegistry, Maintenance, RegistryError, Rejection, ReleaseReason, ReleasedEvent, Status,
    SweepReport, Target, WorkerId, WorkerRegistry,
};

/// Events a worker may have queued before the router answers 503 for its target.
pub const DEFAULT_MAILBOX: usize = 64;
/// The largest `--mailbox`: a worker with more queued events than this is better replaced by a
/// 503 and GitHub's (or the reconciler's) retry.
pub const MAX_MAILBOX: usize = 65_536;

/// How the router behaves (the registry's own settings are in its
/// [`RegistryConfig`](worker_registry::RegistryConfig)).
#[derive(Clone)]
pub struct Options {
    /// The webhook secret. `None` accepts unsigned deliveries: only pass `None` for a loopback bind.
    pub webhook_secret: Option<Arc<[u8]>>,
    /// If set, the admin API and `POST /debug/...` need `Authorization: Bearer <token>`.
    pub admin_token: Option<String>,
    /// How long a simulated worker works per event.
    pub work: Duration,
    /// How long a simulated worker waits for another event before it leaves.
    pub idle: Duration,
    /// Queued events per worker before 503 (1 ..= [`MAX_MAILBOX`]).
    pub mailbox: usize,
    /// Which events start, reach or drain a pull request's worker.
    pub policy: Arc<Policy>,
    /// How delivery bodies are read (size cap, time limit, memory budget).
    pub body: BodyLimits,
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field(
                "webhook_secret",
                &self.webhook_secret.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("work", &self.work)
            .field("idle", &self.idle)
            .field("mailbox", &self.mailbox)
            .field("policy", &self.policy)
            .field("body", &self.body)
            .finish()
    }
}

/// Who asked for an admission (a label of the `webhook_router_admissions_total` metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A webhook delivery.
    Webhook,
    /// A released event placed again by the sweeper callback.
    Redispatch,
}

impl Source {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Webhook => "webhook",
            Self::Redispatch => "redispatch",
        }
    }
}

/// What the router did with one (target, delivery) pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatch {
    /// Placed on a worker, which has it queued.
    Assigned(Assignment),
    /// A redelivery of something in flight or recently completed.
    Duplicate(AlreadyClaimed),
    /// The registry refused it (no claim is left behind).
    Rejected(Rejection),
    /// The worker's mailbox is full; the claim was released again.
    Backlog {
        /// The worker.
        worker: WorkerId,
    },
    /// The worker's container (on another replica) could not be reached; the claim was released
    /// again.
    Unreachable {
        /// The worker.
        worker: WorkerId,
        /// Why.
        reason: String,
    },
    /// The router is shutting down.
    Closing,
    /// The registry's backend could not answer: the delivery was not accepted.
    Unavailable(RegistryError),
}

impl Dispatch {
    /// The outcome as the router answers it (and counts it): `assigned`, `duplicate`, `capacity`
    /// (no capacity, or the worker's queue is full), `draining`, `closing` or `unavailable`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Assigned(_) => "assigned",
            Self::Duplicate(_) => "duplicate",
            Self::Rejected(Rejection::CapacityFull { .. }) | Self::Backlog { .. } => "capacity",
            Self::Rejected(_) => "draining",
            Self::Closing => "closing",
            Self::Unavailable(_) | Self::Unreachable { .. } => "unavailable",
        }
    }

    /// Every value of [`outcome`](Self::outcome).
    pub const OUTCOMES: [&'static str; 6] = [
        "assigned",
        "duplicate",
        "capacity",
        "draining",
        "closing",
        "unavailable",
    ];
}

/// What the router did with one pull request of a delivery, under the routing policy's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetOutcome {
    /// `start`, or `reach` with a live worker: the admission's result.
    Dispatched(Dispatch),
    /// `drain`: the worker got the event as its last one and is draining.
    Drained {
        /// The assignment of that last event.
        assignment: Assignment,
    },
    /// `drain` of a worker that already drains: nothing more to do.
    AlreadyDraining {
        /// The worker.
        worker: WorkerId,
    },
    /// `reach` or `drain`, and the pull request has no live worker: nothing is started.
    NoWorker(Decision),
    /// The policy ignores this event.
    Ignored,
}

/// Why an accepted delivery was not completed before the router stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnfinishedWhy {
    /// Its worker was still busy (or had it queued) at the shutdown deadline: the worker was
    /// stopped and deregistered, which released the claim through the registry.
    StoppedAtDeadline {
        /// The worker.
        worker: WorkerId,
    },
    /// Its worker died and the registry released it; it was not placed again before the router
    /// stopped.
    Released {
        /// Why the registry released it.
        reason: ReleaseReason,
    },
}

impl fmt::Display for UnfinishedWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StoppedAtDeadline { worker } => {
                write!(f, "worker {worker} was stopped at the shutdown deadline")
            }
            Self::Released { reason } => {
                write!(f, "released ({reason}) and not re-dispatched before exit")
            }
        }
    }
}

/// An accepted delivery that was not completed before the router stopped. Its claim is released in
/// the registry: a shared backend's other replicas re-dispatch it (or the next start, if the
/// backend outlives the process); with the in-memory backend it is gone with the process, and
/// GitHub does not redeliver on its own: redeliver it by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// The target.
    pub target: Target,
    /// The delivery (`X-GitHub-Delivery`).
    pub delivery: DeliveryId,
    /// Why it was not completed.
    pub why: UnfinishedWhy,
}

/// Where a router's containers run, and how it reaches those of other replicas.
#[derive(Clone)]
pub struct Platform {
    /// The containers of this process (shared by the replicas of one process).
    pub containers: Arc<Containers>,
    /// With replicas in other processes: the owner records and forwarding.
    pub remote: Option<Remote>,
}

impl Platform {
    /// A platform of this router's own: one process, one replica.
    pub fn local(mailbox: usize) -> Self {
        Self {
            containers: Arc::new(Containers::new(mailbox)),
            remote: None,
        }
    }

    /// The platform of a replica in its own process on the shared backend `choice` (registry
    /// `name`): its own containers, and the other replicas' reached through the owner records
    /// next to the registry, this one being reachable at `advertise`; `token` guards the internal
    /// endpoint (the admin token); `heartbeat` (the registry's interval) bounds the waits. For the
    /// in-memory backend, [`local`](Self::local).
    pub async fn for_backend(
        choice: &RegistryChoice,
        name: &str,
        advertise: &str,
        token: Option<String>,
        heartbeat: Duration,
        mailbox: usize,
    ) -> Result<Self, String> {
        let mut platform = Self::local(mailbox);
        if let Some(store) = Store::open(choice, name).await.map_err(|e| {
            format!("cannot open the router's records next to the {choice} registry: {e}")
        })? {
            platform.remote = Some(Remote::new(store, advertise, token, heartbeat)?);
        }
        Ok(platform)
    }
}

pub(crate) struct Inner {
    pub(crate) registry: DynRegistry,
    pub(crate) opts: Options,
    timings: Timings,
    /// Every container of this process, by worker id.
    containers: Arc<Containers>,
    /// This replica's tag in `containers`.
    replica: ReplicaTag,
    remote: Option<Remote>,
    /// Which worker of this router serves a target (for `reach` and `drain` decisions).
    targets: DashMap<Target, WorkerId>,
    tasks: DashMap<WorkerId, AbortHandle>,
    closing: AtomicBool,
    /// Worker tasks running now (shutdown waits for 0).
    running: watch::Sender<usize>,
    /// Set at the shutdown deadline: every worker stops at once.
    stop: watch::Sender<bool>,
    pub(crate) metrics: RouterMetrics,
    /// The Prometheus registry (the registry's and the router's metrics), until the HTTP app takes it.
    export: Mutex<Option<Metrics>>,
    /// Released events not yet placed again (capacity full, or shutting down).
    pending: Mutex<Vec<ReleasedEvent>>,
    /// Events handed back by workers stopped at the shutdown deadline.
    stopped: Mutex<Vec<Unfinished>>,
    redispatched: AtomicU64,
}

/// The router's state; cheap to clone.
#[derive(Clone)]
pub struct App {
    pub(crate) inner: Arc<Inner>,
}

impl App {
    /// A router over `registry` (any backend), alone in its process.
    pub fn new(registry: DynRegistry, opts: Options) -> Self {
        let platform = Platform::local(opts.mailbox);
        Self::with_platform(registry, opts, platform)
    }

    /// A router over `registry` on `platform` (shared with the other replicas of this process, or
    /// reaching replicas in other processes).
    pub fn with_platform(registry: DynRegistry, opts: Options, platform: Platform) -> Self {
        let timings = Timings {
            heartbeat: registry.config().heartbeat_interval(),
            work: opts.work,
            idle: opts.idle,
        };
        let mut export = Metrics::new(&registry);
        let metrics = RouterMetrics::new(export.returned());
        metrics.register(&mut export);
        Self {
            inner: Arc::new(Inner {
                export: Mutex::new(Some(export)),
                metrics,
                registry,
                timings,
                opts,
                replica: platform.containers.join(),
                containers: platform.containers,
                remote: platform.remote,
                targets: DashMap::new(),
                tasks: DashMap::new(),
                closing: AtomicBool::new(false),
                running: watch::Sender::new(0),
                stop: watch::Sender::new(false),
                pending: Mutex::new(Vec::new()),
                stopped: Mutex::new(Vec::new()),
                redispatched: AtomicU64::new(0),
            }),
        }
    }

    /// The router's own metrics.
    pub fn metrics(&self) -> &RouterMetrics {
        &self.inner.metrics
    }

    /// The Prometheus registry to serve, once (the HTTP app takes it; add more metrics first).
    pub fn take_metrics(&self) -> Option<Metrics> {
        self.inner.export.lock().ok().and_then(|mut m| m.take())
    }

    /// The registry.
    pub fn registry(&self) -> &DynRegistry {
        &self.inner.registry
    }

    /// The router's options.
    pub fn options(&self) -> &Options {
        &self.inner.opts
    }

    /// The containers of this process.
    pub fn containers(&self) -> &Arc<Containers> {
        &self.inner.containers
    }

    /// This replica's tag among them.
    pub fn replica(&self) -> ReplicaTag {
        self.inner.replica
    }

    /// How it reaches other processes' containers, if it does.
    pub fn remote(&self) -> Option<&Remote> {
        self.inner.remote.as_ref()
    }

    /// Released events admitted again so far.
    pub fn redispatched(&self) -> u64 {
        // Relaxed: a statistic; nothing is published through it.
        self.inner.redispatched.load(Ordering::Relaxed)
    }

    /// Released events waiting to be placed again.
    pub fn pending_redispatch(&self) -> usize {
        self.inner.pending.lock().map_or(0, |p| p.len())
    }

    /// Worker tasks running now.
    pub fn running_workers(&self) -> usize {
        *self.inner.running.borrow()
    }

    /// Whether shutdown has begun (deliveries are refused with 503).
    pub fn is_closing(&self) -> bool {
        // Acquire: pairs with the Release in `begin_shutdown`.
        self.inner.closing.load(Ordering::Acquire)
    }

    /// Admits one (target, delivery) pair and hands it to the target's worker.
    ///
    /// Only the admission that created the worker (`new: true`) starts its container; every event
    /// goes through the worker's bounded mailbox, found by id on the platform (or on its owner
    /// replica).
    pub async fn dispatch(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        source: Source,
    ) -> Dispatch {
        let d = self.place(target, delivery).await;
        self.inner.metrics.admission(source, d.outcome());
        d
    }

    async fn place(&self, target: &Target, delivery: &DeliveryId) -> Dispatch {
        // A delivery that sees the flag clear may still race with the drain, which is fine: it is
        // caught below.
        if self.is_closing() {
            return Dispatch::Closing;
        }
        let a = match self.inner.registry.admit(target, delivery).await {
            Ok(Admission::Assigned(a)) => a,
            Ok(Admission::Duplicate(d)) => return Dispatch::Duplicate(d),
            Ok(Admission::Rejected(r)) => return Dispatch::Rejected(r),
            Err(e) => {
                tracing::warn!(%target, %delivery, "admission failed, answering 503: {e}");
                return Dispatch::Unavailable(e);
            }
        };
        self.inner.targets.insert(target.clone(), a.worker);
        if a.new {
            self.start_container(a.worker, target, delivery).await;
        }
        // Shutdown began between the check and the admission, so the drain may have missed this
        // worker: drain it now (it is busy with this event, so it runs it and exits).
        if self.is_closing() {
            let deadline = self.inner.registry.config().drain_deadline();
            let _ = self.inner.registry.drain_within(a.worker, deadline).await;
        }
        let job = Job {
            target: target.clone(),
            event: delivery.clone(),
            token: a.token,
        };
        match self.hand_over(a.worker, job).await {
            Handover::Queued => Dispatch::Assigned(a),
            Handover::Full => {
                // Undo the claim so a redelivery is admitted later; count it as refused, not
                // admitted, since that is what the router answers.
                match self.inner.registry.release(target, delivery).await {
                    Ok(()) => self.inner.metrics.returned.record(&a),
                    Err(e) => tracing::warn!(
                        %target, %delivery,
                        "could not release the claim of a delivery refused for a full queue ({e}); \
                         the registry releases it after max_in_flight"
                    ),
                }
                Dispatch::Backlog { worker: a.worker }
            }
            // The container is gone without a clean exit (crashed, fenced a moment ago, stopped at
            // shutdown, or died with its replica): the registry still counts the event as held by
            // that worker, so the sweep that declares it dead releases it and a sweeper callback
            // re-dispatches it.
            Handover::Held => Dispatch::Assigned(a),
            Handover::Unreachable(reason) => {
                match self.inner.registry.release(target, delivery).await {
                    Ok(()) => {
                        tracing::warn!(%target, %delivery, worker = %a.worker, "answering 503: {reason}");
                        Dispatch::Unreachable {
                            worker: a.worker,
                            reason,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(
                            %target, %delivery, worker = %a.worker,
                            "{reason}, and the claim could not be released ({e}): it stays with the worker, which releases it when it dies or exits"
                        );
                        Dispatch::Assigned(a)
                    }
                }
            }
        }
    }

    /// Starts the container of a worker this router's admission of `delivery` just created, and
    /// (with replicas in other processes) records this replica as its owner.
    async fn start_container(&self, id: WorkerId, target: &Target, delivery: &DeliveryId) {
        let Some(started) = self
            .inner
            .containers
            .start(id, self.inner.replica, (target, delivery))
        else {
            tracing::error!(worker = %id, "a container for this worker was started already: not starting a second one");
            return;
        };
        self.spawn_worker(id, started.jobs, started.crash);
        if let Some(remote) = &self.inner.remote {
            remote.publish(&self.inner.containers, id).await;
        }
    }

    /// Hands `job` to worker `id`'s container: on this process's platform (parked for the container
    /// to come if it is not started yet and every replica is in this process), else on its owner
    /// replica.
    async fn hand_over(&self, id: WorkerId, job: Job) -> Handover {
        let park = self.inner.remote.is_none();
        match self.inner.containers.hand(id, job, park) {
            Handed::Queued => Handover::Queued,
            Handed::Full => Handover::Full,
            Handed::Stopped => Handover::Held,
            Handed::Absent(job) => match &self.inner.remote {
                Some(remote) => remote.forward(&self.inner.containers, id, job).await,
                // Not reached: without replicas elsewhere the event was parked.
                None => Handover::Held,
            },
        }
    }

    fn spawn_worker(&self, id: WorkerId, jobs: mpsc::Receiver<Job>, crash: Arc<Notify>) {
        let app = self.clone();
        let w = worker::Worker {
            registry: self.inner.registry.clone(),
            id,
            jobs,
            crash,
            stop: self.inner.stop.subscribe(),
            timings: self.inner.timings,
        };
        self.inner.running.send_modify(|n| *n += 1);
        self.inner.containers.ledger().running_up();
        tracing::info!(worker = %id, "container started");
        let task = tokio::spawn(async move {
            // Decrements the running count however the task ends (a panic included).
            let _running = RunningGuard(app.clone(), id);
            let exit = w.run().await;
            tracing::info!(worker = %id, exit = exit.as_str(), "container stopped");
            app.inner.metrics.exit(exit.as_str());
            // A crashed container leaves its record (a killed one could not remove it): events
            // forwarded meanwhile are answered "stopped" and stay with the worker until the sweep
            // declares it dead and releases them. Any other end is the worker's death.
            let dead = !matches!(exit, Exit::Crashed);
            if let Exit::Stopped(jobs) = exit {
                if let Ok(mut stopped) = app.inner.stopped.lock() {
                    stopped.extend(jobs.into_iter().map(|j| Unfinished {
                        target: j.target,
                        delivery: j.event,
                        why: UnfinishedWhy::StoppedAtDeadline { worker: id },
                    }));
                }
            }
            if let (true, Some(remote)) = (dead, &app.inner.remote) {
                remote.forget(&[id]).await;
            }
        });
        self.inner.tasks.insert(id, task.abort_handle());
    }

    /// The live worker that serves `target`, if there is one: this router's own (checked live in the
    /// registry), else one the published snapshot lists (another replica's, with a shared backend).
    pub async fn live_worker_of(&self, target: &Target) -> Result<Option<WorkerId>, RegistryError> {
        let local = self.inner.targets.get(target).map(|w| *w);
        if let Some(w) = local {
            match self.inner.registry.worker(w).await? {
                Some(info) if info.status.is_alive() => return Ok(Some(w)),
                _ => {
                    self.inner.targets.remove_if(target, |_, v| *v == w);
                }
            }
        }
        // Only when this router has none; the snapshot holds at most max_workers live workers.
        let snapshot = self.inner.registry.status();
        Ok(snapshot
            .workers
            .iter()
            .find(|w| w.status.is_alive() && w.target.as_ref() == Some(target))
            .map(|w| w.id))
    }

    /// A `reach` or `drain` event whose pull request has no worker is handled by doing nothing, and
    /// recorded as handled (a bare claim, completed at once), so that a redelivery is answered as
    /// the duplicate it is, whatever has happened to workers since.
    async fn handled_without_worker(
        &self,
        decision: Decision,
        target: &Target,
        delivery: &DeliveryId,
    ) -> TargetOutcome {
        match self.inner.registry.claim(target, delivery).await {
            Ok(ClaimOutcome::Claimed) => match self.inner.registry.complete(target, delivery).await
            {
                Ok(()) => TargetOutcome::NoWorker(decision),
                // Unrecorded: the bare claim expires after the heartbeat timeout; answer 503 so
                // that the delivery is sent again rather than counted as handled.
                Err(e) => TargetOutcome::Dispatched(Dispatch::Unavailable(e)),
            },
            Ok(ClaimOutcome::AlreadyClaimed(d)) => {
                TargetOutcome::Dispatched(Dispatch::Duplicate(d))
            }
            Err(e) => TargetOutcome::Dispatched(Dispatch::Unavailable(e)),
        }
    }

    /// Carries out the routing policy's `decision` for one pull request of a delivery.
    pub async fn apply(
        &self,
        decision: Decision,
        target: &Target,
        delivery: &DeliveryId,
    ) -> TargetOutcome {
        match decision {
            Decision::Ignore => TargetOutcome::Ignored,
            Decision::Start => {
                TargetOutcome::Dispatched(self.dispatch(target, delivery, Source::Webhook).await)
            }
            Decision::Reach | Decision::Drain => {
                if self.is_closing() {
                    return TargetOutcome::Dispatched(Dispatch::Closing);
                }
                match self.live_worker_of(target).await {
                    Err(e) => TargetOutcome::Dispatched(Dispatch::Unavailable(e)),
                    Ok(None) => {
                        self.handled_without_worker(decision, target, delivery)
                            .await
                    }
                    Ok(Some(_)) if decision == Decision::Reach => TargetOutcome::Dispatched(
                        self.dispatch(target, delivery, Source::Webhook).await,
                    ),
                    Ok(Some(_)) => match self.dispatch(target, delivery, Source::Webhook).await {
                        // The worker (or, if it died a moment ago, a new one) runs this event last.
                        Dispatch::Assigned(a) => {
                            match self.inner.registry.drain(a.worker).await {
                                Ok(status) => {
                                    tracing::info!(%target, worker = %a.worker, %status, "pull request closed: worker drained")
                                }
                                Err(e) => {
                                    tracing::warn!(%target, worker = %a.worker, "could not drain the worker of a closed pull request: {e}")
                                }
                            }
                            TargetOutcome::Drained { assignment: a }
                        }
                        Dispatch::Rejected(Rejection::TargetDraining { worker }) => {
                            TargetOutcome::AlreadyDraining { worker }
                        }
                        other => TargetOutcome::Dispatched(other),
                    },
                }
            }
        }
    }

    /// Makes a worker's container crash: it stops heartbeating and working, without telling the
    /// registry, so the sweep declares it dead after the heartbeat timeout and its events are
    /// released and re-dispatched.
    pub async fn crash(&self, id: WorkerId) -> Result<(), CrashError> {
        let info = self
            .inner
            .registry
            .worker(id)
            .await
            .map_err(CrashError::Unavailable)?
            .ok_or(CrashError::Unknown(id))?;
        if let Status::Dead(_) = info.status {
            return Err(CrashError::Dead(id, info.status));
        }
        match self.inner.containers.crash(id) {
            CrashOutcome::Crashed => {
                tracing::warn!(worker = %id, "crashing container on request");
                Ok(())
            }
            CrashOutcome::Stopped => Err(CrashError::AlreadyStopped(id)),
            CrashOutcome::NotHere => Err(CrashError::NoContainer(id)),
        }
    }

    /// The sweeper callback: re-dispatch released events (keeping, and deferring, those that cannot
    /// be placed yet), then forget the mailboxes of dead workers whose task has stopped.
    pub async fn after_sweep(&self, report: SweepReport) -> Deferred {
        for (id, reason) in &report.died {
            tracing::warn!(worker = %id, %reason, "worker declared dead");
        }
        self.inner.containers.ledger().released(&report.released);
        if let Some(remote) = &self.inner.remote {
            // Their owners may be gone (that may be why they died): nobody else forgets them.
            let died: Vec<WorkerId> = report.died.iter().map(|(id, _)| *id).collect();
            remote.forget(&died).await;
        }
        let mut queue = self
            .inner
            .pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default();
        let known: HashSet<(Target, DeliveryId)> = queue
            .iter()
            .map(|e| (e.target.clone(), e.delivery.clone()))
            .collect();
        // A shared backend may offer a deferred event again: keep one copy.
        queue.extend(
            report
                .released
                .iter()
                .filter(|e| !known.contains(&(e.target.clone(), e.delivery.clone())))
                .cloned(),
        );
        let mut placed_late = Vec::new();
        let mut still = Vec::new();
        let fresh: HashSet<(Target, DeliveryId)> = report
            .released
            .iter()
            .map(|e| (e.target.clone(), e.delivery.clone()))
            .collect();
        for event in queue {
            match self
                .dispatch(&event.target, &event.delivery, Source::Redispatch)
                .await
            {
                Dispatch::Assigned(a) => {
                    tracing::info!(target = %event.target, delivery = %event.delivery, worker = %a.worker, "released event re-dispatched");
                    // Relaxed: a statistic.
                    self.inner.redispatched.fetch_add(1, Ordering::Relaxed);
                    self.inner.metrics.redispatched.inc();
                    if !fresh.contains(&(event.target.clone(), event.delivery.clone())) {
                        placed_late.push(event);
                    }
                }
                // Someone (a GitHub redelivery) placed it again first.
                Dispatch::Duplicate(_) => {
                    if !fresh.contains(&(event.target.clone(), event.delivery.clone())) {
                        placed_late.push(event);
                    }
                }
                Dispatch::Rejected(_)
                | Dispatch::Backlog { .. }
                | Dispatch::Unreachable { .. }
                | Dispatch::Closing
                | Dispatch::Unavailable(_) => still.push(event),
            }
        }
        // Events deferred by an earlier sweep and placed now are acknowledged here (this sweep's
        // own are acknowledged by the sweeper, unless deferred below).
        if !placed_late.is_empty() {
            if let Err(e) = self.inner.registry.acknowledge(&placed_late).await {
                tracing::warn!(
                    "acknowledging {} re-dispatched events failed: {e}",
                    placed_late.len()
                );
            }
        }
        let deferred: Vec<ReleasedEvent> = still
            .iter()
            .filter(|e| fresh.contains(&(e.target.clone(), e.delivery.clone())))
            .cloned()
            .collect();
        if let Ok(mut p) = self.inner.pending.lock() {
            p.extend(still);
        }
        self.forget_stopped_workers().await;
        Deferred::new(deferred)
    }

    /// Forgets the mailbox (and target entry) of every worker without a running container (stopped,
    /// or parked for an owner that never came) that the registry no longer counts alive. A crashed
    /// container's mailbox stays until the registry has declared the worker dead, so that events
    /// sent to it meanwhile are answered "stopped" and stay with the worker, to be released.
    async fn forget_stopped_workers(&self) {
        for id in self.inner.containers.without_container() {
            let alive = match self.inner.registry.worker(id).await {
                Ok(info) => info.is_some_and(|w| w.status.is_alive()),
                // Ask again after the next sweep.
                Err(_) => true,
            };
            if !alive {
                self.inner.containers.forget(id);
                self.inner.targets.retain(|_, w| *w != id);
            }
        }
    }

    /// The Ctrl-C path, first half: refuse new deliveries (503) and drain this replica's workers
    /// (those whose containers it started) with `deadline`, one by one, leaving other replicas'
    /// alone; closing their mailboxes lets idle workers leave at once and draining ones leave once
    /// their queue is done.
    pub async fn begin_shutdown(&self, deadline: Duration) -> DrainAll {
        // Release: pairs with the Acquire in `is_closing`.
        self.inner.closing.store(true, Ordering::Release);
        let mut drained = DrainAll::default();
        for id in self.inner.containers.owned_by(self.inner.replica) {
            match self.inner.registry.drain_within(id, deadline).await {
                Ok(Status::Draining) => drained.draining += 1,
                Ok(_) => drained.exited += 1,
                // Dead already (crashed and swept), or the backend is away: its claims are
                // released when the registry declares it dead.
                Err(e) => tracing::debug!(worker = %id, "not drained: {e}"),
            }
        }
        self.inner.containers.close_owned_by(self.inner.replica);
        drained
    }

    /// A killed replica: its containers stop at once, as if their process had been killed (no
    /// goodbye to the registry; the sweep of another replica declares them dead). Returns how many
    /// were running.
    pub fn kill_containers(&self) -> usize {
        // Release: pairs with the Acquire in `is_closing`; nothing new is placed from now on.
        self.inner.closing.store(true, Ordering::Release);
        let tasks: Vec<AbortHandle> = self.inner.tasks.iter().map(|t| t.clone()).collect();
        for t in &tasks {
            t.abort();
        }
        tasks.len()
    }

    /// Waits until every worker task has stopped, or `deadline` passes; returns how many still run.
    pub async fn wait_workers(&self, deadline: Duration) -> usize {
        let mut rx = self.inner.running.subscribe();
        let _ = tokio::time::timeout(deadline, rx.wait_for(|n| *n == 0)).await;
        self.running_workers()
    }

    /// The shutdown deadline passed: every worker still running stops now, deregisters (releasing
    /// its claims through the registry) and hands back what it did not finish. Waits up to `grace`
    /// for that, then aborts what is left; returns how many had to be aborted.
    pub async fn stop_workers(&self, grace: Duration) -> usize {
        self.inner.stop.send_replace(true);
        let left = self.wait_workers(grace).await;
        if left > 0 {
            for t in self.inner.tasks.iter() {
                t.abort();
            }
            let _ = self.wait_workers(grace).await;
        }
        left
    }

    /// Everything accepted and not completed that this router knows of, once its workers are
    /// stopped: what stopped workers handed back, released events not re-dispatched, and
    /// `released` (the final sweep's), one entry per delivery.
    pub(crate) fn unfinished(&self, released: &[ReleasedEvent]) -> Vec<Unfinished> {
        let mut out: Vec<Unfinished> = self
            .inner
            .stopped
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let pending = self
            .inner
            .pending
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default();
        let mut seen: HashSet<(Target, DeliveryId)> = out
            .iter()
            .map(|u| (u.target.clone(), u.delivery.clone()))
            .collect();
        for e in pending.iter().chain(released) {
            if seen.insert((e.target.clone(), e.delivery.clone())) {
                out.push(Unfinished {
                    target: e.target.clone(),
                    delivery: e.delivery.clone(),
                    why: UnfinishedWhy::Released { reason: e.reason },
                });
            }
        }
        out
    }
}

/// Keeps the running-task count (see [`App::wait_workers`]).
struct RunningGuard(App, WorkerId);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.inner.tasks.remove(&self.1);
        self.0.inner.containers.ledger().running_down();
        self.0
            .inner
            .running
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Why a crash request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashError {
    /// No such worker (404).
    Unknown(WorkerId),
    /// The worker is dead already (409).
    Dead(WorkerId, Status),
    /// The worker has no container in this router (409).
    NoContainer(WorkerId),
    /// Its container has stopped already (409).
    AlreadyStopped(WorkerId),
    /// The registry's backend could not answer (503).
    Unavailable(RegistryError),
}

impl fmt::Display for CrashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(id) => write!(f, "unknown worker {id}"),
            Self::Dead(id, status) => write!(f, "worker {id} is {status}"),
            Self::NoContainer(id) => write!(f, "worker {id} has no container in this router"),
            Self::AlreadyStopped(id) => write!(f, "worker {id}'s container has stopped already"),
            Self::Unavailable(e) => write!(f, "{e}"),
        }
    }
}
