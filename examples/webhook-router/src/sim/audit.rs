//! The audit phase: every accepted delivery, redelivered once more (to the next live replica),
//! must be a duplicate that every pull request it names holds as completed; any other answer is
//! a lost delivery. Each one not found completed is named with the router's answer and what the
//! server holds for it.

use super::client::Outcome;
use super::sampler::Probe;
use super::Sim;

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
}

/// An accepted delivery the audit did not find completed: how its last redelivery was answered and
/// what the registry's server holds for it.
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
    /// The server's rows for it ([`Store::delivery_state`](crate::store::Store::delivery_state)),
    /// or why they could not be read.
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
    for &i in &accepted {
        let (o, body) = sim.client.send(&sim.deliveries[i], i).await;
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
        if !matches!((o, all_completed), (Outcome::Duplicate, true)) {
            let d = &sim.deliveries[i];
            not_completed.push(NotCompleted {
                delivery: d.id.clone(),
                event: d.event,
                lost: o != Outcome::Duplicate,
                answer: body.map_or_else(|| format!("{o:?}, no body"), |b| b.to_string()),
                registry: probe.delivery_state(&d.id).await,
            });
        }
    }
    Audited {
        accepted: accepted.len(),
        completed,
        in_flight,
        lost,
        not_completed,
    }
}
