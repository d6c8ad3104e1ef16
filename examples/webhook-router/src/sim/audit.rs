//! The audit phase: every accepted delivery, redelivered once more (to the next live replica),
//! must be a duplicate that every pull request it names holds as completed; any other answer is
//! a lost delivery. Each one not found completed is named with the router's answer and what the
//! registry held unfinished then (its audit).

use super::client::Outcome;
use super::sampler::Probe;
use super::traffic::Delivery;
use super::Sim;
use crate::runs::digest;

use serde_json::Value;
use worker_registry::{DeliveryId, Target};

/// What the audit found of the bodies the workers ran on ([`crate::runs`]): for every pull
/// request of every delivery found completed, each recorded loop's body against the body sent.
///
/// # Examples
///
/// ```
/// use webhook_router::sim::Bodies;
///
/// let b = Bodies::default();
/// assert!(b.mismatched.is_empty());
/// ```
#[derive(Debug, Clone, Default)]
pub struct Bodies {
    /// (pull request, delivery) pairs completed with every recorded loop on the body sent.
    pub matched: usize,
    /// Of those, released (their worker died) or promoted out of the waiting room before the
    /// loop that completed them.
    pub handed_on: usize,
    /// Pairs completed without a recorded loop (a `reach` or `drain` of a pull request without a
    /// worker is recorded as handled without one).
    pub unrun: usize,
    /// Pairs with a loop whose body was missing or not the one sent, each described.
    pub mismatched: Vec<String>,
}

/// What the audit found.
pub(super) struct Audited {
    /// Accepted deliveries (by their original's index), audited.
    pub(super) accepted: usize,
    /// Completed everywhere.
    pub(super) completed: usize,
    /// Duplicates not yet completed everywhere (not lost, not done).
    pub(super) in_flight: usize,
    /// Neither: lost.
    pub(super) lost: usize,
    /// The accepted deliveries not found completed, each explained.
    pub(super) not_completed: Vec<NotCompleted>,
    /// The bodies the completed ones ran on.
    pub(super) bodies: Bodies,
}

/// An accepted delivery the audit did not find completed: how its last redelivery was answered and
/// what the registry held unfinished then.
///
/// # Examples
///
/// ```
/// use webhook_router::sim::NotCompleted;
///
/// let n = NotCompleted {
///     delivery: "d-1".into(),
///     event: "pull_request",
///     lost: true,
///     answer: "Assigned".into(),
///     registry: "(in memory: not read)".into(),
/// };
/// assert!(n.lost);
/// ```
#[derive(Debug, Clone)]
pub struct NotCompleted {
    /// The delivery id (`X-GitHub-Delivery`).
    pub delivery: String,
    /// Its event (`X-GitHub-Event`).
    pub event: &'static str,
    /// Lost (the redelivery was not answered as a duplicate) rather than still in flight.
    pub lost: bool,
    /// The router's answer to the audit's redelivery (JSON).
    pub answer: String,
    /// What the registry held unfinished when it was found (its
    /// [`audit`](worker_registry::WorkerRegistry::audit)), or why that could not be read.
    pub registry: String,
}

/// Redelivers every accepted delivery once more.
pub(super) async fn run(sim: &Sim, probe: &Probe) -> Audited {
    let accepted: Vec<usize> = {
        let mut v: Vec<usize> = sim
            .accepted
            .lock()
            .expect("not poisoned")
            .iter()
            .copied()
            .collect();
        v.sort_unstable();
        v
    };
    let (mut completed, mut in_flight, mut lost) = (0usize, 0usize, 0usize);
    let mut not_completed = Vec::new();
    let mut bodies = Bodies::default();
    for &i in &accepted {
        let (o, body) = sim.client.send(&sim.deliveries[i], i).await;
        // Every pull request the delivery names must hold it as completed.
        let all_completed = body
            .as_ref()
            .and_then(|b| b["targets"].as_array())
            .is_some_and(|ts| !ts.is_empty() && ts.iter().all(|t| t["state"] == "completed"));
        match (o, all_completed) {
            (Outcome::Duplicate, true) => {
                completed += 1;
                if let Some(b) = &body {
                    ran_on(sim, &sim.deliveries[i], b, &mut bodies);
                }
            }
            (Outcome::Duplicate, false) => in_flight += 1,
            _ => lost += 1,
        }
        if !matches!((o, all_completed), (Outcome::Duplicate, true)) {
            let d = &sim.deliveries[i];
            not_completed.push(NotCompleted {
                delivery: d.id.clone(),
                event: d.event,
                lost: o != Outcome::Duplicate,
                answer: body.map_or_else(|| format!("{o:?}, no body"), |b| b.to_string()),
                registry: probe.registry_state().await,
            });
        }
    }
    Audited {
        accepted: accepted.len(),
        completed,
        in_flight,
        lost,
        not_completed,
        bodies,
    }
}

/// Checks the loops that ran `d` (found completed, `answer` naming its pull requests) against the
/// body sent: every one must have run on it, byte for byte (by SHA-256), when the registry keeps
/// payloads.
fn ran_on(sim: &Sim, d: &Delivery, answer: &Value, bodies: &mut Bodies) {
    let sent = digest(&d.body);
    // The simulator sends no hook headers: the claim key is the delivery id.
    let Ok(key) = DeliveryId::new(&d.id) else {
        return;
    };
    let targets = answer["targets"].as_array().map_or(&[][..], Vec::as_slice);
    for t in targets {
        let Some(target) = t["target"].as_str().and_then(|t| t.parse::<Target>().ok()) else {
            continue;
        };
        let containers = sim.app().containers();
        let runs = containers.runs().of(&target, &key);
        if runs.is_empty() {
            bodies.unrun += 1;
            continue;
        }
        let bad: Vec<String> = runs
            .iter()
            .filter(|r| r.body != Some(sent))
            .map(|r| match r.body {
                None => format!("worker {} ran it without a payload", r.worker),
                Some(_) => format!("worker {} ran it on other bytes", r.worker),
            })
            .collect();
        if bad.is_empty() {
            bodies.matched += 1;
            if containers.ledger().was_released(&target, &key) {
                bodies.handed_on += 1;
            }
        } else {
            bodies
                .mismatched
                .push(format!("{} on {target}: {}", d.id, bad.join("; ")));
        }
    }
}
