//! Shutdown, the router's half: refuse new deliveries, drain this replica's workers, stop what
//! still runs at the deadline, and account for every delivery accepted and not completed
//! ([`Unfinished`]). [`Server::shutdown`](crate::server::Server::shutdown) runs these steps in
//! order, with the HTTP server and the sweeper; [`App::kill_containers`] is the `kill -9` of a
//! replica.

use crate::app::App;
use crate::outcome::{Unfinished, UnfinishedWhy};

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::Instant;
use worker_registry::{
    DeliveryId, DrainAll, Maintenance, ReleaseReason, ReleasedEvent, Status, SweepReport, Target,
    WorkerRegistry,
};

impl App {
    /// The Ctrl-C path, first half: refuse new deliveries (503) and drain this replica's workers
    /// (those whose containers it started) with `deadline`, one by one, leaving other replicas'
    /// alone; closing their mailboxes lets idle workers leave at once and draining ones leave once
    /// their queue is done.
    pub async fn begin_shutdown(&self, deadline: Duration) -> DrainAll {
        // Release: pairs with the Acquire in `is_closing`.
        self.inner.closing.store(true, Ordering::Release);
        let mut drained = DrainAll::default();
        // A worker speaking the protocol holds a lease capped by the registry's drain deadline
        // only (docs::worker_protocol, "Drain caps the lease"): the registry's deadline for this
        // drain must not be shorter, or another replica's sweep could hand its pull request on
        // while its lease runs. This router stops its workers at `deadline` all the same.
        let registry_deadline = if self.inner.launcher.speaks_protocol() {
            deadline.max(self.inner.registry.config().drain_deadline())
        } else {
            deadline
        };
        for id in self.inner.containers.owned_by(self.inner.replica) {
            match self
                .inner
                .registry
                .drain_within(id, registry_deadline)
                .await
            {
                Ok(Status::Draining) => drained.draining += 1,
                Ok(_) => drained.exited += 1,
                // Dead already (crashed and swept), or the backend is away: its claims are
                // released when the registry declares it dead.
                Err(e) => tracing::debug!(worker = %id, "not drained: {e}"),
            }
        }
        self.inner.containers.close_owned_by(self.inner.replica);
        drained
    }

    /// A killed replica: its containers stop at once, as if their process had been killed (no
    /// goodbye to the registry; the sweep of another replica declares them dead). Returns how many
    /// were running.
    pub fn kill_containers(&self) -> usize {
        // Release: pairs with the Acquire in `is_closing`; nothing new is placed from now on.
        self.inner.closing.store(true, Ordering::Release);
        let tasks: Vec<AbortHandle> = self.inner.tasks.iter().map(|t| t.clone()).collect();
        for t in &tasks {
            t.abort();
        }
        tasks.len()
    }

    /// The shutdown's sweeps (the sweeper is stopped by then), until this replica has nothing left
    /// to do, or `until` passes; whether it got there. Between sweeps it waits for its workers to
    /// finish, for the registry to wake it (a delivery promoted by an exit) or for the sweep
    /// interval. It is done when a sweep that began once no worker task ran handed it nothing,
    /// and nothing waits: no released event to place again, and (a registry that dies with the
    /// process) nothing parked in its waiting room. Every sweep's released and promoted
    /// deliveries are placed as the sweeper's callback places them ([`App::after_sweep`]).
    pub async fn finish_accepted(&self, until: Instant) -> bool {
        let registry = &self.inner.registry;
        let interval = registry.config().sweep_interval();
        let mut running = self.inner.running.subscribe();
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

    /// One sweep's report as the sweeper handles it: placed again ([`App::after_sweep`]), and
    /// what was not deferred acknowledged.
    async fn sweep_step(&self, report: SweepReport) {
        let released = report.released.clone();
        let deferred = self.after_sweep(report).await;
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
            if let Err(e) = self.inner.registry.acknowledge(&done).await {
                tracing::warn!(
                    "acknowledging {} re-dispatched events failed: {e}",
                    done.len()
                );
            }
        }
    }

