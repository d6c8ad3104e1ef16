//! `--simulate`: realistic GitHub traffic over real HTTP at a running router, with crashes and
//! drains, then a summary (throughput, latency, outcomes, an audit that nothing was lost, and the
//! final status table).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::time::{sleep, sleep_until, Instant};
use worker_registry::{DeadReason, Status, StatusSnapshot, WorkerInfo, WorkerRegistry};

use crate::github;
use crate::server::Server;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Deliveries to send (redeliveries included).
    pub events: usize,
    /// Deliveries per second (0: as fast as the clients go).
    pub rate: u32,
    /// Concurrent HTTP clients.
    pub clients: usize,
    /// Repositories (each with `prs` pull requests).
    pub repos: usize,
    /// Pull requests per repository.
    pub prs: u64,
    /// Fraction of deliveries that are redeliveries of an earlier one.
    pub redeliveries: f64,
    /// Crash a random worker this often.
    pub crash_every: Duration,
    /// Drain a random worker through the admin API this often.
    pub drain_every: Duration,
    /// Stop sending after this long even if deliveries remain.
    pub max_time: Duration,
    /// Seed of the traffic generator.
    pub seed: u64,
    /// Signs every delivery with this secret.
    pub secret: Vec<u8>,
    /// Bearer token for the admin and debug endpoints.
    pub admin_token: Option<String>,
    /// How long shutdown may take.
    pub shutdown_deadline: Duration,
}

/// One delivery as GitHub would send it.
struct Delivery {
    id: String,
    event: &'static str,
    body: Vec<u8>,
    signature: String,
    redelivery: bool,
    /// Whether the router should place it on a worker.
    has_target: bool,
}

const OWNERS: [&str; 4] = ["acme", "octo-org", "tidal", "northwind"];
const NAMES: [&str; 12] = [
    "api", "web", "billing", "infra", "docs", "mobile", "search", "auth", "ledger", "notify",
    "gateway", "cli",
];
const USERS: [&str; 6] = ["mona", "hubot", "octocat", "dependabot[bot]", "ana", "li"];

fn uuid(rng: &mut StdRng) -> String {
    let (a, b, c, d, e): (u32, u16, u16, u16, u64) =
        (rng.gen(), rng.gen(), rng.gen(), rng.gen(), rng.gen());
    format!(
        "{a:08x}-{b:04x}-4{:03x}-{:04x}-{:012x}",
        c & 0xfff,
        (d & 0x3fff) | 0x8000,
        e & 0xffff_ffff_ffff
    )
}

