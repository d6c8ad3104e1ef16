//! The reconcile phase, as a GitHub App's reconciler would: deliveries answered 503 (or cut off
//! by the killed replica) are sent again, to the next replica, a round every 200 ms, until each is
//! placed; at most [`RESEND_CAP`], a guard that only turns a hang into a failure (a loaded
//! machine takes longer to free capacity, not forever).

use std::time::Duration;

use tokio::time::{sleep, Instant};

use super::client::record;
use super::Sim;

/// How long the resends may take at most (they normally take a second or two).
pub(super) const RESEND_CAP: Duration = Duration::from_secs(120);
/// Between two rounds of resends.
const ROUND: Duration = Duration::from_millis(200);

/// What the reconciler did.
pub(super) struct Resent {
    /// Sends it made.
    pub(super) retried: usize,
    /// Deliveries still refused at [`RESEND_CAP`].
    pub(super) gave_up: usize,
}

/// Resends what was refused until nothing is, or [`RESEND_CAP`] has passed.
pub(super) async fn run(sim: &Sim) -> Resent {
    let mut retried = 0usize;
    let deadline = Instant::now() + RESEND_CAP;
    while Instant::now() < deadline {
        let batch: Vec<usize> = std::mem::take(&mut *sim.retry.lock().expect("not poisoned"));
        if batch.is_empty() {
            break;
        }
        sleep(ROUND).await;
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
