//! The router tests' harness: a router on 127.0.0.1:0 over an in-memory registry on tokio's
//! paused clock, a client, and helpers to send deliveries and poll state.
#![allow(dead_code)] // each test file uses part of it

use webhook_router::{app, body, policy, server};

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use webhook_router::github;
use worker_registry::{DynRegistry, InMemoryRegistry, RegistryConfig, TokioClock};

pub const HEARTBEAT: Duration = Duration::from_millis(100);
pub const MISSED: u32 = 3;

/// How a test's router is set up.
#[derive(Clone)]
pub struct Setup {
    pub capacity: usize,
    pub secret: Option<&'static str>,
    pub token: Option<&'static str>,
    pub work: Duration,
    pub mailbox: usize,
    /// Events queued behind a worker's full mailbox before 503 (`--overflow`; 0: off).
    pub overflow: usize,
    pub policy: policy::Policy,
    pub body_timeout: Duration,
    pub body_budget: usize,
    pub limits: server::ServerLimits,
    /// The registry's waiting room (`max_waiting`; 0: off).
    pub waiting: usize,
    /// Live workers per repository owner (`max_workers_per_owner`; 0: no cap).
    pub owner_cap: usize,
    /// How long a worker waits for another event before it exits.
    pub idle: Duration,
    /// The registry's `max_payload_bytes`.
    pub max_payload: u64,
    /// The registry's `payload_budget`.
    pub payload_budget: u64,
    /// What starts the workers, built over the router's registry; `None`: the `task` launcher.
    pub launcher: Option<MakeLauncher>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            capacity: 8,
            secret: None,
            token: None,
            work: Duration::from_millis(10),
            mailbox: 8,
            overflow: webhook_router::limits::DEFAULT_OVERFLOW,
            policy: policy::Policy::default(),
            body_timeout: body::DEFAULT_BODY_TIMEOUT,
            body_budget: body::DEFAULT_BODY_BUDGET,
            limits: server::ServerLimits::default(),
            waiting: 0,
            owner_cap: 0,
            // Workers stay until drained, crashed or shut down (unless a test advances an hour).
            idle: Duration::from_secs(3600),
            max_payload: worker_registry::config::DEFAULT_MAX_PAYLOAD_BYTES,
            payload_budget: worker_registry::config::DEFAULT_PAYLOAD_BUDGET,
            launcher: None,
        }
    }
}

/// Builds a launcher over the router's registry.
pub type MakeLauncher =
    Arc<dyn Fn(DynRegistry) -> Arc<dyn webhook_router::launcher::Launcher> + Send + Sync>;

pub struct Harness {
    pub server: server::Server,
    /// The backend behind the router's `DynRegistry`, for what the contract does not expose.
    pub memory: InMemoryRegistry<TokioClock>,
    pub base: String,
    pub http: reqwest::Client,
    pub secret: Option<&'static str>,
    pub token: Option<&'static str>,
}

pub async fn start(setup: Setup) -> Harness {
    start_with(setup, DynRegistry::new).await
}

/// Like [`start`], with the router on `wrap(the in-memory registry)`: a fault-injecting wrapper,
/// say.
pub async fn start_with(
    setup: Setup,
    wrap: impl FnOnce(InMemoryRegistry<TokioClock>) -> DynRegistry,
) -> Harness {
    let config = RegistryConfig::builder()
        .max_workers(setup.capacity)
        .heartbeat_interval(HEARTBEAT)
        .missed_heartbeats(MISSED)
        .sweep_interval(HEARTBEAT / 2)
        .startup_grace(HEARTBEAT)
        .max_waiting(setup.waiting)
        .max_workers_per_owner(setup.owner_cap)
        .max_payload_bytes(setup.max_payload)
        .payload_budget(setup.payload_budget)
        .build()
        .unwrap();
    let memory = InMemoryRegistry::with_clock(config, TokioClock::new());
    let registry = wrap(memory.clone());
    let options = app::Options {
        webhook_secret: setup.secret.into(),
        admin_token: setup.token.into(),
        work: setup.work,
        idle: setup.idle,
        mailbox: setup.mailbox,
        overflow: setup.overflow,
        policy: Arc::new(setup.policy.clone()),
        body: body::BodyLimits {
            max: github::MAX_PAYLOAD_BYTES,
            timeout: setup.body_timeout,
            budget: body::BodyBudget::new(setup.body_budget),
        },
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut platform = app::Platform::local(options.mailbox, options.overflow);
    platform.launcher = setup.launcher.as_ref().map(|make| make(registry.clone()));
    let app = app::App::with_platform(registry, options, platform);
    let server = server::serve_with(app, listener, setup.limits)
        .await
        .unwrap();
    Harness {
        memory,
        base: format!("http://{}", server.addr()),
        server,
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
        secret: setup.secret,
        token: setup.token,
    }
}

/// The replayed GitHub payloads' directory (`tests/replay`).
pub fn replay_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/replay")
}

