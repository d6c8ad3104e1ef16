//! The worker protocol's server (`/worker/v1/...` on `--worker-bind`), driven by an HTTP client in
//! the test acting as a worker in another process, against a router over an in-memory registry
//! on a `ManualClock` (liveness moves only when the test advances it; the sweeper runs on its
//! short real interval and sees only that clock). The launcher is the test's own: it speaks the
//! protocol, starts nothing, records the environment it is given, and logs its starts and kills.
//!
//! Checked: heartbeat → the lease from the registry's timings and the margins; the event's bytes
//! and headers as posted to `/webhook`; loop and completion; a credential that does not verify →
//! 401; after the clock passes the heartbeat timeout and a sweep, every call → 410 fenced, and
//! the dead worker is killed before its event goes to its successor; a draining worker's lease
//! is counted from the last call that showed it active.

mod common;

use common::{eventually, pr};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use webhook_router::app::{App, Platform};
use webhook_router::launcher::{
    BoxFuture, Control, Exit, Launch, LaunchError, Launched, Launcher, Leftover,
};
use webhook_router::lease::LeaseRules;
use webhook_router::protocol::ProtocolSettings;
use webhook_router::{github, server};
use worker_registry::WorkerRegistryExt;
use worker_registry::{
    DynRegistry, InMemoryRegistry, Maintenance, ManualClock, RegistryConfig, WorkerId,
    WorkerRegistry,
};

const HEARTBEAT: Duration = Duration::from_millis(200);
const MISSED: u32 = 3;
const MARGIN: Duration = Duration::from_millis(50);
const SWEEP: Duration = Duration::from_millis(20);

/// What the launcher saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Launched(WorkerId),
    Killed(WorkerId),
}

#[derive(Default)]
struct Recorder {
    log: Mutex<Vec<Seen>>,
    envs: Mutex<Vec<Vec<(String, String)>>>,
}

impl Recorder {
    fn log(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
    fn env(&self, i: usize) -> Vec<(String, String)> {
        self.envs.lock().unwrap()[i].clone()
    }
}

/// A launcher of workers that the test plays: nothing is started; a kill or a stop ends the
/// "process" at once.
struct Played(Arc<Recorder>);

struct PlayedControl {
    id: WorkerId,
    recorder: Arc<Recorder>,
    end: Arc<Notify>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
}

impl Control for PlayedControl {
    fn kill(&self) {
        self.recorder
            .log
            .lock()
            .unwrap()
            .push(Seen::Killed(self.id));
        self.end.notify_one();
    }
    fn stop(&self) {
        // Relaxed: read by the exit future after the notification that follows.
        self.stopped
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.end.notify_one();
    }
}

impl Launcher for Played {
    fn kind(&self) -> &'static str {
        "played"
    }
    fn speaks_protocol(&self) -> bool {
        true
    }
    fn launch(&self, spec: Launch) -> BoxFuture<'_, Result<Launched, LaunchError>> {
        self.0.envs.lock().unwrap().push(spec.env.clone());
        self.0.log.lock().unwrap().push(Seen::Launched(spec.id));
        let end = Arc::new(Notify::new());
        let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let control = PlayedControl {
            id: spec.id,
            recorder: self.0.clone(),
            end: end.clone(),
            stopped: stopped.clone(),
        };
        let exit = Box::pin(async move {
            end.notified().await;
            // Relaxed: see `stop`.
            if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                Exit::Stopped(Vec::new())
            } else {
                Exit::Crashed
            }
        });
        Box::pin(async move {
            Ok(Launched {
                exit,
                control: Box::new(control),
            })
        })
    }
    fn leftovers(&self) -> BoxFuture<'_, Result<Vec<Leftover>, LaunchError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn remove(&self, _: Leftover) -> BoxFuture<'_, Result<(), LaunchError>> {
        Box::pin(async { Ok(()) })
    }
}

