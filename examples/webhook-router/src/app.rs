//! The router's state and HTTP app.
//!
//! * [`App`] owns the [`InMemoryRegistry`], one mailbox per simulated worker, and the router's metrics;
//!   [`App::dispatch`] is the whole decision for one delivery: `admit`, then hand the event to the
//!   target's worker (starting its container, a tokio task, if the registry just created it).
//! * [`App::router`] is the axum app: `POST /webhook`, `POST /debug/workers/{id}/crash`, and the
//!   library's admin API (`/workers`, `/metrics`, `/openapi.json`, `/healthz`) merged at the root.
//! * [`serve`] runs it with the [`Sweeper`], whose reports' released events are re-dispatched;
//!   [`Server::shutdown`] is the Ctrl-C path: refuse new deliveries, drain every worker, wait for
//!   them within a deadline.

use crate::github;
use crate::worker;

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinHandle;
use worker_registry::http::{admin_router, require_bearer, AdminOptions};
use worker_registry::metrics::Metrics;
use worker_registry::{
    Admission, AlreadyClaimed, Assignment, ClaimState, Clock, DeliveryId, DrainAll,
    InMemoryRegistry, Rejection, Status, Sweeper, SystemClock, Target, WorkerId,
};

use github::Route;
use worker::{Exit, Job, Timings};

/// Events a worker may have queued before the router answers 503 for its target.
pub const DEFAULT_MAILBOX: usize = 64;

/// How the router behaves (the registry's own settings are in its [`RegistryConfig`]).
///
/// [`RegistryConfig`]: worker_registry::RegistryConfig
#[derive(Clone)]
pub struct Options {
    /// The webhook secret. `None` accepts unsigned deliveries: only pass `None` for a loopback bind.
    pub webhook_secret: Option<Arc<[u8]>>,
    /// If set, `POST /workers/{id}/drain` and `POST /debug/...` need `Authorization: Bearer <token>`.
    pub admin_token: Option<String>,
    /// How long a simulated worker works per event.
    pub work: Duration,
    /// How long a simulated worker waits for another event before it leaves.
    pub idle: Duration,
    /// Queued events per worker before 503.
    pub mailbox: usize,
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
            .finish()
    }
}

/// A worker's mailbox: its queue of events and its crash button.
#[derive(Clone)]
struct Mailbox {
    jobs: mpsc::Sender<Job>,
    crash: Arc<Notify>,
}

/// The router's own Prometheus counters (the registry's are served next to them).
#[derive(Clone)]
struct RouterMetrics {
    deliveries: Family<Vec<(&'static str, &'static str)>, Counter>,
    exits: Family<Vec<(&'static str, &'static str)>, Counter>,
    redispatched: Counter,
}

impl RouterMetrics {
    fn new() -> Self {
        Self {
            deliveries: Family::default(),
            exits: Family::default(),
            redispatched: Counter::default(),
        }
    }

    fn register(&self, metrics: &mut Metrics) {
        let p = metrics.prometheus_mut();
        p.register(
            "webhook_router_deliveries",
            "Webhook deliveries answered, by outcome",
            self.deliveries.clone(),
        );
        p.register(
            "webhook_router_worker_exits",
            "Simulated worker containers that stopped, by how",
            self.exits.clone(),
        );
        p.register(
            "webhook_router_redispatched",
            "Released events (their worker died) admitted again",
            self.redispatched.clone(),
        );
    }
}

/// What the router did with one delivery (its HTTP answer is [`Reply`]).
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
    /// The router is shutting down.
    Closing,
}

struct Inner<C: Clock> {
    registry: InMemoryRegistry<C>,
    opts: Options,
    timings: Timings,
    mailboxes: DashMap<WorkerId, Mailbox>,
    closing: AtomicBool,
    /// Worker tasks running now (shutdown waits for 0).
    running: watch::Sender<usize>,
    metrics: RouterMetrics,
    /// Released events not yet placed again (capacity full, or shutting down).
    pending: AtomicUsize,
    redispatched: AtomicU64,
}

/// The router's state; cheap to clone.
pub struct App<C: Clock = SystemClock> {
    inner: Arc<Inner<C>>,
}