    /// No released event waits to be placed again, and (a registry that dies with the process)
    /// nothing is parked in its waiting room; a shared registry's room is left to the replicas
    /// that stay.
    fn nothing_waits(&self) -> bool {
        self.pending_redispatch() == 0
            && (self.inner.shared || self.inner.registry.stats().waiting == 0)
    }

    /// Remembers a parked delivery (see [`Inner::parked`](crate::app::Inner)), unless the
    /// registry is shared.
    pub(crate) fn parked(&self, target: &Target, delivery: &DeliveryId) {
        if !self.inner.shared {
            self.inner
                .parked
                .insert((target.clone(), delivery.clone()), ());
        }
    }

    /// Forgets the parked deliveries a sweep promoted or dropped.
    pub(crate) fn unparked(&self, report: &SweepReport) {
        if self.inner.parked.is_empty() {
            return;
        }
        let promoted = report
            .released
            .iter()
            .filter(|e| e.reason == ReleaseReason::Promoted)
            .map(|e| (&e.target, &e.delivery));
        let dropped = report
            .expired_waiting
            .iter()
            .map(|e| (&e.target, &e.delivery));
        for (t, d) in promoted.chain(dropped) {
            self.inner.parked.remove(&(t.clone(), d.clone()));
        }
    }

    /// Waits until every worker task has stopped, or `deadline` passes; returns how many still run.
    pub async fn wait_workers(&self, deadline: Duration) -> usize {
        let mut rx = self.inner.running.subscribe();
        let _ = tokio::time::timeout(deadline, rx.wait_for(|n| *n == 0)).await;
        self.running_workers()
    }

    /// The shutdown deadline passed: every worker still running stops now, deregisters (releasing
    /// its claims through the registry) and hands back what it did not finish. Waits up to `grace`
    /// for that, then aborts what is left; returns how many had to be aborted.
    pub async fn stop_workers(&self, grace: Duration) -> usize {
        self.inner.stop.send_replace(true);
        for control in self.inner.controls.iter() {
            control.stop();
        }
        let left = self.wait_workers(grace).await;
        if left > 0 {
            for t in self.inner.tasks.iter() {
                t.abort();
            }
            let _ = self.wait_workers(grace).await;
        }
        left
    }

    /// Everything accepted and not completed that this router knows of, once its workers are
    /// stopped: what stopped workers handed back, released events not re-dispatched, and
    /// `released` (the final sweep's), one entry per delivery.
    fn unfinished(&self, released: &[ReleasedEvent]) -> Vec<Unfinished> {
        let mut out: Vec<Unfinished> = self
            .inner
            .stopped
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let pending = self
            .inner
            .pending
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default();
        let mut seen: HashSet<(Target, DeliveryId)> = out
            .iter()
            .map(|u| (u.target.clone(), u.delivery.clone()))
            .collect();
        for e in pending.iter().chain(released) {
            if seen.insert((e.target.clone(), e.delivery.clone())) {
                out.push(Unfinished {
                    target: e.target.clone(),
                    delivery: e.delivery.clone(),
                    why: UnfinishedWhy::Released { reason: e.reason },
                });
            }
        }
        for entry in self.inner.parked.iter() {
            let (target, delivery) = entry.key();
            if seen.insert((target.clone(), delivery.clone())) {
                out.push(Unfinished {
                    target: target.clone(),
                    delivery: delivery.clone(),
                    why: UnfinishedWhy::StillWaiting,
                });
            }
        }
        out
    }

    /// [`unfinished`](Self::unfinished), each logged and counted in
    /// `webhook_router_shutdown_unfinished_total`.
    pub(crate) fn account_unfinished(&self, released: &[ReleasedEvent]) -> Vec<Unfinished> {
        let unfinished = self.unfinished(released);
        self.inner
            .metrics
            .shutdown_unfinished
            .inc_by(unfinished.len() as u64);
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
}
