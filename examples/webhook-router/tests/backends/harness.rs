//! Routers on real servers: the workspace's `test-servers` (the server named by
//! `WORKER_REGISTRY_REDIS_URL` / `WORKER_REGISTRY_POSTGRES_URL`, else a throwaway one; one skip
//! line without the binaries, a failure under `CI`), replicas built as the binary builds them, and
//! polling for a condition on real time, with a cap only a hang reaches.

#![allow(dead_code)] // each test module uses part of it

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tokio::net::TcpListener;
use webhook_router::app::{App, Options, Platform};
use webhook_router::backend::RegistryChoice;
use webhook_router::body::{BodyBudget, BodyLimits, DEFAULT_BODY_BUDGET, DEFAULT_BODY_TIMEOUT};
use webhook_router::github;
use webhook_router::policy::Policy;
use webhook_router::server::{self, Server, ServerLimits};
use worker_registry::{DynRegistry, RegistryConfig};

pub use test_servers::{postgres as pg, redis as rd};

/// The two shared backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Redis,
    Postgres,
}

/// The server of this test binary for `kind` (see the module documentation), or `None` after
/// the skip line.
pub fn shared(kind: Kind) -> Option<RegistryChoice> {
    record_logs();
    match kind {
        Kind::Redis => rd::shared("the router on Redis").map(RegistryChoice::Redis),
        Kind::Postgres => pg::shared_url().map(RegistryChoice::Postgres),
    }
}

/// Sends the router's log to the test's captured output, which the harness prints when the
/// test fails: warnings, and the reconciler's line per GUID chased, per redelivery and per move
/// of its position (`RUST_LOG` overrides).
pub fn record_logs() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,webhook_router::reconcile=info".into()),
        )
        .try_init();
}

/// A registry name no other test uses.
pub fn unique(test: &str) -> String {
    pg::unique_name(&format!("wr-{test}"))
}

/// The registry's heartbeat interval in these tests; every other timing derives from it.
pub const HEARTBEAT: Duration = Duration::from_millis(100);
pub const MISSED: u32 = 3;
pub const SECRET: &str = "s3cret";
pub const TOKEN: &str = "admin-token";

/// The configuration of these tests' registries.
pub fn config(capacity: usize) -> RegistryConfig {
    configured(capacity, MISSED, 0)
}

/// Missed heartbeats before death in the tests that assert a worker is still alive, or still
/// sticky, some time after a replica or a process could have stalled: a 4 s timeout, which a
/// loaded 2-core machine does not eat (with `MISSED` it was 300 ms, 200 ms of it past a beat).
/// Deaths those tests wait for take that much longer (seconds, waited for by [`eventually`]).
pub const PATIENT_MISSED: u32 = 40;

/// As [`config`], with the heartbeat timeout `HEARTBEAT * PATIENT_MISSED`.
pub fn patient_config(capacity: usize) -> RegistryConfig {
    configured(capacity, PATIENT_MISSED, 0)
}

/// These tests' timings with `missed` heartbeats before death and a waiting room of `room`
/// deliveries (one owner may fill it; 0: no room).
pub fn configured(capacity: usize, missed: u32, room: usize) -> RegistryConfig {
    let b = RegistryConfig::builder()
        .max_workers(capacity)
        .heartbeat_interval(HEARTBEAT)
        .missed_heartbeats(missed)
        .sweep_interval(HEARTBEAT / 2)
        .startup_grace(HEARTBEAT)
        .suspect_grace(HEARTBEAT * 4)
        .release_ack_timeout(HEARTBEAT * 5);
    let b = if room > 0 {
        b.max_waiting(room).max_waiting_per_owner(room)
    } else {
        b
    };
    b.build().unwrap()
}

/// How long [`eventually`] waits at most for a condition: far beyond what a loaded 2-core machine
/// needs for anything these tests wait for (seconds), so only a hang reaches it. A verdict never
/// depends on how fast the machine is.
pub const HANG: Duration = Duration::from_secs(120);

/// Polls `probe` every sweep interval until it yields; panics naming `what` after [`HANG`] (on
/// the wall clock, whatever the probes cost).
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let every = HEARTBEAT / 2;
    let started = std::time::Instant::now();
    let mut polls = 0u64;
    loop {
        polls += 1;
        if let Some(v) = probe().await {
            return v;
        }
        if started.elapsed() > HANG {
            panic!("{what}: still not the case after {HANG:?} ({polls} polls)");
        }
        tokio::time::sleep(every).await;
    }
}