struct Router {
    server: server::Server,
    clock: ManualClock,
    memory: InMemoryRegistry<ManualClock>,
    recorder: Arc<Recorder>,
    base: String,
    workers: String,
    http: reqwest::Client,
    config: RegistryConfig,
}

async fn router(drain_deadline: Duration) -> Router {
    router_with(drain_deadline, server::ServerLimits::default()).await
}

async fn router_with(drain_deadline: Duration, limits: server::ServerLimits) -> Router {
    let config = RegistryConfig::builder()
        .max_workers(4)
        .heartbeat_interval(HEARTBEAT)
        .missed_heartbeats(MISSED)
        .sweep_interval(SWEEP)
        .startup_grace(HEARTBEAT)
        .drain_deadline(drain_deadline)
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let memory = InMemoryRegistry::with_clock(config.clone(), clock.clone());
    let options = common::protocol_options(None, None);
    let recorder = Arc::new(Recorder::default());
    let mut platform = Platform::local(options.mailbox, options.overflow);
    platform.launcher = Some(Arc::new(Played(recorder.clone())));
    platform.protocol = ProtocolSettings {
        key: None,
        kill_margin: MARGIN,
        timer_slack: MARGIN,
    };
    let app = App::with_platform(DynRegistry::new(memory.clone()), options, platform);
    if drain_deadline > config.heartbeat_timeout() {
        app.protocol()
            .check()
            .expect("the test's margins leave a usable lease");
    }
    let webhook = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = server::serve_all(app, webhook, None, Some(worker), limits)
        .await
        .unwrap();
    Router {
        base: format!("http://{}", server.addr()),
        workers: format!("http://{}", server.worker_addr().unwrap()),
        server,
        clock,
        memory,
        recorder,
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
        config,
    }
}

/// The posted body: odd spacing and a trailing newline, which a JSON round trip would lose.
fn raw_body() -> Vec<u8> {
    let mut b = serde_json::to_vec_pretty(&pr("o/r", 1)).unwrap();
    b.extend_from_slice(b"  \n");
    b
}

/// One worker's calls.
struct Worker<'a> {
    r: &'a Router,
    credential: String,
}

struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    bytes: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
    }
}

impl Worker<'_> {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Reply {
        let url = format!("{}/worker/v1/{path}", self.r.workers);
        let req = match method {
            "GET" => self.r.http.get(url),
            _ => self.r.http.post(url),
        };
        let req = req.bearer_auth(&self.credential);
        let req = match body {
            Some(b) => req.json(&b),
            None => req,
        };
        let res = req.send().await.unwrap();
        Reply {
            status: res.status(),
            headers: res.headers().clone(),
            bytes: res.bytes().await.unwrap().to_vec(),
        }
    }
    async fn heartbeat(&self) -> Reply {
        self.call("POST", "heartbeat", None).await
    }
    async fn next(&self, wait_ms: u64) -> Reply {
        self.call("GET", &format!("next?wait_ms={wait_ms}"), None)
            .await
    }
}

impl Router {
    async fn deliver(&self, id: &str, body: Vec<u8>) -> Value {
        let res = self
            .http
            .post(format!("{}/webhook", self.base))
            .header("content-type", "application/json")
            .header(github::EVENT_HEADER, "pull_request")
            .header(github::DELIVERY_HEADER, id)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED);
        res.json().await.unwrap()
    }

    fn worker(&self, i: usize) -> Worker<'_> {
        let env = self.recorder.env(i);
        let credential = get(&env, "WORKER_CREDENTIAL").to_owned();
        Worker {
            r: self,
            credential,
        }
    }

    /// Moves the registry's clock by `by` in steps of half a sweep interval, a sweep after each
    /// (a longer gap between two sweeps is a stall of the registry's own, which it does not hold
    /// against its workers).
    async fn pass(&self, by: Duration) {
        let step = SWEEP / 2;
        for _ in 0..by.as_millis().div_ceil(step.as_millis()) {
            self.clock.advance(step);
            let swept = self.memory.stats().sweeps;
            eventually(|| async { (self.memory.stats().sweeps > swept).then_some(()) }).await;
        }
    }

    fn rules(&self) -> LeaseRules {
        LeaseRules::with_margins(
            self.config.heartbeat_timeout(),
            self.config.drain_deadline(),
            MARGIN,
            MARGIN,
        )
    }
}

