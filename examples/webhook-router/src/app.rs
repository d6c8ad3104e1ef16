//! The router's state: [`App`], what it is built from ([`Options`], [`Platform`]) and what it
//! shows. What it does lives one concern a module, each adding to `App` and none imported here:
//!
//! * [`crate::routing`]: the routing policy's decision carried out for one pull request;
//! * [`crate::dispatch`]: one (target, delivery) pair admitted and handed to its worker's
//!   container, on this process's [`Containers`] or through [`Remote`] on its owner replica;
//! * [`crate::lifecycle`]: containers started, crashed on request and forgotten;
//! * [`crate::redispatch`]: the sweeper's callback, placing released events again;
//! * [`crate::shutdown`]: refusing, draining and stopping, and what was left unfinished.
//!
//! `App` owns a [`DynRegistry`] (the backend chosen at start, see [`crate::backend`]), its
//! [`Platform`] (where the containers run), and the router's metrics. Every registry call is
//! awaited; a backend that cannot answer is a typed error, answered 503 with `Retry-After` (a
//! delivery whose admission failed was not accepted), never a panic.

use crate::backend::RegistryChoice;
use crate::body::BodyLimits;
use crate::closing::Closing;
use crate::containers::{Containers, ReplicaTag};
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
use crate::remote::Remote;
use crate::secrets::Secret;
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::worker::Timings;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use worker_registry::metrics::Metrics;
use worker_registry::{DynRegistry, Target, WorkerId, WorkerRegistry};

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

/// The state every concern of the router shares (see the [module documentation](self)).
pub(crate) struct Inner {
    pub(crate) registry: DynRegistry,
    pub(crate) opts: Options,
    /// Every container of this process, by worker id.
    pub(crate) containers: Arc<Containers>,
    pub(crate) remote: Option<Remote>,
    /// Which worker of this router serves a target (the lifecycle's).
    pub(crate) targets: Arc<DashMap<Target, WorkerId>>,
    /// The workers' lifecycle.
    pub(crate) lifecycle: Arc<Lifecycle>,
    /// The accepted, unfinished deliveries this router holds.
    pub(crate) outstanding: Arc<Outstanding>,
    pub(crate) closing: Closing,
    /// The shutdown.
    pub(crate) shutdown: Shutdown,
    pub(crate) metrics: RouterMetrics,
    /// The Prometheus registry (the registry's and the router's metrics), until the HTTP app takes it.
    export: Mutex<Option<Metrics>>,
    pub(crate) redispatched: AtomicU64,
    /// The most recent deliveries whose command failed every attempt.
    pub(crate) failed: FailedDeliveries,
}

/// The router's state; cheap to clone.
#[derive(Clone)]
pub struct App {
    pub(crate) inner: Arc<Inner>,
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
            containers: platform.containers.clone(),
            remote: platform.remote.clone(),
            launcher,
            protocol,
            outstanding: outstanding.clone(),
        }));
        let closing = Closing::default();
        let shutdown = Shutdown::new(
            closing.clone(),
            registry.clone(),
            metrics.clone(),
            lifecycle.clone(),
            outstanding.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                export: Mutex::new(Some(export)),
                metrics,
                registry,
                opts,
                containers: platform.containers,
                remote: platform.remote,
                targets: lifecycle.targets.clone(),
                lifecycle,
                outstanding,
                closing,
                shutdown,
                redispatched: AtomicU64::new(0),
                failed: FailedDeliveries::default(),
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

    /// The workers' lifecycle.
    pub fn lifecycle(&self) -> &Arc<Lifecycle> {
        &self.inner.lifecycle
    }

    /// The accepted, unfinished deliveries this router holds.
    pub fn outstanding(&self) -> &Arc<Outstanding> {
        &self.inner.outstanding
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

    /// The closing flag.
    pub fn closing(&self) -> &Closing {
        &self.inner.closing
    }

    /// The worker protocol's state.
    pub fn protocol(&self) -> &Arc<Protocol> {
        self.inner.lifecycle.protocol()
    }

    /// The launcher that starts this router's workers.
    pub fn launcher(&self) -> &Arc<dyn Launcher> {
        self.inner.lifecycle.launcher()
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
        self.inner.lifecycle.replica()
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

    /// The most recent deliveries whose command failed every attempt.
    pub fn failed(&self) -> &FailedDeliveries {
        &self.inner.failed
    }

    /// Whether shutdown has begun (deliveries are refused with 503).
    pub fn is_closing(&self) -> bool {
        self.inner.closing.is_set()
    }
}