/// Opens `choice`'s registry `name`, trying again while it cannot (a busy machine can keep a
/// server from answering a connection within the router's connect timeout): a test fails on a
/// backend that does not open within [`HANG`], never on one that was slow to.
pub async fn open_registry(
    choice: &RegistryChoice,
    config: &RegistryConfig,
    name: &str,
) -> DynRegistry {
    let started = std::time::Instant::now();
    loop {
        match choice.open(config.clone(), name).await {
            Ok(registry) => return registry,
            Err(e) if started.elapsed() < HANG => {
                eprintln!("opening the {choice} registry {name}: {e}; trying again");
                tokio::time::sleep(HEARTBEAT).await;
            }
            Err(e) => panic!("the {choice} registry {name} did not open within {HANG:?}: {e}"),
        }
    }
}

pub fn options(work: Duration, idle: Duration, mailbox: usize) -> Options {
    Options {
        webhook_secret: Some(SECRET).into(),
        admin_token: Some(TOKEN).into(),
        work,
        idle,
        mailbox,
        overflow: webhook_router::limits::DEFAULT_OVERFLOW,
        policy: Arc::new(Policy::default()),
        body: BodyLimits {
            max: github::MAX_PAYLOAD_BYTES,
            timeout: DEFAULT_BODY_TIMEOUT,
            budget: BodyBudget::new(DEFAULT_BODY_BUDGET),
        },
    }
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A replica as the binary serves one (`--registry` shared): its own registry handle, its own
/// containers, and the other replicas' reached through the owner records and the internal
/// endpoint.
pub async fn replica(
    choice: &RegistryChoice,
    name: &str,
    config: &RegistryConfig,
    options: &Options,
) -> Server {
    replica_with(choice, name, config, options, |r| r).await
}

/// Like [`replica`], on `wrap(its registry handle)`: one that holds admission replies back, say.
pub async fn replica_with(
    choice: &RegistryChoice,
    name: &str,
    config: &RegistryConfig,
    options: &Options,
    wrap: impl FnOnce(DynRegistry) -> DynRegistry,
) -> Server {
    let registry = wrap(open_registry(choice, config, name).await);
    let listener = TcpListener::bind(loopback()).await.unwrap();
    let advertise = format!("http://{}", listener.local_addr().unwrap());
    let platform = Platform::for_backend(
        choice,
        name,
        &advertise,
        options.admin_token.clone(),
        config.heartbeat_interval(),
        options.mailbox,
        options.overflow,
    )
    .await
    .unwrap();
    let app = App::with_platform(registry, options.clone(), platform);
    server::serve_with(app, listener, ServerLimits::default())
        .await
        .unwrap()
}

pub struct Answer {
    pub status: StatusCode,
    pub retry_after: Option<u64>,
    pub body: Value,
}

impl Answer {
    pub fn worker(&self) -> u64 {
        self.body["worker"]
            .as_u64()
            .unwrap_or_else(|| panic!("no worker in {}", self.body))
    }

    /// A redelivery answered as completed by every PR it names.
    pub fn completed(&self) -> bool {
        self.status == StatusCode::OK
            && self.body["targets"]
                .as_array()
                .is_some_and(|ts| !ts.is_empty() && ts.iter().all(|t| t["state"] == "completed"))
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

pub fn pr(repo: &str, number: u64) -> Value {
    serde_json::json!({
        "action": "synchronize",
        "number": number,
        "pull_request": { "number": number, "title": "t", "head": { "sha": "0".repeat(40) } },
        "repository": { "full_name": repo },
        "sender": { "login": "mona" }
    })
}

/// Sends a signed `pull_request` delivery to the router at `base` (`http://host:port`); `None`
/// if the connection failed (a killed router).
pub async fn try_deliver(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    payload: &Value,
) -> Option<Answer> {
    let body = serde_json::to_vec(payload).unwrap();
    let res = http
        .post(format!("{base}/webhook"))
        .header("content-type", "application/json")
        .header(github::EVENT_HEADER, "pull_request")
        .header(github::DELIVERY_HEADER, id)
        .header(
            github::SIGNATURE_HEADER,
            github::sign(SECRET.as_bytes(), &body),
        )
        .body(body)
        .send()
        .await
        .ok()?;
    let status = res.status();
    let retry_after = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let text = res.text().await.ok()?;
    Some(Answer {
        status,
        retry_after,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    })
}

pub async fn deliver(http: &reqwest::Client, base: &str, id: &str, payload: &Value) -> Answer {
    try_deliver(http, base, id, payload)
        .await
        .unwrap_or_else(|| panic!("{base} did not answer {id}"))
}

pub fn base(server: &Server) -> String {
    format!("http://{}", server.addr())
}
