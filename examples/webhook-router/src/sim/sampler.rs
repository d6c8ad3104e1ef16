//! The sampler phase: the registry's live-worker count, as the backend's server holds it, read
//! throughout the run (with every live replica's snapshot and the containers running), to show
//! that capacity was never exceeded.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::sleep;
use worker_registry::{DynRegistry, WorkerRegistry};

use super::Sim;
use crate::store::Store;

/// How the simulator reads the registry's live-worker count while it runs.
pub enum Probe {
    /// From a handle's counters (the in-memory registry's are live).
    Stats(DynRegistry),
    /// From the shared backend's server, directly ([`Store::live_workers`]).
    Store(Store),
}

impl Probe {
    async fn live(&self) -> Option<u64> {
        match self {
            Self::Stats(r) => Some(r.stats().live_workers as u64),
            Self::Store(s) => s.live_workers().await.ok(),
        }
    }

    /// What the shared backend's server holds unfinished ([`Store::unfinished`]); `None` in memory.
    pub(super) async fn unfinished(&self) -> Option<Result<u64, worker_registry::RegistryError>> {
        match self {
            Self::Stats(_) => None,
            Self::Store(s) => Some(s.unfinished().await),
        }
    }

    /// What the shared backend's server holds for `delivery` ([`Store::delivery_state`]), for the
    /// audit's explanation.
    pub(super) async fn delivery_state(&self, delivery: &str) -> String {
        match self {
            Self::Stats(_) => "(in memory: not read)".to_owned(),
            Self::Store(s) => match s.delivery_state(delivery).await {
                Ok(Some(state)) => state,
                Ok(None) => "(not read on this backend)".to_owned(),
                Err(e) => format!("(could not be read: {e})"),
            },
        }
    }

    pub(super) fn describe(&self) -> &'static str {
        match self {
            Self::Stats(_) => "the in-memory registry's live count",
            Self::Store(Store::Redis { .. }) => "ZCARD {name}:live on the server",
            Self::Store(Store::Postgres { .. }) => "wr_capacity.live on the server",
        }
    }
}

/// The capacity samples.
#[derive(Default)]
pub(super) struct Samples {
    pub(super) taken: u64,
    pub(super) failed: u64,
    pub(super) max_live: u64,
    pub(super) max_snapshot: usize,
    /// The most deliveries any live replica's snapshot showed waiting.
    pub(super) max_waiting: usize,
    pub(super) max_running: usize,
}

/// Starts the sampler; it stops once the run is `done`.
pub(super) fn spawn(sim: &Arc<Sim>, probe: Probe) -> JoinHandle<(Samples, Probe)> {
    let sim = sim.clone();
    tokio::spawn(async move {
        let every = sim.app().registry().config().sweep_interval() / 10;
        let containers = sim.app().containers().clone();
        let mut s = Samples::default();
        // Relaxed: a stop flag.
        while !sim.done.load(Ordering::Relaxed) {
            match probe.live().await {
                Some(n) => {
                    s.taken += 1;
                    s.max_live = s.max_live.max(n);
                }
                None => s.failed += 1,
            }
            for (r, a) in sim.apps.iter().enumerate() {
                if sim.client.is_alive(r) {
                    let status = a.registry().status();
                    s.max_snapshot = s.max_snapshot.max(status.capacity.used);
                    s.max_waiting = s.max_waiting.max(status.waiting);
                }
            }
            s.max_running = s.max_running.max(containers.ledger().running());
            sleep(every.max(Duration::from_millis(1))).await;
        }
        (s, probe)
    })
}

/// The samples, once the sampler has stopped.
pub(super) async fn finish(sim: &Sim, sampler: JoinHandle<(Samples, Probe)>) -> (Samples, Probe) {
    sampler.await.unwrap_or_else(|_| {
        (
            Samples::default(),
            Probe::Stats(sim.app().registry().clone()),
        )
    })
}
