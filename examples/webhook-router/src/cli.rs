//! The command line: [`Args`] (every flag has a `WEBHOOK_ROUTER_*` environment variable) and
//! [`settings`], which validates them into [`Settings`] or says what is wrong. Every bound is
//! checked here, where the flag is read, so that nothing downstream can overflow or panic on a
//! value a careless operator typed.

use crate::app;
use crate::backend::{validate_name, RegistryChoice, DEFAULT_REGISTRY_NAME};
use crate::body::{BodyBudget, BodyLimits};
use crate::github;
use crate::limits::{DEFAULT_MAILBOX, DEFAULT_OVERFLOW, MAX_MAILBOX, MAX_OVERFLOW};
use crate::policy::Policy;
use crate::reload::{self, ReloadOptions, Rotation, Watched};
use crate::secrets::{self, Secret};
use crate::server::{self, ServerLimits};

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rand::Rng;
use worker_registry::config::{
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_MAX_WAITING_PER_OWNER, DEFAULT_MAX_WORKERS,
    DEFAULT_MAX_WORKERS_PER_OWNER, DEFAULT_MISSED_HEARTBEATS, DEFAULT_RELEASE_ACK_TIMEOUT,
    DEFAULT_SWEEP_INTERVAL, MAX_DURATION,
};
use worker_registry::RegistryConfig;

/// A heartbeat timeout must span at least this many ticks of the registry's clock: a coarser one
/// would declare healthy workers dead between two ticks (4 ms ticks and a 2 ms timeout killed 251
/// healthy workers in 4 s).
pub const MIN_TIMEOUT_TICKS: u32 = 10;

