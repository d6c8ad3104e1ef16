//! The workers' lifecycle ([`Lifecycle`]): a worker's container started through the router's
//! [`Launcher`] by whichever path wins the worker's start claim (the
//! admission that created the worker, or the retry of one whose reply was lost), its exit awaited
//! and accounted, crashed on request (`POST /debug/...`), killed once the registry declared it
//! dead, its mailbox forgotten once the registry no longer counts it alive; and at shutdown, this
//! replica's workers drained, stopped at the deadline (what they hand back goes to
//! [`Outstanding`]) or, for a killed replica, aborted. It holds the launcher, the worker
//! protocol's state, the containers, the tasks and controls of the running workers, and which
//! worker serves each pull request.

use crate::containers::{Claim, Containers, CrashOutcome, ReplicaTag};
use crate::launcher::{Control, Exit, Launch, Launched, Launcher};
use crate::mailbox::{self, Mailbox, OverflowMetrics};
use crate::metrics::RouterMetrics;
use crate::outcome::CrashError;
use crate::outstanding::Outstanding;
use crate::protocol::Protocol;
use crate::remote::{Owner, Remote, StartClaim};

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use worker_registry::{
    DeliveryId, DrainAll, DynRegistry, FencingToken, RegistryError, Status, Target, WorkerId,
    WorkerRegistry,
};

/// The workers' lifecycle on one router replica (see the [module documentation](self)): what
/// starts them, the containers they run in, and the tasks that await their exits.
pub struct Lifecycle {
    registry: DynRegistry,
    metrics: RouterMetrics,
    /// Every container of this process, by worker id.
    containers: Arc<Containers>,
    /// This replica's tag in `containers`.
    replica: ReplicaTag,
    remote: Option<Remote>,
    /// What starts this router's workers.
    launcher: Arc<dyn Launcher>,
    /// The worker protocol's state (served when a worker listener is given).
    protocol: Arc<Protocol>,
    /// Which worker of this router serves a target (for `reach` and `drain` decisions).
    targets: DashMap<Target, WorkerId>,
    /// The task awaiting each running worker's exit (aborting it ends the worker with no
    /// goodbye: a killed replica).
    tasks: DashMap<WorkerId, AbortHandle>,
    /// Each running worker's control (crash on request, stop at the shutdown deadline).
    controls: DashMap<WorkerId, Box<dyn Control>>,
    /// Worker tasks running now (shutdown waits for 0).
    running: watch::Sender<usize>,
    /// Set at the shutdown deadline: every worker stops at once (those running are told through
    /// their control; one launched later is told as soon as it is).
    stop: watch::Sender<bool>,
    /// Where a worker stopped at the deadline leaves the events it hands back.
    outstanding: Arc<Outstanding>,
}

/// What a [`Lifecycle`] is built from.
pub(crate) struct Parts {
    pub(crate) registry: DynRegistry,
    pub(crate) metrics: RouterMetrics,
    pub(crate) containers: Arc<Containers>,
    pub(crate) remote: Option<Remote>,
    pub(crate) launcher: Arc<dyn Launcher>,
    pub(crate) protocol: Arc<Protocol>,
    pub(crate) outstanding: Arc<Outstanding>,
}

/// What came of an attempt to start a worker's container (see [`Lifecycle::start_container`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// This replica won the worker's start claim and started its container.
    Started,
    /// Another path holds the claim (or it could not be decided): the event goes to the
    /// worker's container like any other, on this platform or on its owner replica.
    HandOver,
    /// Another path holds the claim, won for the admission of this same delivery: that path
    /// hands it to the container (handing it too would run it twice).
    Handled,
    /// The claim was won, but the registry no longer counts the worker alive: its events, the
    /// one at hand included, are released for re-dispatch (they stay with it until then).
    Dead,
}

impl Lifecycle {
    /// A lifecycle with no worker yet, joining `parts.containers` as a replica of its own.
    pub(crate) fn new(parts: Parts) -> Self {
        Self {
            replica: parts.containers.join(),
            registry: parts.registry,
            metrics: parts.metrics,
            containers: parts.containers,
            remote: parts.remote,
            launcher: parts.launcher,
            protocol: parts.protocol,
            targets: DashMap::new(),
            tasks: DashMap::new(),
            controls: DashMap::new(),
            running: watch::Sender::new(0),
            stop: watch::Sender::new(false),
            outstanding: parts.outstanding,
        }
    }

    /// The containers of this process.
    pub fn containers(&self) -> &Arc<Containers> {
        &self.containers
    }

