//! Container lifecycle: a worker's container (a tokio task running [`worker::Worker`]) started
//! by the admission that created the worker, crashed on request (`POST /debug/...`), and its
//! mailbox forgotten once the registry no longer counts the worker alive.

use crate::app::App;
use crate::containers::CrashOutcome;
use crate::mailbox::Mailbox;
use crate::outcome::{CrashError, Unfinished, UnfinishedWhy};
use crate::worker::{self, Exit};

use std::sync::Arc;

use tokio::sync::Notify;
use worker_registry::{DeliveryId, Status, Target, WorkerId, WorkerRegistry};

impl App {
    /// Starts the container of a worker this router's admission of `delivery` just created, and
    /// (with replicas in other processes) records this replica as its owner.
    pub(crate) async fn start_container(
        &self,
        id: WorkerId,
        target: &Target,
        delivery: &DeliveryId,
    ) {
        let Some(started) = self
            .inner
            .containers
            .start(id, self.inner.replica, (target, delivery))
        else {
            tracing::error!(worker = %id, "a container for this worker was started already: not starting a second one");
            return;
        };
        self.spawn_worker(id, started.jobs, started.crash);
        tracing::info!(worker = %id, %target, %delivery, "container started");
        if let Some(remote) = &self.inner.remote {
            let containers = self.inner.containers.clone();
            remote.publish(id, move || containers.is_running(id)).await;
        }
    }

    fn spawn_worker(&self, id: WorkerId, jobs: Mailbox, crash: Arc<Notify>) {
        let app = self.clone();
        let w = worker::Worker {
            registry: self.inner.registry.clone(),
            id,
            jobs,
            crash,
            stop: self.inner.stop.subscribe(),
            timings: self.inner.timings,
            traces: self.inner.containers.traces().clone(),
        };
        self.inner.running.send_modify(|n| *n += 1);
        self.inner.containers.ledger().running_up();
        let task = tokio::spawn(async move {
            // Decrements the running count however the task ends (a panic included).
            let _running = RunningGuard(app.clone(), id);
            let exit = w.run().await;
            tracing::info!(worker = %id, exit = exit.as_str(), "container stopped");
            app.inner.metrics.exit(exit.as_str());
            // A crashed container leaves its record (a killed one could not remove it): events
            // forwarded meanwhile are answered "stopped" and stay with the worker until the sweep
            // declares it dead and releases them. Any other end is the worker's death.
            let dead = !matches!(exit, Exit::Crashed);
            if let Exit::Stopped(jobs) = exit {
                if let Ok(mut stopped) = app.inner.stopped.lock() {
                    stopped.extend(jobs.into_iter().map(|j| Unfinished {
                        target: j.target,
                        delivery: j.event,
                        why: UnfinishedWhy::StoppedAtDeadline { worker: id },
                    }));
                }
            }
            if let (true, Some(remote)) = (dead, &app.inner.remote) {
                remote.forget(&[id]).await;
            }
        });
        self.inner.tasks.insert(id, task.abort_handle());
    }

    /// Makes a worker's container crash: it stops heartbeating and working, without telling the
    /// registry, so the sweep declares it dead after the heartbeat timeout and its events are
    /// released and re-dispatched.
    pub async fn crash(&self, id: WorkerId) -> Result<(), CrashError> {
        let info = self
            .inner
            .registry
            .worker(id)
            .await
            .map_err(CrashError::Unavailable)?
            .ok_or(CrashError::Unknown(id))?;
        if let Status::Dead(_) = info.status {
            return Err(CrashError::Dead(id, info.status));
        }
        match self.inner.containers.crash(id) {
            CrashOutcome::Crashed => {
                tracing::warn!(worker = %id, "crashing container on request");
                Ok(())
            }
            CrashOutcome::Stopped => Err(CrashError::AlreadyStopped(id)),
            CrashOutcome::NotHere => Err(CrashError::NoContainer(id)),
        }
    }

    /// Forgets the mailbox (and target entry) of every worker without a running container (stopped,
    /// or parked for an owner that never came) that the registry no longer counts alive. A crashed
    /// container's mailbox stays until the registry has declared the worker dead, so that events
    /// sent to it meanwhile are answered "stopped" and stay with the worker, to be released.
    pub(crate) async fn forget_stopped_workers(&self) {
        for id in self.inner.containers.without_container() {
            let alive = match self.inner.registry.worker(id).await {
                Ok(info) => info.is_some_and(|w| w.status.is_alive()),
                // Ask again after the next sweep.
                Err(_) => true,
            };
            if !alive {
                self.inner.containers.forget(id);
                self.inner.targets.retain(|_, w| *w != id);
            }
        }
    }
}

/// Keeps the running-task count (see [`App::wait_workers`]).
struct RunningGuard(App, WorkerId);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.inner.tasks.remove(&self.1);
        self.0.inner.containers.ledger().running_down();
        self.0
            .inner
            .running
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}