/// Serve GitHub webhooks through the worker registry (or simulate traffic at it with --simulate).
///
/// Timing flags default to production-like values, or to fast ones with --simulate (shown as
/// "serve / simulate").
#[derive(Parser, Debug, Clone)]
#[command(name = "webhook-router", version)]
pub struct Args {
    /// Registry backend: `memory` (this process only), `redis://host:port/db` or
    /// `postgres://user@host/db` (shared by every replica with the same --registry-name).
    #[arg(long, env = "WEBHOOK_ROUTER_REGISTRY", default_value = "memory")]
    pub registry: RegistryChoice,
    /// The registry's name on a shared backend: replicas with the same name share one registry
    /// [default: webhook-router / a fresh one per run].
    #[arg(long, env = "WEBHOOK_ROUTER_REGISTRY_NAME")]
    pub registry_name: Option<String>,
    /// How other replicas reach this one (its events for this replica's containers are forwarded
    /// there), with a shared backend [default: http://ADDR, ADDR the address it listens on].
    #[arg(long, env = "WEBHOOK_ROUTER_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// How long a released event handed to this replica for re-dispatch may stay unacknowledged
    /// before a shared backend offers it to another replica, ms [default: 60000 / 1000].
    #[arg(long, env = "WEBHOOK_ROUTER_RELEASE_ACK_MS")]
    pub release_ack_ms: Option<u64>,
    /// Address to listen on [default: 127.0.0.1:3000 / 127.0.0.1:0].
    #[arg(long, env = "WEBHOOK_ROUTER_BIND")]
    pub bind: Option<SocketAddr>,
    /// A separate address for the admin API, /metrics, /openapi.json, the debug endpoint and the
    /// replicas' internal endpoint (the default --advertise-url is then this one); --bind then
    /// serves only POST /webhook and the probes (/healthz, /readyz), which both addresses serve
    /// [default: everything on --bind].
    #[arg(long, env = "WEBHOOK_ROUTER_ADMIN_BIND")]
    pub admin_bind: Option<SocketAddr>,
    /// Live workers (containers) allowed at once [default: 64 / 48].
    #[arg(long, env = "WEBHOOK_ROUTER_CAPACITY")]
    pub capacity: Option<usize>,
    /// Deliveries that may wait for room (no capacity, or their pull request's worker draining):
    /// answered 202 `waiting` and processed when room appears, instead of 503. 0 turns the
    /// waiting room off [default: 1024, --simulate too].
    #[arg(long, env = "WEBHOOK_ROUTER_WAITING")]
    pub waiting: Option<usize>,
    /// Deliveries of one repository owner that may wait at once [default: 256].
    #[arg(long, env = "WEBHOOK_ROUTER_WAITING_PER_OWNER")]
    pub waiting_per_owner: Option<usize>,
    /// Live workers one repository owner may hold at once (0: no cap beyond --capacity)
    /// [default: 0].
    #[arg(long, env = "WEBHOOK_ROUTER_OWNER_CAP")]
    pub owner_cap: Option<usize>,
    /// Worker heartbeat interval, ms [default: 30000 / 100].
    #[arg(long, env = "WEBHOOK_ROUTER_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// Missed heartbeat intervals before a worker is declared dead [default: 4 / 3].
    #[arg(long, env = "WEBHOOK_ROUTER_MISSED_HEARTBEATS")]
    pub missed_heartbeats: Option<u32>,
    /// How long a simulated worker's loop runs per event, ms [default: 2000 / 20].
    #[arg(long, env = "WEBHOOK_ROUTER_WORK_MS")]
    pub work_ms: Option<u64>,
    /// How long a worker waits for another event before it exits, ms [default: 60000 / 200].
    #[arg(long, env = "WEBHOOK_ROUTER_IDLE_MS")]
    pub idle_ms: Option<u64>,
    /// Events a worker may have queued in its mailbox (1 to 65536).
    #[arg(long, env = "WEBHOOK_ROUTER_MAILBOX", default_value_t = DEFAULT_MAILBOX)]
    pub mailbox: usize,
    /// Events a worker may have queued behind its full mailbox, answered 202 waiting and sent to it
    /// in arrival order, before its target gets 503 (0 to 65536; 0: a full mailbox is a 503).
    #[arg(long, env = "WEBHOOK_ROUTER_OVERFLOW", default_value_t = DEFAULT_OVERFLOW)]
    pub overflow: usize,
    /// GitHub webhook secret: deliveries must carry a valid X-Hub-Signature-256. Without one, unsigned
    /// deliveries are accepted, and only on a loopback bind. [default: none / a random one]
    #[arg(
        long,
        env = "WEBHOOK_ROUTER_WEBHOOK_SECRET",
        hide_env_values = true,
        conflicts_with = "webhook_secret_file"
    )]
    pub webhook_secret: Option<String>,
    /// A file holding the webhook secret (one trailing line break is ignored), read again on
    /// SIGHUP and when it changes; the previous secret stays accepted for
    /// --secret-rotation-window.
    #[arg(long, env = "WEBHOOK_ROUTER_WEBHOOK_SECRET_FILE")]
    pub webhook_secret_file: Option<PathBuf>,
    /// Bearer token required by the admin API (reads included) and POST /debug/...
    /// [default: none / a random one]
    #[arg(
        long,
        env = "WEBHOOK_ROUTER_ADMIN_TOKEN",
        hide_env_values = true,
        conflicts_with = "admin_token_file"
    )]
    pub admin_token: Option<String>,
    /// A file holding the admin token, read again on SIGHUP and when it changes; the previous
    /// token stays accepted for --secret-rotation-window.
    #[arg(long, env = "WEBHOOK_ROUTER_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// How long a replaced webhook secret or admin token (read again from its file) stays
    /// accepted beside the new one, e.g. `1h`, `10m`; `0s` retires it at once (a leaked secret).
    #[arg(long, env = "WEBHOOK_ROUTER_SECRET_ROTATION_WINDOW", default_value = "1h", value_parser = humantime::parse_duration)]
    pub secret_rotation_window: Duration,
    /// How often the secret files are read to see whether they changed (`0s`: only on SIGHUP).
    #[arg(long, env = "WEBHOOK_ROUTER_SECRET_POLL_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub secret_poll_interval: Duration,
    /// A routing rule, `event[.action]=start|reach|drain|ignore`, overriding the default policy
    /// (repeatable; in the environment, comma-separated).
    #[arg(long = "route", env = "WEBHOOK_ROUTER_ROUTES", value_delimiter = ',')]
    pub routes: Vec<String>,
    /// Time a client has to send a delivery's whole body, ms (GitHub gives up after 10 s).
    #[arg(long, env = "WEBHOOK_ROUTER_BODY_TIMEOUT_MS", default_value_t = 10_000)]
    pub body_timeout_ms: u64,
    /// Memory for delivery bodies being received at once, MiB (at least 25, one maximal delivery).
    #[arg(long, env = "WEBHOOK_ROUTER_BODY_BUDGET_MIB", default_value_t = 64)]
    pub body_budget_mib: usize,
    /// Time a client has to send a request's head, ms (also how long an idle connection stays open).
    #[arg(
        long,
        env = "WEBHOOK_ROUTER_HEADER_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub header_timeout_ms: u64,
    /// Connections open at once; more wait in the kernel's backlog (needs that many file
    /// descriptors, plus some).
    #[arg(long, env = "WEBHOOK_ROUTER_MAX_CONNECTIONS", default_value_t = server::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Webhook requests handled at once; more get 503 at once.
    #[arg(long, env = "WEBHOOK_ROUTER_MAX_CONCURRENT_WEBHOOKS", default_value_t = server::DEFAULT_MAX_CONCURRENT_WEBHOOKS)]
    pub max_concurrent_webhooks: usize,
    /// Log lines on stderr: `text`, or `json` (one object per line: timestamp, level, target,
    /// message and the fields at the top level). Text is coloured only on a terminal, and never
    /// with NO_COLOR set.
    #[arg(long, env = "WEBHOOK_ROUTER_LOG_FORMAT", default_value = "text")]
    pub log_format: crate::telemetry::LogFormat,
    /// How long a stop (SIGTERM, SIGINT) may take to finish the accepted work before it stops the
    /// workers still running, ms; give the orchestrator's grace period (Kubernetes'
    /// terminationGracePeriodSeconds, systemd's TimeoutStopSec) at least this plus 10 s
    /// [default: 10000 / 5000].
    #[arg(long, env = "WEBHOOK_ROUTER_SHUTDOWN_MS")]
    pub shutdown_ms: Option<u64>,
    /// The reconciler of failed deliveries (see `reconcile/`).
    #[command(flatten)]
    pub reconcile: crate::reconcile::flags::ReconcileArgs,
    /// The launcher and the worker protocol (see `launch_flags.rs`).
    #[command(flatten)]
    pub launch: crate::launch_flags::LaunchArgs,
    /// Drive built-in traffic at the router over HTTP, then print a summary and exit.
    #[arg(long)]
    pub simulate: bool,
    /// --simulate: deliveries to send.
    #[arg(long, default_value_t = 4000, requires = "simulate")]
    pub events: usize,
    /// --simulate: deliveries per second (0: as fast as the clients go).
    #[arg(long, default_value_t = 800, requires = "simulate")]
    pub rate: u32,
    /// --simulate: concurrent HTTP clients.
    #[arg(long, default_value_t = 32, requires = "simulate")]
    pub clients: usize,
    /// --simulate: repositories (6 pull requests each).
    #[arg(long, default_value_t = 12, requires = "simulate")]
    pub repos: usize,
    /// --simulate: seed of the traffic generator.
    #[arg(long, default_value_t = 1, requires = "simulate")]
    pub seed: u64,
    /// --simulate: router replicas on the shared registry (more than one needs redis:// or
    /// postgres://); each delivery and its redeliveries go to different replicas, and one replica
    /// is killed mid-run.
    #[arg(long, default_value_t = 1, requires = "simulate")]
    pub replicas: usize,
}

