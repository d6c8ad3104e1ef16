//! A running router: the HTTP server and the [`Sweeper`] whose released events are re-dispatched;
//! [`Server::shutdown`] is the Ctrl-C path.

use crate::app::{App, Unfinished};
use crate::http;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use worker_registry::{DrainAll, Maintenance, Sweeper, WorkerRegistry};

/// How long workers told to stop at the deadline get to deregister before their tasks are aborted.
pub const STOP_GRACE: Duration = Duration::from_secs(1);

/// A running router: HTTP server plus sweeper.
pub struct Server {
    app: App,
    addr: SocketAddr,
    sweeper: Sweeper,
    stop_http: oneshot::Sender<()>,
    http: JoinHandle<io::Result<()>>,
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

/// Starts the router on `listener` and its sweeper.
pub async fn serve(app: App, listener: TcpListener) -> io::Result<Server> {
    let addr = listener.local_addr()?;
    let redispatcher = app.clone();
    let sweeper = Sweeper::spawn_async(app.registry().clone(), move |report| {
        let app = redispatcher.clone();
        async move { app.after_sweep(report).await }
    });
    let mut metrics = app
        .take_metrics()
        .ok_or_else(|| io::Error::other("this App is already being served"))?;
    metrics.sweeper(sweeper.monitor());
    let (stop_http, stopped) = oneshot::channel::<()>();
    let router = http::router(&app, metrics);
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

impl Server {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The router's state.
    pub fn app(&self) -> &App {
        &self.app
    }

    /// Whether the sweeper runs.
    pub fn sweeper_running(&self) -> bool {
        self.sweeper.monitor().is_running()
    }

    /// Refuses new deliveries, drains every worker with `deadline` and waits for them (a draining
    /// worker finishes the events already queued for it); at the deadline, stops the workers still
    /// running (each deregisters, releasing its claims through the registry), then stops the HTTP
    /// server and the sweeper, runs one last sweep and reports every accepted delivery that was not
    /// completed, in the report, the log and `webhook_router_shutdown_unfinished_total`.
    pub async fn shutdown(self, deadline: Duration) -> ShutdownReport {
        let started = Instant::now();
        let registry = self.app.registry().clone();
        let completed_before = registry.stats().claims_completed;
        let drained = self.app.begin_shutdown(deadline).await;
        let left = deadline.saturating_sub(started.elapsed());
        let stopped_at_deadline = self.app.wait_workers(left).await;
        let aborted = if stopped_at_deadline > 0 {
            tracing::warn!(
                workers = stopped_at_deadline,
                "shutdown deadline reached: stopping the workers still running"
            );
            self.app.stop_workers(STOP_GRACE).await
        } else {
            0
        };
        let _ = self.stop_http.send(());
        let _ = self.http.await;
        self.sweeper.shutdown().await;
        // One last sweep collects what the exits released. Nobody is left to place it here, so it is
        // not acknowledged: a shared backend offers it to another replica.
        let released = match registry.sweep().await {
            Ok(report) => report.released,
            Err(e) => {
                tracing::warn!("the last sweep failed: {e}");
                Vec::new()
            }
        };
        let unfinished = self.app.unfinished(&released);
        self.app
            .inner
            .metrics
            .shutdown_unfinished
            .inc_by(unfinished.len() as u64);
        for u in &unfinished {
            tracing::warn!(
                delivery = %u.delivery,
                target = %u.target,
                why = %u.why,
                "accepted delivery not completed at shutdown (released in the registry)"
            );
        }
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
