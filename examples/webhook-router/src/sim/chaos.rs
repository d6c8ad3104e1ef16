//! The chaos phase: every `plan.crash_every` a random live worker's container is crashed
//! (`POST /debug/workers/{id}/crash`), every `plan.drain_every` one is drained
//! (`POST /workers/{id}/drain`), through the HTTP endpoints of any live replica.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

use super::Sim;

/// Starts the chaos; it stops once the run is `done`.
pub(super) fn spawn(sim: &Arc<Sim>) -> JoinHandle<()> {
    let sim = sim.clone();
    tokio::spawn(async move {
        let (crash_every, drain_every) = (sim.plan.crash_every, sim.plan.drain_every);
        let (client, tally) = (&sim.client, &sim.tally);
        let mut rng = StdRng::seed_from_u64(sim.plan.seed ^ 0x5eed);
        let mut next_crash = Instant::now() + crash_every;
        let mut next_drain = Instant::now() + drain_every;
        // Relaxed: a stop flag; the next iteration sees it soon enough.
        while !sim.done.load(Ordering::Relaxed) {
            let crash = next_crash <= next_drain;
            sleep_until(next_crash.min(next_drain)).await;
            if crash {
                next_crash += crash_every;
            } else {
                next_drain += drain_every;
            }
            let live = client.live_workers(client.any(&mut rng)).await;
            if live.is_empty() {
                continue;
            }
            let id = live[rng.gen_range(0..live.len())];
            let via = client.any(&mut rng);
            if crash {
                if client
                    .post_ok(via, format!("/debug/workers/{id}/crash"))
                    .await
                {
                    // Relaxed: statistics.
                    tally.crashes.fetch_add(1, Ordering::Relaxed);
                }
            } else if client.post_ok(via, format!("/workers/{id}/drain")).await {
                // Relaxed: statistics.
                tally.drains.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}