/// The default `--waiting`: deliveries parked in the registry's waiting room (serving and
/// `--simulate` alike, so that the simulation shows the 503s the room does not avoid).
pub const DEFAULT_WAITING: usize = 1024;

/// The most replicas `--simulate --replicas` runs.
pub const MAX_REPLICAS: usize = 16;

/// Everything the flags decide, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The backend.
    pub registry: RegistryChoice,
    /// The registry's name on a shared backend.
    pub registry_name: String,
    /// `--advertise-url`, if given.
    pub advertise_url: Option<String>,
    /// Router replicas (`--simulate --replicas`).
    pub replicas: usize,
    /// Where to listen.
    pub bind: SocketAddr,
    /// Where the admin API listens, if apart from `bind`.
    pub admin_bind: Option<SocketAddr>,
    /// The registry's configuration.
    pub config: RegistryConfig,
    /// The router's options.
    pub options: app::Options,
    /// The shutdown deadline.
    pub shutdown: Duration,
    /// The HTTP server's limits.
    pub limits: ServerLimits,
    /// The reconciler of failed deliveries, if an App or a hook is named.
    pub reconcile: Option<crate::reconcile::Config>,
    /// The launcher and the worker protocol.
    pub launch: crate::launch_flags::LaunchSettings,
    /// The secret files to read again on SIGHUP and when they change.
    pub watched: Vec<Watched>,
    /// How they are read again.
    pub reload: ReloadOptions,
}