/// The replay's routing table: the deliveries in order, each with the answer it must get.
pub fn replay_table() -> Vec<Value> {
    let text = std::fs::read_to_string(replay_dir().join("table.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["deliveries"].as_array().unwrap().clone()
}

/// One replayed payload, as GitHub sends it.
pub fn replay_payload(name: &str) -> Vec<u8> {
    std::fs::read(replay_dir().join("payloads").join(format!("{name}.json"))).unwrap()
}

pub fn pr(repo: &str, number: u64) -> Value {
    json!({
        "action": "synchronize",
        "number": number,
        "pull_request": { "number": number, "title": "t", "head": { "sha": "0".repeat(40) } },
        "repository": { "full_name": repo },
        "sender": { "login": "mona" }
    })
}

pub struct Answer {
    pub status: StatusCode,
    pub retry_after: Option<u64>,
    pub body: Value,
}

impl Harness {
    /// Sends a delivery, signed if the router has a secret.
    pub async fn deliver(&self, event: &str, id: &str, payload: &Value) -> Answer {
        self.deliver_bytes(event, id, serde_json::to_vec(payload).unwrap())
            .await
    }

    /// Sends a JSON delivery of these bytes as they are, signed if the router has a secret.
    pub async fn deliver_bytes(&self, event: &str, id: &str, body: Vec<u8>) -> Answer {
        let mut req = self
            .http
            .post(format!("{}/webhook", self.base))
            .header("content-type", "application/json")
            .header(github::EVENT_HEADER, event)
            .header(github::DELIVERY_HEADER, id);
        if let Some(secret) = self.secret {
            req = req.header(
                github::SIGNATURE_HEADER,
                github::sign(secret.as_bytes(), &body),
            );
        }
        answer(req.body(body).send().await.unwrap()).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        answer(
            self.http
                .get(format!("{}{path}", self.base))
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    pub async fn post(&self, path: &str) -> Answer {
        let mut req = self.http.post(format!("{}{path}", self.base));
        if let Some(t) = self.token {
            req = req.bearer_auth(t);
        }
        answer(req.send().await.unwrap()).await
    }

    /// Polls `GET /workers/{id}` until its status is `status`.
    pub async fn until_status(&self, id: u64, status: &str) -> Value {
        eventually(|| async move {
            let a = self.get(&format!("/workers/{id}")).await;
            (a.body["status"] == status).then_some(a.body)
        })
        .await
    }
}

pub async fn answer(res: reqwest::Response) -> Answer {
    let status = res.status();
    let retry_after = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let text = res.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Answer {
        status,
        retry_after,
        body,
    }
}

/// How long [`eventually`] and the tests' other waits for a condition poll at most, on the wall
/// clock: only a hang reaches it. (A bound on polls would not do: on tokio's paused clock a poll's
/// sleep passes at once whenever the runtime waits for real sockets, so a loaded machine would
/// spend the polls before the work they wait for is done.)
pub const HANG: Duration = Duration::from_secs(120);

/// Polls `probe` until it yields, letting 25 ms of virtual time pass between attempts; fails
/// after [`HANG`] of real time.
pub async fn eventually<T, F, Fut>(mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = std::time::Instant::now();
    let mut polls = 0u64;
    loop {
        polls += 1;
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            started.elapsed() < HANG,
            "condition not reached after {HANG:?} ({polls} polls)"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub fn worker_of(a: &Answer) -> u64 {
    a.body["worker"].as_u64().unwrap()
}

/// `application/x-www-form-urlencoded` encoding of one value (test data only).
pub fn form_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                (b as char).to_string()
            }
            b' ' => "+".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The router options of the worker-protocol tests (`worker_protocol.rs`, `real_workers.rs`):
/// mailboxes of 8 and no overflow, workers that never leave by themselves, the default body
/// limits.
pub fn protocol_options(secret: Option<&'static str>, token: Option<&'static str>) -> app::Options {
    app::Options {
        webhook_secret: secret.into(),
        admin_token: token.into(),
        work: Duration::from_millis(10),
        idle: Duration::from_secs(3600),
        mailbox: 8,
        overflow: 0,
        policy: Arc::new(policy::Policy::default()),
        body: body::BodyLimits {
            max: github::MAX_PAYLOAD_BYTES,
            timeout: body::DEFAULT_BODY_TIMEOUT,
            budget: body::BodyBudget::new(body::DEFAULT_BODY_BUDGET),
        },
    }
}

/// `webhook-worker`, built beside this test binary's directory (`target/<profile>`), or `None`
/// after a one-line skip saying how to build it; under `CI` a missing binary fails the test.
pub fn worker_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent()?.parent()?.join("webhook-worker");
    if bin.is_file() {
        return Some(bin);
    }
    let why = format!(
        "{} not built: run `cargo build -p webhook-worker` first",
        bin.display()
    );
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("skipped: {why}");
    None
}