/// The traffic: a mix of PR events on skewed targets, some events without a PR target, and
/// redeliveries of recent deliveries.
fn generate(plan: &Plan) -> Vec<Arc<Delivery>> {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let repos: Vec<String> = (0..plan.repos.max(1))
        .map(|i| {
            let base = format!("{}/{}", OWNERS[i % OWNERS.len()], NAMES[i % NAMES.len()]);
            match i / (OWNERS.len() * NAMES.len()) {
                0 => base,
                n => format!("{base}-{n}"),
            }
        })
        .collect();
    let mut out: Vec<Arc<Delivery>> = Vec::with_capacity(plan.events);
    while out.len() < plan.events {
        if !out.is_empty() && rng.gen_bool(plan.redeliveries) {
            let from = out.len().saturating_sub(300);
            let original = &out[rng.gen_range(from..out.len())];
            out.push(Arc::new(Delivery {
                id: original.id.clone(),
                event: original.event,
                body: original.body.clone(),
                signature: original.signature.clone(),
                redelivery: true,
                has_target: original.has_target,
            }));
            continue;
        }
        // Zipf-like: a few repositories and pull requests get most of the activity.
        let r = ((rng.gen::<f64>().powi(2)) * repos.len() as f64) as usize;
        let repo = &repos[r.min(repos.len() - 1)];
        let number = 1 + ((rng.gen::<f64>().powi(2)) * plan.prs as f64) as u64;
        let sender = USERS[rng.gen_range(0..USERS.len())];
        let repository = json!({ "full_name": repo, "private": false });
        let pr = json!({ "number": number, "title": format!("Change #{number}"),
            "head": { "sha": format!("{:040x}", rng.gen::<u128>()) }, "state": "open" });
        let roll: u32 = rng.gen_range(0..100);
        let (event, body, has_target) = match roll {
            0..=44 => {
                let action = ["opened", "synchronize", "synchronize", "labeled", "edited"]
                    [rng.gen_range(0..5)];
                let body = json!({ "action": action, "number": number, "pull_request": pr,
                    "repository": repository, "sender": { "login": sender } });
                ("pull_request", body, true)
            }
            45..=64 => {
                let body = json!({ "action": "created",
                    "issue": { "number": number, "pull_request": { "url": "https://api.github.com/..." } },
                    "comment": { "body": "/retest" }, "repository": repository,
                    "sender": { "login": sender } });
                ("issue_comment", body, true)
            }
            65..=74 => {
                let body = json!({ "action": "submitted", "review": { "state": "approved" },
                    "pull_request": pr, "repository": repository, "sender": { "login": sender } });
                ("pull_request_review", body, true)
            }
            75..=84 => {
                let body = json!({ "action": "created", "comment": { "body": "nit" },
                    "pull_request": pr, "repository": repository, "sender": { "login": sender } });
                ("pull_request_review_comment", body, true)
            }
            85 => {
                // A PR closed: its worker gets this as its last event and drains.
                let mut closed = pr.clone();
                closed["state"] = json!("closed");
                closed["merged"] = json!(rng.gen_bool(0.7));
                let body = json!({ "action": "closed", "number": number, "pull_request": closed,
                    "repository": repository, "sender": { "login": sender } });
                ("pull_request", body, true)
            }
            86 => {
                // CI finished for a commit shared by two PRs of the repository: two targets.
                let other = 1 + (number % plan.prs);
                let body = json!({ "action": "completed", "repository": repository,
                    "check_run": { "name": "build", "status": "completed", "conclusion": "success",
                        "pull_requests": [{ "number": number }, { "number": other }] },
                    "sender": { "login": "github-actions[bot]" } });
                ("check_run", body, true)
            }
            87..=89 => {
                let body = json!({ "action": "created", "issue": { "number": number },
                    "comment": { "body": "+1" }, "repository": repository,
                    "sender": { "login": sender } });
                ("issue_comment", body, false)
            }
            _ => {
                let body = json!({ "ref": "refs/heads/main", "after": format!("{:040x}", rng.gen::<u128>()),
                    "repository": repository, "sender": { "login": sender } });
                ("push", body, false)
            }
        };
        let body = serde_json::to_vec(&body).expect("a json! value serialises");
        let signature = github::sign(&plan.secret, &body);
        out.push(Arc::new(Delivery {
            id: uuid(&mut rng),
            event,
            body,
            signature,
            redelivery: false,
            has_target,
        }));
    }
    out
}

/// How one request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Outcome {
    AssignedNew,
    AssignedExisting,
    Duplicate,
    Ignored,
    Capacity,
    Draining,
    Refused,
    Failed,
}

const OUTCOMES: [Outcome; 8] = [
    Outcome::AssignedNew,
    Outcome::AssignedExisting,
    Outcome::Duplicate,
    Outcome::Ignored,
    Outcome::Capacity,
    Outcome::Draining,
    Outcome::Refused,
    Outcome::Failed,
];

/// Shared counters of the run.
#[derive(Default)]
struct Tally {
    by_outcome: [AtomicU64; OUTCOMES.len()],
    sent: AtomicUsize,
    crashes: AtomicU64,
    drains: AtomicU64,
}

