//! The shutdown phase: every replica still running shuts down (drain, deadline, last sweep), one
//! after the other, reporting what it left unfinished.

use std::time::Duration;

use tokio::time::Instant;

use super::Sim;
use crate::server::{Server, ShutdownReport};

/// How the replicas shut down.
pub(super) struct ShutDown {
    /// Each replica's report.
    pub(super) reports: Vec<ShutdownReport>,
    /// How long it took, all of them.
    pub(super) took: Duration,
    /// The deliveries reported unfinished.
    pub(super) unfinished: Vec<String>,
}

/// Shuts every remaining replica down with `plan.shutdown_deadline`.
pub(super) async fn run(sim: &Sim) -> ShutDown {
    let started = Instant::now();
    let rest: Vec<Server> = sim
        .servers
        .lock()
        .expect("not poisoned")
        .drain(..)
        .flatten()
        .collect();
    let mut reports = Vec::new();
    for server in rest {
        reports.push(server.shutdown(sim.plan.shutdown_deadline).await);
    }
    let took = started.elapsed();
    let unfinished = reports
        .iter()
        .flat_map(|r| r.unfinished.iter().map(|u| u.delivery.to_string()))
        .collect();
    ShutDown {
        reports,
        took,
        unfinished,
    }
}
