//! The router's composition: [`App`] builds its parts from [`Options`] and a [`Platform`] and
//! hands them out ([`server`](crate::server), [`cli`](crate::cli), the tests). No behaviour lives
//! here and no part imports this module; each part holds what it uses, and nothing more:
//!
//! * [`Routing`] ([`crate::routing`]): the routing policy's decision carried out for one pull
//!   request (what `POST /webhook` calls);
//! * [`Dispatcher`] ([`crate::dispatch`]): one (target, delivery) pair admitted and handed to its
//!   worker's container, on this process's [`Containers`] or through [`Remote`] on its owner
//!   replica;
//! * [`Redispatcher`] ([`crate::redispatch`]): the sweeper's callback, placing released events
//!   again through the dispatcher;
//! * [`Lifecycle`] ([`crate::lifecycle`]): workers' containers started, crashed, killed, stopped
//!   and forgotten;
//! * [`Shutdown`] ([`crate::shutdown`]): refusing, draining and stopping, and what was left
//!   unfinished;
//! * the reconciler ([`crate::reconcile`]), given [`reconcile::Router`] ([`App::for_reconciler`]).
//!
//! What two parts share has one small owner that both hold: [`Closing`] (the flag the shutdown
//! sets) and [`Outstanding`] (the released, parked and handed-back deliveries the shutdown
//! reports).
//!
//! Every registry call goes through one [`DynRegistry`] (the backend chosen at start, see
//! [`crate::backend`]), timed for the router's metrics. Every call is awaited; a backend that
//! cannot answer is a typed error, answered 503 with `Retry-After` (a delivery whose admission
//! failed was not accepted), never a panic.

use crate::backend::RegistryChoice;
use crate::body::BodyLimits;
use crate::closing::Closing;
use crate::containers::Containers;
use crate::dispatch::Dispatcher;
use crate::failed::FailedDeliveries;
use crate::launcher::task::TaskLauncher;
use crate::launcher::Launcher;
use crate::lifecycle::{self, Lifecycle};
use crate::metrics::timed::{RegistryCalls, Timed};
use crate::metrics::RouterMetrics;
use crate::outstanding::Outstanding;
use crate::policy::Policy;
use crate::protocol::{Protocol, ProtocolSettings};
use crate::reconcile;
use crate::redispatch::Redispatcher;
use crate::remote::Remote;
use crate::routing::Routing;
use crate::secrets::Secret;
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::worker::Timings;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use worker_registry::metrics::Metrics;
use worker_registry::{DynRegistry, WorkerRegistry};

/// How the router behaves (the registry's own settings are in its
/// [`RegistryConfig`](worker_registry::RegistryConfig)).
#[derive(Clone)]
pub struct Options {
    /// The webhook secret (during a rotation window, the previous one too). Unset accepts
    /// unsigned deliveries: only leave it unset for a loopback bind.
    pub webhook_secret: Secret,
    /// If set, the admin API and `POST /debug/...` need `Authorization: Bearer <token>` (during a
    /// rotation window, the previous token is accepted too).
    pub admin_token: Secret,
    /// How long a simulated worker works per event.
    pub work: Duration,
    /// How long a simulated worker waits for another event before it leaves.
    pub idle: Duration,
    /// Queued events per worker in its mailbox (1 ..= [`MAX_MAILBOX`](crate::limits::MAX_MAILBOX)).
    pub mailbox: usize,
    /// Events per worker queued in order behind a full mailbox before 503
    /// (0 ..= [`MAX_OVERFLOW`](crate::limits::MAX_OVERFLOW); 0: a full mailbox answers 503).
    pub overflow: usize,
    /// Which events start, reach or drain a pull request's worker.
    pub policy: Arc<Policy>,
    /// How delivery bodies are read (size cap, time limit, memory budget).
    pub body: BodyLimits,
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("webhook_secret", &self.webhook_secret)
            .field("admin_token", &self.admin_token)
            .field("work", &self.work)
            .field("idle", &self.idle)
            .field("mailbox", &self.mailbox)
            .field("overflow", &self.overflow)
            .field("policy", &self.policy)
            .field("body", &self.body)
            .finish()
    }
}