impl Tally {
    fn add(&self, o: Outcome) {
        let i = OUTCOMES.iter().position(|x| *x == o).unwrap_or(0);
        // Relaxed: statistics, read after the tasks are joined (or approximately for progress).
        self.by_outcome[i].fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self, o: Outcome) -> u64 {
        let i = OUTCOMES.iter().position(|x| *x == o).unwrap_or(0);
        // Relaxed: see `add`.
        self.by_outcome[i].load(Ordering::Relaxed)
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
    admin_token: Option<String>,
}

impl Client {
    async fn send(&self, d: &Delivery) -> (Outcome, Option<Value>) {
        let res = self
            .http
            .post(format!("{}/webhook", self.base))
            .header("content-type", "application/json")
            .header("user-agent", "GitHub-Hookshot/sim")
            .header(github::EVENT_HEADER, d.event)
            .header(github::DELIVERY_HEADER, &d.id)
            .header(github::SIGNATURE_HEADER, &d.signature)
            .body(d.body.clone())
            .send()
            .await;
        let Ok(res) = res else {
            return (Outcome::Failed, None);
        };
        let status = res.status().as_u16();
        let body: Option<Value> = res.json().await.ok();
        let outcome = body
            .as_ref()
            .and_then(|b| b.get("outcome"))
            .and_then(Value::as_str);
        let o = match (status, outcome) {
            (202, Some("assigned")) => {
                let new = body.as_ref().and_then(|b| b["new"].as_bool());
                if new == Some(true) {
                    Outcome::AssignedNew
                } else {
                    Outcome::AssignedExisting
                }
            }
            (200, Some("duplicate")) => Outcome::Duplicate,
            // The PR's worker got a `closed` event as its last one.
            (202, Some("drained")) => Outcome::AssignedExisting,
            (202, Some("ignored")) => Outcome::Ignored,
            (503, Some("capacity")) => Outcome::Capacity,
            // The PR's worker is draining, the router is shutting down, or its backend is away.
            (503, Some("draining" | "closing" | "unavailable")) => Outcome::Draining,
            (400..=499, _) => Outcome::Refused,
            _ => Outcome::Failed,
        };
        (o, body)
    }

