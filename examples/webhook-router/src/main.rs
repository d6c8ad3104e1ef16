//! The reference webhook router: GitHub deliveries in, one simulated worker container per pull
//! request, the worker registry in between.
//!
//! ```text
//! cargo run --release -p worker-registry-router -- --simulate
//! cargo run --release -p worker-registry-router -- --webhook-secret s3cret
//! ```
//!
//! * `POST /webhook` takes GitHub deliveries (`X-GitHub-Event`, `X-GitHub-Delivery`,
//!   `X-Hub-Signature-256`), finds the pull request they concern, and admits them to the registry:
//!   a redelivery is skipped, the PR's worker gets the event, a new PR gets a new worker (a tokio
//!   task standing in for a container) if capacity allows, else 503.
//! * `GET /workers`, `GET /workers/{id}`, `POST /workers/{id}/drain`, `GET /metrics`,
//!   `GET /openapi.json`: the library's admin API; `GET /healthz`, `GET /readyz`: the probes.
//!   `--admin-bind` puts all but the webhook and the probes on an address of their own.
//! * `POST /debug/workers/{id}/crash`: the container stops heartbeating; watch the sweep declare it
//!   dead and its events go to a new worker.
//! * `GET /deliveries/failed`: the most recent deliveries whose command failed every attempt.
//! * `--simulate` drives built-in traffic at it over HTTP and prints a summary; with
//!   `--replicas N` and a shared registry, at N replicas in this process, one of which is killed.
//! * `--registry redis://...` or `postgres://...`: replicas (processes) sharing one registry;
//!   each runs the containers of the workers its admissions create and forwards events for other
//!   workers to their owner (see `remote.rs`).
//! * `--github-app-id`/`--github-app-key` or `--github-repo-hook`/`--github-org-hook` with
//!   `--github-token`: the reconciler redelivers what GitHub logged as failed (see `reconcile/`).
//! * SIGTERM or SIGINT (Ctrl-C): readiness turns 503, new deliveries are refused, the accepted
//!   ones are finished (parked and released ones included) and it exits when they are done; at
//!   the deadline it stops the rest and lists every delivery it could not complete. A second
//!   signal exits at once.

use webhook_router::server::{Server, ShutdownReport};
use webhook_router::signals::Signals;
use webhook_router::{cli, reload, server, sim, telemetry};

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio::net::TcpListener;
use webhook_router::app::{App, Platform};
use webhook_router::reconcile::shared::Shared;
use webhook_router::reconcile::{Reconciler, Running};
use worker_registry::WorkerRegistry;

fn main() -> ExitCode {
    // Before the runtime's threads exist.
    webhook_router::body::return_large_buffers_to_the_os();
    match tokio::runtime::Runtime::new() {
        Ok(rt) => {
            let code = rt.block_on(run());
            // Whatever still runs (a second signal's exit leaves workers) is not waited for.
            rt.shutdown_background();
            code
        }
        Err(e) => {
            eprintln!("webhook-router: cannot start the runtime: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run() -> ExitCode {
    let args = cli::Args::parse();
    // The simulation's summary says what happened; its log only shows errors unless RUST_LOG says.
    let default_filter = if args.simulate {
        "error"
    } else {
        "info,webhook_router=info"
    };
    // The log on stderr; with the `otel` feature, traces over OTLP as the OTEL_* variables say.
    let telemetry = match telemetry::init(default_filter, args.log_format) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("webhook-router: {e}");
            return ExitCode::from(2);
        }
    };
    let code = run_with(&args).await;
    telemetry.shutdown();
    code
}

async fn run_with(args: &cli::Args) -> ExitCode {
    let s = match cli::settings(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("webhook-router: {e}");
            return ExitCode::from(2);
        }
    };
    match server::fit_file_limit(s.limits.max_connections) {
        Ok(limit) => tracing::debug!(limit, "file descriptor limit"),
        Err(e) => {
            eprintln!("webhook-router: {e}");
            return ExitCode::from(2);
        }
    }
    if args.simulate {
        return simulate(args, &s).await;
    }
    // Handled from before the router listens: a stop that comes early is a graceful one too.
    let (signals, reloader) = match handlers(&s) {
        Ok(handlers) => handlers,
        Err(e) => {
            eprintln!("webhook-router: {e}");
            return ExitCode::from(1);
        }
    };
    let server = match start(&s).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("webhook-router: {e}");
            return ExitCode::from(1);
        }
    };
    announce(&server, &s);
    let reconciler = match reconciler(&server, &s).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("webhook-router: {e}");
            return ExitCode::from(1);
        }
    };
    let code = serve_until_signalled(server, signals, &s).await;
    reloader.abort();
    if let Some(r) = reconciler {
        r.stop().await;
    }
    code
}

