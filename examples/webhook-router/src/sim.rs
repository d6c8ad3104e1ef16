//! `--simulate`: realistic GitHub traffic over real HTTP at a running router (or at several
//! replicas on one shared registry, `--replicas N`), with crashes, drains and a replica killed
//! mid-run, then a summary (throughput, latency, outcomes, and an audit: nothing lost, no worker
//! with two containers, capacity never exceeded; and the final status table).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::time::{sleep, sleep_until, Instant};
use worker_registry::{
    DeadReason, DynRegistry, RegistryConfig, Status, StatusSnapshot, WorkerInfo, WorkerRegistry,
};

use crate::app::{App, Options, Platform};
use crate::backend::RegistryChoice;
use crate::containers::{Audit, Containers};
use crate::github;
use crate::server::{self, Killed, Server, ServerLimits, ShutdownReport};
use crate::store::Store;

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
    /// The backend, for the summary (credentials redacted).
    pub registry: String,
    /// The registry's name, for the summary.
    pub registry_name: String,
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
    Unavailable,
    Refused,
    Failed,
}

const OUTCOMES: [Outcome; 9] = [
    Outcome::AssignedNew,
    Outcome::AssignedExisting,
    Outcome::Duplicate,
    Outcome::Ignored,
    Outcome::Capacity,
    Outcome::Draining,
    Outcome::Unavailable,
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

/// The replicas under test, as the simulated clients see them.
struct Client {
    http: reqwest::Client,
    bases: Vec<String>,
    /// Which replicas still answer (a killed one is skipped).
    alive: Vec<AtomicBool>,
    /// Sends of each delivery so far, by the index of its first attempt: the next one goes to the
    /// next replica.
    sends: Vec<AtomicUsize>,
    admin_token: Option<String>,
}

impl Client {
    fn is_alive(&self, replica: usize) -> bool {
        // Acquire: pairs with the Release in `kill`; a client that sees a replica dead stops using it.
        self.alive[replica].load(Ordering::Acquire)
    }

    /// The replica for the next send of delivery `original`: the one after the replica its previous
    /// send went to, skipping dead ones.
    fn replica_for(&self, original: usize) -> usize {
        let n = self.bases.len();
        // Relaxed: only the count matters.
        let k = self.sends[original].fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|j| (original + k + j) % n)
            .find(|&r| self.is_alive(r))
            .unwrap_or(0)
    }

    /// Any live replica, for admin calls.
    fn any(&self, rng: &mut StdRng) -> usize {
        let live: Vec<usize> = (0..self.bases.len())
            .filter(|&r| self.is_alive(r))
            .collect();
        live.get(rng.gen_range(0..live.len().max(1)))
            .copied()
            .unwrap_or(0)
    }

    async fn send(&self, d: &Delivery, original: usize) -> (Outcome, Option<Value>) {
        let base = &self.bases[self.replica_for(original)];
        let res = self
            .http
            .post(format!("{base}/webhook"))
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
            (503, Some("draining")) => Outcome::Draining,
            // The router is shutting down, or its backend (or the worker's container) is away.
            (503, Some("closing" | "unavailable")) => Outcome::Unavailable,
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

    /// Live worker ids, from the admin API of `replica` (the registry's, all replicas').
    async fn live_workers(&self, replica: usize) -> Vec<u64> {
        let Ok(res) = self
            .admin(self.http.get(format!("{}/workers", self.bases[replica])))
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

    async fn post_ok(&self, replica: usize, path: String) -> bool {
        self.admin(self.http.post(format!("{}{path}", self.bases[replica])))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }
}

/// How the simulator reads the registry's live-worker count while it runs.
pub enum Probe {
    /// From a handle's counters (the in-memory registry's are live).
    Stats(DynRegistry),
    /// From the shared backend's server, directly ([`Store::live_workers`]).
    Store(Store),
}

impl Probe {
    async fn live(&self) -> Option<u64> {
        match self {
            Self::Stats(r) => Some(r.stats().live_workers as u64),
            Self::Store(s) => s.live_workers().await.ok(),
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Self::Stats(_) => "the in-memory registry's live count",
            Self::Store(Store::Redis { .. }) => "ZCARD {name}:live on the server",
            Self::Store(Store::Postgres { .. }) => "wr_capacity.live on the server",
        }
    }
}

/// The capacity samples.
#[derive(Default)]
struct Samples {
    taken: u64,
    failed: u64,
    max_live: u64,
    max_snapshot: usize,
    max_running: usize,
}

/// Counters summed over the replicas.
#[derive(Default, Clone, Copy)]
struct Totals {
    admitted_new: u64,
    exited: u64,
    died: u64,
    heartbeats: u64,
    sweeps: u64,
}

impl Totals {
    fn add(&mut self, s: &worker_registry::Stats) {
        self.admitted_new += s.admitted_new;
        self.exited += s.deaths_exited + s.deaths_deregistered;
        self.died += s.deaths_missed_heartbeats;
        self.heartbeats += s.heartbeats;
        self.sweeps += s.sweeps;
    }
}

/// Starts `n` router replicas for a simulation: each with its own handle on the registry `name`
/// of `choice` (so on a shared backend they share one registry), its own HTTP server (the first
/// on `bind`, the others on free ports of the same address) and sweeper, all on one in-process
/// container platform; and the probe that samples the registry's live count.
pub async fn start(
    choice: &RegistryChoice,
    name: &str,
    config: &RegistryConfig,
    options: &Options,
    limits: ServerLimits,
    bind: SocketAddr,
    n: usize,
) -> Result<(Vec<Server>, Probe), String> {
    let containers = Arc::new(Containers::new(options.mailbox));
    let mut servers = Vec::with_capacity(n);
    for i in 0..n {
        let registry = choice
            .open(config.clone(), name)
            .await
            .map_err(|e| format!("cannot open the {choice} registry: {e}"))?;
        let bind = if i == 0 {
            bind
        } else {
            SocketAddr::new(bind.ip(), 0)
        };
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|e| format!("cannot listen on {bind}: {e}"))?;
        let platform = Platform {
            containers: containers.clone(),
            remote: None,
        };
        let app = App::with_platform(registry, options.clone(), platform);
        servers.push(
            server::serve_with(app, listener, limits)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let probe = match Store::open(choice, name).await {
        Ok(Some(store)) => Probe::Store(store),
        Ok(None) => Probe::Stats(servers[0].app().registry().clone()),
        Err(e) => {
            return Err(format!(
                "cannot read the {choice} registry's live count: {e}"
            ))
        }
    };
    Ok((servers, probe))
}

/// Runs the simulation against `servers` (one router, or several replicas on one shared
/// registry) and prints the summary. With several, each delivery and its redeliveries go to
/// different replicas, and the last replica is killed when half the traffic is sent. The
/// [`Report`] says whether the audit passed.
pub async fn run(servers: Vec<Server>, plan: Plan, probe: Probe) -> Report {
    let deliveries = Arc::new(generate(&plan));
    let total = deliveries.len();
    let replicas = servers.len().max(1);
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(plan.clients.max(1) + 2)
        .build()
        .expect("a plain HTTP client builds");
    // First-attempt key for a delivery: the index of the original (redeliveries share its id).
    let original_of: Arc<Vec<usize>> = Arc::new({
        let mut first = std::collections::HashMap::new();
        deliveries
            .iter()
            .enumerate()
            .map(|(i, d)| *first.entry(d.id.clone()).or_insert(i))
            .collect()
    });
    let client = Arc::new(Client {
        http,
        bases: servers
            .iter()
            .map(|s| format!("http://{}", s.addr()))
            .collect(),
        alive: (0..replicas).map(|_| AtomicBool::new(true)).collect(),
        sends: (0..total).map(|_| AtomicUsize::new(0)).collect(),
        admin_token: plan.admin_token.clone(),
    });
    let apps: Vec<App> = servers.iter().map(|s| s.app().clone()).collect();
    let app = apps[0].clone();
    let containers = app.containers().clone();
    let tally = Arc::new(Tally::default());
    let accepted: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let retry: Arc<Mutex<Vec<usize>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let servers: Arc<Mutex<Vec<Option<Server>>>> =
        Arc::new(Mutex::new(servers.into_iter().map(Some).collect()));

    eprintln!(
        "simulating {total} deliveries at {} over {} clients against {} (capacity {}, heartbeat {:?} x {}, work {:?})",
        if plan.rate == 0 { "full speed".to_owned() } else { format!("{}/s", plan.rate) },
        plan.clients,
        if replicas == 1 {
            client.bases[0].clone()
        } else {
            format!("{replicas} replicas ({})", client.bases.join(", "))
        },
        app.registry().config().max_workers(),
        app.registry().config().heartbeat_interval(),
        app.registry().config().missed_heartbeats(),
        app.options().work,
    );

    let started = Instant::now();

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
                let (o, _) = client.send(d, original_of[i]).await;
                let _ = hist.record(t0.elapsed().as_micros().max(1) as u64);
                // Relaxed: statistics.
                tally.sent.fetch_add(1, Ordering::Relaxed);
                tally.add(o);
                record(o, original_of[i], &accepted, &retry);
            }
            hist
        }));
    }

    // Chaos: crashes and drains through the HTTP endpoints of any live replica.
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
                let live = client.live_workers(client.any(&mut rng)).await;
                if live.is_empty() {
                    if crash {
                        next_crash += crash_every;
                    } else {
                        next_drain += drain_every;
                    }
                    continue;
                }
                let id = live[rng.gen_range(0..live.len())];
                let via = client.any(&mut rng);
                if crash {
                    next_crash += crash_every;
                    if client
                        .post_ok(via, format!("/debug/workers/{id}/crash"))
                        .await
                    {
                        // Relaxed: statistics.
                        tally.crashes.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    next_drain += drain_every;
                    if client.post_ok(via, format!("/workers/{id}/drain")).await {
                        // Relaxed: statistics.
                        tally.drains.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };

    // One replica is killed when half the traffic is sent (with more than one).
    let killer = {
        let (client, tally, done, servers) =
            (client.clone(), tally.clone(), done.clone(), servers.clone());
        let (victim_app, poll) = (
            apps[replicas - 1].clone(),
            app.registry().config().sweep_interval(),
        );
        tokio::spawn(async move {
            if replicas < 2 {
                return None;
            }
            // Relaxed: progress counters and a stop flag.
            while tally.sent.load(Ordering::Relaxed) < total / 2 && !done.load(Ordering::Relaxed) {
                sleep(poll / 4).await;
            }
            let victim = servers.lock().expect("not poisoned")[replicas - 1].take()?;
            // Release: pairs with the Acquire in `Client::is_alive`.
            client.alive[replicas - 1].store(false, Ordering::Release);
            let at = started.elapsed();
            let stats = victim_app.registry().stats();
            let killed = victim.kill().await;
            Some((at, killed, stats))
        })
    };

    // The capacity sampler: the registry's live count, as the server holds it, throughout.
    let sampler = {
        let (done, apps, client, containers) = (
            done.clone(),
            apps.clone(),
            client.clone(),
            containers.clone(),
        );
        let every = app.registry().config().sweep_interval() / 10;
        tokio::spawn(async move {
            let mut s = Samples::default();
            // Relaxed: a stop flag.
            while !done.load(Ordering::Relaxed) {
                match probe.live().await {
                    Some(n) => {
                        s.taken += 1;
                        s.max_live = s.max_live.max(n);
                    }
                    None => s.failed += 1,
                }
                for (r, a) in apps.iter().enumerate() {
                    if client.is_alive(r) {
                        s.max_snapshot = s.max_snapshot.max(a.registry().status().capacity.used);
                    }
                }
                s.max_running = s.max_running.max(containers.ledger().running());
                sleep(every.max(Duration::from_millis(1))).await;
            }
            (s, probe)
        })
    };
    let live_apps = |client: &Client| -> Vec<App> {
        apps.iter()
            .enumerate()
            .filter(|(r, _)| client.is_alive(*r))
            .map(|(_, a)| a.clone())
            .collect()
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
                    tally.get(Outcome::Capacity) + tally.get(Outcome::Draining) + tally.get(Outcome::Unavailable),
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
    let killed = killer.await.ok().flatten();
    let at_peak = app.registry().status();
    // Relaxed: read after the clients are joined.
    let sent = tally.sent.load(Ordering::Relaxed);

    // The reconciler: deliveries answered 503 (or cut off by the killed replica) are sent again,
    // to the next replica, until placed (bounded).
    let mut retried = 0usize;
    for _ in 0..10 {
        let batch: Vec<usize> = std::mem::take(&mut *retry.lock().expect("not poisoned"));
        if batch.is_empty() {
            break;
        }
        sleep(Duration::from_millis(200)).await;
        for i in batch {
            retried += 1;
            let (o, _) = client.send(&deliveries[i], i).await;
            tally.add(o);
            record(o, i, &accepted, &retry);
        }
    }
    let gave_up = retry.lock().expect("not poisoned").len();
    // Relaxed: the chaos task stops at its next iteration.
    done.store(true, Ordering::Relaxed);
    let _ = chaos.await;
    let _ = progress.await;
    if std::io::stderr().is_terminal() {
        eprintln!();
    }

    // Let the sweeps re-dispatch what crashed workers held and the workers finish everything.
    let config = app.registry().config().clone();
    let sweep = config.sweep_interval();
    // A shared backend offers a released event that a killed replica held again only after
    // `release_ack_timeout`: quiet must last that long (and a sweep) before it counts.
    let quiet_for = if replicas > 1 {
        config.release_ack_timeout() + sweep * 2
    } else {
        Duration::ZERO
    };
    let settle_started = Instant::now();
    let settle_limit = Duration::from_secs(10) + quiet_for * 2;
    // A sweep publishes its snapshot before its callback re-dispatches what it released, so a quiet
    // snapshot only counts if nothing was re-dispatched since before it was published: since the
    // previous poll, which saw an older snapshot.
    let mut previous: Option<(u64, u64)> = None;
    let mut quiet_since: Option<Instant> = None;
    loop {
        let live = live_apps(&client);
        let s = live[0].registry().status();
        let redispatched: u64 = live.iter().map(App::redispatched).sum();
        let pending: usize = live.iter().map(App::pending_redispatch).sum();
        let quiet = s.claims.in_flight == 0 && s.counts.busy == 0 && pending == 0;
        let settled = quiet
            && previous.is_some_and(|(generation, before)| {
                s.version > generation && redispatched == before
            });
        if settled {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= quiet_for {
                break;
            }
        } else {
            quiet_since = None;
        }
        if settle_started.elapsed() > settle_limit {
            break;
        }
        previous = Some((s.version, redispatched));
        sleep(sweep).await;
    }
    let settled_in = settle_started.elapsed();
    let live = live_apps(&client);
    let status = live[0].registry().status();

    // Audit: every accepted delivery, redelivered once more (to the next live replica), must be a
    // completed duplicate.
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
        let (o, body) = client.send(&deliveries[i], i).await;
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

    let mut totals = Totals::default();
    for a in &live {
        totals.add(&a.registry().stats());
    }
    if let Some((_, _, stats)) = &killed {
        totals.add(stats);
    }
    let redispatched: u64 = apps.iter().map(App::redispatched).sum();
    let (mut samples, probe) = sampler
        .await
        .unwrap_or_else(|_| (Samples::default(), Probe::Stats(app.registry().clone())));
    let ledger = containers.ledger().audit();
    let shutdown_started = Instant::now();
    let mut reports = Vec::new();
    let rest: Vec<Server> = servers
        .lock()
        .expect("not poisoned")
        .drain(..)
        .flatten()
        .collect();
    for server in rest {
        reports.push(server.shutdown(plan.shutdown_deadline).await);
    }
    let shutdown_took = shutdown_started.elapsed();
    let unfinished: Vec<String> = reports
        .iter()
        .flat_map(|r| r.unfinished.iter().map(|u| u.delivery.to_string()))
        .collect();

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
    if replicas > 1 {
        let _ = writeln!(
            out,
            "replicas   {replicas} routers on {} (registry {:?}), one process, one container platform; each delivery and its redeliveries sent to different replicas",
            plan.registry, plan.registry_name,
        );
        match &killed {
            Some((at, k, _)) => {
                let _ = writeln!(
                    out,
                    "killed     replica {replicas} at {:.2} s: its HTTP server, sweeper and {} running containers stopped abruptly, nothing acknowledged ({} deferred released events dropped)",
                    at.as_secs_f64(),
                    k.containers,
                    k.pending,
                );
            }
            None => {
                let _ = writeln!(out, "killed     none (the traffic ended first)");
            }
        }
    }
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
        "outcomes   202 assigned {} (new worker {}, existing worker {}) | 200 duplicate {} | 202 ignored {} | 503 capacity {} | 503 draining {} | 503 unavailable {} | 4xx {} | failed {}",
        tally.get(Outcome::AssignedNew) + tally.get(Outcome::AssignedExisting),
        tally.get(Outcome::AssignedNew),
        tally.get(Outcome::AssignedExisting),
        tally.get(Outcome::Duplicate),
        tally.get(Outcome::Ignored),
        tally.get(Outcome::Capacity),
        tally.get(Outcome::Draining),
        tally.get(Outcome::Unavailable),
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
        "recovery   {} workers declared dead by the sweep, {} released events re-dispatched; {retried} 503s and cut-off requests resent by the simulated reconciler, {gave_up} given up",
        totals.died, redispatched,
    );
    let _ = writeln!(
        out,
        "registry   {} workers created, {} exited cleanly, {} died of missed heartbeats; {} heartbeats; {} sweeps; settled in {:.2} s",
        totals.admitted_new,
        totals.exited,
        totals.died,
        totals.heartbeats,
        totals.sweeps,
        settled_in.as_secs_f64(),
    );
    let _ = writeln!(
        out,
        "containers {} started for {} worker ids: at most {} per worker id{}; at most {} per delivery, {} deliveries started more than 1 + their releases; at most {} container tasks at once (an exiting one ends just after the registry frees its slot)",
        ledger.started,
        ledger.workers,
        ledger.max_per_worker,
        if ledger.refused > 0 { format!(" ({} second starts refused)", ledger.refused) } else { String::new() },
        ledger.max_per_delivery,
        ledger.unexplained.len(),
        ledger.max_running,
    );
    let limit = config.max_workers() as u64;
    let _ = writeln!(
        out,
        "capacity   {} samples of {} ({} failed): at most {} live of {limit}; snapshots: at most {}",
        samples.taken,
        probe.describe(),
        samples.failed,
        samples.max_live,
        samples.max_snapshot,
    );
    samples.max_live = samples.max_live.max(samples.max_snapshot as u64);
    let _ = writeln!(
        out,
        "audit      {} accepted deliveries redelivered once more: {completed} duplicate/completed, {in_flight} still in flight, {lost} lost",
        accepted.len(),
    );
    status_table(&mut out, "at the end of the traffic", &at_peak, 12, 4);
    status_table(&mut out, "final", &status, usize::MAX, 4);
    let sum = |f: fn(&ShutdownReport) -> u64| reports.iter().map(f).sum::<u64>();
    let _ = writeln!(
        out,
        "shutdown   in {:.0} ms{}: {} busy workers drained, {} idle ones exited at once; {} deliveries completed meanwhile; {} workers stopped at the deadline; {} accepted deliveries not completed{}",
        shutdown_took.as_secs_f64() * 1000.0,
        if reports.len() > 1 { format!(" ({} replicas)", reports.len()) } else { String::new() },
        sum(|r| r.drained.draining as u64),
        sum(|r| r.drained.exited as u64),
        sum(|r| r.completed),
        sum(|r| r.stopped_at_deadline as u64),
        unfinished.len(),
        if unfinished.is_empty() {
            String::new()
        } else {
            format!(" ({})", unfinished.join(" "))
        },
    );
    print!("{out}");
    Report {
        accepted: accepted.len(),
        completed,
        in_flight,
        lost,
        unfinished: unfinished.len(),
        containers: ledger,
        samples: samples.taken,
        max_live: samples.max_live,
        capacity: limit,
        killed: killed.map(|(at, k, _)| (at, k)),
        died: totals.died,
        redispatched,
        crashes: tally.crashes.load(Ordering::Relaxed),
    }
}

/// What a simulation found (the summary prints it all).
#[derive(Debug, Clone)]
pub struct Report {
    /// Accepted deliveries (answered 202 or 200 duplicate at least once).
    pub accepted: usize,
    /// Of those, completed when audited.
    pub completed: usize,
    /// Of those, still in flight when audited (not lost, not done).
    pub in_flight: usize,
    /// Of those, neither completed nor in flight: lost.
    pub lost: usize,
    /// Accepted deliveries the shutdown reported not completed.
    pub unfinished: usize,
    /// Container starts.
    pub containers: Audit,
    /// Samples of the registry's live count.
    pub samples: u64,
    /// The most live workers any sample saw (the snapshots' included).
    pub max_live: u64,
    /// The registry's capacity.
    pub capacity: u64,
    /// When a replica was killed, and what that stopped.
    pub killed: Option<(Duration, Killed)>,
    /// Workers declared dead by the sweeps.
    pub died: u64,
    /// Released events re-dispatched.
    pub redispatched: u64,
    /// Containers crashed by the chaos.
    pub crashes: u64,
}

impl Report {
    /// Whether the audit passed: nothing lost or left unfinished, no worker with two containers
    /// and no delivery that started more than its releases explain, capacity never exceeded.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.unfinished == 0
            && self.containers.max_per_worker <= 1
            && self.containers.refused == 0
            && self.containers.unexplained.is_empty()
            && self.max_live <= self.capacity
    }
}

/// Remembers that a delivery was placed (or needs a retry).
fn record(o: Outcome, i: usize, accepted: &Mutex<HashSet<usize>>, retry: &Mutex<Vec<usize>>) {
    match o {
        Outcome::AssignedNew | Outcome::AssignedExisting | Outcome::Duplicate => {
            accepted.lock().expect("not poisoned").insert(i);
        }
        // Refused, or cut off (a killed replica): send it again.
        Outcome::Capacity | Outcome::Draining | Outcome::Unavailable | Outcome::Failed => {
            retry.lock().expect("not poisoned").push(i)
        }
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
        "  {:>14}  {:<26} {:<26} {:<8} {:>10}  {:>20} {:>6}",
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
            "  {:>14}  {:<26} {:<26} {:<8} {:>7} ms  {:>20} {:>6}",
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