    /// This replica's tag among them.
    pub fn replica(&self) -> ReplicaTag {
        self.replica
    }

    /// How it reaches other processes' containers, if it does.
    pub fn remote(&self) -> Option<&Remote> {
        self.remote.as_ref()
    }

    /// The launcher that starts this router's workers.
    pub fn launcher(&self) -> &Arc<dyn Launcher> {
        &self.launcher
    }

    /// The worker protocol's state.
    pub fn protocol(&self) -> &Arc<Protocol> {
        &self.protocol
    }

    /// Records that `worker` serves `target` (its latest admission placed an event on it).
    pub(crate) fn serves(&self, target: &Target, worker: WorkerId) {
        self.targets.insert(target.clone(), worker);
    }

    /// The worker of this router that served `target` last, if any (alive or not: ask the
    /// registry).
    pub(crate) fn worker_of(&self, target: &Target) -> Option<WorkerId> {
        self.targets.get(target).map(|w| *w)
    }

    /// Forgets that `worker` serves `target` (the registry no longer counts it alive).
    pub(crate) fn not_serving(&self, target: &Target, worker: WorkerId) {
        self.targets.remove_if(target, |_, w| *w == worker);
    }

    /// Worker tasks running now.
    pub fn running(&self) -> usize {
        *self.running.borrow()
    }

    /// The running-task count, to wait on (0: no worker task runs).
    pub(crate) fn watch_running(&self) -> watch::Receiver<usize> {
        self.running.subscribe()
    }

    /// Starts worker `id`'s container if this replica wins its start claim; the admission of
    /// `delivery` placed an event on the worker, which has never started (the admission created
    /// it, or it is the retry of one whose reply was lost).
    ///
    /// The claim comes first, so that whatever the timing exactly one path starts the worker: with
    /// every replica in this process, [`Containers::claim`](crate::containers::Containers::claim);
    /// with replicas in other processes, this replica's owner record written next to the shared
    /// registry if no record exists ([`Remote::claim_start`](crate::remote::Remote::claim_start)).
    /// A winner then checks that the worker is still one to start (alive, never heartbeated): a
    /// winner held up for a whole worker lifetime must not start a worker that has come and gone.
    /// The loser hands its event over, unless the winner claimed for the same delivery.
    /// `token` is the fencing token of the assignment that created the worker: with a launcher
    /// whose workers speak the protocol, its credential binds it.
    pub(crate) async fn start_container(
        self: &Arc<Self>,
        id: WorkerId,
        target: &Target,
        delivery: &DeliveryId,
        token: FencingToken,
    ) -> Start {
        match self.claim_start(id, delivery).await {
            Claimed::Won => {}
            Claimed::Lost { same: true } => return Start::Handled,
            Claimed::Lost { same: false } | Claimed::Undecided => return Start::HandOver,
        }
        let ledger = self.containers.ledger();
        // The start of the call that shows the worker active: what a draining lease counts from.
        let active_at = Instant::now();
        match self.to_start(id).await {
            ToStart::Yes => {}
            verdict => {
                ledger.claim_abandoned();
                match &self.remote {
                    None => self.containers.unclaim(id, self.replica),
                    Some(remote) => remote.forget(&[id]).await,
                }
                tracing::info!(worker = %id, ?verdict, "won the start claim of a worker that is no longer one to start: given up");
                return if verdict == ToStart::Dead {
                    Start::Dead
                } else {
                    Start::HandOver
                };
            }
        }
        let Some(started) = self.containers.start(id, self.replica, (target, delivery)) else {
            tracing::error!(worker = %id, "the platform refused to start a container whose start claim this replica won (a bug): not starting a second one");
            return Start::HandOver;
        };
        let spec = self.launch_spec(id, token, started.jobs, active_at);
        let launched = match self.launcher.launch(spec).await {
            Ok(launched) => launched,
            Err(e) => {
                // A protocol worker's mailbox is dropped here, as below.
                let _ = self.protocol.hub().remove(id).await;
                // Its mailbox is dropped with the failed start: events handed to it meanwhile are
                // answered "stopped" and stay with the worker, which never heartbeats: the sweep
                // declares it dead after its start-up grace and releases them for re-dispatch.
                tracing::error!(worker = %id, %target, %delivery, launcher = self.launcher.kind(), "{e}");
                return Start::Started;
            }
        };
        self.watch_worker(id, launched);
        tracing::info!(worker = %id, %target, %delivery, "container started");
        Start::Started
    }