impl<C: Clock> Clone for App<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Clock> App<C> {
    /// A router over `registry`.
    pub fn new(registry: InMemoryRegistry<C>, opts: Options) -> Self {
        let timings = Timings {
            heartbeat: registry.config().heartbeat_interval(),
            work: opts.work,
            idle: opts.idle,
        };
        Self {
            inner: Arc::new(Inner {
                registry,
                timings,
                opts,
                mailboxes: DashMap::new(),
                closing: AtomicBool::new(false),
                running: watch::Sender::new(0),
                metrics: RouterMetrics::new(),
                pending: AtomicUsize::new(0),
                redispatched: AtomicU64::new(0),
            }),
        }
    }

    /// The registry.
    pub fn registry(&self) -> &InMemoryRegistry<C> {
        &self.inner.registry
    }

    /// The router's options.
    pub fn options(&self) -> &Options {
        &self.inner.opts
    }

    /// Released events admitted again so far.
    pub fn redispatched(&self) -> u64 {
        // Relaxed: a statistic; nothing is published through it.
        self.inner.redispatched.load(Ordering::Relaxed)
    }

    /// Released events waiting to be placed again.
    pub fn pending_redispatch(&self) -> usize {
        // Relaxed: a statistic.
        self.inner.pending.load(Ordering::Relaxed)
    }

    /// Worker tasks running now.
    pub fn running_workers(&self) -> usize {
        *self.inner.running.borrow()
    }

