//! The clients phase: `plan.clients` concurrent senders take the deliveries in order (paced at
//! `plan.rate` if set) and send each to a replica, recording how it was answered.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

use super::client::record;
use super::Sim;

/// What the clients saw.
pub(super) struct Traffic {
    /// Client-observed latency of `POST /webhook`, in microseconds.
    pub(super) latency: Histogram<u64>,
    /// How long sending took.
    pub(super) took: Duration,
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Starts the senders.
pub(super) fn spawn(sim: &Arc<Sim>) -> Vec<JoinHandle<Histogram<u64>>> {
    (0..sim.plan.clients.max(1))
        .map(|_| tokio::spawn(send_all(sim.clone())))
        .collect()
}

/// One sender: the next unsent delivery, until none is left or `plan.max_time` has passed.
async fn send_all(sim: Arc<Sim>) -> Histogram<u64> {
    let mut hist = histogram();
    let (rate, max_time, started) = (sim.plan.rate, sim.plan.max_time, sim.started);
    let next = &sim.tally.next;
    loop {
        // Relaxed: only uniqueness of the index matters.
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= sim.deliveries.len() {
            break;
        }
        if rate > 0 {
            let at = started + Duration::from_secs_f64(i as f64 / f64::from(rate));
            sleep_until(at).await;
        }
        if started.elapsed() > max_time {
            break;
        }
        let t0 = Instant::now();
        let (o, _) = sim
            .client
            .send(&sim.deliveries[i], sim.original_of[i])
            .await;
        let _ = hist.record(t0.elapsed().as_micros().max(1) as u64);
        // Relaxed: statistics.
        sim.tally.sent.fetch_add(1, Ordering::Relaxed);
        sim.tally.add(o);
        record(o, sim.original_of[i], &sim.accepted, &sim.retry);
    }
    hist
}

/// Waits for every sender; the traffic is over.
pub(super) async fn join(sim: &Sim, clients: Vec<JoinHandle<Histogram<u64>>>) -> Traffic {
    let mut latency = histogram();
    for c in clients {
        if let Ok(h) = c.await {
            let _ = latency.add(h);
        }
    }
    Traffic {
        latency,
        took: sim.started.elapsed(),
    }
}