    /// What the launcher is given for worker `id`: with a launcher whose workers speak the
    /// protocol, the router serves the mailbox itself (`GET /worker/v1/next`) and the launcher
    /// gets an empty, closed one, with the credential, the fencing token and the router's URL in
    /// the environment; otherwise the mailbox and the worker's id.
    fn launch_spec(
        &self,
        id: WorkerId,
        token: FencingToken,
        jobs: Mailbox,
        active_at: Instant,
    ) -> Launch {
        if !self.launcher.speaks_protocol() {
            return Launch::new(id, jobs);
        }
        let protocol = &self.protocol;
        protocol.hub().serve(id, jobs, active_at);
        let (_, mut none) = mailbox::channel(1, 0, OverflowMetrics::default());
        none.close();
        Launch {
            id,
            jobs: none,
            env: protocol.env(id, token),
        }
    }

    /// Takes worker `id`'s start claim for this replica's admission of `delivery` (a lost claim
    /// is counted).
    async fn claim_start(&self, id: WorkerId, delivery: &DeliveryId) -> Claimed {
        let (owner, cause) = match &self.remote {
            None => match self.containers.claim(id, self.replica, delivery) {
                Claim::Won => return Claimed::Won,
                Claim::Lost { cause } => (Owner::This, cause),
            },
            Some(remote) => match remote.claim_start(id, delivery).await {
                Ok(StartClaim::Won) => return Claimed::Won,
                Ok(StartClaim::Lost { owner, cause }) => (owner, cause),
                Err(reason) => {
                    tracing::warn!(worker = %id, "not starting the worker's container: {reason}; the event goes to whichever replica starts it, or the worker dies unstarted after its start-up grace and the sweep releases its events");
                    return Claimed::Undecided;
                }
            },
        };
        self.containers.ledger().claim_lost();
        let same = cause.as_ref() == Some(delivery);
        tracing::debug!(worker = %id, ?owner, ?cause, "another path claimed the worker's start: {}", if same { "it hands this delivery" } else { "handing the event to its container" });
        Claimed::Lost { same }
    }

    /// Whether worker `id`, whose start claim this replica holds, is still one to start.
    async fn to_start(&self, id: WorkerId) -> ToStart {
        match self.registry.worker(id).await {
            Ok(Some(info)) if !info.status.is_alive() => ToStart::Dead,
            Ok(Some(info)) if info.has_heartbeated => ToStart::Running,
            Ok(Some(_)) => ToStart::Yes,
            Ok(None) => ToStart::Dead,
            // Cannot tell: the claim is this replica's and the worker was alive and unstarted
            // when it was admitted, so start it (if it has died since, its first heartbeat fences
            // it).
            Err(e) => {
                tracing::debug!(worker = %id, "could not read the worker before starting it, starting it: {e}");
                ToStart::Yes
            }
        }
    }

    /// Keeps a launched worker's control and awaits its exit in a task of its own.
    fn watch_worker(self: &Arc<Self>, id: WorkerId, launched: Launched) {
        let lifecycle = Arc::clone(self);
        let Launched { exit, control } = launched;
        self.controls.insert(id, control);
        // After the insert: either `stop_all` (which sets the flag, then stops every control it
        // finds) sees this control, or this sees the flag.
        if *self.stop.borrow() {
            if let Some(control) = self.controls.get(&id) {
                control.stop();
            }
        }
        self.running.send_modify(|n| *n += 1);
        self.containers.ledger().running_up();
        let task = tokio::spawn(async move {
            // Decrements the running count however the task ends (a panic included).
            let _running = RunningGuard(Arc::clone(&lifecycle), id);
            let exit = exit.await;
            let exit = if lifecycle.launcher.speaks_protocol() {
                lifecycle.protocol_exit(id, exit).await
            } else {
                exit
            };
            tracing::info!(worker = %id, exit = exit.as_str(), "container stopped");
            lifecycle.metrics.exit(exit.as_str());
            // A crashed container leaves its record (a killed one could not remove it): events
            // forwarded meanwhile are answered "stopped" and stay with the worker until the sweep
            // declares it dead and releases them. Any other end is the worker's death.
            let dead = !matches!(exit, Exit::Crashed);
            if let Exit::Stopped(jobs) = exit {
                let events = jobs.into_iter().map(|j| (j.target, j.event));
                lifecycle.outstanding.stopped(id, events);
            }
            if let (true, Some(remote)) = (dead, &lifecycle.remote) {
                remote.forget(&[id]).await;
            }
        });
        self.tasks.insert(id, task.abort_handle());
    }

