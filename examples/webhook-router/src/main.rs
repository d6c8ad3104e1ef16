//! The reference webhook router: GitHub deliveries in, one simulated worker container per pull
//! request, the worker registry in between.
//!
//! ```text
//! cargo run --release --features http --example webhook_router -- --simulate
//! cargo run --release --features http --example webhook_router -- --webhook-secret s3cret
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
//! * `--simulate` drives built-in traffic at it over HTTP and prints a summary.
//! * Ctrl-C refuses new deliveries, drains every worker and exits when they are done (or at the
//!   deadline).

use webhook_router::{app, sim};

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rand::Rng;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;
use worker_registry::{
    InMemoryRegistry, RegistryConfig, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_MAX_WORKERS,
    DEFAULT_MISSED_HEARTBEATS, DEFAULT_SWEEP_INTERVAL,
};

/// Serve GitHub webhooks through the worker registry (or simulate traffic at it with --simulate).
///
/// Timing flags default to production-like values, or to fast ones with --simulate (shown as
/// "serve / simulate").
#[derive(Parser, Debug)]
#[command(name = "webhook_router", version)]
struct Args {
    /// Address to listen on [default: 127.0.0.1:3000 / 127.0.0.1:0].
    #[arg(long, env = "WEBHOOK_ROUTER_BIND")]
    bind: Option<SocketAddr>,
    /// Live workers (containers) allowed at once [default: 64 / 48].
    #[arg(long, env = "WEBHOOK_ROUTER_CAPACITY")]
    capacity: Option<usize>,
    /// Worker heartbeat interval, ms [default: 30000 / 100].
    #[arg(long, env = "WEBHOOK_ROUTER_HEARTBEAT_MS")]
    heartbeat_ms: Option<u64>,
    /// Missed heartbeat intervals before a worker is declared dead [default: 4 / 3].
    #[arg(long, env = "WEBHOOK_ROUTER_MISSED_HEARTBEATS")]
    missed_heartbeats: Option<u32>,
    /// How long a simulated worker's loop runs per event, ms [default: 2000 / 20].
    #[arg(long, env = "WEBHOOK_ROUTER_WORK_MS")]
    work_ms: Option<u64>,
    /// How long a worker waits for another event before it exits, ms [default: 60000 / 200].
    #[arg(long, env = "WEBHOOK_ROUTER_IDLE_MS")]
    idle_ms: Option<u64>,
    /// Events a worker may have queued before its target gets 503.
    #[arg(long, env = "WEBHOOK_ROUTER_MAILBOX", default_value_t = app::DEFAULT_MAILBOX)]
    mailbox: usize,
    /// GitHub webhook secret: deliveries must carry a valid X-Hub-Signature-256. Without one, unsigned
    /// deliveries are accepted, and only on a loopback bind. [default: none / a random one]
    #[arg(long, env = "WEBHOOK_ROUTER_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// Bearer token required by POST /workers/{id}/drain and POST /debug/... [default: none / a random one]
    #[arg(long, env = "WEBHOOK_ROUTER_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// How long Ctrl-C waits for draining workers before exiting anyway, ms [default: 10000 / 5000].
    #[arg(long, env = "WEBHOOK_ROUTER_SHUTDOWN_MS")]
    shutdown_ms: Option<u64>,
    /// Drive built-in traffic at the router over HTTP, then print a summary and exit.
    #[arg(long)]
    simulate: bool,
    /// --simulate: deliveries to send.
    #[arg(long, default_value_t = 4000, requires = "simulate")]
    events: usize,
    /// --simulate: deliveries per second (0: as fast as the clients go).
    #[arg(long, default_value_t = 800, requires = "simulate")]
    rate: u32,
    /// --simulate: concurrent HTTP clients.
    #[arg(long, default_value_t = 32, requires = "simulate")]
    clients: usize,
    /// --simulate: repositories (6 pull requests each).
    #[arg(long, default_value_t = 12, requires = "simulate")]
    repos: usize,
    /// --simulate: seed of the traffic generator.
    #[arg(long, default_value_t = 1, requires = "simulate")]
    seed: u64,
}