    /// Admits one delivery and hands it to its target's worker.
    ///
    /// The first caller to see a worker id starts its task (normally the one whose admission created
    /// it, but a concurrent sticky admission may get there first); every event goes through the
    /// worker's bounded mailbox.
    pub fn dispatch(&self, target: &Target, event: &DeliveryId) -> Dispatch {
        // Acquire: pairs with the Release in `begin_shutdown`; a delivery that sees the flag clear may
        // still race with the drain, which is fine: drain_all then catches its worker.
        if self.inner.closing.load(Ordering::Acquire) {
            return Dispatch::Closing;
        }
        let a = match self.inner.registry.admit(target, event) {
            Admission::Assigned(a) => a,
            Admission::Duplicate(d) => return Dispatch::Duplicate(d),
            Admission::Rejected(r) => return Dispatch::Rejected(r),
        };
        // Acquire: as above. Shutdown began between the check and the admission, so `drain_all`
        // may have missed this worker: drain it now (it is busy with this event, so it runs it and
        // exits).
        if self.inner.closing.load(Ordering::Acquire) {
            let _ = self.inner.registry.drain(a.worker);
        }
        let Some(mailbox) = self.mailbox(a.worker) else {
            // The record is gone already (purged): the claim is released with it; say so.
            return Dispatch::Assigned(a);
        };
        let job = Job {
            target: target.clone(),
            event: event.clone(),
            token: a.token,
        };
        match mailbox.jobs.try_send(job) {
            Ok(()) => Dispatch::Assigned(a),
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Undo the claim so a redelivery is admitted later.
                let _ = self.inner.registry.release(target, event);
                Dispatch::Backlog { worker: a.worker }
            }
            // The task is gone without a clean exit (crashed, or fenced a moment ago): the registry
            // still counts the event as held by that worker, so the sweep that declares it dead
            // releases the event and the sweeper callback re-dispatches it.
            Err(mpsc::error::TrySendError::Closed(_)) => Dispatch::Assigned(a),
        }
    }

    /// The worker's mailbox, starting its task the first time the id is seen.
    fn mailbox(&self, id: WorkerId) -> Option<Mailbox> {
        if let Some(m) = self.inner.mailboxes.get(&id) {
            return Some(m.clone());
        }
        let handle = self.inner.registry.handle(id).ok()?;
        let (mailbox, rx) = match self.inner.mailboxes.entry(id) {
            Entry::Occupied(o) => return Some(o.get().clone()),
            Entry::Vacant(v) => {
                let (tx, rx) = mpsc::channel(self.inner.opts.mailbox.max(1));
                let mailbox = Mailbox {
                    jobs: tx,
                    crash: Arc::new(Notify::new()),
                };
                v.insert(mailbox.clone());
                (mailbox, rx)
            }
        };
        // Spawned after the map's shard lock is released; events sent meanwhile wait in the queue.
        self.spawn_worker(handle, rx, mailbox.crash.clone());
        Some(mailbox)
    }

    fn spawn_worker(
        &self,
        handle: worker_registry::WorkerHandle<C>,
        rx: mpsc::Receiver<Job>,
        crash: Arc<Notify>,
    ) {
        let app = self.clone();
        let registry = self.inner.registry.clone();
        let timings = self.inner.timings;
        self.inner.running.send_modify(|n| *n += 1);
        let id = handle.id();
        tracing::info!(worker = %id, target = ?handle.target().map(ToString::to_string), "container started");
        tokio::spawn(async move {
            // Decrements the running count however the task ends (a panic included).
            let _running = RunningGuard(app.clone());
            let exit = worker::run(registry, handle, rx, crash, timings).await;
            tracing::info!(worker = %id, ?exit, "container stopped");
            let how = match exit {
                Exit::Exited => "exited",
                Exit::Fenced => "fenced",
                Exit::Crashed => "crashed",
            };
            app.inner
                .metrics
                .exits
                .get_or_create(&vec![("how", how)])
                .inc();
        });
    }

    /// Makes a worker's container crash: it stops heartbeating and working, without telling the
    /// registry, so the sweep declares it dead after the heartbeat timeout and its events are
    /// released and re-dispatched.
    pub fn crash(&self, id: WorkerId) -> Result<(), CrashError> {
        let info = self
            .inner
            .registry
            .worker(id)
            .ok_or(CrashError::Unknown(id))?;
        if let Status::Dead(_) = info.status {
            return Err(CrashError::Dead(id, info.status));
        }
        let mailbox = self
            .inner
            .mailboxes
            .get(&id)
            .map(|m| m.clone())
            .ok_or(CrashError::NoContainer(id))?;
        if mailbox.jobs.is_closed() {
            return Err(CrashError::AlreadyStopped(id));
        }
        tracing::warn!(worker = %id, "crashing container on request");
        mailbox.crash.notify_one();
        Ok(())
    }

    /// After each sweep: re-dispatch released events (keeping those that cannot be placed yet for
    /// the next sweep) and forget the mailboxes of dead workers whose task has stopped.
    fn after_sweep(
        &self,
        pending: &mut VecDeque<(Target, DeliveryId)>,
        released: &[(Target, DeliveryId)],
    ) {
        pending.extend(released.iter().cloned());
        for _ in 0..pending.len() {
            let Some((target, event)) = pending.pop_front() else {
                break;
            };
            match self.dispatch(&target, &event) {
                Dispatch::Assigned(a) => {
                    tracing::info!(%target, %event, worker = %a.worker, "released event re-dispatched");
                    // Relaxed: a statistic.
                    self.inner.redispatched.fetch_add(1, Ordering::Relaxed);
                    self.inner.metrics.redispatched.inc();
                }
                // Someone (a GitHub redelivery) placed it again first.
                Dispatch::Duplicate(_) => {}
                Dispatch::Rejected(_) | Dispatch::Backlog { .. } | Dispatch::Closing => {
                    pending.push_back((target, event));
                }
            }
        }
        // Relaxed: a statistic.
        self.inner.pending.store(pending.len(), Ordering::Relaxed);
        // A crashed worker's mailbox stays until the registry has declared it dead, so that no later
        // event for it starts a second task under the same id.
        let registry = &self.inner.registry;
        self.inner.mailboxes.retain(|id, m| {
            !m.jobs.is_closed() || registry.worker(*id).is_some_and(|w| w.status.is_alive())
        });
    }

    /// The Ctrl-C path, first half: refuse new deliveries (503 draining) and drain every worker;
    /// closing the mailboxes wakes the idle ones so they leave at once.
    pub fn begin_shutdown(&self) -> DrainAll {
        // Release: pairs with the Acquire in `dispatch`.
        self.inner.closing.store(true, Ordering::Release);
        let drained = self.inner.registry.drain_all();
        self.inner.mailboxes.clear();
        drained
    }

    /// Waits until every worker task has stopped, or `deadline` passes; returns how many still run.
    pub async fn wait_workers(&self, deadline: Duration) -> usize {
        let mut rx = self.inner.running.subscribe();
        let _ = tokio::time::timeout(deadline, rx.wait_for(|n| *n == 0)).await;
        self.running_workers()
    }

    /// The HTTP app: webhook, debug endpoint and the library's admin API.
    pub fn router(&self) -> Router {
        let mut metrics = Metrics::new(&self.inner.registry);
        self.inner.metrics.register(&mut metrics);
        let token = self.inner.opts.admin_token.clone();
        let admin = AdminOptions::new()
            .metrics(metrics)
            .maybe_bearer_token(token.clone());
        // The debug endpoint mutates, so it takes the admin API's bearer token (same 401 answer).
        let mut debug = Router::new().route("/debug/workers/{id}/crash", post(crash::<C>));
        if let Some(token) = token {
            debug = require_bearer(debug, token);
        }
        Router::new()
            .route("/webhook", post(webhook::<C>))
            .layer(DefaultBodyLimit::max(github::MAX_PAYLOAD_BYTES))
            .merge(debug)
            .with_state(self.clone())
            .merge(admin_router(self.inner.registry.clone(), admin))
    }

    fn retry_after(&self, reason: &Dispatch) -> HeaderValue {
        let cfg = self.inner.registry.config();
        let wait = match reason {
            Dispatch::Rejected(Rejection::TargetDraining { .. }) | Dispatch::Backlog { .. } => {
                self.inner.opts.work
            }
            Dispatch::Closing => cfg.heartbeat_timeout(),
            _ => cfg.sweep_interval(),
        };
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        HeaderValue::from(secs.max(1))
    }

    /// The whole handling of one `POST /webhook`.
    async fn handle_delivery(
        &self,
        headers: &HeaderMap,
        body: Result<Bytes, BytesRejection>,
    ) -> Reply {
        let body = match body {
            Ok(b) => b,
            Err(e) => return Reply::Error(e.status(), e.body_text()),
        };
        // The signature covers the raw body, whichever content type the webhook uses.
        if let Some(secret) = &self.inner.opts.webhook_secret {
            if let Err(e) = github::verify(secret, headers, &body) {
                return Reply::Error(StatusCode::UNAUTHORIZED, e.to_string());
            }
        }
        let body = match github::json_payload(headers, body).await {
            Ok(b) => b,
            Err(e) => return Reply::Error(StatusCode::BAD_REQUEST, e),
        };
        let delivery = match github::delivery(headers) {
            Ok(d) => d,
            Err(e) => return Reply::Error(StatusCode::BAD_REQUEST, e.to_string()),
        };
        let target = match github::route(&delivery.event, &body) {
            Ok(Route::Target(t)) => t,
            Ok(Route::Ignored(reason)) => return Reply::Ignored(reason),
            Err(e) => return Reply::Error(StatusCode::BAD_REQUEST, e.to_string()),
        };
        let d = self.dispatch(&target, &delivery.id);
        tracing::debug!(%target, delivery = %delivery.id, event = %delivery.event, outcome = ?d, "delivery");
        match d {
            Dispatch::Assigned(a) => Reply::Assigned(a),
            Dispatch::Duplicate(dup) => Reply::Duplicate(dup),
            other => {
                let retry_after = self.retry_after(&other);
                Reply::Unavailable(other, retry_after)
            }
        }
    }
}

