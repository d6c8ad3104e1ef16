//! [`Sweeper`]: the tokio maintenance task that runs [`Maintenance::sweep`] on the configured
//! interval, over any backend.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use crate::api::contract::{Maintenance, WorkerRegistry};
use crate::api::report::SweepReport;

/// A background task that sweeps a registry every
/// [`sweep_interval`](crate::RegistryConfig::sweep_interval) until shut down.
///
/// Each report is handed to a callback, which re-dispatches its [released
/// events](SweepReport::released); when the callback returns, the sweeper
/// [acknowledges](Maintenance::acknowledge) them. Ticks missed because the runtime was busy are not
/// bunched up: the next sweep simply runs late (a sweep catches up on everything at once anyway).
/// A sweep that fails (a networked backend is unreachable) is counted and retried at the next tick.
/// Dropping the `Sweeper` also stops the task.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use worker_registry::{InMemoryRegistry, Sweeper};
///
/// let registry = InMemoryRegistry::default();
/// let sweeper = Sweeper::spawn(registry.clone(), |report| {
///     for event in &report.released {
///         println!("re-dispatch {event}");
///     }
/// });
/// tokio::time::sleep(registry.config().sweep_interval() * 2).await;
/// assert!(registry.status().version >= 1);
/// sweeper.shutdown().await;
/// # }
/// ```
#[derive(Debug)]
pub struct Sweeper {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    errors: Arc<AtomicU64>,
}

impl Sweeper {
    /// Spawns the task on the current tokio runtime; `on_report` sees every report, and the
    /// released events in it are acknowledged when it returns.
    ///
    /// # Examples
    ///
    /// See [`Sweeper`].
    pub fn spawn<R, F>(registry: R, mut on_report: F) -> Self
    where
        R: WorkerRegistry + Maintenance + 'static,
        F: FnMut(&SweepReport) + Send + 'static,
    {
        Self::spawn_async(registry, move |report| {
            on_report(&report);
            std::future::ready(())
        })
    }

    /// Like [`spawn`](Self::spawn), with a callback that re-dispatches asynchronously (through a
    /// networked backend's `admit`, say); the released events are acknowledged once its future
    /// completes.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use worker_registry::{DynRegistry, InMemoryRegistry, Sweeper, WorkerRegistry};
    ///
    /// let registry = DynRegistry::new(InMemoryRegistry::default());
    /// let router = registry.clone();
    /// let sweeper = Sweeper::spawn_async(registry.clone(), move |report| {
    ///     let router = router.clone();
    ///     async move {
    ///         for e in &report.released {
    ///             let _ = router.admit(&e.target, &e.delivery).await;
    ///         }
    ///     }
    /// });
    /// sweeper.shutdown().await;
    /// # }
    /// ```
    pub fn spawn_async<R, F, Fut>(registry: R, mut on_report: F) -> Self
    where
        R: WorkerRegistry + Maintenance + 'static,
        F: FnMut(SweepReport) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let period = registry.config().sweep_interval();
        let errors = Arc::new(AtomicU64::new(0));
        let counted = errors.clone();
        let task = tokio::spawn(async move {
            let mut ticks = interval_at(Instant::now() + period, period);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = ticks.tick() => {
                        match registry.sweep().await {
                            Ok(report) => {
                                let released = report.released.clone();
                                on_report(report).await;
                                if !released.is_empty()
                                    && registry.acknowledge(&released).await.is_err()
                                {
                                    // Relaxed: a statistic.
                                    counted.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            // Relaxed: a statistic.
                            Err(_) => { counted.fetch_add(1, Ordering::Relaxed); }
                        }
                    }
                }
            }
        });
        Self {
            stop: Some(stop),
            task,
            errors,
        }
    }

    /// Sweeps or acknowledgements that failed so far (the backend could not answer).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let sweeper = worker_registry::Sweeper::spawn(worker_registry::InMemoryRegistry::default(), |_| {});
    /// assert_eq!(sweeper.errors(), 0);
    /// # }
    /// ```
    pub fn errors(&self) -> u64 {
        // Relaxed: a statistic.
        self.errors.load(Ordering::Relaxed)
    }

    /// Stops the task and waits for it (a sweep in progress finishes first).
    ///
    /// # Examples
    ///
    /// See [`Sweeper`].
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}