/// A duration flag in milliseconds, at most [`MAX_DURATION`].
fn ms(flag: &str, v: u64) -> Result<Duration, String> {
    let d = Duration::from_millis(v);
    if d > MAX_DURATION {
        return Err(format!(
            "{flag} {v} is more than a year ({} ms); it is almost certainly a unit mistake",
            MAX_DURATION.as_millis()
        ));
    }
    Ok(d)
}

/// Validates the flags.
pub fn settings(a: &Args) -> Result<Settings, String> {
    let config = registry_config(a)?;
    let access = access(a)?;
    let bind = access.bind;
    let registry_name = match (&a.registry_name, a.simulate) {
        (Some(n), _) => n.clone(),
        (None, false) => DEFAULT_REGISTRY_NAME.to_owned(),
        // A fresh registry per run: the simulator's deliveries repeat from run to run (same seed).
        (None, true) => format!("webhook-router-sim-{:08x}", rand::thread_rng().gen::<u32>()),
    };
    validate_name(&registry_name)?;
    if !(1..=MAX_REPLICAS).contains(&a.replicas) {
        return Err(format!(
            "--replicas {} is out of range: 1 to {MAX_REPLICAS}",
            a.replicas
        ));
    }
    if a.replicas > 1 && !a.registry.is_shared() {
        return Err(format!(
            "--replicas {} needs a shared registry (--registry redis://... or postgres://...): \
             replicas on the in-memory registry would each have their own",
            a.replicas
        ));
    }
    let options = router_options(a, access.webhook_secret, access.admin_token)?;
    let reconcile = crate::reconcile::flags::config(&a.reconcile)?;
    let mut watched = access.watched;
    if let Some(c) = &reconcile {
        watched.extend(crate::reconcile::flags::watched(&a.reconcile, c));
    }
    if a.secret_rotation_window > MAX_DURATION || a.secret_poll_interval > MAX_DURATION {
        return Err(
            "--secret-rotation-window and --secret-poll-interval are at most a year".into(),
        );
    }
    let launch = a.launch.settings(a.simulate)?;
    watched.extend(launch.watched_key(&a.launch));
    Ok(Settings {
        limits: server_limits(a)?,
        registry: a.registry.clone(),
        registry_name,
        advertise_url: a.advertise_url.clone(),
        replicas: a.replicas,
        bind,
        admin_bind: a.admin_bind,
        config,
        options,
        shutdown: pick(a, "--shutdown-ms", a.shutdown_ms, 10_000, 5_000)?,
        reconcile,
        launch,
        watched,
        reload: ReloadOptions {
            window: a.secret_rotation_window,
            poll: a.secret_poll_interval,
        },
    })
}

/// A duration flag in milliseconds, or its default when serving or simulating.
fn pick(
    a: &Args,
    flag: &str,
    v: Option<u64>,
    serve: u64,
    simulate: u64,
) -> Result<Duration, String> {
    ms(flag, v.unwrap_or(if a.simulate { simulate } else { serve }))
}

