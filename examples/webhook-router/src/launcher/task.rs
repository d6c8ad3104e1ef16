//! The `task` launcher: each worker is a simulated worker ([`crate::worker::Worker`]), a tokio
//! task of this process that calls the registry directly, through its contract. No process, no
//! protocol: what `--simulate` and the router's tests ran before real workers existed, kept for
//! tests that need thousands of workers cheaply and for machines that cannot start processes.
//!
//! [`Control::kill`] makes the task stop with no goodbye (a crash: only the sweep notices);
//! [`Control::stop`] makes it deregister (releasing its claims, as its last act) and hand back
//! what it did not finish.

use super::{BoxFuture, Control, Launch, LaunchError, Launched, Launcher, Leftover};
use crate::runs::Runs;
use crate::telemetry::Traces;
use crate::worker::{Timings, Worker};

use std::sync::Arc;

use tokio::sync::{watch, Notify};
use worker_registry::DynRegistry;

/// The `task` launcher (see the [module documentation](self)).
pub struct TaskLauncher {
    registry: DynRegistry,
    timings: Timings,
    traces: Arc<Traces>,
    runs: Arc<Runs>,
}

impl TaskLauncher {
    /// Workers that call `registry`, with `timings`, recording completed events' trace contexts
    /// in `traces` and what each loop ran on in `runs`.
    pub fn new(
        registry: DynRegistry,
        timings: Timings,
        traces: Arc<Traces>,
        runs: Arc<Runs>,
    ) -> Self {
        Self {
            registry,
            timings,
            traces,
            runs,
        }
    }
}

impl Launcher for TaskLauncher {
    fn kind(&self) -> &'static str {
        "task"
    }

    fn launch(&self, spec: Launch) -> BoxFuture<'_, Result<Launched, LaunchError>> {
        let crash = Arc::new(Notify::new());
        let (stop, stopped) = watch::channel(false);
        let worker = Worker {
            registry: self.registry.clone(),
            id: spec.id,
            jobs: spec.jobs,
            crash: crash.clone(),
            stop: stopped,
            timings: self.timings,
            traces: self.traces.clone(),
            runs: self.runs.clone(),
        };
        let launched = Launched {
            exit: Box::pin(worker.run()),
            control: Box::new(TaskControl { crash, stop }),
        };
        Box::pin(std::future::ready(Ok(launched)))
    }

    /// Nothing: a task dies with its process.
    fn leftovers(&self) -> BoxFuture<'_, Result<Vec<Leftover>, LaunchError>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Nothing to do: no task is ever a leftover.
    fn remove(&self, _leftover: Leftover) -> BoxFuture<'_, Result<(), LaunchError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Controls one simulated worker.
struct TaskControl {
    crash: Arc<Notify>,
    stop: watch::Sender<bool>,
}

impl Control for TaskControl {
    fn kill(&self) {
        // A permit is stored if the worker is not waiting right now: it crashes at its next wait.
        self.crash.notify_one();
    }

    fn stop(&self) {
        self.stop.send_replace(true);
    }
}