/// Where a router's containers run, and how it reaches those of other replicas.
#[derive(Clone)]
pub struct Platform {
    /// The containers of this process (shared by the replicas of one process).
    pub containers: Arc<Containers>,
    /// With replicas in other processes: the owner records and forwarding.
    pub remote: Option<Remote>,
    /// Whether the registry outlives this process (a shared backend, used by other replicas or
    /// the next start): what a stopping router leaves in it is handed over. Without, it dies
    /// with the process, and a stop waits for its waiting room too.
    pub shared: bool,
    /// The backend's kind (`memory`, `redis`, `postgres`), a label of the registry calls' metric.
    pub backend: &'static str,
    /// What starts this router's workers; `None`: the `task` launcher (simulated workers, tokio
    /// tasks of this process, see [`crate::launcher::task`]).
    pub launcher: Option<Arc<dyn Launcher>>,
    /// The worker protocol's key and lease margins (used by launchers whose workers speak it).
    pub protocol: ProtocolSettings,
}

impl Platform {
    /// A platform of this router's own: one process, one replica; mailboxes of `mailbox` events
    /// with an overflow of `overflow` behind each.
    pub fn local(mailbox: usize, overflow: usize) -> Self {
        Self {
            containers: Arc::new(Containers::new(mailbox, overflow)),
            remote: None,
            shared: false,
            backend: "memory",
            launcher: None,
            protocol: ProtocolSettings::default(),
        }
    }

    /// The platform of a replica in its own process on the shared backend `choice` (registry
    /// `name`): its own containers, and the other replicas' reached through the owner records
    /// next to the registry, this one being reachable at `advertise`; `token` guards the internal
    /// endpoint (the admin token, sent as it is when forwarding); `heartbeat` (the registry's interval) bounds the waits. For the
    /// in-memory backend, [`local`](Self::local).
    pub async fn for_backend(
        choice: &RegistryChoice,
        name: &str,
        advertise: &str,
        token: Secret,
        heartbeat: Duration,
        mailbox: usize,
        overflow: usize,
    ) -> Result<Self, String> {
        let mut platform = Self::local(mailbox, overflow);
        platform.shared = choice.is_shared();
        platform.backend = choice.kind();
        if let Some(store) = Store::open(choice, name).await.map_err(|e| {
            format!("cannot open the router's records next to the {choice} registry: {e}")
        })? {
            platform.remote = Some(Remote::new(store, advertise, token, heartbeat)?);
        }
        Ok(platform)
    }
}

/// The router's parts, and the data that is no part's (see the [module documentation](self)).
struct Inner {
    registry: DynRegistry,
    opts: Options,
    metrics: RouterMetrics,
    /// The Prometheus registry (the registry's and the router's metrics), until the HTTP app takes it.
    export: Mutex<Option<Metrics>>,
    /// The most recent deliveries whose command failed every attempt.
    failed: FailedDeliveries,
    closing: Closing,
    outstanding: Arc<Outstanding>,
    lifecycle: Arc<Lifecycle>,
    dispatcher: Arc<Dispatcher>,
    routing: Routing,
    redispatcher: Arc<Redispatcher>,
    shutdown: Shutdown,
}

/// The router: its parts, built once and handed out; cheap to clone.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

