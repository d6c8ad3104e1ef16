//! [`Sweeper`]: the tokio maintenance task that runs [`Registry::sweep`] on the configured interval.

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use crate::clock::Clock;
use crate::registry::Registry;
use crate::sweep::SweepReport;

/// A background task that sweeps the registry every `sweep_interval` until shut down.
///
/// Each report is handed to a callback (log it, re-dispatch its released events). Ticks missed
/// because the runtime was busy are not bunched up: the next sweep simply runs late (a sweep
/// catches up on everything at once anyway). Dropping the `Sweeper` also stops the task.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use worker_registry::{Registry, Sweeper};
///
/// let registry = Registry::default();
/// let sweeper = Sweeper::spawn(registry.clone(), |report| {
///     for (target, event) in &report.released_events {
///         println!("re-dispatch {event} for {target}");
///     }
/// });
/// tokio::time::sleep(registry.config().sweep_interval * 2).await;
/// assert!(registry.status().generation >= 1);
/// sweeper.shutdown().await;
/// # }
/// ```
#[derive(Debug)]
pub struct Sweeper {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Sweeper {
    /// Spawns the task on the current tokio runtime; `on_report` sees every sweep's report.
    pub fn spawn<C, F>(registry: Registry<C>, mut on_report: F) -> Self
    where
        C: Clock,
        F: FnMut(&SweepReport) + Send + 'static,
    {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let period = registry.config().sweep_interval;
        let task = tokio::spawn(async move {
            let mut ticks = interval_at(Instant::now() + period, period);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = ticks.tick() => {
                        let report = registry.sweep();
                        on_report(&report);
                    }
                }
            }
        });
        Self {
            stop: Some(stop),
            task,
        }
    }

    /// Stops the task and waits for it (a sweep in progress finishes first).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}
