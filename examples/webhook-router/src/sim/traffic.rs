//! The simulated traffic: a mix of GitHub deliveries on skewed targets, some without a pull
//! request, and redeliveries of recent ones, signed as GitHub signs them.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::Plan;
use crate::github;

/// One delivery as GitHub would send it.
pub(super) struct Delivery {
    pub(super) id: String,
    pub(super) event: &'static str,
    pub(super) body: Vec<u8>,
    pub(super) signature: String,
    pub(super) redelivery: bool,
    /// Whether the router should place it on a worker.
    pub(super) has_target: bool,
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
pub(super) fn generate(plan: &Plan) -> Vec<Arc<Delivery>> {
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
        let (event, body, has_target) = event(&mut rng, repo, number, plan.prs);
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

/// One new event on pull request `number` of `repo` (of `prs`): its name, its payload, and whether
/// it names a pull request the router should place.
fn event(rng: &mut StdRng, repo: &str, number: u64, prs: u64) -> (&'static str, Value, bool) {
    let sender = USERS[rng.gen_range(0..USERS.len())];
    let repository = json!({ "full_name": repo, "private": false });
    let pr = json!({ "number": number, "title": format!("Change #{number}"),
        "head": { "sha": format!("{:040x}", rng.gen::<u128>()) }, "state": "open" });
    let roll: u32 = rng.gen_range(0..100);
    match roll {
        0..=44 => {
            let action =
                ["opened", "synchronize", "synchronize", "labeled", "edited"][rng.gen_range(0..5)];
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
            let other = 1 + (number % prs);
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
    }
}
