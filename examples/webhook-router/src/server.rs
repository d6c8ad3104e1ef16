//! A running router: the HTTP server and the [`Sweeper`] whose released events are re-dispatched;
//! [`Server::shutdown`] is the Ctrl-C path.
//!
//! The HTTP server is hyper's HTTP/1 connection builder in an accept loop of its own (rather than
//! `axum::serve`, which has no timeouts and no connection cap), with [`ServerLimits`]:
//!
//! * a header read timeout: a client that has not sent a whole request head within it (a
//!   slowloris socket, or an idle keep-alive connection) is disconnected;
//! * a connection cap: beyond it, the loop stops accepting until a connection ends (the kernel's
//!   backlog holds the newcomers), so file descriptors never run out and the connections already
//!   open keep being served;
//! * small connection buffers, so that idle connections cost little memory.
//!
//! The body's own limits (size, time, memory budget) are in [`crate::body`]; the cap on webhook
//! requests handled at once is a semaphore in front of the handler (503 beyond it), in
//! [`crate::http`].

use crate::app::App;
use crate::http;
use crate::outcome::Unfinished;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use worker_registry::{DrainAll, Maintenance, Sweeper, WorkerRegistry};

/// How long workers told to stop at the deadline get to deregister before their tasks are aborted.
pub const STOP_GRACE: Duration = Duration::from_secs(1);

/// The default header read timeout (GitHub sends a delivery's head at once).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The default connection cap: well under the common 1,024 file-descriptor limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// The default number of webhook requests handled at once (more get 503 at once).
pub const DEFAULT_MAX_CONCURRENT_WEBHOOKS: usize = 256;
/// Connections the worker listener takes beyond two per worker the registry can hold (a
/// worker's heartbeat and its long poll), for workers reconnecting while their old connection
/// closes.
pub const WORKER_CONNECTION_HEADROOM: usize = 64;
/// A connection's read buffer: enough for any request head GitHub sends (8 KiB is hyper's floor).
const CONNECTION_BUFFER: usize = 64 * 1024;
/// How long shutdown lets open connections finish their request.
const CONNECTION_GRACE: Duration = Duration::from_secs(5);

/// The HTTP server's limits.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// A request head must arrive within this (also closes idle keep-alive connections).
    pub header_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Webhook requests handled at once.
    pub max_concurrent_webhooks: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_concurrent_webhooks: DEFAULT_MAX_CONCURRENT_WEBHOOKS,
        }
    }
}

/// The worker listener's connection cap for a registry of `max_workers`: two per worker, plus
/// [`WORKER_CONNECTION_HEADROOM`].
pub fn worker_connections(max_workers: usize) -> usize {
    max_workers
        .saturating_mul(2)
        .saturating_add(WORKER_CONNECTION_HEADROOM)
}

/// Raises this process's soft file-descriptor limit to its hard limit, and says whether
/// `connections` (plus headroom for everything else) fit under it; returns the limit.
#[cfg(unix)]
pub fn fit_file_limit(connections: usize) -> Result<u64, String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, exclusively borrowed rlimit for the call to fill in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(format!("getrlimit: {}", io::Error::last_os_error()));
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above; raising the soft limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    #[allow(clippy::useless_conversion)] // rlim_t is u64 here, but not on every platform
    let limit = u64::try_from(lim.rlim_cur).unwrap_or(u64::MAX);
    let needed = (connections as u64).saturating_add(64);
    if needed > limit {
        return Err(format!(
            "--max-connections {connections} needs about {needed} file descriptors, but the limit is {limit} (ulimit -n)"
        ));
    }
    Ok(limit)
}

/// Without `getrlimit`, nothing to check.
#[cfg(not(unix))]
pub fn fit_file_limit(_connections: usize) -> Result<u64, String> {
    Ok(u64::MAX)
}

/// A running router: HTTP server (one address, or the webhook's and the admin's) plus sweeper.
pub struct Server {
    app: App,
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    worker_addr: Option<SocketAddr>,
    /// Set at the end of shutdown, after the workers: the worker protocol's accept loop stops.
    stop_workers_http: watch::Sender<bool>,
    sweeper: Sweeper,
    /// Set when shutdown stops the HTTP server: the accept loops stop and open connections finish.
    stop_http: watch::Sender<bool>,
    /// Set when the replica is killed: every open connection is cut at once.
    kill_http: watch::Sender<bool>,
    http: Vec<JoinHandle<io::Result<()>>>,
}

/// What [`Server::kill`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Killed {
    /// Containers that were running (they stopped without a word to the registry).
    pub containers: usize,
    /// Released events it held for re-dispatch (not acknowledged: offered to another replica after
    /// `release_ack_timeout`).
    pub pending: usize,
}