    /// Makes a worker's container crash: it stops heartbeating and working, without telling the
    /// registry, so the sweep declares it dead after the heartbeat timeout and its events are
    /// released and re-dispatched.
    pub async fn crash(&self, id: WorkerId) -> Result<(), CrashError> {
        let info = self
            .registry
            .worker(id)
            .await
            .map_err(CrashError::Unavailable)?
            .ok_or(CrashError::Unknown(id))?;
        if let Status::Dead(_) = info.status {
            return Err(CrashError::Dead(id, info.status));
        }
        match self.containers.can_crash(id) {
            CrashOutcome::Crashed => match self.controls.get(&id) {
                Some(control) => {
                    tracing::warn!(worker = %id, "crashing container on request");
                    control.kill();
                    Ok(())
                }
                // Started a moment ago and not launched yet, or its exit is being accounted.
                None => Err(CrashError::NoContainer(id)),
            },
            CrashOutcome::Stopped => Err(CrashError::AlreadyStopped(id)),
            CrashOutcome::NotHere => Err(CrashError::NoContainer(id)),
        }
    }

    /// Forgets the mailbox (and target entry) of every worker without a running container (stopped,
    /// or parked for an owner that never came) that the registry no longer counts alive. A crashed
    /// container's mailbox stays until the registry has declared the worker dead, so that events
    /// sent to it meanwhile are answered "stopped" and stay with the worker, to be released.
    pub(crate) async fn forget_stopped_workers(&self) {
        for id in self.containers.without_container() {
            let alive = match self.registry.worker(id).await {
                Ok(info) => info.is_some_and(|w| w.status.is_alive()),
                // Ask again after the next sweep.
                Err(_) => true,
            };
            if !alive {
                self.containers.forget(id);
                self.targets.retain(|_, w| *w != id);
            }
        }
    }
}

impl Lifecycle {
    /// A protocol worker's process (or container) has ended: the router stops serving it. If it
    /// was stopped at the shutdown deadline, the router deregisters it now that it has seen it
    /// exit (kill before deregister, which releases its claims) and reports the events it was
    /// handed or had queued and did not complete.
    async fn protocol_exit(&self, id: WorkerId, exit: Exit) -> Exit {
        let left = self.protocol.hub().remove(id).await;
        let Exit::Stopped(mut jobs) = exit else {
            return exit;
        };
        match self.registry.deregister(id).await {
            Ok(_) | Err(RegistryError::WorkerDead { .. } | RegistryError::UnknownWorker { .. }) => {
            }
            Err(e) => tracing::warn!(
                worker = %id,
                "could not deregister a stopped worker ({e}); the registry releases its claims when it declares it dead"
            ),
        }
        jobs.extend(left);
        Exit::Stopped(jobs)
    }

    /// Settles what a previous incarnation of this replica left running
    /// ([`Launcher::leftovers`]), before the router serves:
    /// each is removed (stopped, then forced), and a worker the registry still counts alive is
    /// then deregistered, which releases its events for re-dispatch (kill before deregister).
    /// Nothing is left running unaccounted. A leftover that cannot be removed is not
    /// deregistered (its lease, or the sweep, ends it); a launcher that cannot list them stops
    /// the start.
    pub async fn settle_leftovers(&self) -> Result<usize, String> {
        let launcher = &self.launcher;
        let found = launcher.leftovers().await.map_err(|e| {
            format!(
                "cannot list what the {} launcher left running: {e}",
                launcher.kind()
            )
        })?;
        let n = found.len();
        for leftover in found {
            let id = leftover.worker;
            let handle = leftover.handle.clone();
            if let Err(e) = launcher.remove(leftover).await {
                tracing::error!(worker = %id, %handle, "could not remove a leftover worker, not deregistering it (its lease stops it): {e}");
                continue;
            }
            match self.registry.deregister(id).await {
                Ok(reason) => {
                    tracing::warn!(worker = %id, %handle, %reason, "a worker a previous incarnation left running was removed and deregistered: its events are re-dispatched")
                }
                Err(RegistryError::WorkerDead { .. } | RegistryError::UnknownWorker { .. }) => {
                    tracing::info!(worker = %id, %handle, "a dead worker a previous incarnation left running was removed")
                }
                Err(e) => {
                    tracing::warn!(worker = %id, "a removed leftover could not be deregistered ({e}); the sweep declares it dead")
                }
            }
        }
        Ok(n)
    }