/// The registry's configuration: heartbeats, capacity, sweeps (checked against the backend's
/// clock).
fn registry_config(a: &Args) -> Result<RegistryConfig, String> {
    let sim = a.simulate;
    // Real worker processes heartbeat over HTTP, through a loaded router: a simulation running
    // them gets a 1 s timeout (250 ms x 4) rather than the simulated workers' 300 ms.
    let real = sim && a.launch.kind(true) == crate::launch_flags::LauncherKind::Process;
    let heartbeat = Duration::from_millis(a.heartbeat_ms.unwrap_or(if real {
        250
    } else if sim {
        100
    } else {
        u64::try_from(DEFAULT_HEARTBEAT_INTERVAL.as_millis()).unwrap_or(30_000)
    }));
    let missed = a.missed_heartbeats.unwrap_or(if real {
        4
    } else if sim {
        3
    } else {
        DEFAULT_MISSED_HEARTBEATS
    });
    let capacity = a
        .capacity
        .unwrap_or(if sim { 48 } else { DEFAULT_MAX_WORKERS });
    // Sweep at least twice per heartbeat interval (never less often than the library default), so a
    // silent worker is noticed within half an interval of its deadline.
    let sweep = (heartbeat / 2).clamp(Duration::from_millis(1), DEFAULT_SWEEP_INTERVAL);
    let config = RegistryConfig::builder()
        .max_workers(capacity)
        .max_waiting(a.waiting.unwrap_or(DEFAULT_WAITING))
        .max_waiting_per_owner(a.waiting_per_owner.unwrap_or(DEFAULT_MAX_WAITING_PER_OWNER))
        .max_workers_per_owner(a.owner_cap.unwrap_or(DEFAULT_MAX_WORKERS_PER_OWNER))
        .heartbeat_interval(heartbeat)
        .missed_heartbeats(missed)
        .sweep_interval(sweep)
        // The simulated container heartbeats as soon as it starts.
        .startup_grace(heartbeat)
        // Workers held as suspect by the mass-staleness brake (every container of a router gone at
        // once) wait four intervals: the library's two minutes at the default 30 s interval,
        // scaled with it (--simulate's 100 ms).
        .suspect_grace((heartbeat * 4).max(sweep))
        .release_ack_timeout(pick(
            a,
            "--release-ack-ms",
            a.release_ack_ms,
            u64::try_from(DEFAULT_RELEASE_ACK_TIMEOUT.as_millis()).unwrap_or(60_000),
            1_000,
        )?)
        .build()
        .map_err(|e| e.to_string())?;
    let resolution = a.registry.clock_resolution();
    let floor = resolution.saturating_mul(MIN_TIMEOUT_TICKS);
    if config.heartbeat_timeout() < floor {
        return Err(format!(
            "--heartbeat-ms x --missed-heartbeats is {:?}, but the registry's clock ticks every {resolution:?}: \
             a timeout under {MIN_TIMEOUT_TICKS} ticks ({floor:?}) declares healthy workers dead",
            config.heartbeat_timeout()
        ));
    }
    Ok(config)
}

/// Where to listen, and the secrets that guard it.
struct Access {
    bind: SocketAddr,
    webhook_secret: Secret,
    admin_token: Secret,
    /// Those read from files.
    watched: Vec<Watched>,
}

