//! The worker protocol at 1,000 workers: what one router serves to workers speaking
//! `/worker/v1` (simulated here by tasks with an HTTP client, one per worker, not processes),
//! against a bare axum floor on the same machine and in the same process, under the same load.
//!
//! ```text
//! cargo bench -p worker-registry-router --bench worker_protocol                 # 1,000 workers, 5 s phases
//! BENCH_WORKERS=200 BENCH_SECS=2 cargo bench -p worker-registry-router --bench worker_protocol
//! ```
//!
//! * **Heartbeats per second**: every worker heartbeats back to back (a closed loop of 1,000
//!   concurrent clients). Router: the credential verified, the registry's `heartbeat`, the lease
//!   computed. Floor: the credential verified (the same HMAC), the same JSON answered.
//! * **Events per second, and the latency to the worker**: 64 posters send signed
//!   `pull_request` deliveries round robin over the 1,000 pull requests; each worker long-polls
//!   `next`, and per event calls `loop/started`, `complete`, and `loop/finished` once `next` is
//!   empty. The latency is from the instant the delivery's POST was sent to the instant its
//!   worker's `next` answer arrived: an upper bound of admission → receipt (it includes the
//!   webhook request's own processing, which precedes the admission's end). Floor: the HMAC
//!   verified, the JSON parsed, the body queued per pull request and handed by a long poll.
//!
//! The router runs an in-memory registry, logs at `warn` (so that per-request logs do not count)
//! and a launcher that starts nothing: it hands each worker's environment to the bench, which
//! starts the worker's task. Both servers and the clients share the machine: the figures are a
//! ratio, not a capacity.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use dashmap::DashMap;
use hdrhistogram::Histogram;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};
use webhook_router::app::{self, App, Platform};
use webhook_router::credential::WorkerKey;
use webhook_router::launcher::{
    BoxFuture, Control, Exit, Launch, LaunchError, Launched, Launcher, Leftover,
};
use webhook_router::{body, github, server, telemetry};
use worker_registry::{DynRegistry, FencingToken, InMemoryRegistry, RegistryConfig, WorkerId};

const SECRET: &str = "It's a Secret to Everybody";
const POSTERS: usize = 64;

/// Numbers every delivery posted (Relaxed: a counter, only its uniqueness matters).
static DELIVERIES: AtomicU64 = AtomicU64::new(0);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The signed `pull_request.synchronize` bodies, one per pull request (1-based).
struct Bodies(Vec<(Bytes, String)>);

impl Bodies {
    fn new(prs: u64) -> Self {
        let template: serde_json::Value = serde_json::from_slice(
            &std::fs::read(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/replay/payloads/pull_request.opened.json"
            ))
            .unwrap(),
        )
        .unwrap();
        Self(
            (1..=prs)
                .map(|n| {
                    let mut p = template.clone();
                    p["action"] = "synchronize".into();
                    p["number"] = n.into();
                    p["pull_request"]["number"] = n.into();
                    let body = serde_json::to_vec(&p).unwrap();
                    let sig = github::sign(SECRET.as_bytes(), &body);
                    (Bytes::from(body), sig)
                })
                .collect(),
        )
    }
}

// ---------------------------------------------------------------- the router and its launcher

/// Starts nothing: hands each worker's environment to the bench.
struct Handed(mpsc::UnboundedSender<Vec<(String, String)>>);

struct Noop;

impl Control for Noop {
    fn kill(&self) {}
    fn stop(&self) {}
}