/// SIGTERM and SIGINT (the stop), and SIGHUP with the secret files' changes (the reloader).
fn handlers(s: &cli::Settings) -> Result<(Signals, tokio::task::JoinHandle<()>), String> {
    let signals = Signals::new().map_err(|e| format!("cannot handle signals: {e}"))?;
    let reloader = reload::spawn(s.watched.clone(), s.reload)
        .map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
    if !s.watched.is_empty() {
        let files: Vec<&str> = s.watched.iter().map(|w| w.flag).collect();
        tracing::info!(
            files = %files.join(", "),
            rotation_window = %humantime::format_duration(s.reload.window),
            poll = %humantime::format_duration(s.reload.poll),
            "secret files are read again on SIGHUP and when they change"
        );
    }
    Ok((signals, reloader))
}

/// Starts the reconciler of failed deliveries, if one is configured.
async fn reconciler(server: &Server, s: &cli::Settings) -> Result<Option<Running>, String> {
    let Some(cfg) = s.reconcile.clone() else {
        return Ok(None);
    };
    // The replica's one store (its container owners' records) holds the lease too.
    let store = server.app().remote().map(|r| r.store());
    let shared = Shared::beside(store).await.map_err(|e| {
        format!(
            "cannot open the reconciler's lease next to the {} registry: {e}",
            s.registry
        )
    })?;
    tracing::info!(
        api = %cfg.api_url,
        app = cfg.app.is_some(),
        hooks = cfg.hooks.len(),
        interval = %humantime::format_duration(cfg.interval),
        horizon = %humantime::format_duration(cfg.horizon),
        "reconciler of failed deliveries started"
    );
    let r = Reconciler::new(server.app().for_reconciler(), cfg, shared)?;
    Ok(Some(r.spawn()))
}

/// Opens the registry, listens and starts the router.
async fn start(s: &cli::Settings) -> Result<Server, String> {
    let registry = s
        .registry
        .open(s.config.clone(), &s.registry_name)
        .await
        .map_err(|e| format!("cannot open the {} registry: {e}", s.registry))?;
    let listener = listen(s.bind).await?;
    let admin = match s.admin_bind {
        Some(addr) => Some(listen(addr).await?),
        None => None,
    };
    // Other replicas forward to the internal endpoint, on the admin address if it has one.
    let mut platform = platform(s, admin.as_ref().unwrap_or(&listener)).await?;
    platform.launcher = s.launch.launcher(&s.registry_name, &s.bind.to_string())?;
    platform.protocol = s.launch.protocol.clone();
    let app = App::with_platform(registry, s.options.clone(), platform);
    let worker = if app.launcher().speaks_protocol() {
        app.protocol().check().map_err(|e| {
            format!(
                "--launcher {}: {e} (or lower --kill-margin / --timer-slack)",
                s.launch.kind.as_str()
            )
        })?;
        if s.launch.protocol.key.is_none() && s.registry.is_shared() {
            tracing::warn!("no --worker-key-file with a shared registry: this replica's workers carry credentials only it can verify (right while each worker talks only to the replica that launched it)");
        }
        Some(listen(s.launch.worker_bind).await?)
    } else {
        None
    };
    // What a previous incarnation left running is settled before anything is served.
    app.lifecycle().settle_leftovers().await?;
    server::serve_all(app, listener, admin, worker, s.limits)
        .await
        .map_err(|e| e.to_string())
}