impl App {
    /// A router over `registry` (any backend), alone in its process.
    pub fn new(registry: DynRegistry, opts: Options) -> Self {
        let platform = Platform::local(opts.mailbox, opts.overflow);
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
        // Every registry call of the router, timed here (see `metrics::timed`).
        let mut calls_family = RegistryCalls::family();
        let calls = RegistryCalls::new(platform.backend, &mut calls_family);
        let registry = DynRegistry::new(Timed::new(registry, calls.clone()));
        let mut export = Metrics::new(&registry);
        let metrics = RouterMetrics::new(export.returned(), calls);
        metrics.register(&mut export, calls_family);
        metrics.register_overflow(&mut export, platform.containers.overflow_metrics());
        let protocol = Arc::new(Protocol::new(registry.config(), platform.protocol));
        let launcher = platform.launcher.unwrap_or_else(|| {
            Arc::new(TaskLauncher::new(
                registry.clone(),
                timings,
                platform.containers.traces().clone(),
                platform.containers.runs().clone(),
            ))
        });
        let outstanding = Arc::new(Outstanding::new(platform.shared));
        let lifecycle = Arc::new(Lifecycle::new(lifecycle::Parts {
            registry: registry.clone(),
            metrics: metrics.clone(),
            containers: platform.containers,
            remote: platform.remote,
            launcher,
            protocol,
            outstanding: outstanding.clone(),
        }));
        Self {
            inner: Arc::new(Inner::compose(
                registry,
                opts,
                metrics,
                export,
                outstanding,
                lifecycle,
            )),
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

    /// The most recent deliveries whose command failed every attempt.
    pub fn failed(&self) -> &FailedDeliveries {
        &self.inner.failed
    }

    /// The closing flag (set by [`Shutdown`]).
    pub fn closing(&self) -> &Closing {
        &self.inner.closing
    }

    /// The accepted, unfinished deliveries this router holds.
    pub fn outstanding(&self) -> &Arc<Outstanding> {
        &self.inner.outstanding
    }

    /// The workers' lifecycle.
    pub fn lifecycle(&self) -> &Arc<Lifecycle> {
        &self.inner.lifecycle
    }

    /// The dispatcher: admission and the hand-over to a worker.
    pub fn dispatcher(&self) -> &Arc<Dispatcher> {
        &self.inner.dispatcher
    }

    /// The routing policy's decisions carried out (what `POST /webhook` calls).
    pub fn routing(&self) -> &Routing {
        &self.inner.routing
    }

    /// The re-dispatcher: the sweeper's callback.
    pub fn redispatcher(&self) -> &Arc<Redispatcher> {
        &self.inner.redispatcher
    }

    /// The shutdown.
    pub fn shutdown(&self) -> &Shutdown {
        &self.inner.shutdown
    }

    /// What the reconciler of failed deliveries uses of this router.
    pub fn for_reconciler(&self) -> reconcile::Router {
        reconcile::Router {
            registry: self.inner.registry.clone(),
            policy: self.inner.opts.policy.clone(),
            metrics: self.inner.metrics.clone(),
            closing: self.inner.closing.clone(),
        }
    }

    /// The containers of this process (the lifecycle's).
    pub fn containers(&self) -> &Arc<Containers> {
        self.inner.lifecycle.containers()
    }

    /// How it reaches other processes' containers, if it does (the lifecycle's).
    pub fn remote(&self) -> Option<&Remote> {
        self.inner.lifecycle.remote()
    }

    /// The worker protocol's state (the lifecycle's).
    pub fn protocol(&self) -> &Arc<Protocol> {
        self.inner.lifecycle.protocol()
    }

    /// The launcher that starts this router's workers (the lifecycle's).
    pub fn launcher(&self) -> &Arc<dyn Launcher> {
        self.inner.lifecycle.launcher()
    }
}

impl Inner {
    /// The parts above the lifecycle, each given what it uses.
    fn compose(
        registry: DynRegistry,
        opts: Options,
        metrics: RouterMetrics,
        export: Metrics,
        outstanding: Arc<Outstanding>,
        lifecycle: Arc<Lifecycle>,
    ) -> Self {
        let closing = Closing::default();
        let dispatcher = Arc::new(Dispatcher::new(
            registry.clone(),
            metrics.clone(),
            lifecycle.clone(),
            outstanding.clone(),
            closing.clone(),
        ));
        let routing = Routing::new(
            dispatcher.clone(),
            registry.clone(),
            lifecycle.clone(),
            closing.clone(),
        );
        let redispatcher = Arc::new(Redispatcher::new(
            dispatcher.clone(),
            registry.clone(),
            metrics.clone(),
            lifecycle.clone(),
            outstanding.clone(),
        ));
        let shutdown = Shutdown::new(
            closing.clone(),
            registry.clone(),
            &metrics,
            lifecycle.clone(),
            outstanding.clone(),
            redispatcher.clone(),
        );
        Self {
            registry,
            opts,
            metrics,
            export: Mutex::new(Some(export)),
            failed: FailedDeliveries::default(),
            closing,
            outstanding,
            lifecycle,
            dispatcher,
            routing,
            redispatcher,
            shutdown,
        }
    }
}