/// Keeps the running-task count (see [`App::wait_workers`]).
struct RunningGuard<C: Clock>(App<C>);

impl<C: Clock> Drop for RunningGuard<C> {
    fn drop(&mut self) {
        self.0.inner.running.send_modify(|n| *n -= 1);
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
}

impl fmt::Display for CrashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(id) => write!(f, "unknown worker {id}"),
            Self::Dead(id, status) => write!(f, "worker {id} is {status}"),
            Self::NoContainer(id) => write!(f, "worker {id} has no container in this router"),
            Self::AlreadyStopped(id) => write!(f, "worker {id}'s container has stopped already"),
        }
    }
}

/// The answer to one delivery.
enum Reply {
    Assigned(Assignment),
    Duplicate(AlreadyClaimed),
    Unavailable(Dispatch, HeaderValue),
    Ignored(String),
    Error(StatusCode, String),
}

impl Reply {
    fn outcome(&self) -> &'static str {
        match self {
            Self::Assigned(_) => "assigned",
            Self::Duplicate(_) => "duplicate",
            Self::Unavailable(Dispatch::Rejected(Rejection::CapacityFull { .. }), _)
            | Self::Unavailable(Dispatch::Backlog { .. }, _) => "capacity",
            Self::Unavailable(..) => "draining",
            Self::Ignored(_) => "ignored",
            Self::Error(s, _) if *s == StatusCode::UNAUTHORIZED => "unauthorized",
            Self::Error(..) => "invalid",
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let outcome = self.outcome();
        match self {
            Self::Assigned(a) => (
                StatusCode::ACCEPTED,
                Json(json!({
                    "outcome": outcome,
                    "worker": a.worker.get(),
                    "new": a.new,
                    "token": a.token.get(),
                })),
            )
                .into_response(),
            Self::Duplicate(d) => (
                StatusCode::OK,
                Json(json!({
                    "outcome": outcome,
                    "worker": d.holder.map(WorkerId::get),
                    "state": match d.state {
                        ClaimState::InFlight => "in_flight",
                        ClaimState::Completed => "completed",
                        _ => "other",
                    },
                })),
            )
                .into_response(),
            Self::Unavailable(why, retry_after) => {
                let mut body = json!({ "outcome": outcome });
                match why {
                    Dispatch::Rejected(Rejection::CapacityFull { limit }) => {
                        body["limit"] = limit.into();
                    }
                    Dispatch::Rejected(Rejection::TargetDraining { worker }) => {
                        body["worker"] = worker.get().into();
                    }
                    Dispatch::Backlog { worker } => {
                        body["worker"] = worker.get().into();
                        body["reason"] = "the worker's queue is full".into();
                    }
                    Dispatch::Closing => body["reason"] = "the router is shutting down".into(),
                    _ => {}
                }
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, retry_after)],
                    Json(body),
                )
                    .into_response()
            }
            Self::Ignored(reason) => (
                StatusCode::ACCEPTED,
                Json(json!({ "outcome": outcome, "reason": reason })),
            )
                .into_response(),
            Self::Error(status, error) => error_response(status, error),
        }
    }
}

