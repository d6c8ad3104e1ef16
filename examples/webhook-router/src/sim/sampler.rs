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

/// How the simulator reads what the registry holds while it runs and after.
pub enum Probe {
    /// In memory: the handle's counters (live); the settle phase reads the snapshot.
    Stats(DynRegistry),
    /// A shared backend: the library's audit ([`WorkerRegistry::audit`]), on a handle of the
    /// probe's own (it outlives any replica the run stops).
    Audit(DynRegistry),
}

impl Probe {
    async fn live(&self) -> Option<u64> {
        match self {
            Self::Stats(r) => Some(r.stats().live_workers as u64),
            Self::Audit(r) => r.audit().await.ok().map(|a| a.live_workers),
        }
    }

    /// What the shared backend holds unfinished
    /// ([`Audit::unfinished`](worker_registry::Audit::unfinished)); `None` in memory.
    pub(super) async fn unfinished(&self) -> Option<Result<u64, worker_registry::RegistryError>> {
        match self {
            Self::Stats(_) => None,
            Self::Audit(r) => Some(r.audit().await.map(|a| a.unfinished())),
        }
    }

    /// What the registry holds unfinished now, in words, for the audit's explanation of a
    /// delivery it did not find completed.
    pub(super) async fn registry_state(&self) -> String {
        let r = match self {
            Self::Stats(_) => return "(in memory: not read)".to_owned(),
            Self::Audit(r) => r,
        };
        match r.audit().await {
            Ok(a) => format!(
                "the registry holds {} in flight, {} released, {} waiting; {} live workers",
                a.in_flight, a.released, a.waiting, a.live_workers
            ),
            Err(e) => format!("(could not be read: {e})"),
        }
    }

    pub(super) fn describe(&self) -> &'static str {
        match self {
            Self::Stats(_) => "the in-memory registry's live count",
            Self::Audit(_) => "the registry's audit (its storage's live count)",
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
