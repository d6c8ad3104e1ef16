//! The outage phase: the router is unreachable from GitHub (its webhook URL points at a closed
//! port) while deliveries continue, so GitHub logs them failed; then it is reachable again (the
//! live replicas in turn) and the reconciler ([`crate::reconcile`]) finds them in the simulated
//! GitHub's log (`github.rs`) and has them redelivered, chasing each one until the registry knows
//! it. The phase runs passes until nothing is chased (each after the previous one's redeliveries
//! have been answered), at most [`OUTAGE_CAP`], a guard that only turns a hang into a failure.
//! Once the router has settled (a claim released by a worker's death is re-dispatched then), every
//! GUID is sent once more, as a redelivery by hand would be ([`Outage::audit`]): lost unless the
//! router answers it as a duplicate that its pull request completed. Each lost GUID is printed
//! with its attempts: which replica took each, and its answer.

use std::time::Duration;

use rand::Rng;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::time::{sleep, Instant};
use worker_registry::WorkerRegistry;

use super::github::{FakeGitHub, HOOK_ID, ORG};
use super::Sim;
use crate::reconcile::api::Hook;
use crate::reconcile::shared::Shared;
use crate::reconcile::{Config, Reconciler};

/// Deliveries sent while the router is away.
const DELIVERIES: usize = 24;
/// Pull requests they concern.
const PRS: u64 = 4;
/// How long the reconciler may take to have the registry know every GUID: far beyond what a
/// loaded machine needs (seconds); only a hang reaches it.
pub(super) const OUTAGE_CAP: Duration = Duration::from_secs(120);

/// What the phase saw.
pub(super) struct Outage {
    /// Deliveries GitHub logged failed while the router was away.
    pub(super) failed: usize,
    /// GUIDs the reconciler redelivered (once each).
    pub(super) redelivered: u64,
    /// Redeliveries of GUIDs it still chased (the registry did not know them yet).
    pub(super) again: u64,
    /// Passes run.
    pub(super) passes: usize,
    /// GUIDs not answered as a completed duplicate by the audit, each with its attempts.
    pub(super) lost: Vec<String>,
    /// Why the phase could not run, if it could not.
    pub(super) error: Option<String>,
    /// The simulated GitHub and the GUIDs it logged failed, for the audit.
    sent: Option<(FakeGitHub, Vec<String>)>,
}

impl Outage {
    /// The summary line (and one line per lost GUID).
    pub(super) fn line(&self) -> String {
        match &self.error {
            Some(e) => format!("outage     not run: {e}"),
            None => {
                let mut line = format!(
                    "outage     {} deliveries failed while the router was unreachable, {} redelivered by the reconciler and {} again (chased until the registry knew them) in {} passes, {} lost",
                    self.failed, self.redelivered, self.again, self.passes, self.lost.len()
                );
                for l in &self.lost {
                    line.push_str("\n           lost ");
                    line.push_str(l);
                }
                line
            }
        }
    }
}

/// Waits until the simulated GitHub has no send in progress, or `deadline`.
async fn until_idle(fake: &FakeGitHub, deadline: Instant) {
    while !fake.idle() && Instant::now() < deadline {
        sleep(Duration::from_millis(10)).await;
    }
}

pub(super) async fn run(sim: &Sim) -> Outage {
    match phase(sim).await {
        Ok(o) => o,
        Err(e) => Outage {
            failed: 0,
            redelivered: 0,
            again: 0,
            passes: 0,
            lost: Vec::new(),
            error: Some(e),
            sent: None,
        },
    }
}

/// The live replicas' webhook URLs.
fn routers(sim: &Sim) -> Vec<String> {
    (0..sim.replicas())
        .filter(|r| sim.client.is_alive(*r))
        .map(|r| format!("{}/webhook", sim.client.bases[r]))
        .collect()
}

/// Sends the deliveries while the router is away: their GUIDs.
async fn fail_deliveries(fake: &FakeGitHub) -> Vec<String> {
    let run = rand::thread_rng().gen::<u32>();
    let mut guids = Vec::with_capacity(DELIVERIES);
    for i in 0..DELIVERIES {
        let guid = format!("{run:08x}-0000-4000-8000-{i:012x}");
        let number = 1 + i as u64 % PRS;
        let payload = json!({
            "action": "synchronize",
            "number": number,
            "pull_request": { "number": number, "title": "t", "head": { "sha": "0".repeat(40) } },
            "repository": { "full_name": "sim/outage" },
            "sender": { "login": "mona" }
        });
        fake.deliver(guid.clone(), "pull_request", payload).await;
        guids.push(guid);
    }
    guids
}