    fn admin(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.admin_token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Live worker ids, from the admin API.
    async fn live_workers(&self) -> Vec<u64> {
        let Ok(res) = self
            .admin(self.http.get(format!("{}/workers", self.base)))
            .send()
            .await
        else {
            return Vec::new();
        };
        let Ok(v) = res.json::<Value>().await else {
            return Vec::new();
        };
        v["workers"]
            .as_array()
            .map(|ws| {
                ws.iter()
                    .filter(|w| w["status"] == "active")
                    .filter_map(|w| w["id"].as_u64())
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn post_ok(&self, path: String) -> bool {
        self.admin(self.http.post(format!("{}{path}", self.base)))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }
}

/// Runs the simulation against `server` and prints the summary. Returns false if the audit found a
/// delivery that was accepted but lost.
pub async fn run(server: Server, plan: Plan) -> bool {
    let deliveries = Arc::new(generate(&plan));
    let total = deliveries.len();
    let base = format!("http://{}", server.addr());
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(plan.clients.max(1) + 2)
        .build()
        .expect("a plain HTTP client builds");
    let client = Arc::new(Client {
        http,
        base,
        admin_token: plan.admin_token.clone(),
    });
    let tally = Arc::new(Tally::default());
    let accepted: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let retry: Arc<Mutex<Vec<usize>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let app = server.app().clone();

    eprintln!(
        "simulating {total} deliveries at {} over {} clients against http://{} (capacity {}, heartbeat {:?} x {}, work {:?})",
        if plan.rate == 0 { "full speed".to_owned() } else { format!("{}/s", plan.rate) },
        plan.clients,
        server.addr(),
        app.registry().config().max_workers(),
        app.registry().config().heartbeat_interval(),
        app.registry().config().missed_heartbeats(),
        app.options().work,
    );

    let started = Instant::now();
    // First-attempt key for a delivery: the index of the original (redeliveries share its id).
    let original_of: Arc<Vec<usize>> = Arc::new({
        let mut first = std::collections::HashMap::new();
        deliveries
            .iter()
            .enumerate()
            .map(|(i, d)| *first.entry(d.id.clone()).or_insert(i))
            .collect()
    });

    // The clients.
    let mut clients = Vec::new();
    for _ in 0..plan.clients.max(1) {
        let (client, tally, accepted, retry, next, deliveries, original_of) = (
            client.clone(),
            tally.clone(),
            accepted.clone(),
            retry.clone(),
            next.clone(),
            deliveries.clone(),
            original_of.clone(),
        );
        let (rate, max_time) = (plan.rate, plan.max_time);
        clients.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                .expect("valid histogram bounds");
            loop {
                // Relaxed: only uniqueness of the index matters.
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= deliveries.len() {
                    break;
                }
                if rate > 0 {
                    let at = started + Duration::from_secs_f64(i as f64 / f64::from(rate));
                    sleep_until(at).await;
                }
                if started.elapsed() > max_time {
                    break;
                }
                let d = &deliveries[i];
                let t0 = Instant::now();
                let (o, _) = client.send(d).await;
                let _ = hist.record(t0.elapsed().as_micros().max(1) as u64);
                // Relaxed: statistics.
                tally.sent.fetch_add(1, Ordering::Relaxed);
                tally.add(o);
                record(o, original_of[i], &accepted, &retry);
            }
            hist
        }));
    }

    // Chaos: crashes and drains through the HTTP endpoints.
    let chaos = {
        let (client, tally, done) = (client.clone(), tally.clone(), done.clone());
        let (crash_every, drain_every, seed) = (plan.crash_every, plan.drain_every, plan.seed);
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
            let mut next_crash = Instant::now() + crash_every;
            let mut next_drain = Instant::now() + drain_every;
            // Relaxed: a stop flag; the next iteration sees it soon enough.
            while !done.load(Ordering::Relaxed) {
                let crash = next_crash <= next_drain;
                sleep_until(next_crash.min(next_drain)).await;
                let live = client.live_workers().await;
                if live.is_empty() {
                    if crash {
                        next_crash += crash_every;
                    } else {
                        next_drain += drain_every;
                    }
                    continue;
                }
                let id = live[rng.gen_range(0..live.len())];
                if crash {
                    next_crash += crash_every;
                    if client.post_ok(format!("/debug/workers/{id}/crash")).await {
                        // Relaxed: statistics.
                        tally.crashes.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    next_drain += drain_every;
                    if client.post_ok(format!("/workers/{id}/drain")).await {
                        // Relaxed: statistics.
                        tally.drains.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };

    // Progress.
    let progress = {
        let (tally, done, app) = (tally.clone(), done.clone(), app.clone());
        tokio::spawn(async move {
            let tty = std::io::stderr().is_terminal();
            // Relaxed: a stop flag.
            while !done.load(Ordering::Relaxed) {
                sleep(Duration::from_millis(if tty { 250 } else { 1000 })).await;
                let secs = started.elapsed().as_secs_f64();
                // Relaxed: statistics.
                let sent = tally.sent.load(Ordering::Relaxed);
                let line = format!(
                    "[{secs:5.1}s] {sent}/{total} sent, {:.0} req/s | workers {}/{} live | assigned {} duplicate {} ignored {} 503 {} | crashed {} drained {}",
                    sent as f64 / secs.max(1e-3),
                    app.registry().stats().live_workers,
                    app.registry().config().max_workers(),
                    tally.get(Outcome::AssignedNew) + tally.get(Outcome::AssignedExisting),
                    tally.get(Outcome::Duplicate),
                    tally.get(Outcome::Ignored),
                    tally.get(Outcome::Capacity) + tally.get(Outcome::Draining),
                    tally.crashes.load(Ordering::Relaxed),
                    tally.drains.load(Ordering::Relaxed),
                );
                let mut err = std::io::stderr().lock();
                let _ = if tty {
                    write!(err, "\r{line}\x1b[K")
                } else {
                    writeln!(err, "{line}")
                };
                let _ = err.flush();
            }
        })
    };

    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    for c in clients {
        if let Ok(h) = c.await {
            let _ = hist.add(h);
        }
    }
    let traffic_time = started.elapsed();
    let at_peak = app.registry().status();
    // Relaxed: read after the clients are joined.
    let sent = tally.sent.load(Ordering::Relaxed);

    // The reconciler: deliveries answered 503 are sent again until placed (bounded).
    let mut retried = 0usize;
    for _ in 0..10 {
        let batch: Vec<usize> = std::mem::take(&mut *retry.lock().expect("not poisoned"));
        if batch.is_empty() {
            break;
        }
        sleep(Duration::from_millis(200)).await;
        for i in batch {
            retried += 1;
            let (o, _) = client.send(&deliveries[i]).await;
            tally.add(o);
            record(o, i, &accepted, &retry);
        }
    }
    let gave_up = retry.lock().expect("not poisoned").len();
    // Relaxed: the chaos and progress tasks stop at their next iteration.
    done.store(true, Ordering::Relaxed);
    let _ = chaos.await;
    let _ = progress.await;
    if std::io::stderr().is_terminal() {
        eprintln!();
    }

    // Let the sweeps re-dispatch what crashed workers held and the workers finish everything.
    let sweep = app.registry().config().sweep_interval();
    let settle_started = Instant::now();
    let settle_limit = Duration::from_secs(10);
    // A sweep publishes its snapshot before its callback re-dispatches what it released, so a quiet
    // snapshot only counts if nothing was re-dispatched since before it was published: since the
    // previous poll, which saw an older snapshot.
    let mut previous: Option<(u64, u64)> = None;
    loop {
        let s = app.registry().status();
        let redispatched = app.redispatched();
        let quiet = s.claims.in_flight == 0 && s.counts.busy == 0 && app.pending_redispatch() == 0;
        if quiet
            && previous.is_some_and(|(generation, before)| {
                s.version > generation && redispatched == before
            })
        {
            break;
        }
        if settle_started.elapsed() > settle_limit {
            break;
        }
        previous = Some((s.version, redispatched));
        sleep(sweep).await;
    }
    let settled_in = settle_started.elapsed();
    let status = app.registry().status();

    // Audit: every accepted delivery, redelivered once more, must be a completed duplicate.
    let accepted: Vec<usize> = {
        let mut v: Vec<usize> = accepted
            .lock()
            .expect("not poisoned")
            .iter()
            .copied()
            .collect();
        v.sort_unstable();
        v
    };
    let (mut completed, mut in_flight, mut lost) = (0usize, 0usize, 0usize);
    for &i in &accepted {
        let (o, body) = client.send(&deliveries[i]).await;
        // Every pull request the delivery names must hold it as completed.
        let all_completed = body
            .as_ref()
            .and_then(|b| b["targets"].as_array())
            .is_some_and(|ts| !ts.is_empty() && ts.iter().all(|t| t["state"] == "completed"));
        match (o, all_completed) {
            (Outcome::Duplicate, true) => completed += 1,
            (Outcome::Duplicate, false) => in_flight += 1,
            _ => lost += 1,
        }
    }

    let stats = app.registry().stats();
    let redispatched = app.redispatched();
    let shutdown_started = Instant::now();
    let report = server.shutdown(plan.shutdown_deadline).await;
    let shutdown_took = shutdown_started.elapsed();

    // ---- the summary ---------------------------------------------------------------------------
    let mut out = String::new();
    let redeliveries = deliveries[..sent.min(total)]
        .iter()
        .filter(|d| d.redelivery)
        .count();
    let with_target = deliveries[..sent.min(total)]
        .iter()
        .filter(|d| d.has_target && !d.redelivery)
        .count();
    let ms = |us: u64| us as f64 / 1000.0;
    let _ = writeln!(out, "\n== webhook-router --simulate: summary ==");
    let _ = writeln!(
        out,
        "traffic    {sent} deliveries in {:.2} s = {:.0} req/s ({} clients, {}); {redeliveries} redeliveries ({:.1}%), {with_target} distinct PR deliveries",
        traffic_time.as_secs_f64(),
        sent as f64 / traffic_time.as_secs_f64().max(1e-9),
        plan.clients,
        if plan.rate == 0 { "unpaced".to_owned() } else { format!("paced at {}/s", plan.rate) },
        100.0 * redeliveries as f64 / sent.max(1) as f64,
    );
    let _ = writeln!(
        out,
        "latency    p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms  (client-observed POST /webhook over loopback, {} samples)",
        ms(hist.value_at_quantile(0.50)),
        ms(hist.value_at_quantile(0.90)),
        ms(hist.value_at_quantile(0.99)),
        ms(hist.max()),
        hist.len(),
    );
    let _ = writeln!(
        out,
        "outcomes   202 assigned {} (new worker {}, existing worker {}) | 200 duplicate {} | 202 ignored {} | 503 capacity {} | 503 draining {} | 4xx {} | failed {}",
        tally.get(Outcome::AssignedNew) + tally.get(Outcome::AssignedExisting),
        tally.get(Outcome::AssignedNew),
        tally.get(Outcome::AssignedExisting),
        tally.get(Outcome::Duplicate),
        tally.get(Outcome::Ignored),
        tally.get(Outcome::Capacity),
        tally.get(Outcome::Draining),
        tally.get(Outcome::Refused),
        tally.get(Outcome::Failed),
    );
    let _ = writeln!(
        out,
        "chaos      {} containers crashed (POST /debug/workers/{{id}}/crash), {} drained (POST /workers/{{id}}/drain)",
        tally.crashes.load(Ordering::Relaxed),
        tally.drains.load(Ordering::Relaxed),
    );
    let _ = writeln!(
        out,
        "recovery   {} workers declared dead by the sweep, {} released events re-dispatched; {retried} 503s resent by the simulated reconciler, {gave_up} given up",
        stats.deaths_missed_heartbeats, redispatched,
    );
    let _ = writeln!(
        out,
        "registry   {} workers created, {} exited cleanly, {} died of missed heartbeats; {} heartbeats; {} sweeps; settled in {:.2} s",
        stats.admitted_new,
        stats.deaths_exited + stats.deaths_deregistered,
        stats.deaths_missed_heartbeats,
        stats.heartbeats,
        stats.sweeps,
        settled_in.as_secs_f64(),
    );
    let _ = writeln!(
        out,
        "audit      {} accepted deliveries redelivered once more: {completed} duplicate/completed, {in_flight} still in flight, {lost} lost",
        accepted.len(),
    );
    status_table(&mut out, "at the end of the traffic", &at_peak, 12, 4);
    status_table(&mut out, "final", &status, usize::MAX, 4);
    let _ = writeln!(
        out,
        "shutdown   in {:.0} ms: {} busy workers drained, {} idle ones exited at once; {} deliveries completed meanwhile; {} workers stopped at the deadline; {} accepted deliveries not completed{}",
        shutdown_took.as_secs_f64() * 1000.0,
        report.drained.draining,
        report.drained.exited,
        report.completed,
        report.stopped_at_deadline,
        report.unfinished.len(),
        if report.unfinished.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                report
                    .unfinished
                    .iter()
                    .map(|u| u.delivery.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        },
    );
    print!("{out}");
    lost == 0 && report.unfinished.is_empty()
}

/// Remembers that a delivery was placed (or needs a retry).
fn record(o: Outcome, i: usize, accepted: &Mutex<HashSet<usize>>, retry: &Mutex<Vec<usize>>) {
    match o {
        Outcome::AssignedNew | Outcome::AssignedExisting | Outcome::Duplicate => {
            accepted.lock().expect("not poisoned").insert(i);
        }
        Outcome::Capacity | Outcome::Draining => retry.lock().expect("not poisoned").push(i),
        _ => {}
    }
}

/// The final status table: every live worker and the most recent dead ones.
fn status_table(
    out: &mut String,
    when: &str,
    s: &StatusSnapshot,
    show_live: usize,
    show_dead: usize,
) {
    let died_of = |r: DeadReason| {
        s.workers
            .iter()
            .filter(|w| w.status == Status::Dead(r))
            .count()
    };
    let _ = writeln!(
        out,
        "status     {when}, snapshot #{}: {} active, {} draining, {} dead ({} exited, {} missed heartbeats); capacity {}/{}; claims {} in flight, {} retained",
        s.version,
        s.counts.active,
        s.counts.draining,
        s.counts.dead,
        died_of(DeadReason::Exited) + died_of(DeadReason::Deregistered),
        died_of(DeadReason::MissedHeartbeats),
        s.capacity.used,
        s.capacity.limit,
        s.claims.in_flight,
        s.claims.retained,
    );
    let mut live: Vec<&WorkerInfo> = s.workers.iter().filter(|w| w.status.is_alive()).collect();
    let mut dead: Vec<&WorkerInfo> = s.workers.iter().filter(|w| !w.status.is_alive()).collect();
    live.sort_by_key(|w| w.id);
    dead.sort_by_key(|w| std::cmp::Reverse(w.id));
    let _ = writeln!(
        out,
        "  {:>5}  {:<26} {:<26} {:<8} {:>10}  {:>14} {:>6}",
        "id", "target", "status", "activity", "last beat", "token", "events"
    );
    for w in live
        .iter()
        .take(show_live)
        .chain(dead.iter().take(show_dead))
    {
        let status = match w.status {
            Status::Dead(reason) => format!("dead ({reason})"),
            other => other.as_str().to_owned(),
        };
        let _ = writeln!(
            out,
            "  {:>5}  {:<26} {:<26} {:<8} {:>7} ms  {:>14} {:>6}",
            w.id.get(),
            w.target
                .as_ref()
                .map_or("-".to_owned(), ToString::to_string),
            status,
            w.activity.as_str(),
            w.heartbeat_age.as_millis(),
            w.token.get(),
            w.token.seq(),
        );
    }
    let hidden_live = live.len().saturating_sub(show_live);
    let hidden_dead = dead.len().saturating_sub(show_dead);
    if hidden_live + hidden_dead > 0 {
        let _ = writeln!(
            out,
            "  ... and {hidden_live} more live, {hidden_dead} more dead workers"
        );
    }
}
