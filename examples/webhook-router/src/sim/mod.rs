//! `--simulate`: realistic GitHub traffic over real HTTP at a running router (or at several
//! replicas on one shared registry, `--replicas N`), with crashes, drains and a replica killed
//! mid-run, then a summary (throughput, latency, outcomes, and an audit: nothing lost, no worker
//! with two containers, capacity never exceeded; and the final status table).
//!
//! [`run`] is the list of phases, one file each: the clients (`clients.rs`) send the generated
//! traffic (`traffic.rs`) while the chaos (`chaos.rs`) crashes and drains workers, the killer
//! (`killer.rs`) kills a replica halfway, the sampler (`sampler.rs`) watches the registry's live
//! count and a progress line (`progress.rs`) is printed; then the reconciler (`reconcile.rs`)
//! resends what was refused, the outage (`outage.rs`) has deliveries fail against a simulated
//! GitHub (`github.rs`) and the reconciler recover them, the router is left to settle (`settle.rs`), every accepted delivery
//! is audited (`audit.rs`), the replicas shut down (`shutdown.rs`) and the summary
//! (`summary.rs`) is printed. `client.rs` is the simulated GitHub and operator they all use.

mod audit;
mod chaos;
mod client;
mod clients;
mod github;
mod killer;
mod outage;
pub mod processes;
mod progress;
mod reconcile;
mod sampler;
mod settle;
mod shutdown;
mod summary;
mod traffic;

pub use audit::{Bodies, NotCompleted};
pub use sampler::Probe;
pub use settle::SETTLE_CAP;
pub use summary::Report;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;
use worker_registry::{RegistryConfig, WorkerRegistry};

use crate::app::{App, Options, Platform};
use crate::backend::RegistryChoice;
use crate::containers::Containers;
use crate::server::{self, Server, ServerLimits};
use client::{Client, Tally};
use traffic::Delivery;

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
    /// Real `webhook-worker` processes (the `process` launcher), audited for overlap; `None`:
    /// simulated workers (the `task` launcher).
    pub workers: Option<Arc<processes::SimWorkers>>,
}

/// What every phase of a run shares.
struct Sim {
    plan: Plan,
    deliveries: Vec<Arc<Delivery>>,
    /// First-attempt key for a delivery: the index of the original (redeliveries share its id).
    original_of: Vec<usize>,
    client: Client,
    /// Every replica's router, the killed one's included.
    apps: Vec<App>,
    /// The replicas still running, until the killer or the shutdown takes them.
    servers: Mutex<Vec<Option<Server>>>,
    tally: Tally,
    /// Deliveries (by their original's index) answered assigned or duplicate at least once.
    accepted: Mutex<HashSet<usize>>,
    /// Deliveries refused or cut off, to resend.
    retry: Mutex<Vec<usize>>,
    /// Set when the traffic and its resends are over: the background phases stop.
    done: AtomicBool,
    started: Instant,
}

impl Sim {
    fn new(servers: Vec<Server>, plan: Plan) -> Self {
        let deliveries = traffic::generate(&plan);
        let mut first = HashMap::new();
        let original_of = deliveries
            .iter()
            .enumerate()
            .map(|(i, d)| *first.entry(d.id.clone()).or_insert(i))
            .collect();
        let bases = servers
            .iter()
            .map(|s| format!("http://{}", s.addr()))
            .collect();
        let client = Client::new(
            bases,
            deliveries.len(),
            plan.clients,
            plan.admin_token.clone(),
        );
        // The audit compares the bodies the workers ran on with those sent.
        for s in &servers {
            s.app().containers().runs().keep();
        }
        Self {
            apps: servers.iter().map(|s| s.app().clone()).collect(),
            servers: Mutex::new(servers.into_iter().map(Some).collect()),
            client,
            deliveries,
            original_of,
            plan,
            tally: Tally::default(),
            accepted: Mutex::default(),
            retry: Mutex::default(),
            done: AtomicBool::new(false),
            started: Instant::now(),
        }
    }

    /// The first replica's router (its registry's configuration is every replica's).
    fn app(&self) -> &App {
        &self.apps[0]
    }

    fn replicas(&self) -> usize {
        self.apps.len().max(1)
    }

    /// The routers of the replicas still running.
    fn live_apps(&self) -> Vec<App> {
        self.apps
            .iter()
            .enumerate()
            .filter(|(r, _)| self.client.is_alive(*r))
            .map(|(_, a)| a.clone())
            .collect()
    }