/// A secret from its flag or its file (watched), else a random one for `--simulate`.
fn secret_from(
    (flag, inline): (&'static str, &Option<String>),
    (file_flag, file): (&'static str, &Option<PathBuf>),
    random: bool,
    watched: &mut Vec<Watched>,
) -> Result<Secret, String> {
    let value = match (inline, file) {
        (Some(s), _) if s.is_empty() => return Err(format!("{flag} is empty")),
        (Some(s), _) => Some(s.clone().into_bytes()),
        (None, Some(path)) => Some(secrets::read_file(file_flag, path)?),
        (None, None) if random => {
            Some(format!("{:032x}", rand::thread_rng().gen::<u128>()).into_bytes())
        }
        (None, None) => None,
    };
    let secret = Secret::new(value.map(Arc::from));
    if let (None, Some(path)) = (inline, file) {
        watched.push(Watched {
            flag: file_flag,
            path: path.clone(),
            secret: secret.clone(),
            rotation: Rotation::Window,
            check: reload::any_value,
        });
    }
    Ok(secret)
}

/// Where to listen, the webhook secret and the admin token (random ones for `--simulate`), and
/// the refusals that keep a non-loopback router from running unguarded.
fn access(a: &Args) -> Result<Access, String> {
    let sim = a.simulate;
    let bind = a.bind.unwrap_or(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        if sim { 0 } else { 3000 },
    ));
    if sim && !bind.ip().is_loopback() {
        return Err(format!(
            "--simulate only runs on a loopback address, not {bind}"
        ));
    }
    let mut watched = Vec::new();
    let secret = secret_from(
        ("--webhook-secret", &a.webhook_secret),
        ("--webhook-secret-file", &a.webhook_secret_file),
        sim,
        &mut watched,
    )?;
    if !secret.is_set() && !bind.ip().is_loopback() {
        return Err(format!(
            "refusing to accept unsigned deliveries on {bind}, which is not a loopback address: \
             set --webhook-secret or --webhook-secret-file (the secret configured on the GitHub webhook)"
        ));
    }
    let admin_token = secret_from(
        ("--admin-token", &a.admin_token),
        ("--admin-token-file", &a.admin_token_file),
        sim,
        &mut watched,
    )?;
    if let Some(admin) = a.admin_bind {
        if sim {
            return Err("--admin-bind is not used by --simulate (one address per replica)".into());
        }
        if admin == bind && admin.port() != 0 {
            return Err(format!(
                "--admin-bind {admin} is --bind's address: give it one of its own, or leave it out"
            ));
        }
    }
    // Where the internal endpoint is served.
    let internal = a.admin_bind.unwrap_or(bind);
    if a.registry.is_shared() && !sim && !admin_token.is_set() && !internal.ip().is_loopback() {
        return Err(format!(
            "a shared registry on {internal}, which is not a loopback address, needs --admin-token: \
             replicas forward events to each other's containers through POST /internal/..., which it guards"
        ));
    }
    Ok(Access {
        bind,
        webhook_secret: secret,
        admin_token,
        watched,
    })
}

/// The router's options: mailboxes, the routing policy, body limits, the simulated work.
fn router_options(
    a: &Args,
    webhook_secret: Secret,
    admin_token: Secret,
) -> Result<app::Options, String> {
    if !(1..=MAX_MAILBOX).contains(&a.mailbox) {
        return Err(format!(
            "--mailbox {} is out of range: 1 to {MAX_MAILBOX}",
            a.mailbox
        ));
    }
    if a.overflow > MAX_OVERFLOW {
        return Err(format!(
            "--overflow {} is out of range: 0 to {MAX_OVERFLOW}",
            a.overflow
        ));
    }
    let mut policy = Policy::default();
    for rule in &a.routes {
        policy = policy.with_rule(rule)?;
    }
    let min_budget = github::MAX_PAYLOAD_BYTES >> 20;
    if !(min_budget..=64 * 1024).contains(&a.body_budget_mib) {
        return Err(format!(
            "--body-budget-mib {} is out of range: {min_budget} (one delivery at GitHub's cap) to 65536",
            a.body_budget_mib
        ));
    }
    let body_timeout = ms("--body-timeout-ms", a.body_timeout_ms)?;
    if body_timeout.is_zero() {
        return Err("--body-timeout-ms must be at least 1".into());
    }
    Ok(app::Options {
        policy: Arc::new(policy),
        body: BodyLimits {
            max: github::MAX_PAYLOAD_BYTES,
            timeout: body_timeout,
            budget: BodyBudget::new(a.body_budget_mib << 20),
        },
        webhook_secret,
        admin_token,
        work: pick(a, "--work-ms", a.work_ms, 2_000, 20)?,
        idle: pick(a, "--idle-ms", a.idle_ms, 60_000, 200)?,
        mailbox: a.mailbox,
        overflow: a.overflow,
    })
}

/// The HTTP server's limits.
fn server_limits(a: &Args) -> Result<ServerLimits, String> {
    let header_timeout = ms("--header-timeout-ms", a.header_timeout_ms)?;
    if header_timeout.is_zero() {
        return Err("--header-timeout-ms must be at least 1".into());
    }
    if !(1..=1_000_000).contains(&a.max_connections) {
        return Err(format!(
            "--max-connections {} is out of range: 1 to 1000000",
            a.max_connections
        ));
    }
    if !(1..=65_536).contains(&a.max_concurrent_webhooks) {
        return Err(format!(
            "--max-concurrent-webhooks {} is out of range: 1 to 65536",
            a.max_concurrent_webhooks
        ));
    }
    Ok(ServerLimits {
        header_timeout,
        max_connections: a.max_connections,
        max_concurrent_webhooks: a.max_concurrent_webhooks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::LogFormat;

    fn parse(args: &[&str]) -> Result<Settings, String> {
        let mut all = vec!["webhook-router"];
        all.extend_from_slice(args);
        settings(&Args::try_parse_from(all).map_err(|e| e.to_string())?)
    }

    #[test]
    fn defaults_validate() {
        let s = parse(&[]).unwrap();
        assert_eq!(s.registry, RegistryChoice::Memory);
        assert_eq!(s.bind.port(), 3000);
        assert!(parse(&["--simulate"]).is_ok());
    }

    /// Issue 13: flags are bounded where they are read; none reaches a consumer that would panic.
    #[test]
    fn extreme_values_are_refused_with_the_flag_named() {
        let max = u64::MAX.to_string();
        for (flag, value, says) in [
            ("--mailbox", "18446744073709551615", "--mailbox"),
            ("--mailbox", "0", "--mailbox"),
            ("--mailbox", "65537", "--mailbox"),
            ("--overflow", "65537", "--overflow"),
            ("--overflow", "18446744073709551615", "--overflow"),
            ("--heartbeat-ms", max.as_str(), "heartbeat_interval"),
            ("--work-ms", max.as_str(), "--work-ms"),
            ("--idle-ms", max.as_str(), "--idle-ms"),
            ("--shutdown-ms", max.as_str(), "--shutdown-ms"),
            ("--capacity", "0", "max_workers"),
        ] {
            let e = parse(&[flag, value]).unwrap_err();
            assert!(e.contains(says), "{flag} {value}: {e}");
        }
        assert!(parse(&["--mailbox", "65536"]).is_ok());
        assert!(parse(&["--overflow", "0"]).is_ok());
        assert!(parse(&["--overflow", "65536"]).is_ok());
    }

    /// Issue 36: `--docker-volume` is repeatable, reaches the docker launcher's settings, and is
    /// refused with any other launcher (it would be ignored).
    #[test]
    fn docker_volumes_are_for_the_docker_launcher() {
        let docker = [
            "--launcher",
            "docker",
            "--docker-image",
            "i",
            "--event-command",
            "true",
        ];
        let mut args = docker.to_vec();
        args.extend([
            "--docker-volume",
            "/srv/w:/w",
            "--docker-volume",
            "cache:/c:ro",
        ]);
        let s = parse(&args).unwrap();
        assert_eq!(s.launch.docker_volumes, ["/srv/w:/w", "cache:/c:ro"]);
        assert!(parse(&docker).unwrap().launch.docker_volumes.is_empty());
        let e = parse(&["--event-command", "true", "--docker-volume", "/a:/b"]).unwrap_err();
        assert!(e.contains("--docker-volume"), "{e}");
        // The limits, the same way.
        args.extend(["--docker-memory", "67108864", "--docker-cpus", "0.5"]);
        let s = parse(&args).unwrap();
        assert_eq!(
            (s.launch.docker_memory, s.launch.docker_cpus),
            (Some(64 << 20), Some(0.5))
        );
        let e = parse(&["--event-command", "true", "--docker-cpus", "1"]).unwrap_err();
        assert!(e.contains("--docker-cpus"), "{e}");
    }

    /// Issue 13: a heartbeat timeout the clock cannot resolve is refused.
    #[test]
    fn a_timeout_below_the_clock_resolution_is_refused() {
        let e = parse(&["--heartbeat-ms", "1", "--missed-heartbeats", "2"]).unwrap_err();
        assert!(e.contains("ticks every"), "{e}");
        let resolution = RegistryChoice::Memory.clock_resolution();
        let ok = (resolution * MIN_TIMEOUT_TICKS).as_millis().div_ceil(2) as u64;
        assert!(parse(&[
            "--heartbeat-ms",
            &ok.to_string(),
            "--missed-heartbeats",
            "2"
        ])
        .is_ok());
    }

    #[test]
    fn routing_rules_and_body_limits_are_validated() {
        let s = parse(&[
            "--route",
            "pull_request.closed=ignore",
            "--route",
            "check_run=start",
        ])
        .unwrap();
        assert_eq!(
            s.options.policy.decide("pull_request", Some("closed")),
            crate::policy::Decision::Ignore
        );
        assert!(parse(&["--route", "push=start"]).is_err());
        assert!(parse(&["--body-budget-mib", "1"]).is_err());
        assert!(parse(&["--body-budget-mib", "18446744073709551615"]).is_err());
        assert!(parse(&["--body-timeout-ms", "0"]).is_err());
        assert!(parse(&["--body-timeout-ms", &u64::MAX.to_string()]).is_err());
        assert!(parse(&["--header-timeout-ms", "0"]).is_err());
        assert!(parse(&["--header-timeout-ms", &u64::MAX.to_string()]).is_err());
        assert!(parse(&["--max-connections", "0"]).is_err());
        assert!(parse(&["--max-connections", &usize::MAX.to_string()]).is_err());
        assert!(parse(&["--max-concurrent-webhooks", "0"]).is_err());
    }

    /// Issue 37: the admin address, the log format.
    #[test]
    fn admin_bind_and_log_format_are_validated() {
        let s = parse(&["--admin-bind", "127.0.0.1:9090"]).unwrap();
        assert_eq!(s.admin_bind, Some("127.0.0.1:9090".parse().unwrap()));
        let e = parse(&["--bind", "127.0.0.1:9090", "--admin-bind", "127.0.0.1:9090"]).unwrap_err();
        assert!(e.contains("--admin-bind"), "{e}");
        assert!(parse(&["--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"]).is_ok());
        assert!(parse(&["--simulate", "--admin-bind", "127.0.0.1:0"]).is_err());
        // The internal endpoint is on the admin address: that one needs the token off loopback.
        let shared = ["--registry", "redis://h/0", "--webhook-secret", "s"];
        let mut open_admin = shared.to_vec();
        open_admin.extend(["--admin-bind", "0.0.0.0:9090"]);
        assert!(parse(&open_admin).unwrap_err().contains("--admin-token"));
        let mut open_webhook = shared.to_vec();
        open_webhook.extend(["--bind", "0.0.0.0:3000", "--admin-bind", "127.0.0.1:9090"]);
        assert!(parse(&open_webhook).is_ok());
        let a = |v: &str| Args::try_parse_from(["webhook-router", "--log-format", v]);
        assert_eq!(a("json").unwrap().log_format, LogFormat::Json);
        assert_eq!(a("TEXT").unwrap().log_format, LogFormat::Text);
        assert!(a("yaml").is_err());
    }

    #[test]
    fn unknown_backends_are_refused() {
        assert!(parse(&["--registry", "etcd://x"]).is_err());
    }

    #[test]
    fn shared_backends_their_names_and_replicas() {
        let s = parse(&["--registry", "redis://127.0.0.1:6379/0"]).unwrap();
        assert!(s.registry.is_shared());
        assert_eq!(s.registry_name, DEFAULT_REGISTRY_NAME);
        assert_eq!(s.config.release_ack_timeout(), DEFAULT_RELEASE_ACK_TIMEOUT);
        let a = parse(&["--simulate", "--registry", "postgres://h/db"]).unwrap();
        let b = parse(&["--simulate", "--registry", "postgres://h/db"]).unwrap();
        assert_ne!(a.registry_name, b.registry_name, "a fresh registry per run");
        assert_eq!(a.config.release_ack_timeout(), Duration::from_secs(1));
        assert!(parse(&["--registry-name", "a b"]).is_err());
        // Forwarding between replicas needs the admin token off loopback.
        let open = [
            "--registry",
            "redis://h/0",
            "--bind",
            "0.0.0.0:3000",
            "--webhook-secret",
            "s",
        ];
        let e = parse(&open).unwrap_err();
        assert!(e.contains("--admin-token"), "{e}");
        let mut guarded = open.to_vec();
        guarded.extend(["--admin-token", "t"]);
        assert!(parse(&guarded).is_ok());
        let e = parse(&["--simulate", "--replicas", "3"]).unwrap_err();
        assert!(e.contains("shared registry"), "{e}");
        assert_eq!(
            parse(&["--simulate", "--replicas", "3", "--registry", "redis://h/0"])
                .unwrap()
                .replicas,
            3
        );
        assert!(parse(&["--simulate", "--replicas", "0", "--registry", "redis://h/0"]).is_err());
        assert!(parse(&["--replicas", "2"]).is_err(), "only with --simulate");
    }
}