fn get<'e>(env: &'e [(String, String)], key: &str) -> &'e str {
    env.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{key} missing from the worker's environment"))
}

#[tokio::test]
async fn a_worker_heartbeats_fetches_its_event_byte_for_byte_and_completes_it() {
    let r = router(Duration::from_secs(60)).await;
    let answer = r.deliver("d-1", raw_body()).await;
    let id = answer["targets"][0]["worker"].as_u64().unwrap();
    eventually(|| async { (!r.recorder.log().is_empty()).then_some(()) }).await;
    let env = r.recorder.env(0);
    let mut keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "WORKER_CREDENTIAL",
            "WORKER_ID",
            "WORKER_ROUTER_URL",
            "WORKER_TOKEN"
        ],
        "a protocol worker's environment: its identity, credential and the router, nothing else"
    );
    assert_eq!(get(&env, "WORKER_ID"), id.to_string());
    assert_eq!(get(&env, "WORKER_ROUTER_URL"), r.workers);
    let w = r.worker(0);

    // No lease before the first heartbeat: nothing is handed, however long it asks to wait.
    assert_eq!(w.next(5_000).await.status, StatusCode::NO_CONTENT);

    let hb = w.heartbeat().await;
    assert_eq!(hb.status, StatusCode::OK);
    let expected = r.rules().active().as_millis() as u64;
    assert_eq!(hb.json(), json!({"status": "active", "lease_ms": expected}));
    // 600 ms · (1 − 2·10⁻³) − 50 − 50 − 1 ms, rounded down.
    assert_eq!(expected, 497);

    let ev = w.next(5_000).await;
    assert_eq!(ev.status, StatusCode::OK);
    assert_eq!(ev.bytes, raw_body(), "the body byte for byte as posted");
    let h = |name: &str| ev.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(h("content-type").as_deref(), Some("application/json"));
    assert_eq!(h("x-github-event").as_deref(), Some("pull_request"));
    assert_eq!(h("x-github-delivery").as_deref(), Some("d-1"));
    assert_eq!(h("x-github-action").as_deref(), Some("synchronize"));
    assert_eq!(h("x-worker-target").as_deref(), Some("o/r#1"));
    assert_eq!(
        h("x-worker-fencing-token").as_deref(),
        Some(get(&env, "WORKER_TOKEN")),
        "the creating assignment's event carries the worker's own token"
    );

    assert_eq!(
        w.call("POST", "loop/started", Some(json!({"delivery": "d-1"})))
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let done = json!({"delivery": "d-1", "outcome": "succeeded", "attempts": 1});
    assert_eq!(
        w.call("POST", "complete", Some(done.clone())).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(r.memory.stats().claims_completed, 1);
    assert_eq!(
        w.call("POST", "complete", Some(done)).await.status,
        StatusCode::CONFLICT,
        "a completion of an event not (or no longer) handed to it"
    );
    let fin = w.call("POST", "loop/finished", None).await;
    assert_eq!(
        (fin.status, fin.json()),
        (StatusCode::OK, json!({"status": "active"}))
    );
    assert_eq!(
        w.next(0).await.status,
        StatusCode::NO_CONTENT,
        "nothing more"
    );
    assert_eq!(
        w.call("POST", "exit", None).await.status,
        StatusCode::NO_CONTENT
    );
    let after = w.heartbeat().await;
    assert_eq!(after.status, StatusCode::GONE);
    assert_eq!(
        after.json(),
        json!({"error": "fenced", "worker": id, "reason": "deregistered"})
    );
}

#[tokio::test]
async fn a_credential_that_does_not_verify_is_401() {
    let r = router(Duration::from_secs(60)).await;
    r.deliver("d-1", raw_body()).await;
    eventually(|| async { (!r.recorder.log().is_empty()).then_some(()) }).await;
    let good = r.worker(0).credential;
    // The last hex digit changed; another worker's id under the same MAC; nothing at all.
    let last = good.chars().last().unwrap();
    let flipped = format!(
        "{}{}",
        &good[..good.len() - 1],
        if last == '0' { '1' } else { '0' }
    );
    let parts: Vec<&str> = good.split('.').collect();
    let other_id = format!("v1.{}.{}.{}", 999, parts[2], parts[3]);
    for bad in [flipped.as_str(), other_id.as_str(), "", "Basic abc"] {
        let w = Worker {
            r: &r,
            credential: bad.to_owned(),
        };
        for (method, path) in [
            ("POST", "heartbeat"),
            ("GET", "next?wait_ms=0"),
            ("POST", "loop/finished"),
            ("POST", "exit"),
        ] {
            let a = w.call(method, path, None).await;
            assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{path} with {bad:?}");
            assert!(a.headers.contains_key("www-authenticate"));
        }
    }
    // The good one still works, and nothing above changed the worker.
    assert_eq!(r.worker(0).heartbeat().await.status, StatusCode::OK);
}

/// The worker listener has a connection cap of its own, two per worker the registry can hold:
/// the webhook's cap (here 1, with connections never timed out) does not starve workers.
#[tokio::test]
async fn the_worker_listener_is_not_capped_by_the_webhook_listeners_limit() {
    let limits = server::ServerLimits {
        max_connections: 1,
        header_timeout: Duration::from_secs(3600),
        ..Default::default()
    };
    let r = router_with(Duration::from_secs(60), limits).await;
    r.deliver("d-1", raw_body()).await;
    eventually(|| async { (!r.recorder.log().is_empty()).then_some(()) }).await;
    let addr = r.server.worker_addr().unwrap();
    // Idle connections, as many as the registry has workers, hold slots and send nothing.
    let mut idle = Vec::new();
    for _ in 0..r.config.max_workers() {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let beat = tokio::time::timeout(common::HANG, r.worker(0).heartbeat())
        .await
        .expect("a heartbeat waited for a connection slot");
    assert_eq!(beat.status, StatusCode::OK);
    assert_eq!(
        server::worker_connections(r.config.max_workers()),
        2 * r.config.max_workers() + server::WORKER_CONNECTION_HEADROOM
    );
    drop(idle);
}

/// Silent past the heartbeat timeout on the registry's clock: the sweep declares the worker dead,
/// the router kills its process before the event goes to a successor, and every call of the old
/// worker is answered 410.
#[tokio::test]
async fn a_silent_worker_is_fenced_and_killed_before_its_event_moves_on() {
    let r = router(Duration::from_secs(60)).await;
    let answer = r.deliver("d-1", raw_body()).await;
    let first = WorkerId::new(answer["targets"][0]["worker"].as_u64().unwrap());
    eventually(|| async { (!r.recorder.log().is_empty()).then_some(()) }).await;
    let w = r.worker(0);
    assert_eq!(w.heartbeat().await.status, StatusCode::OK);
    assert_eq!(w.next(5_000).await.status, StatusCode::OK);
    // Silence: the registry's clock passes the timeout; the sweeper does the rest.
    r.pass(HEARTBEAT * (MISSED + 1)).await;
    let log = eventually(|| async {
        let log = r.recorder.log();
        log.iter()
            .any(|s| matches!(s, Seen::Launched(id) if *id != first))
            .then_some(log)
    })
    .await;
    assert_eq!(
        &log[..2],
        [Seen::Launched(first), Seen::Killed(first)],
        "the dead worker is killed before its event is handed on: {log:?}"
    );
    for (method, path, body) in [
        ("POST", "heartbeat", None),
        ("GET", "next?wait_ms=1000", None),
        ("POST", "loop/started", Some(json!({"delivery": "d-1"}))),
        (
            "POST",
            "complete",
            Some(json!({"delivery": "d-1", "outcome": "succeeded", "attempts": 1})),
        ),
        ("POST", "loop/finished", None),
        ("POST", "exit", None),
    ] {
        let a = w.call(method, path, body).await;
        assert_eq!(a.status, StatusCode::GONE, "{path}: {:?}", a.json());
        assert_eq!(a.json()["error"], "fenced");
        assert_eq!(a.json()["worker"], first.get());
        let reason = a.json()["reason"].clone();
        assert!(
            reason == "missed_heartbeats" || reason == "unknown",
            "{path}: {reason}"
        );
    }
    // The successor gets the same bytes.
    let w2 = r.worker(1);
    assert_eq!(w2.heartbeat().await.status, StatusCode::OK);
    let ev = w2.next(5_000).await;
    assert_eq!((ev.status, ev.bytes), (StatusCode::OK, raw_body()));
}

/// A drain can begin right after an `active` answer: a `draining` answer's lease is what is left
/// of the drain deadline since the last call that showed the worker active, never more than an
/// active one; once the deadline passes on the registry's clock, the worker is fenced.
#[tokio::test]
async fn a_draining_workers_lease_is_capped_by_its_deadline() {
    let drain = Duration::from_millis(400);
    let r = router(drain).await;
    r.deliver("d-1", raw_body()).await;
    eventually(|| async { (!r.recorder.log().is_empty()).then_some(()) }).await;
    let w = r.worker(0);
    let hb = w.heartbeat().await;
    let active = hb.json()["lease_ms"].as_u64().unwrap();
    // min(T, D) = D = 400 ms: 400 · 0.998 − 101 ms.
    assert_eq!(active, 298);
    let answered = std::time::Instant::now();
    assert_eq!(w.next(5_000).await.status, StatusCode::OK);
    let id = WorkerId::new(get(&r.recorder.env(0), "WORKER_ID").parse().unwrap());
    // Busy (the event is in flight), so the drain leaves it draining.
    assert_eq!(
        r.memory.drain(id).await,
        Ok(worker_registry::Status::Draining)
    );
    let gap = answered.elapsed().as_millis() as u64;
    let d = w.heartbeat().await;
    assert_eq!(d.json()["status"], "draining");
    let draining = d.json()["lease_ms"].as_u64().unwrap();
    assert!(
        draining + gap <= active,
        "counted from the last active call: {draining} + {gap} > {active}"
    );
    r.pass(drain + HEARTBEAT).await;
    let fenced = eventually(|| async {
        let a = w.heartbeat().await;
        (a.status == StatusCode::GONE).then_some(a.json())
    })
    .await;
    assert_eq!(fenced["reason"], "drain_timed_out");
    let _ = r.memory.sweep().await;
    drop(r.server);
}

#[test]
fn the_openapi_document_describes_the_protocol() {
    let doc = serde_json::to_value(webhook_router::http::openapi::document()).unwrap();
    for (path, method, statuses) in [
        (
            "/worker/v1/heartbeat",
            "post",
            &["200", "401", "410", "503"][..],
        ),
        (
            "/worker/v1/next",
            "get",
            &["200", "204", "401", "410", "503"][..],
        ),
        (
            "/worker/v1/loop/started",
            "post",
            &["204", "401", "410"][..],
        ),
        (
            "/worker/v1/complete",
            "post",
            &["204", "401", "409", "410"][..],
        ),
        (
            "/worker/v1/loop/finished",
            "post",
            &["200", "401", "410"][..],
        ),
        ("/worker/v1/exit", "post", &["204", "401", "410"][..]),
    ] {
        let op = &doc["paths"][path][method];
        assert!(op.is_object(), "{method} {path} undocumented");
        for s in statuses {
            assert!(op["responses"][s].is_object(), "{path} {s} undocumented");
        }
    }
    assert!(doc["components"]["schemas"]["FencedAnswer"].is_object());
}
