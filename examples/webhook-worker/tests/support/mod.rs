//! A small router for the worker's tests: the `/worker/v1` endpoints of the design page
//! (`worker_protocol.md`), with what each answers set by the test and every call recorded.
//! Not the router's server (the worker's own behaviours are tested against this; the real router
//! is tested in the router's end-to-end tests).

#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// The credential the fake accepts.
pub const CREDENTIAL: &str =
    "v1.7.7340033.9de65b4a6d96a5bb42aa91ed844439cd82303aaf28b683ef9beb87a24f2145b3";

/// Longer than any wait of a test that works: only a hang reaches it.
pub const HANG: Duration = Duration::from_secs(120);

/// What `heartbeat` answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Beat {
    /// `200` with this status and lease.
    Answer { draining: bool, lease_ms: u64 },
    /// `503`.
    Unavailable,
    /// `410` with this reason.
    Fenced(&'static str),
    /// `401`.
    Unauthorized,
}

/// One event the fake hands out.
#[derive(Debug, Clone)]
pub struct FakeEvent {
    pub delivery: String,
    pub body: Vec<u8>,
    pub token: u64,
}

/// A recorded call: its path and when it arrived (wall clock, ns since the epoch: the
/// commands' timestamps are on the same clock).
#[derive(Debug, Clone)]
pub struct Call {
    pub path: String,
    pub at_ns: u128,
    pub body: Value,
}

#[derive(Debug)]
pub struct Fake {
    pub beat: Beat,
    pub events: VecDeque<FakeEvent>,
    pub calls: Vec<Call>,
    /// `410` on every call but heartbeat when set.
    pub fenced: bool,
    /// `next` answers `503` this many more times.
    pub next_unavailable: u32,
}

/// A running fake router.
pub struct FakeRouter {
    pub url: String,
    state: Arc<Mutex<Fake>>,
}

pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