/// What [`Server::shutdown`] did, and every accepted delivery it could not complete.
#[derive(Debug, Clone)]
pub struct ShutdownReport {
    /// What draining every worker did at once.
    pub drained: DrainAll,
    /// Deliveries completed while shutting down.
    pub completed: u64,
    /// Worker tasks still running at the deadline (stopped then, their claims released).
    pub stopped_at_deadline: usize,
    /// Of those, tasks that did not stop within [`STOP_GRACE`] and were aborted.
    pub aborted: usize,
    /// Every accepted delivery that was not completed, by delivery id. Their claims are released in
    /// the registry (a shared backend's other replicas, or the next start, re-dispatch them); with
    /// the in-memory backend they are gone with the process: redeliver them from GitHub.
    pub unfinished: Vec<Unfinished>,
    /// How long the shutdown took.
    pub took: Duration,
}

/// Starts the router on `listener` and its sweeper, with the default [`ServerLimits`].
pub async fn serve(app: App, listener: TcpListener) -> io::Result<Server> {
    serve_with(app, listener, ServerLimits::default()).await
}

/// Starts the router on `listener` and its sweeper.
pub async fn serve_with(
    app: App,
    listener: TcpListener,
    limits: ServerLimits,
) -> io::Result<Server> {
    serve_split(app, listener, None, limits).await
}

/// Starts the router and its sweeper: the webhook on `listener` and, given `admin`, the admin
/// API, metrics, debug and internal endpoints there (the probes on both); without, all on
/// `listener`. Each address has its own connection cap.
pub async fn serve_split(
    app: App,
    listener: TcpListener,
    admin: Option<TcpListener>,
    limits: ServerLimits,
) -> io::Result<Server> {
    serve_all(app, listener, admin, None, limits).await
}

/// Like [`serve_split`], and given `worker`, the worker protocol (`/worker/v1/...`) there: its
/// URL is what each worker of a launcher that speaks it is handed. It is served until the end of
/// [`Server::shutdown`], after the workers have stopped (a draining worker still completes its
/// events through it).
pub async fn serve_all(
    app: App,
    listener: TcpListener,
    admin: Option<TcpListener>,
    worker: Option<TcpListener>,
    limits: ServerLimits,
) -> io::Result<Server> {
    let addr = listener.local_addr()?;
    let worker_addr = worker.as_ref().map(TcpListener::local_addr).transpose()?;
    if let Some(w) = worker_addr {
        app.protocol().set_url(format!("http://{w}"));
    }
    let admin_addr = admin.as_ref().map(TcpListener::local_addr).transpose()?;
    let mut metrics = app
        .take_metrics()
        .ok_or_else(|| io::Error::other("this App is already being served"))?;
    let redispatcher = app.redispatcher().clone();
    let sweeper = Sweeper::spawn_async(app.registry().clone(), move |report| {
        let redispatcher = redispatcher.clone();
        async move { redispatcher.after_sweep(report).await }
    });
    metrics.sweeper(sweeper.monitor());
    let (stop_http, stopped) = watch::channel(false);
    let (kill_http, killed) = watch::channel(false);
    let apps = http::apps(
        &app,
        metrics,
        limits.max_concurrent_webhooks,
        admin.is_some(),
    );
    let loop_on = |listener, router| {
        tokio::spawn(accept_loop(
            listener,
            router,
            limits,
            stopped.clone(),
            killed.clone(),
        ))
    };
    let mut http = vec![loop_on(listener, apps.webhook)];
    if let (Some(admin), Some(router)) = (admin, apps.admin) {
        http.push(loop_on(admin, router));
    }
    let (stop_workers_http, workers_stopped) = watch::channel(false);
    if let Some(worker) = worker {
        // Its own cap: every live worker holds two connections open (a heartbeat, a long poll),
        // so the webhook's cap (sized for GitHub's traffic) would starve workers past half of it.
        let worker_limits = ServerLimits {
            max_connections: worker_connections(app.registry().config().max_workers()),
            ..limits
        };
        http.push(tokio::spawn(accept_loop(
            worker,
            http::worker_app(&app),
            worker_limits,
            workers_stopped,
            killed.clone(),
        )));
    }
    Ok(Server {
        app,
        addr,
        admin_addr,
        worker_addr,
        stop_workers_http,
        sweeper,
        stop_http,
        kill_http,
        http,
    })
}

