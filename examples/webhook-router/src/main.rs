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
//!   `GET /openapi.json`, `GET /healthz`: the library's admin API.
//! * `POST /debug/workers/{id}/crash`: the container stops heartbeating; watch the sweep declare it
//!   dead and its events go to a new worker.
//! * `--simulate` drives built-in traffic at it over HTTP and prints a summary; with
//!   `--replicas N` and a shared registry, at N replicas in this process, one of which is killed.
//! * `--registry redis://...` or `postgres://...`: replicas (processes) sharing one registry;
//!   each runs the containers of the workers its admissions create and forwards events for other
//!   workers to their owner (see `remote.rs`).
//! * `--github-app-id`/`--github-app-key` or `--github-repo-hook`/`--github-org-hook` with
//!   `--github-token`: the reconciler redelivers what GitHub logged as failed (see `reconcile/`).
//! * Ctrl-C refuses new deliveries, drains every worker and exits when they are done; at the
//!   deadline it stops the rest and lists every delivery it could not complete.

use webhook_router::server::Server;
use webhook_router::{cli, server, sim, telemetry};

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
        Ok(rt) => rt.block_on(run()),
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
    let telemetry = match telemetry::init(default_filter) {
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
    let code = serve_until_ctrl_c(server, &s).await;
    if let Some(r) = reconciler {
        r.stop().await;
    }
    code
}

/// Starts the reconciler of failed deliveries, if one is configured.
async fn reconciler(server: &Server, s: &cli::Settings) -> Result<Option<Running>, String> {
    let Some(cfg) = s.reconcile.clone() else {
        return Ok(None);
    };
    let shared = Shared::open(&s.registry, &s.registry_name)
        .await
        .map_err(|e| {
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
    let r = Reconciler::new(server.app().clone(), cfg, shared)?;
    Ok(Some(r.spawn()))
}

/// Opens the registry, listens and starts the router.
async fn start(s: &cli::Settings) -> Result<Server, String> {
    let registry = s
        .registry
        .open(s.config.clone(), &s.registry_name)
        .await
        .map_err(|e| format!("cannot open the {} registry: {e}", s.registry))?;
    let listener = TcpListener::bind(s.bind)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", s.bind))?;
    let platform = platform(s, &listener).await?;
    let app = App::with_platform(registry, s.options.clone(), platform);
    server::serve_with(app, listener, s.limits)
        .await
        .map_err(|e| e.to_string())
}

/// Logs where the router listens and how it is configured (and what it leaves unguarded).
fn announce(server: &Server, s: &cli::Settings) {
    let addr = server.addr();
    let signed = s.options.webhook_secret.is_some();
    let cfg = server.app().registry().config();
    tracing::info!(
        "listening on http://{addr}: POST /webhook | GET /workers, /workers/{{id}}, /metrics, /openapi.json, /healthz | POST /workers/{{id}}/drain, /debug/workers/{{id}}/crash"
    );
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
    if server.app().options().admin_token.is_none() {
        tracing::warn!("no --admin-token: the admin API and /debug/... are open to anyone who can reach {addr}");
    }
}

/// Serves until Ctrl-C, then shuts down (a second Ctrl-C exits at once).
async fn serve_until_ctrl_c(server: Server, s: &cli::Settings) -> ExitCode {
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("webhook-router: cannot wait for Ctrl-C: {e}");
        return ExitCode::from(1);
    }
    tracing::info!(
        live = server.app().registry().stats().live_workers,
        deadline = ?s.shutdown,
        "Ctrl-C: refusing new deliveries, draining every worker (Ctrl-C again to exit at once)"
    );
    tokio::select! {
        report = server.shutdown(s.shutdown) => {
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
                ExitCode::SUCCESS
            } else {
                let ids: Vec<String> = report.unfinished.iter().map(|u| u.delivery.to_string()).collect();
                tracing::warn!(
                    "{} accepted deliveries were not completed (released in the {} registry; redeliver them from GitHub if it does not outlive this process): {}",
                    ids.len(),
                    s.registry,
                    ids.join(" ")
                );
                ExitCode::from(3)
            }
        }
        _ = tokio::signal::ctrl_c() => {
            tracing::warn!("second Ctrl-C: exiting without waiting for the workers");
            ExitCode::from(130)
        }
    }
}

/// Where this (serving) router's containers run: its own platform, and, with a shared registry,
/// the owner records and forwarding to the replicas in other processes.
async fn platform(s: &cli::Settings, listener: &TcpListener) -> Result<Platform, String> {
    let advertise = match &s.advertise_url {
        Some(url) => url.clone(),
        None => {
            let addr = listener
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
    let (servers, probe) = match sim::start(
        &s.registry,
        &s.registry_name,
        &s.config,
        &s.options,
        s.limits,
        s.bind,
        s.replicas,
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
            .as_deref()
            .map(<[u8]>::to_vec)
            .unwrap_or_default(),
        admin_token: s.options.admin_token.clone(),
        shutdown_deadline: s.shutdown,
        registry: s.registry.to_string(),
        registry_name: s.registry_name.clone(),
    };
    if sim::run(servers, plan, probe).await.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