impl FakeRouter {
    /// Starts the fake on a free loopback port, on a runtime of its own.
    pub fn start(beat: Beat) -> Self {
        let state = Arc::new(Mutex::new(Fake {
            beat,
            events: VecDeque::new(),
            calls: Vec::new(),
            fenced: false,
            next_unavailable: 0,
        }));
        let app = Router::new()
            .route("/worker/v1/heartbeat", post(heartbeat))
            .route("/worker/v1/next", get(next))
            .route("/worker/v1/loop/started", post(plain))
            .route("/worker/v1/complete", post(plain))
            .route("/worker/v1/loop/finished", post(loop_finished))
            .route("/worker/v1/exit", post(plain))
            .with_state(Arc::clone(&state));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(l, app).await.unwrap();
            });
        });
        Self {
            url: format!("http://{addr}"),
            state,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Fake> {
        self.state.lock().unwrap()
    }

    pub fn push(&self, delivery: &str, body: &[u8]) {
        let n = self.lock().events.len() as u64;
        self.lock().events.push_back(FakeEvent {
            delivery: delivery.to_owned(),
            body: body.to_vec(),
            token: 7_340_033 + n,
        });
    }

    pub fn calls(&self, path: &str) -> Vec<Call> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.path == path)
            .cloned()
            .collect()
    }

    /// Waits until `cond` holds of the recorded state (capped by [`HANG`]).
    pub fn wait_for(&self, what: &str, cond: impl Fn(&Fake) -> bool) {
        let start = Instant::now();
        while !cond(&self.lock()) {
            assert!(start.elapsed() < HANG, "hung waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn record(state: &Mutex<Fake>, path: &str, body: Value) {
    state.lock().unwrap().calls.push(Call {
        path: path.to_owned(),
        at_ns: now_ns(),
        body,
    });
}

fn authorized(h: &HeaderMap) -> bool {
    h.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {CREDENTIAL}"))
}

fn fenced() -> Response {
    fenced_because("missed_heartbeats")
}

fn fenced_because(reason: &str) -> Response {
    (
        StatusCode::GONE,
        Json(json!({"error": "fenced", "worker": 7, "reason": reason})),
    )
        .into_response()
}

async fn heartbeat(State(s): State<Arc<Mutex<Fake>>>, h: HeaderMap) -> Response {
    record(&s, "heartbeat", Value::Null);
    if !authorized(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let beat = s.lock().unwrap().beat.clone();
    match beat {
        Beat::Answer { draining, lease_ms } => Json(json!({
            "status": if draining { "draining" } else { "active" },
            "lease_ms": lease_ms,
        }))
        .into_response(),
        Beat::Unavailable => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Beat::Fenced(reason) => fenced_because(reason),
        Beat::Unauthorized => StatusCode::UNAUTHORIZED.into_response(),
    }
}

#[derive(serde::Deserialize)]
struct Wait {
    wait_ms: u64,
}

async fn next(State(s): State<Arc<Mutex<Fake>>>, h: HeaderMap, Query(w): Query<Wait>) -> Response {
    record(&s, "next", json!({ "wait_ms": w.wait_ms }));
    if !authorized(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let until = Instant::now() + Duration::from_millis(w.wait_ms);
    loop {
        {
            let mut f = s.lock().unwrap();
            if f.fenced {
                return fenced();
            }
            if f.next_unavailable > 0 {
                f.next_unavailable -= 1;
                return StatusCode::SERVICE_UNAVAILABLE.into_response();
            }
            if let Some(e) = f.events.pop_front() {
                return Response::builder()
                    .header("content-type", "application/json")
                    .header("x-github-event", "pull_request")
                    .header("x-github-delivery", &e.delivery)
                    .header("x-github-action", "opened")
                    .header("x-worker-target", "octo/repo#12")
                    .header("x-worker-fencing-token", e.token.to_string())
                    .header(
                        "traceparent",
                        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                    )
                    .body(Body::from(e.body))
                    .unwrap();
            }
        }
        if Instant::now() >= until {
            return StatusCode::NO_CONTENT.into_response();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn plain(
    State(s): State<Arc<Mutex<Fake>>>,
    uri: axum::http::Uri,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().trim_start_matches("/worker/v1/").to_owned();
    record(
        &s,
        &path,
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    );
    if !authorized(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if s.lock().unwrap().fenced {
        return fenced();
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn loop_finished(State(s): State<Arc<Mutex<Fake>>>, h: HeaderMap) -> Response {
    record(&s, "loop/finished", Value::Null);
    if !authorized(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let f = s.lock().unwrap();
    if f.fenced {
        return fenced();
    }
    let draining = matches!(f.beat, Beat::Answer { draining: true, .. });
    Json(json!({ "status": if draining { "dead" } else { "active" } })).into_response()
}

/// A scratch directory for one test, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("webhook-worker-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    pub fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the worker binary against `url` with a cleared environment (the launcher's), the
/// command `cmd` and `args`.
pub fn worker(url: &str, cmd: &str, args: &[&str]) -> Child {
    launched(
        Command::new(env!("CARGO_BIN_EXE_webhook-worker")).args(args),
        url,
        cmd,
    )
}

/// Starts `c` as a launcher would: a cleared environment plus `PATH`, the worker's identity,
/// credential and router, and the event command.
pub fn launched(c: &mut Command, url: &str, cmd: &str) -> Child {
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("WORKER_ID", "7")
        .env("WORKER_TOKEN", "7340033")
        .env("WORKER_CREDENTIAL", CREDENTIAL)
        .env("WORKER_ROUTER_URL", url)
        .env("WEBHOOK_EVENT_COMMAND", cmd)
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

/// The command that writes its own clock (ns since the epoch) to `ticks` every 10 ms while it
/// lives.
pub fn ticking(ticks: &Path) -> String {
    format!(
        "while :; do date +%s%N >> {}; sleep 0.01; done",
        ticks.display()
    )
}

/// Stops answering heartbeats, and returns when the last one answered arrived (no earlier than
/// the worker sent it).
pub fn cut_heartbeats(router: &FakeRouter) -> u128 {
    let mut f = router.lock();
    f.beat = Beat::Unavailable;
    f.calls
        .iter()
        .rfind(|c| c.path == "heartbeat")
        .unwrap()
        .at_ns
}

/// Asserts that the command's last tick came before `last_answered + lease_ms`: the latest the
/// worker's lease, counted from the heartbeat's send, can run.
pub fn assert_stopped_in_time(ticks: &Path, last_answered: u128, lease_ms: u64) {
    let deadline = last_answered + u128::from(lease_ms) * 1_000_000;
    let text = std::fs::read_to_string(ticks).unwrap();
    let last: u128 = text.lines().filter_map(|l| l.parse().ok()).max().unwrap();
    assert!(
        last < deadline,
        "the command ran {} ms past its lease",
        (last - deadline) / 1_000_000
    );
}

/// Waits for `child` to exit (capped by [`HANG`]).
pub fn exit_of(child: &mut Child) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            panic!("the worker hung");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `path` exists (capped by [`HANG`]).
pub fn wait_file(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < HANG,
            "hung waiting for {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether a process `pid` is alive (not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}