/// Accepts connections (at most `limits.max_connections` open at once) and serves each with
/// hyper's HTTP/1 builder, until `stopped`; then lets open connections finish, for a while.
async fn accept_loop(
    listener: TcpListener,
    router: axum::Router,
    limits: ServerLimits,
    mut stopped: watch::Receiver<bool>,
    killed: watch::Receiver<bool>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(CONNECTION_BUFFER)
        .keep_alive(true);
    let mut last_error_log: Option<Instant> = None;
    loop {
        // Wait for a free slot first: a full house is left in the kernel's backlog.
        let slot = tokio::select! {
            () = until_set(&mut stopped) => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let (stream, _peer) = tokio::select! {
            () = until_set(&mut stopped) => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was accepted: say
                    // so (at most once a second), wait a little, and carry on.
                    if last_error_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                        tracing::warn!("accept failed: {e}");
                        last_error_log = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = builder.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(router.clone()),
        );
        let conn = graceful.watch(conn);
        let mut killed = killed.clone();
        tokio::spawn(async move {
            // The slot is given back however the connection ends.
            let _slot = slot;
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!("connection ended: {e}");
                },
                // Killed: the connection and the request it serves are dropped where they are.
                () = async { let _ = killed.wait_for(|k| *k).await; } => {}
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(CONNECTION_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "some connections were still open {CONNECTION_GRACE:?} after shutdown began"
        );
    }
    Ok(())
}

/// Resolves once `flag` is set (or its sender is gone).
async fn until_set(flag: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`: dropped here, before the caller awaits more.
    let _ = flag.wait_for(|set| *set).await.map(|_| ());
}

impl Server {
    /// Where it listens (for the webhook, and everything else without an admin address).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the admin API listens, when it has an address of its own.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Where the worker protocol listens, when it is served.
    pub fn worker_addr(&self) -> Option<SocketAddr> {
        self.worker_addr
    }

    /// The router's state.
    pub fn app(&self) -> &App {
        &self.app
    }

    /// Whether the sweeper runs.
    pub fn sweeper_running(&self) -> bool {
        self.sweeper.monitor().is_running()
    }

    /// Kills this replica, as `kill -9` would: the HTTP server and every open connection stop at
    /// once (requests in progress get no answer), the sweeper stops wherever it is (released
    /// events handed to it are not acknowledged, so a shared backend offers them to another
    /// replica), and its containers stop without a word to the registry (another replica's sweep
    /// declares their workers dead and re-dispatches their events). Nothing is drained, completed
    /// or reported.
    pub async fn kill(self) -> Killed {
        self.kill_http.send_replace(true);
        for task in self.http {
            task.abort();
            let _ = task.await;
        }
        self.sweeper.abort().await;
        Killed {
            containers: self.app.shutdown().kill(),
            pending: self.app.outstanding().pending(),
        }
    }

    /// Refuses new deliveries and finishes the work it accepted, up to `deadline`: drains every
    /// worker (a draining worker finishes the events already queued for it), and sweeps in place
    /// of the sweeper (see [`Shutdown::finish_accepted`](crate::shutdown::Shutdown::finish_accepted)), so that released events are placed again and
    /// deliveries promoted out of the waiting room get their worker (a drained one's successor,
    /// started and drained at once), until nothing is left. At the deadline it stops the workers
    /// still running (each deregisters, releasing its claims through the registry), then stops
    /// the HTTP server. With a registry that dies with the process, one last sweep collects what
    /// those exits released; a shared one keeps it for the other replicas (handed over, not
    /// collected here, so that the next sweep of another replica places it at once). Every
    /// accepted delivery that was not completed is reported, in the report, the log and
    /// `webhook_router_shutdown_unfinished_total`.
    pub async fn shutdown(mut self, deadline: Duration) -> ShutdownReport {
        let started = Instant::now();
        let until = started + deadline;
        let registry = self.app.registry().clone();
        let completed_before = registry.stats().claims_completed;
        let drained = self.app.shutdown().begin(deadline).await;
        // From here the shutdown sweeps (`Shutdown::finish_accepted`).
        self.sweeper.shutdown().await;
        let mut settled = self.app.shutdown().finish_accepted(until).await;
        // The accept loops stop; open connections may finish their request (for a while). The
        // worker protocol's is stopped last, below.
        self.stop_http.send_replace(true);
        let worker_loop = self.worker_addr.and_then(|_| self.http.pop());
        for task in self.http.drain(..) {
            let _ = task.await;
        }
        // A request that raced the closing flag may have started a worker meanwhile.
        if settled && self.app.lifecycle().running() > 0 {
            settled = self.app.shutdown().finish_accepted(until).await;
        }
        let stopped_at_deadline = if settled {
            0
        } else {
            self.app.lifecycle().running()
        };
        let aborted = if stopped_at_deadline > 0 {
            tracing::warn!(
                workers = stopped_at_deadline,
                "shutdown deadline reached: stopping the workers still running"
            );
            self.app.shutdown().stop_workers(STOP_GRACE).await
        } else {
            0
        };
        self.stop_workers_http.send_replace(true);
        if let Some(task) = worker_loop {
            let _ = task.await;
        }
        let released = if self.app.outstanding().is_shared() {
            Vec::new()
        } else {
            // One last sweep collects what the exits released or promoted: nobody is left to
            // place it.
            match registry.sweep().await {
                Ok(report) => report.released,
                Err(e) => {
                    tracing::warn!("the last sweep failed: {e}");
                    Vec::new()
                }
            }
        };
        let unfinished = self.app.shutdown().account_unfinished(&released);
        ShutdownReport {
            drained,
            completed: registry
                .stats()
                .claims_completed
                .saturating_sub(completed_before),
            stopped_at_deadline,
            aborted,
            unfinished,
            took: started.elapsed(),
        }
    }
}