async fn phase(sim: &Sim) -> Result<Outage, String> {
    let r = (0..sim.replicas())
        .find(|r| sim.client.is_alive(*r))
        .ok_or("no replica is running")?;
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        format!("http://{addr}/webhook")
    };
    let token = format!("{:032x}", rand::thread_rng().gen::<u128>());
    let fake = FakeGitHub::start(closed, &sim.plan.secret, &token).await?;
    let guids = fail_deliveries(&fake).await;
    let failed = fake.log().attempts.iter().filter(|a| a.status == 0).count();
    // The router is back, behind a load balancer.
    fake.log().routers = routers(sim);
    let cfg = Config {
        api_url: fake.base().to_owned(),
        app: None,
        hooks: vec![Hook::Org {
            org: ORG.to_owned(),
            id: HOOK_ID,
        }],
        token: Some(Some(token).into()),
        ca_bundle: None,
        interval: Duration::from_secs(60),
        horizon: Duration::from_secs(3600),
        settle: Duration::ZERO,
        per_page: 10,
        // Each pass follows the answers to the previous one's redeliveries.
        chase_backoff: Duration::ZERO,
    };
    let mut reconciler = Reconciler::new(sim.apps[r].for_reconciler(), cfg, Shared::default())?;
    let (mut redelivered, mut again, mut passes) = (0, 0, 0);
    let deadline = Instant::now() + OUTAGE_CAP;
    let pause = sim.app().registry().config().sweep_interval();
    loop {
        let pass = reconciler.pass().await.map_err(|e| e.to_string())?;
        passes += 1;
        redelivered += pass.redelivered;
        again += pass.redelivered_again;
        if pass.errors == 0 && pass.chasing == 0 && pass.redelivered == 0 {
            break;
        }
        until_idle(&fake, deadline).await;
        if Instant::now() >= deadline {
            eprintln!(
                "outage     still chasing {} GUIDs after {OUTAGE_CAP:?}: {pass:?}",
                pass.chasing
            );
            break;
        }
        // A redelivery refused for capacity is tried again once the sweeps have freed some.
        sleep(pause).await;
    }
    Ok(Outage {
        failed,
        redelivered,
        again,
        passes,
        lost: Vec::new(),
        error: None,
        sent: Some((fake, guids)),
    })
}

impl Outage {
    /// Once the router has settled: every GUID sent once more to a live replica; those not
    /// answered as a duplicate that every pull request it names completed are lost, each listed
    /// with its answer and its attempts (which replica took each, and how it answered).
    pub(super) async fn audit(&mut self, sim: &Sim) {
        if let Some((fake, guids)) = &self.sent {
            self.lost = audit(sim, fake, guids).await;
        }
    }
}

async fn audit(sim: &Sim, fake: &FakeGitHub, guids: &[String]) -> Vec<String> {
    let routers = routers(sim);
    let mut lost = Vec::new();
    for (i, g) in guids.iter().enumerate() {
        let Some(router) = routers.get(i % routers.len().max(1)) else {
            lost.push(format!("{g}: no replica is running"));
            continue;
        };
        let answer = fake.resend(g, router).await;
        if answer.as_ref().is_some_and(|(status, body)| {
            *status == 200
                && body["targets"].as_array().is_some_and(|ts| {
                    !ts.is_empty() && ts.iter().all(|t| t["state"] == "completed")
                })
        }) {
            continue;
        }
        let log = fake.log();
        let attempts: Vec<String> = log
            .attempts
            .iter()
            .filter(|a| &a.guid == g)
            .map(|a| {
                let kind = if a.redelivery {
                    "redelivery"
                } else {
                    "delivery"
                };
                format!(
                    "#{} {kind} to {}: {} {}",
                    a.id, a.router, a.status, a.answer
                )
            })
            .collect();
        lost.push(format!(
            "{g}: answered {answer:?} now; attempts: {}",
            attempts.join("; ")
        ));
    }
    lost
}