    /// Kill before re-dispatch: the workers `died` names that still run here (a process or a
    /// container whose worker the registry declared dead) are killed, and this returns once each
    /// has exited, or after `cap` (logged: the lease is then what stops it). Only for a launcher
    /// whose workers run outside this process; a simulated worker learns its death from its
    /// next call.
    pub(crate) async fn kill_dead(&self, died: &[WorkerId], cap: Duration) {
        if !self.launcher.speaks_protocol() {
            return;
        }
        let mut running = self.running.subscribe();
        let here: Vec<WorkerId> = died
            .iter()
            .copied()
            .filter(|id| match self.controls.get(id) {
                Some(control) => {
                    tracing::warn!(worker = %id, "the registry declared the worker dead: killing it before its events are re-dispatched");
                    control.kill();
                    true
                }
                None => false,
            })
            .collect();
        if here.is_empty() {
            return;
        }
        let gone = async {
            while here.iter().any(|id| self.controls.contains_key(id)) {
                if running.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(cap, gone).await.is_err() {
            tracing::error!(workers = ?here, "dead workers did not exit within {cap:?} of their kill; their leases stop them");
        }
    }

    /// Drains this replica's workers (those whose containers it started) with `deadline`, one by
    /// one, leaving other replicas' alone, then closes their mailboxes: idle workers leave at
    /// once and draining ones once their queue is done.
    pub(crate) async fn drain_own(&self, deadline: Duration) -> DrainAll {
        let mut drained = DrainAll::default();
        // A worker speaking the protocol holds a lease capped by the registry's drain deadline
        // only (docs::worker_protocol, "Drain caps the lease"): the registry's deadline for this
        // drain must not be shorter, or another replica's sweep could hand its pull request on
        // while its lease runs. This router stops its workers at `deadline` all the same.
        let registry_deadline = if self.launcher.speaks_protocol() {
            deadline.max(self.registry.config().drain_deadline())
        } else {
            deadline
        };
        for id in self.containers.owned_by(self.replica) {
            match self.registry.drain_within(id, registry_deadline).await {
                Ok(Status::Draining) => drained.draining += 1,
                Ok(_) => drained.exited += 1,
                // Dead already (crashed and swept), or the backend is away: its claims are
                // released when the registry declares it dead.
                Err(e) => tracing::debug!(worker = %id, "not drained: {e}"),
            }
        }
        self.containers.close_owned_by(self.replica);
        drained
    }

    /// Every worker task aborted at once, as if the process had been killed (no goodbye to the
    /// registry); returns how many were running.
    pub(crate) fn kill_all(&self) -> usize {
        let tasks: Vec<AbortHandle> = self.tasks.iter().map(|t| t.clone()).collect();
        for t in &tasks {
            t.abort();
        }
        tasks.len()
    }

    /// Waits until every worker task has stopped, or `deadline` passes; returns how many still run.
    pub async fn wait(&self, deadline: Duration) -> usize {
        let mut rx = self.running.subscribe();
        let _ = tokio::time::timeout(deadline, rx.wait_for(|n| *n == 0)).await;
        self.running()
    }

    /// Every worker still running stops now, deregisters (releasing its claims through the
    /// registry) and hands back what it did not finish. Waits up to `grace` for that, then
    /// aborts what is left; returns how many had to be aborted.
    pub(crate) async fn stop_all(&self, grace: Duration) -> usize {
        self.stop.send_replace(true);
        for control in self.controls.iter() {
            control.stop();
        }
        let left = self.wait(grace).await;
        if left > 0 {
            for t in self.tasks.iter() {
                t.abort();
            }
            let _ = self.wait(grace).await;
        }
        left
    }
}

/// What a claim of a worker's start came to, for this replica.
enum Claimed {
    Won,
    /// `same`: the winner claimed for the admission of the same delivery.
    Lost {
        same: bool,
    },
    /// The owner records could not be reached.
    Undecided,
}

/// Whether a worker whose start claim was won is still one to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToStart {
    /// Alive and never heartbeated: start it.
    Yes,
    /// Dead (or unknown): its events are released.
    Dead,
    /// Alive and heartbeating: a container runs it somewhere (one that lost its owner record).
    Running,
}

/// Keeps the running-task count (see [`Lifecycle::wait`]).
struct RunningGuard(Arc<Lifecycle>, WorkerId);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.tasks.remove(&self.1);
        self.0.controls.remove(&self.1);
        self.0.containers.ledger().running_down();
        self.0.running.send_modify(|n| *n = n.saturating_sub(1));
    }
}