fn error_response(status: StatusCode, error: String) -> Response {
    let mut r = (status, Json(json!({ "error": error }))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// `POST /webhook`.
async fn webhook<C: Clock>(
    State(app): State<App<C>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let reply = app.handle_delivery(&headers, body).await;
    app.inner
        .metrics
        .deliveries
        .get_or_create(&vec![("outcome", reply.outcome())])
        .inc();
    reply.into_response()
}

/// `POST /debug/workers/{id}/crash`.
async fn crash<C: Clock>(State(app): State<App<C>>, Path(id): Path<String>) -> Response {
    let id: WorkerId = match id.parse() {
        Ok(id) => id,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, format!("{e}")),
    };
    match app.crash(id) {
        Ok(()) => (
            StatusCode::ACCEPTED,
            Json(json!({ "worker": id.get(), "crashed": true })),
        )
            .into_response(),
        Err(e @ CrashError::Unknown(_)) => error_response(StatusCode::NOT_FOUND, e.to_string()),
        Err(e) => error_response(StatusCode::CONFLICT, e.to_string()),
    }
}

/// A running router: HTTP server plus sweeper.
pub struct Server<C: Clock = SystemClock> {
    app: App<C>,
    addr: SocketAddr,
    sweeper: Sweeper,
    stop_http: oneshot::Sender<()>,
    http: JoinHandle<io::Result<()>>,
}

/// What [`Server::shutdown`] did.
#[derive(Debug, Clone, Copy)]
pub struct ShutdownReport {
    /// What draining every worker did at once.
    pub drained: DrainAll,
    /// Worker tasks still running when the deadline passed (0 on a clean shutdown).
    pub still_running: usize,
    /// Events released (their worker died or left) that were not placed again before exit.
    pub not_redispatched: usize,
}

/// Starts the router on `listener` and its sweeper.
pub async fn serve<C: Clock>(app: App<C>, listener: TcpListener) -> io::Result<Server<C>> {
    let addr = listener.local_addr()?;
    let redispatcher = app.clone();
    let mut pending = VecDeque::new();
    let sweeper = Sweeper::spawn(app.registry().clone(), move |report| {
        for (id, reason) in &report.died {
            tracing::warn!(worker = %id, %reason, "worker declared dead");
        }
        redispatcher.after_sweep(&mut pending, &report.released);
    });
    let (stop_http, stopped) = oneshot::channel::<()>();
    let router = app.router();
    let http = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });
    Ok(Server {
        app,
        addr,
        sweeper,
        stop_http,
        http,
    })
}

impl<C: Clock> Server<C> {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The router's state.
    pub fn app(&self) -> &App<C> {
        &self.app
    }

    /// Refuses new deliveries, drains every worker, waits for them up to `deadline`, then stops the
    /// HTTP server and the sweeper.
    pub async fn shutdown(self, deadline: Duration) -> ShutdownReport {
        let drained = self.app.begin_shutdown();
        let still_running = self.app.wait_workers(deadline).await;
        let _ = self.stop_http.send(());
        let _ = self.http.await;
        self.sweeper.shutdown().await;
        // One last sweep counts what the exits released; nobody is left to place it.
        let last = self.app.registry().sweep();
        ShutdownReport {
            drained,
            still_running,
            not_redispatched: self.app.pending_redispatch() + last.released.len(),
        }
    }
}
