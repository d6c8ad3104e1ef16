//! The outage phase: the router is unreachable from GitHub (its webhook URL points at a closed
//! port) while deliveries continue, so GitHub logs them failed; then it is reachable again and
//! the reconciler ([`crate::reconcile`]) finds them in the simulated GitHub's log
//! (`github.rs`) and has them redelivered. Counted: failed, redelivered, lost (a GUID whose latest
//! attempt still failed after the passes); lost must be 0.

use std::time::Duration;

use rand::Rng;
use serde_json::json;
use tokio::net::TcpListener;

use super::github::{FakeGitHub, HOOK_ID, ORG};
use super::Sim;
use crate::reconcile::api::Hook;
use crate::reconcile::shared::Shared;
use crate::reconcile::{Config, Reconciler};

/// Deliveries sent while the router is away.
const DELIVERIES: usize = 24;
/// Pull requests they concern.
const PRS: u64 = 4;
/// Reconciler passes at most (a redelivery refused for capacity is retried by the next one).
const PASSES: usize = 5;

/// What the phase saw.
pub(super) struct Outage {
    /// Deliveries GitHub logged failed while the router was away.
    pub(super) failed: usize,
    /// Redeliveries the reconciler asked for.
    pub(super) redelivered: u64,
    /// Passes run.
    pub(super) passes: usize,
    /// GUIDs whose latest attempt still failed.
    pub(super) lost: usize,
    /// Why the phase could not run, if it could not.
    pub(super) error: Option<String>,
}

impl Outage {
    /// The summary line.
    pub(super) fn line(&self) -> String {
        match &self.error {
            Some(e) => format!("outage     not run: {e}"),
            None => format!(
                "outage     {} deliveries failed while the router was unreachable, {} redelivered by the reconciler in {} passes, {} lost",
                self.failed, self.redelivered, self.passes, self.lost
            ),
        }
    }
}

/// Waits (bounded) until the simulated GitHub has no send in progress.
async fn until_idle(fake: &FakeGitHub) {
    for _ in 0..1000 {
        if fake.idle() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(super) async fn run(sim: &Sim) -> Outage {
    match phase(sim).await {
        Ok(o) => o,
        Err(e) => Outage {
            failed: 0,
            redelivered: 0,
            passes: 0,
            lost: 0,
            error: Some(e),
        },
    }
}

async fn phase(sim: &Sim) -> Result<Outage, String> {
    let r = (0..sim.replicas())
        .find(|r| sim.client.is_alive(*r))
        .ok_or("no replica is running")?;
    let (app, base) = (sim.apps[r].clone(), sim.client.bases[r].clone());
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        format!("http://{addr}/webhook")
    };
    let token = format!("{:032x}", rand::thread_rng().gen::<u128>());
    let fake = FakeGitHub::start(closed, &sim.plan.secret, &token).await?;
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
    let failed = fake.log().attempts.iter().filter(|a| a.status == 0).count();
    // The router is back.
    fake.log().router = format!("{base}/webhook");
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
    };
    let mut reconciler = Reconciler::new(app, cfg, Shared::default())?;
    let mut redelivered = 0;
    let mut passes = 0;
    let mut lost = guids.len();
    while passes < PASSES && lost > 0 {
        let pass = reconciler.pass().await.map_err(|e| e.to_string())?;
        passes += 1;
        redelivered += pass.redelivered;
        until_idle(&fake).await;
        let log = fake.log();
        lost = guids
            .iter()
            .filter(|g| {
                log.attempts
                    .iter()
                    .rev()
                    .find(|a| &a.guid == *g)
                    .is_none_or(|a| !(200..300).contains(&a.status))
            })
            .count();
    }
    Ok(Outage {
        failed,
        redelivered,
        passes,
        lost,
        error: None,
    })
}