/// Everything the flags decide, validated.
struct Settings {
    bind: SocketAddr,
    config: RegistryConfig,
    options: app::Options,
    shutdown: Duration,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn settings(a: &Args) -> Result<Settings, String> {
    let sim = a.simulate;
    let pick =
        |v: Option<u64>, serve: u64, simulate: u64| v.unwrap_or(if sim { simulate } else { serve });
    let heartbeat = ms(pick(
        a.heartbeat_ms,
        u64::try_from(DEFAULT_HEARTBEAT_INTERVAL.as_millis()).unwrap_or(30_000),
        100,
    ));
    let missed = a
        .missed_heartbeats
        .unwrap_or(if sim { 3 } else { DEFAULT_MISSED_HEARTBEATS });
    let capacity = a
        .capacity
        .unwrap_or(if sim { 48 } else { DEFAULT_MAX_WORKERS });
    // Sweep at least twice per heartbeat interval (never less often than the library default), so a
    // silent worker is noticed within half an interval of its deadline.
    let sweep = (heartbeat / 2).clamp(ms(1), DEFAULT_SWEEP_INTERVAL);
    let config = RegistryConfig::builder()
        .max_workers(capacity)
        .heartbeat_interval(heartbeat)
        .missed_heartbeats(missed)
        .sweep_interval(sweep)
        // The simulated container heartbeats as soon as it starts.
        .startup_grace(heartbeat)
        .build()
        .map_err(|e| e.to_string())?;

    let bind = a.bind.unwrap_or(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        if sim { 0 } else { 3000 },
    ));
    if sim && !bind.ip().is_loopback() {
        return Err(format!(
            "--simulate only runs on a loopback address, not {bind}"
        ));
    }
    let random_token = || format!("{:032x}", rand::thread_rng().gen::<u128>());
    let secret = match (&a.webhook_secret, sim) {
        (Some(s), _) if s.is_empty() => return Err("--webhook-secret is empty".into()),
        (Some(s), _) => Some(s.clone()),
        (None, true) => Some(random_token()),
        (None, false) => None,
    };
    if secret.is_none() && !bind.ip().is_loopback() {
        return Err(format!(
            "refusing to accept unsigned deliveries on {bind}, which is not a loopback address: \
             set --webhook-secret (the secret configured on the GitHub webhook)"
        ));
    }
    let admin_token = match (&a.admin_token, sim) {
        (Some(t), _) if t.is_empty() => return Err("--admin-token is empty".into()),
        (Some(t), _) => Some(t.clone()),
        (None, true) => Some(random_token()),
        (None, false) => None,
    };
    let options = app::Options {
        webhook_secret: secret.map(|s| Arc::from(s.into_bytes())),
        admin_token,
        work: ms(pick(a.work_ms, 2_000, 20)),
        idle: ms(pick(a.idle_ms, 60_000, 200)),
        mailbox: a.mailbox,
    };
    if options.mailbox == 0 {
        return Err("--mailbox must be at least 1".into());
    }
    Ok(Settings {
        bind,
        config,
        options,
        shutdown: ms(pick(a.shutdown_ms, 10_000, 5_000)),
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // The simulation's summary says what happened; its log only shows errors unless RUST_LOG says.
    let default_filter = if args.simulate {
        "error"
    } else {
        "info,webhook_router=info"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();

    let s = match settings(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("webhook_router: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(s.bind).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("webhook_router: cannot listen on {}: {e}", s.bind);
            return ExitCode::from(1);
        }
    };
    let signed = s.options.webhook_secret.is_some();
    let plan = args.simulate.then(|| sim::Plan {
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
    });
    let app = app::App::new(InMemoryRegistry::new(s.config), s.options);
    let server = match app::serve(app, listener).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("webhook_router: {e}");
            return ExitCode::from(1);
        }
    };
    let addr = server.addr();

    if let Some(plan) = plan {
        return if sim::run(server, plan).await {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
    }

    let cfg = server.app().registry().config();
    tracing::info!(
        "listening on http://{addr}: POST /webhook | GET /workers, /workers/{{id}}, /metrics, /openapi.json, /healthz | POST /workers/{{id}}/drain, /debug/workers/{{id}}/crash"
    );
    tracing::info!(
        capacity = cfg.max_workers(),
        heartbeat = ?cfg.heartbeat_interval(),
        missed_heartbeats = cfg.missed_heartbeats(),
        sweep = ?cfg.sweep_interval(),
        work = ?server.app().options().work,
        idle = ?server.app().options().idle,
        "registry configured"
    );
    if signed {
        tracing::info!("deliveries must carry a valid X-Hub-Signature-256");
    } else {
        tracing::warn!(
            "no --webhook-secret: accepting UNSIGNED deliveries, allowed only because {addr} is a loopback address"
        );
    }
    if server.app().options().admin_token.is_none() {
        tracing::warn!("no --admin-token: POST /workers/{{id}}/drain and /debug/... are open to anyone who can reach {addr}");
    }

    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("webhook_router: cannot wait for Ctrl-C: {e}");
        return ExitCode::from(1);
    }
    tracing::info!(
        live = server.app().registry().live_workers(),
        deadline = ?s.shutdown,
        "Ctrl-C: refusing new deliveries, draining every worker (Ctrl-C again to exit at once)"
    );
    tokio::select! {
        report = server.shutdown(s.shutdown) => {
            tracing::info!(
                draining = report.drained.draining,
                exited_at_once = report.drained.exited,
                still_running = report.still_running,
                not_redispatched = report.not_redispatched,
                "shut down"
            );
            if report.still_running > 0 {
                tracing::warn!("{} workers were still running at the deadline", report.still_running);
            }
            ExitCode::SUCCESS
        }
        _ = tokio::signal::ctrl_c() => {
            tracing::warn!("second Ctrl-C: exiting without waiting for the workers");
            ExitCode::from(130)
        }
    }
}