async fn listen(addr: std::net::SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))
}

/// Logs where the router listens and how it is configured (and what it leaves unguarded).
fn announce(server: &Server, s: &cli::Settings) {
    let addr = server.addr();
    let signed = s.options.webhook_secret.is_set();
    let cfg = server.app().registry().config();
    match server.admin_addr() {
        None => tracing::info!(
            "listening on http://{addr}: POST /webhook | GET /healthz, /readyz | GET /workers, /workers/{{id}}, /metrics, /openapi.json | POST /workers/{{id}}/drain, /debug/workers/{{id}}/crash"
        ),
        Some(admin) => {
            tracing::info!("listening on http://{addr}: POST /webhook | GET /healthz, /readyz");
            tracing::info!(
                "admin API on http://{admin}: GET /workers, /workers/{{id}}, /metrics, /openapi.json, /healthz, /readyz | POST /workers/{{id}}/drain, /debug/workers/{{id}}/crash"
            );
        }
    }
    if let Some(w) = server.worker_addr() {
        tracing::info!(
            launcher = server.app().launcher().kind(),
            "worker protocol on http://{w}: /worker/v1/heartbeat, /next, /loop/started, /complete, /loop/finished, /exit"
        );
    }
    if let Some(remote) = server.app().remote() {
        tracing::info!(
            registry_name = %s.registry_name,
            advertise = remote.advertise(),
            "shared registry: this replica runs the containers of the workers its admissions create, and forwards other events to their owners"
        );
    }
    tracing::info!(
        registry = %s.registry,
        capacity = cfg.max_workers(),
        heartbeat = ?cfg.heartbeat_interval(),
        missed_heartbeats = cfg.missed_heartbeats(),
        sweep = ?cfg.sweep_interval(),
        work = ?server.app().options().work,
        idle = ?server.app().options().idle,
        "registry configured"
    );
    tracing::info!(
        max_payload_bytes = cfg.max_payload_bytes(),
        payload_budget = cfg.payload_budget(),
        "the registry keeps each delivery's payload with its claim: a re-dispatched or promoted delivery reaches its worker with the body GitHub sent"
    );
    tracing::info!(
        header_timeout = ?s.limits.header_timeout,
        body_timeout = ?s.options.body.timeout,
        body_budget_mib = s.options.body.budget.total() >> 20,
        max_connections = s.limits.max_connections,
        max_concurrent_webhooks = s.limits.max_concurrent_webhooks,
        "HTTP limits"
    );
    if signed {
        tracing::info!("deliveries must carry a valid X-Hub-Signature-256");
    } else {
        tracing::warn!(
            "no --webhook-secret: accepting UNSIGNED deliveries, allowed only because {addr} is a loopback address"
        );
    }
    if !server.app().options().admin_token.is_set() {
        let admin = server.admin_addr().unwrap_or(addr);
        tracing::warn!("no --admin-token: the admin API and /debug/... are open to anyone who can reach {admin}");
    }
}

/// Serves until SIGTERM or SIGINT, then shuts down: readiness turns 503 and new deliveries are
/// refused at once, the work accepted is finished up to `--shutdown-ms`, what is left is
/// reported. Exit status 0 when everything accepted was completed, 3 otherwise; a second signal
/// exits at once with 128 + its number (130 for SIGINT, 143 for SIGTERM).
async fn serve_until_signalled(
    server: Server,
    mut signals: Signals,
    s: &cli::Settings,
) -> ExitCode {
    let first = signals.next().await;
    tracing::info!(
        signal = first.name(),
        live = server.app().registry().stats().live_workers,
        deadline = ?s.shutdown,
        "shutting down: not ready, refusing new deliveries, finishing the accepted ones (a second SIGTERM or SIGINT exits at once)"
    );
    tokio::select! {
        report = server.shutdown(s.shutdown) => shut_down(&report, s),
        second = signals.next() => {
            tracing::warn!(signal = second.name(), "second signal: exiting at once, without waiting for the workers");
            ExitCode::from(second.exit_status())
        }
    }
}

