//! The reconcile phase, as a GitHub App's reconciler would: deliveries answered 503 (or cut off
//! by the killed replica) are sent again, to the next replica, until placed (ten rounds at most).

use std::time::Duration;

use tokio::time::sleep;

use super::client::record;
use super::Sim;

/// What the reconciler did.
pub(super) struct Resent {
    /// Sends it made.
    pub(super) retried: usize,
    /// Deliveries still refused after the last round.
    pub(super) gave_up: usize,
}

/// Resends what was refused until nothing is, or ten rounds have passed.
pub(super) async fn run(sim: &Sim) -> Resent {
    let mut retried = 0usize;
    for _ in 0..10 {
        let batch: Vec<usize> = std::mem::take(&mut *sim.retry.lock().expect("not poisoned"));
        if batch.is_empty() {
            break;
        }
        sleep(Duration::from_millis(200)).await;
        for i in batch {
            retried += 1;
            let (o, _) = sim.client.send(&sim.deliveries[i], i).await;
            sim.tally.add(o);
            record(o, i, &sim.accepted, &sim.retry);
        }
    }
    let gave_up = sim.retry.lock().expect("not poisoned").len();
    Resent { retried, gave_up }
}
