//! Shutdown, the router's half ([`Shutdown`]): refuse new deliveries (it owns the [`Closing`]
//! flag), drain this replica's workers, stop what still runs at the deadline, and account for
//! every delivery accepted and not completed ([`Unfinished`], from [`Outstanding`]).
//! [`Server::shutdown`](crate::server::Server::shutdown) runs these steps in order, with the
//! HTTP server and the sweeper; [`Shutdown::kill`] is the `kill -9` of a replica.

use crate::closing::Closing;
use crate::lifecycle::Lifecycle;
use crate::metrics::RouterMetrics;
use crate::outcome::Unfinished;
use crate::outstanding::Outstanding;
use crate::redispatch::Redispatcher;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;
use worker_registry::{
    DeliveryId, DrainAll, DynRegistry, Maintenance, ReleasedEvent, SweepReport, Target,
    WorkerRegistry,
};

/// The router's shutdown (see the [module documentation](self)).
pub struct Shutdown {
    /// Set here (the only writer): new deliveries are refused from then on.
    closing: Closing,
    /// Swept in place of the sweeper, once it is stopped.
    registry: DynRegistry,
    /// `webhook_router_shutdown_unfinished_total`.
    unfinished_total: Counter,
    /// Drains, stops or kills this replica's workers.
    lifecycle: Arc<Lifecycle>,
    /// What is reported as unfinished.
    outstanding: Arc<Outstanding>,
    /// Places what the shutdown's sweeps release, as the sweeper's callback does.
    redispatcher: Arc<Redispatcher>,
}

impl Shutdown {
    /// The shutdown of the router whose parts these are; it sets `closing`.
    pub(crate) fn new(
        closing: Closing,
        registry: DynRegistry,
        metrics: &RouterMetrics,
        lifecycle: Arc<Lifecycle>,
        outstanding: Arc<Outstanding>,
        redispatcher: Arc<Redispatcher>,
    ) -> Self {
        Self {
            closing,
            registry,
            unfinished_total: metrics.shutdown_unfinished.clone(),
            lifecycle,
            outstanding,
            redispatcher,
        }
    }

    /// The Ctrl-C path, first half: refuse new deliveries (503) and drain this replica's workers
    /// (those whose containers it started) with `deadline`, one by one, leaving other replicas'
    /// alone; closing their mailboxes lets idle workers leave at once and draining ones leave once
    /// their queue is done.
    pub async fn begin(&self, deadline: Duration) -> DrainAll {
        self.closing.begin();
        self.lifecycle.drain_own(deadline).await
    }

    /// A killed replica: its containers stop at once, as if their process had been killed (no
    /// goodbye to the registry; the sweep of another replica declares them dead). Returns how many
    /// were running.
    pub fn kill(&self) -> usize {
        // Nothing new is placed from now on.
        self.closing.begin();
        self.lifecycle.kill_all()
    }

    /// The shutdown deadline passed: every worker still running stops now, deregisters (releasing
    /// its claims through the registry) and hands back what it did not finish. Waits up to `grace`
    /// for that, then aborts what is left; returns how many had to be aborted.
    pub async fn stop_workers(&self, grace: Duration) -> usize {
        self.lifecycle.stop_all(grace).await
    }

    /// Every accepted delivery not completed (see [`Outstanding::unfinished`]; `released`: the
    /// final sweep's), each logged and counted in `webhook_router_shutdown_unfinished_total`.
    pub(crate) fn account_unfinished(&self, released: &[ReleasedEvent]) -> Vec<Unfinished> {
        let unfinished = self.outstanding.unfinished(released);
        self.unfinished_total.inc_by(unfinished.len() as u64);
        for u in &unfinished {
            tracing::warn!(
                delivery = %u.delivery,
                target = %u.target,
                why = %u.why,
                "accepted delivery not completed at shutdown (released in the registry)"
            );
        }
        unfinished
    }

    /// No released event waits to be placed again, and (a registry that dies with the process)
    /// nothing is parked in its waiting room; a shared registry's room is left to the replicas
    /// that stay.
    fn nothing_waits(&self) -> bool {
        self.outstanding.pending() == 0
            && (self.outstanding.is_shared() || self.registry.stats().waiting == 0)
    }
    /// The shutdown's sweeps (the sweeper is stopped by then), until this replica has nothing left
    /// to do, or `until` passes; whether it got there. Between sweeps it waits for its workers to
    /// finish, for the registry to wake it (a delivery promoted by an exit) or for the sweep
    /// interval. It is done when a sweep that began once no worker task ran handed it nothing,
    /// and nothing waits: no released event to place again, and (a registry that dies with the
    /// process) nothing parked in its waiting room. Every sweep's released and promoted
    /// deliveries are placed as the sweeper's callback places them ([`Redispatcher::after_sweep`]).
    pub async fn finish_accepted(&self, until: Instant) -> bool {
        let registry = &self.registry;
        let interval = registry.config().sweep_interval();
        let mut running = self.lifecycle.watch_running();
        loop {
            let quiet = *running.borrow_and_update() == 0;
            let handed = match registry.sweep().await {
                Ok(report) => {
                    let n = report.released.len();
                    self.sweep_step(report).await;
                    n
                }
                Err(e) => {
                    tracing::warn!("a shutdown sweep failed, trying again: {e}");
                    usize::MAX
                }
            };
            if quiet && handed == 0 && self.nothing_waits() {
                return true;
            }
            let busy = *running.borrow_and_update() > 0;
            if !busy && handed > 0 && handed != usize::MAX {
                // What it handed over was placed without starting a container: look again now.
                continue;
            }
            let next = async {
                tokio::select! {
                    _ = running.wait_for(|n| *n == 0), if busy => {}
                    () = registry.wake() => {}
                    () = tokio::time::sleep(interval) => {}
                }
            };
            if tokio::time::timeout_at(until, next).await.is_err() {
                return false;
            }
        }
    }

    /// One sweep's report as the sweeper handles it: placed again ([`Redispatcher::after_sweep`]), and
    /// what was not deferred acknowledged.
    async fn sweep_step(&self, report: SweepReport) {
        let released = report.released.clone();
        let deferred = self.redispatcher.after_sweep(report).await;
        let kept: HashSet<(&Target, &DeliveryId)> = deferred
            .events()
            .iter()
            .map(|e| (&e.target, &e.delivery))
            .collect();
        let done: Vec<ReleasedEvent> = released
            .into_iter()
            .filter(|e| !kept.contains(&(&e.target, &e.delivery)))
            .collect();
        if !done.is_empty() {
            if let Err(e) = self.registry.acknowledge(&done).await {
                tracing::warn!(
                    "acknowledging {} re-dispatched events failed: {e}",
                    done.len()
                );
            }
        }
    }
}