/// Logs what the shutdown did; the exit status.
fn shut_down(report: &ShutdownReport, s: &cli::Settings) -> ExitCode {
    tracing::info!(
        draining = report.drained.draining,
        exited_at_once = report.drained.exited,
        completed = report.completed,
        stopped_at_deadline = report.stopped_at_deadline,
        unfinished = report.unfinished.len(),
        took = ?report.took,
        "shut down"
    );
    if report.unfinished.is_empty() {
        return ExitCode::SUCCESS;
    }
    let ids: Vec<String> = report
        .unfinished
        .iter()
        .map(|u| u.delivery.to_string())
        .collect();
    if s.registry.is_shared() {
        tracing::warn!(
            "{} accepted deliveries were not completed here; they are released in the {} registry, where the other replicas (or the next start) take them: {}",
            ids.len(),
            s.registry,
            ids.join(" ")
        );
    } else {
        tracing::warn!(
            "{} accepted deliveries were not completed, and the in-memory registry is gone with this process: redeliver them from GitHub: {}",
            ids.len(),
            ids.join(" ")
        );
    }
    ExitCode::from(3)
}

/// Where this (serving) router's containers run: its own platform, and, with a shared registry,
/// the owner records and forwarding to the replicas in other processes.
async fn platform(s: &cli::Settings, internal: &TcpListener) -> Result<Platform, String> {
    let advertise = match &s.advertise_url {
        Some(url) => url.clone(),
        None => {
            let addr = internal
                .local_addr()
                .map_err(|e| format!("cannot read the listening address: {e}"))?;
            if addr.ip().is_unspecified() && s.registry.is_shared() {
                return Err(format!(
                    "listening on {addr}: set --advertise-url to the address other replicas reach this one at"
                ));
            }
            format!("http://{addr}")
        }
    };
    Platform::for_backend(
        &s.registry,
        &s.registry_name,
        &advertise,
        s.options.admin_token.clone(),
        s.config.heartbeat_interval(),
        s.options.mailbox,
        s.options.overflow,
    )
    .await
}

/// `--simulate`: the router (or `--replicas` of them on one shared registry, in this process,
/// sharing one container platform) under built-in traffic, then the summary.
async fn simulate(args: &cli::Args, s: &cli::Settings) -> ExitCode {
    let workers = match s.launch.kind {
        webhook_router::launch_flags::LauncherKind::Process => {
            match sim::processes::SimWorkers::new(
                std::path::Path::new(&s.launch.worker_argv[0]),
                s.options.work,
                s.options.idle,
            ) {
                Ok(w) => Some(std::sync::Arc::new(w)),
                Err(e) => {
                    eprintln!("webhook-router: {e}");
                    return ExitCode::from(1);
                }
            }
        }
        _ => None,
    };
    let (servers, probe) = match sim::start_with(
        &s.registry,
        &s.registry_name,
        &s.config,
        &s.options,
        s.limits,
        s.bind,
        s.replicas,
        workers.as_deref(),
    )
    .await
    {
        Ok(started) => started,
        Err(e) => {
            eprintln!("webhook-router: {e}");
            return ExitCode::from(1);
        }
    };
    let plan = sim::Plan {
        events: args.events,
        rate: args.rate,
        clients: args.clients,
        repos: args.repos,
        prs: 6,
        redeliveries: 0.10,
        crash_every: Duration::from_millis(700),
        drain_every: Duration::from_millis(900),
        max_time: Duration::from_secs(30),
        seed: args.seed,
        secret: s
            .options
            .webhook_secret
            .current()
            .map(|v| v.to_vec())
            .unwrap_or_default(),
        admin_token: s.options.admin_token.current_text(),
        shutdown_deadline: s.shutdown,
        registry: s.registry.to_string(),
        registry_name: s.registry_name.clone(),
        workers,
    };
    if sim::run(servers, plan, probe).await.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
