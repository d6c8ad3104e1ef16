//! The killer phase: with more than one replica, the last is killed (as `kill -9` would) once
//! half the traffic is sent.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::sleep;
use worker_registry::{Stats, WorkerRegistry};

use super::Sim;
use crate::server::Killed;

/// When a replica was killed (since the start), what that stopped, and its registry handle's
/// counters as the kill left them.
pub(super) type Kill = (Duration, Killed, Stats);

/// Starts the killer; with one replica it does nothing.
pub(super) fn spawn(sim: &Arc<Sim>) -> JoinHandle<Option<Kill>> {
    let sim = sim.clone();
    tokio::spawn(async move {
        let replicas = sim.replicas();
        if replicas < 2 {
            return None;
        }
        let poll = sim.app().registry().config().sweep_interval();
        let half = sim.deliveries.len() / 2;
        // Relaxed: progress counters and a stop flag.
        while sim.tally.sent.load(Ordering::Relaxed) < half && !sim.done.load(Ordering::Relaxed) {
            sleep(poll / 4).await;
        }
        let victim = sim.servers.lock().expect("not poisoned")[replicas - 1].take()?;
        // Release: pairs with the Acquire in `Client::is_alive`.
        sim.client.alive[replicas - 1].store(false, Ordering::Release);
        let at = sim.started.elapsed();
        let killed = victim.kill().await;
        // Read once its HTTP server and sweeper are stopped: what their last calls counted
        // before the kill cut them off is counted too.
        let stats = sim.apps[replicas - 1].registry().stats();
        Some((at, killed, stats))
    })
}