impl Launcher for Handed {
    fn kind(&self) -> &'static str {
        "bench"
    }
    fn speaks_protocol(&self) -> bool {
        true
    }
    fn launch(&self, spec: Launch) -> BoxFuture<'_, Result<Launched, LaunchError>> {
        let _ = self.0.send(spec.env);
        Box::pin(async {
            Ok(Launched {
                exit: Box::pin(std::future::pending::<Exit>()),
                control: Box::new(Noop),
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

async fn start_router(
    workers: u64,
) -> (
    String,
    server::Server,
    mpsc::UnboundedReceiver<Vec<(String, String)>>,
) {
    let config = RegistryConfig::builder()
        .max_workers(workers as usize)
        .build()
        .unwrap();
    let options = app::Options {
        webhook_secret: Some(SECRET).into(),
        admin_token: Some("bench-token").into(),
        work: Duration::ZERO,
        idle: Duration::from_secs(3600),
        mailbox: webhook_router::limits::DEFAULT_MAILBOX,
        overflow: webhook_router::limits::DEFAULT_OVERFLOW,
        policy: Arc::default(),
        body: body::BodyLimits {
            max: github::MAX_PAYLOAD_BYTES,
            timeout: body::DEFAULT_BODY_TIMEOUT,
            budget: body::BodyBudget::new(body::DEFAULT_BODY_BUDGET),
        },
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let mut platform = Platform::local(options.mailbox, options.overflow);
    platform.launcher = Some(Arc::new(Handed(tx)));
    let registry = DynRegistry::new(InMemoryRegistry::new(config));
    let app = App::with_platform(registry, options, platform);
    let webhook = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = TcpListener::bind("127.0.0.1:0").await.unwrap();
    // Two connections per worker (its heartbeat's and its long poll's): the default cap
    // (`DEFAULT_MAX_CONNECTIONS`, 512, shared with the webhook listener's setting) starves
    // workers past 256, which then die of missed heartbeats.
    let limits = server::ServerLimits {
        max_connections: (workers as usize * 2 + POSTERS).max(server::DEFAULT_MAX_CONNECTIONS),
        ..Default::default()
    };
    let server = server::serve_all(app, webhook, None, Some(worker), limits)
        .await
        .unwrap();
    (format!("http://{}", server.addr()), server, rx)
}

// ---------------------------------------------------------------- the floor

/// Per pull request: its queue and the long poll waiting on it.
#[derive(Default)]
struct Queue {
    events: Mutex<VecDeque<(String, Bytes)>>,
    ready: Notify,
}

struct Floor {
    key: WorkerKey,
    queues: Vec<Queue>,
}

fn verified(f: &Floor, h: &HeaderMap) -> Option<usize> {
    let cred = h
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    let v = f.key.verify(cred).ok()?;
    usize::try_from(v.worker.get()).ok()
}

async fn floor_webhook(State(f): State<Arc<Floor>>, h: HeaderMap, body: Bytes) -> StatusCode {
    let Some(sig) = h.get("x-hub-signature-256").and_then(|v| v.to_str().ok()) else {
        return StatusCode::UNAUTHORIZED;
    };
    if github::sign(SECRET.as_bytes(), &body) != sig {
        return StatusCode::UNAUTHORIZED;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    let n = v["pull_request"]["number"].as_u64().unwrap_or(0) as usize;
    let delivery = h
        .get("x-github-delivery")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let Some(q) = f.queues.get(n.wrapping_sub(1)) else {
        return StatusCode::BAD_REQUEST;
    };
    q.events.lock().unwrap().push_back((delivery, body));
    q.ready.notify_one();
    StatusCode::ACCEPTED
}

async fn floor_heartbeat(State(f): State<Arc<Floor>>, h: HeaderMap) -> Response {
    if verified(&f, &h).is_none() {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    axum::Json(serde_json::json!({"status": "active", "lease_ms": 117_759})).into_response()
}

#[derive(serde::Deserialize)]
struct Wait {
    wait_ms: u64,
}

async fn floor_next(State(f): State<Arc<Floor>>, h: HeaderMap, Query(w): Query<Wait>) -> Response {
    let Some(i) = verified(&f, &h) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let q = &f.queues[i - 1];
    let until = tokio::time::Instant::now() + Duration::from_millis(w.wait_ms);
    loop {
        if let Some((delivery, body)) = q.events.lock().unwrap().pop_front() {
            return (
                [
                    ("content-type", "application/json".to_owned()),
                    ("x-github-delivery", delivery),
                ],
                body,
            )
                .into_response();
        }
        if tokio::time::timeout_at(until, q.ready.notified())
            .await
            .is_err()
        {
            return StatusCode::NO_CONTENT.into_response();
        }
    }
}

async fn floor_plain(State(f): State<Arc<Floor>>, h: HeaderMap, _body: Bytes) -> Response {
    match verified(&f, &h) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

async fn floor_finished(State(f): State<Arc<Floor>>, h: HeaderMap) -> Response {
    match verified(&f, &h) {
        Some(_) => axum::Json(serde_json::json!({"status": "active"})).into_response(),
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

/// The floor, and the environment of each of its `workers` workers (worker i serves PR i).
async fn start_floor(workers: u64) -> (String, Vec<Vec<(String, String)>>) {
    let key = WorkerKey::random();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let envs = (1..=workers)
        .map(|i| {
            let id = WorkerId::new(i);
            let token = FencingToken::new(id, 1).unwrap();
            vec![
                (
                    "WORKER_CREDENTIAL".to_owned(),
                    key.mint(id, token).as_str().to_owned(),
                ),
                ("WORKER_ROUTER_URL".to_owned(), url.clone()),
            ]
        })
        .collect();
    let floor = Arc::new(Floor {
        key,
        queues: (0..workers).map(|_| Queue::default()).collect(),
    });
    let app = Router::new()
        .route("/webhook", post(floor_webhook))
        .route("/worker/v1/heartbeat", post(floor_heartbeat))
        .route("/worker/v1/next", get(floor_next))
        .route("/worker/v1/loop/started", post(floor_plain))
        .route("/worker/v1/complete", post(floor_plain))
        .route("/worker/v1/loop/finished", post(floor_finished))
        .with_state(floor);
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, envs)
}

// ---------------------------------------------------------------- the simulated workers

/// What the clients measure, shared.
#[derive(Default)]
struct Tally {
    beats: AtomicU64,
    events: AtomicU64,
    beat_us: Mutex<Vec<Histogram<u64>>>,
    event_us: Mutex<Vec<Histogram<u64>>>,
    /// When each delivery's POST was sent.
    sent: DashMap<String, Instant>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).unwrap()
}

#[derive(Clone)]
struct Sim {
    http: reqwest::Client,
    base: String,
    auth: String,
}

impl Sim {
    fn new(http: &reqwest::Client, env: &[(String, String)]) -> Self {
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        Self {
            http: http.clone(),
            base: format!("{}/worker/v1", get("WORKER_ROUTER_URL")),
            auth: format!("Bearer {}", get("WORKER_CREDENTIAL")),
        }
    }

    async fn post(&self, path: &str, body: Option<serde_json::Value>) -> reqwest::StatusCode {
        let mut req = self
            .http
            .post(format!("{}/{path}", self.base))
            .header("authorization", &self.auth);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("the server answers");
        let status = res.status();
        let _ = res.bytes().await;
        status
    }

    /// `next`: the delivery id, or `None` on 204.
    async fn next(&self, wait_ms: u64) -> Option<String> {
        let res = self
            .http
            .get(format!("{}/next?wait_ms={wait_ms}", self.base))
            .header("authorization", &self.auth)
            .send()
            .await
            .expect("the server answers");
        if res.status() == reqwest::StatusCode::NO_CONTENT {
            return None;
        }
        assert_eq!(res.status(), reqwest::StatusCode::OK);
        let d = res
            .headers()
            .get("x-github-delivery")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let _ = res.bytes().await;
        d
    }

    /// Heartbeats every 10 s for as long as the bench runs, as a live worker does (the lease is
    /// about two minutes): the phases without heartbeats must not let the registry declare the
    /// workers dead. Both servers get it.
    async fn keep_alive(self) {
        loop {
            let s = self.post("heartbeat", None).await;
            assert!(s.is_success(), "heartbeat answered {s}");
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    }

    /// Heartbeats back to back until `stop`.
    async fn beat_loop(self, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
        let mut h = histogram();
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let s = self.post("heartbeat", None).await;
            assert!(s.is_success(), "heartbeat answered {s}");
            h.saturating_record(t.elapsed().as_micros() as u64);
            tally.beats.fetch_add(1, Ordering::Relaxed);
        }
        tally.beat_us.lock().unwrap().push(h);
    }

    /// Long-polls and completes events until `stop`.
    async fn event_loop(self, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
        let mut h = histogram();
        let mut in_loop = false;
        while !stop.load(Ordering::Relaxed) {
            let wait = if in_loop { 0 } else { 1_000 };
            match self.next(wait).await {
                Some(delivery) => {
                    if let Some((_, sent)) = tally.sent.remove(&delivery) {
                        h.saturating_record(sent.elapsed().as_micros() as u64);
                    }
                    tally.events.fetch_add(1, Ordering::Relaxed);
                    if !in_loop {
                        self.post(
                            "loop/started",
                            Some(serde_json::json!({"delivery": delivery})),
                        )
                        .await;
                        in_loop = true;
                    }
                    let done = serde_json::json!({"delivery": delivery, "outcome": "succeeded", "attempts": 1, "reason": ""});
                    let s = self.post("complete", Some(done)).await;
                    assert!(s.is_success(), "complete answered {s}");
                }
                None if in_loop => {
                    self.post("loop/finished", None).await;
                    in_loop = false;
                }
                None => {}
            }
        }
        tally.event_us.lock().unwrap().push(h);
    }
}

// ---------------------------------------------------------------- the phases

/// Posts signed deliveries round robin over the pull requests until `stop`; the non-202 count.
async fn post_loop(
    http: reqwest::Client,
    url: String,
    bodies: Arc<Bodies>,
    next: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    pace: Option<Duration>,
) -> u64 {
    let mut refused = 0;
    let mut tick = pace.map(|p| {
        let mut i = tokio::time::interval(p);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    while !stop.load(Ordering::Relaxed) {
        if let Some(t) = tick.as_mut() {
            t.tick().await;
        }
        let n = next.fetch_add(1, Ordering::Relaxed);
        let (body, sig) = &bodies.0[(n % bodies.0.len() as u64) as usize];
        // Unique across phases and rounds (a repeated id is a duplicate, answered 200).
        let id = format!(
            "bench-{}-{}",
            std::process::id(),
            DELIVERIES.fetch_add(1, Ordering::Relaxed)
        );
        tally.sent.insert(id.clone(), Instant::now());
        let res = http
            .post(&url)
            .header("content-type", "application/json")
            .header(github::EVENT_HEADER, "pull_request")
            .header(github::DELIVERY_HEADER, &id)
            .header("x-hub-signature-256", sig)
            .body(body.clone())
            .send()
            .await
            .expect("the server answers");
        if res.status() != reqwest::StatusCode::ACCEPTED {
            refused += 1;
            tally.sent.remove(&id);
        }
        let _ = res.bytes().await;
    }
    refused
}

struct Figures {
    beats_per_s: f64,
    beat: Histogram<u64>,
    events_per_s: f64,
    latency: Histogram<u64>,
    refused: u64,
}

fn merged(hs: &Mutex<Vec<Histogram<u64>>>) -> Histogram<u64> {
    let mut all = histogram();
    for h in hs.lock().unwrap().drain(..) {
        all.add(h).unwrap();
    }
    all
}

/// Runs `work` on every worker for `secs`, then stops it and waits for every worker.
async fn phase<F, Fut>(sims: &[Sim], secs: u64, tally: &Arc<Tally>, work: F) -> Duration
where
    F: Fn(Sim, Arc<AtomicBool>, Arc<Tally>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = sims
        .iter()
        .map(|s| tokio::spawn(work(s.clone(), stop.clone(), tally.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    // Relaxed: a flag polled between requests; the join below orders what the tasks recorded.
    stop.store(true, Ordering::Relaxed);
    let took = start.elapsed();
    for t in tasks {
        t.await.unwrap();
    }
    took
}

/// Posters (paced to `rate` deliveries per second in all, or back to back) beside the workers'
/// long polls for `secs`: what the workers received.
async fn events(
    webhook: &str,
    sims: &[Sim],
    bodies: &Arc<Bodies>,
    secs: u64,
    rate: Option<u64>,
) -> (f64, Histogram<u64>, u64) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let tally = Arc::new(Tally::default());
    let stop_posting = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let pace = rate.map(|r| Duration::from_secs_f64(POSTERS as f64 / r.max(1) as f64));
    let posters: Vec<_> = (0..POSTERS)
        .map(|_| {
            tokio::spawn(post_loop(
                http.clone(),
                webhook.to_owned(),
                bodies.clone(),
                counter.clone(),
                stop_posting.clone(),
                tally.clone(),
                pace,
            ))
        })
        .collect();
    let stopper = {
        let stop = stop_posting.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            // Relaxed: a flag polled between requests.
            stop.store(true, Ordering::Relaxed);
        })
    };
    let took = phase(sims, secs, &tally, |s, stop, t| s.event_loop(stop, t)).await;
    stopper.await.unwrap();
    let mut refused = 0;
    for p in posters {
        refused += p.await.unwrap();
    }
    let per_s = tally.events.load(Ordering::Relaxed) as f64 / took.as_secs_f64();
    (per_s, merged(&tally.event_us), refused)
}

/// Lets the workers take what the back-to-back phase left queued, until a second passes with
/// nothing received.
async fn settle(sims: &[Sim]) {
    loop {
        let tally = Arc::new(Tally::default());
        phase(sims, 1, &tally, |s, stop, t| s.event_loop(stop, t)).await;
        if tally.events.load(Ordering::Relaxed) == 0 {
            return;
        }
    }
}

/// The three phases against one server: `webhook` is its `/webhook` URL, `sims` its workers.
async fn measure(
    webhook: &str,
    sims: &[Sim],
    bodies: &Arc<Bodies>,
    secs: u64,
    rate: u64,
) -> Figures {
    let tally = Arc::new(Tally::default());
    let took = phase(sims, secs, &tally, |s, stop, t| s.beat_loop(stop, t)).await;
    let beats_per_s = tally.beats.load(Ordering::Relaxed) as f64 / took.as_secs_f64();
    let beat = merged(&tally.beat_us);
    let (events_per_s, _, refused) = events(webhook, sims, bodies, secs, None).await;
    settle(sims).await;
    let (_, latency, late_refused) = events(webhook, sims, bodies, secs, Some(rate)).await;
    Figures {
        beats_per_s,
        beat,
        events_per_s,
        latency,
        refused: refused + late_refused,
    }
}

/// Creates the router's workers: one delivery per pull request, each worker's first event
/// taken and completed. Their simulated clients, once every one has done so.
async fn router_workers(
    webhook: &str,
    mut launched: mpsc::UnboundedReceiver<Vec<(String, String)>>,
    bodies: &Arc<Bodies>,
    http: &reqwest::Client,
) -> Vec<Sim> {
    let workers = bodies.0.len();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut sims = Vec::with_capacity(workers);
    let mut tasks = Vec::with_capacity(workers);
    for (n, (body, sig)) in bodies.0.iter().enumerate() {
        let res = http
            .post(webhook)
            .header("content-type", "application/json")
            .header(github::EVENT_HEADER, "pull_request")
            .header(github::DELIVERY_HEADER, format!("warm-{n}"))
            .header("x-hub-signature-256", sig)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), reqwest::StatusCode::ACCEPTED);
        let sim = Sim::new(http, &launched.recv().await.expect("a launch"));
        assert!(sim.post("heartbeat", None).await.is_success());
        tasks.push(tokio::spawn(
            sim.clone().event_loop(stop.clone(), tally.clone()),
        ));
        sims.push(sim);
    }
    while tally.events.load(Ordering::Relaxed) < workers as u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    sims
}

fn print(round: u64, name: &str, f: &Figures) {
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{round:>5} {name:<7} {:>9.0} {:>8.2} {:>8.2} {:>8.1}   {:>9.0} {:>14.2} {:>8.2} {:>8.1} {:>8}",
        f.beats_per_s,
        ms(&f.beat, 0.5),
        ms(&f.beat, 0.99),
        f.beat.max() as f64 / 1000.0,
        f.events_per_s,
        ms(&f.latency, 0.5),
        ms(&f.latency, 0.99),
        f.latency.max() as f64 / 1000.0,
        f.refused
    );
}

/// 1,000 workers and their servers' connections need more descriptors than the usual 1,024.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

fn main() {
    raise_fd_limit();
    let (workers, secs) = (env("BENCH_WORKERS", 1_000), env("BENCH_SECS", 5));
    let (rounds, rate) = (env("BENCH_ROUNDS", 2), env("BENCH_RATE", 500));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let _ = telemetry::init("warn", telemetry::LogFormat::Text);
        let bodies = Arc::new(Bodies::new(workers));
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let (floor_url, envs) = start_floor(workers).await;
        let floor_sims: Vec<Sim> = envs.iter().map(|e| Sim::new(&http, e)).collect();
        let (router_url, server, launched) = start_router(workers).await;
        let router_sims =
            router_workers(&format!("{router_url}/webhook"), launched, &bodies, &http).await;
        for sim in &floor_sims {
            tokio::spawn(sim.clone().keep_alive());
        }
        println!(
            "{workers} workers, {secs} s per phase: heartbeats back to back; {POSTERS} posters of signed \
             deliveries over {workers} PRs back to back (events/s the workers received); the same paced \
             to {rate}/s (latency from the POST's send to the worker's receipt)"
        );
        println!(
            "round server   beats/s   p50 ms   p99 ms   max ms    events/s  latency p50 ms   p99 ms   max ms  non-202"
        );
        let mut ratios = Vec::new();
        for round in 1..=rounds {
            let floor = measure(&format!("{floor_url}/webhook"), &floor_sims, &bodies, secs, rate).await;
            print(round, "floor", &floor);
            let router =
                measure(&format!("{router_url}/webhook"), &router_sims, &bodies, secs, rate).await;
            print(round, "router", &router);
            ratios.push((
                router.beats_per_s / floor.beats_per_s,
                router.events_per_s / floor.events_per_s,
            ));
        }
        for (round, (b, e)) in ratios.iter().enumerate() {
            println!("round {}: router/floor heartbeats {b:.2}, events {e:.2}", round + 1);
        }
        // The router's workers are the bench's tasks, which end with it: no shutdown to wait for.
        drop(server);
    });
    // Before the runtime is dropped under the sweeper (which would log its unrequested end).
    std::process::exit(0);
}