    fn announce(&self) {
        let (plan, app, replicas) = (&self.plan, self.app(), self.replicas());
        eprintln!(
            "simulating {} deliveries at {} over {} clients against {} (capacity {}, heartbeat {:?} x {}, work {:?})",
            self.deliveries.len(),
            if plan.rate == 0 { "full speed".to_owned() } else { format!("{}/s", plan.rate) },
            plan.clients,
            if replicas == 1 {
                self.client.bases[0].clone()
            } else {
                format!("{replicas} replicas ({})", self.client.bases.join(", "))
            },
            app.registry().config().max_workers(),
            app.registry().config().heartbeat_interval(),
            app.registry().config().missed_heartbeats(),
            app.options().work,
        );
    }
}

/// Starts `n` router replicas for a simulation: each with its own handle on the registry `name`
/// of `choice` (so on a shared backend they share one registry), its own HTTP server (the first
/// on `bind`, the others on free ports of the same address) and sweeper, all on one in-process
/// container platform; and the probe that reads the registry's audit.
pub async fn start(
    choice: &RegistryChoice,
    name: &str,
    config: &RegistryConfig,
    options: &Options,
    limits: ServerLimits,
    bind: SocketAddr,
    n: usize,
) -> Result<(Vec<Server>, Probe), String> {
    start_with(choice, name, config, options, limits, bind, n, None).await
}

/// Like [`start`], each replica's workers started as real processes by `workers` when given.
// The replicas' eight settings; a struct of them would only be built to be taken apart here.
#[allow(clippy::too_many_arguments)]
pub async fn start_with(
    choice: &RegistryChoice,
    name: &str,
    config: &RegistryConfig,
    options: &Options,
    limits: ServerLimits,
    bind: SocketAddr,
    n: usize,
    workers: Option<&processes::SimWorkers>,
) -> Result<(Vec<Server>, Probe), String> {
    let containers = Arc::new(Containers::new(options.mailbox, options.overflow));
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
            shared: choice.is_shared(),
            backend: choice.kind(),
            launcher: workers.map(processes::SimWorkers::launcher).transpose()?,
            protocol: workers.map(|w| w.protocol()).unwrap_or_default(),
        };
        let app = App::with_platform(registry, options.clone(), platform);
        let worker = match workers {
            Some(_) => {
                app.protocol().check().map_err(|e| e.to_string())?;
                let at = SocketAddr::new(bind.ip(), 0);
                Some(
                    TcpListener::bind(at)
                        .await
                        .map_err(|e| format!("cannot listen on {at}: {e}"))?,
                )
            }
            None => None,
        };
        servers.push(
            server::serve_all(app, listener, None, worker, limits)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let probe = if choice.is_shared() {
        let own = choice
            .open(config.clone(), name)
            .await
            .map_err(|e| format!("cannot open the {choice} registry for the audit: {e}"))?;
        Probe::Audit(own)
    } else {
        Probe::Stats(servers[0].app().registry().clone())
    };
    Ok((servers, probe))
}

/// Runs the simulation against `servers` (one router, or several replicas on one shared
/// registry) and prints the summary. With several, each delivery and its redeliveries go to
/// different replicas, and the last replica is killed when half the traffic is sent. The
/// [`Report`] says whether the audit passed.
pub async fn run(servers: Vec<Server>, plan: Plan, probe: Probe) -> Report {
    let sim = Arc::new(Sim::new(servers, plan));
    sim.announce();
    let clients = clients::spawn(&sim);
    let chaos = chaos::spawn(&sim);
    let killer = killer::spawn(&sim);
    let sampler = sampler::spawn(&sim, probe);
    let progress = progress::spawn(&sim);
    let traffic = clients::join(&sim, clients).await;
    let killed = killer.await.ok().flatten();
    let at_peak = sim.app().registry().status();
    let resent = reconcile::run(&sim).await;
    let mut outage = outage::run(&sim).await;
    // Relaxed: a stop flag; the background phases stop at their next iteration.
    sim.done.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = chaos.await;
    progress::finish(progress).await;
    // The sampler stops with the traffic; its probe reads the server for the settle phase and the
    // audit.
    let (samples, probe) = sampler::finish(&sim, sampler).await;
    let settled = settle::run(&sim, &probe).await;
    outage.audit(&sim).await;
    let audited = audit::run(&sim, &probe).await;
    let counts = summary::Counts::take(&sim, killed.as_ref()).await;
    let shutdown = shutdown::run(&sim).await;
    let overlap = sim.plan.workers.as_ref().map(|w| {
        let bodies = sim
            .deliveries
            .iter()
            .map(|d| (d.id.clone(), hex::encode(crate::runs::digest(&d.body))))
            .collect();
        let found = w.audit(&bodies);
        w.clean();
        found
    });
    eprintln!("{}", outage.line());
    let mut report = summary::print(summary::Findings {
        sim: &sim,
        traffic,
        killed,
        at_peak,
        resent,
        settled,
        audited,
        counts,
        samples,
        probe,
        shutdown,
        overlap,
    });
    report.outage_lost = outage.lost.len() + usize::from(outage.error.is_some());
    report
}
