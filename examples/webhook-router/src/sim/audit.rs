//! The audit phase: every accepted delivery, redelivered once more (to the next live replica),
//! must be a duplicate that every pull request it names holds as completed; any other answer is
//! a lost delivery.

use super::client::Outcome;
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
}

/// Redelivers every accepted delivery once more.
pub(super) async fn run(sim: &Sim) -> Audited {
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
    }
    Audited {
        accepted: accepted.len(),
        completed,
        in_flight,
        lost,
    }
}
