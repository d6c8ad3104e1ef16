//! [`Sweeper`]: the tokio maintenance task that runs [`Maintenance::sweep`] on the configured
//! interval, over any backend, and survives whatever its callback does.

use std::any::Any;
use std::collections::HashSet;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use crate::api::contract::{Maintenance, WorkerRegistry};
use crate::api::report::{ReleasedEvent, SweepReport};

/// What woke the sweeper's loop.
enum Next {
    Stop,
    Tick,
    Wake,
}

/// A background task that sweeps a registry every
/// [`sweep_interval`](crate::RegistryConfig::sweep_interval) until shut down.
///
/// Each report is handed to a callback, which re-dispatches its [released
/// events](SweepReport::released); when the callback returns, the sweeper
/// [acknowledges](Maintenance::acknowledge) them, except those the callback hands back as
/// [`Deferred`]. Ticks missed because the runtime was busy are not bunched up: the next sweep simply
/// runs late (a sweep catches up on everything at once anyway). A sweep also runs at once when
/// [`Maintenance::wake`] resolves (an exit promoted waiting deliveries, to hand over now).
///
/// Nothing a sweep or a callback does stops the task: a sweep that fails (a networked backend is
/// unreachable) is counted and retried at the next tick; a callback (or a backend) that panics is
/// caught, logged with the ids of the released events it may not have re-dispatched (they are not
/// acknowledged, so a shared backend offers them again), counted, and the next tick sweeps as
/// usual. The task ends only when it is shut down or dropped, or when its runtime shuts down; a
/// [`SweeperMonitor`] (and its metrics, see `metrics::Metrics::sweeper`) says whether it runs, and
/// the task logs when it stops.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use worker_registry::{InMemoryRegistry, Sweeper, WorkerRegistry};
///
/// let registry = InMemoryRegistry::default();
/// let sweeper = Sweeper::spawn(registry.clone(), |report| {
///     for event in &report.released {
///         println!("re-dispatch {event}");
///     }
/// });
/// tokio::time::sleep(registry.config().sweep_interval() * 2).await;
/// assert!(registry.status().version >= 1);
/// assert!(sweeper.monitor().is_running());
/// sweeper.shutdown().await;
/// # }
/// ```
#[derive(Debug)]
pub struct Sweeper {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    monitor: SweeperMonitor,
}

/// Released events a [`Sweeper`] callback could not account for yet (it could not re-dispatch
/// them now: no capacity, the router is shutting down, ...): the sweeper does not acknowledge them,
/// so a shared backend offers them again after
/// [`release_ack_timeout`](crate::RegistryConfig::release_ack_timeout), to this replica or another.
/// The in-memory backend hands each event over once whatever the answer: keep what you defer.
///
/// A callback that returns `()` defers nothing.
///
/// # Examples
///
/// ```
/// use worker_registry::{Deferred, DeliveryId, ReleaseReason, ReleasedEvent, Target};
///
/// let e = ReleasedEvent::new(
///     Target::new("o/r", 1).unwrap(),
///     DeliveryId::new("d").unwrap(),
///     None,
///     ReleaseReason::Unbound,
/// );
/// assert!(Deferred::from(()).events().is_empty());
/// assert_eq!(Deferred::new(vec![e.clone()]).events(), &[e]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deferred(Vec<ReleasedEvent>);

impl Deferred {
    /// Defers these events.
    pub fn new(events: Vec<ReleasedEvent>) -> Self {
        Self(events)
    }

    /// The deferred events.
    pub fn events(&self) -> &[ReleasedEvent] {
        &self.0
    }
}

impl From<()> for Deferred {
    fn from((): ()) -> Self {
        Self::default()
    }
}

impl From<Vec<ReleasedEvent>> for Deferred {
    fn from(events: Vec<ReleasedEvent>) -> Self {
        Self(events)
    }
}

/// A cheap, clonable view of a [`Sweeper`]'s health: whether its task runs, and what went wrong so
/// far. `metrics::Metrics::sweeper` exports it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use worker_registry::{InMemoryRegistry, Sweeper};
///
/// let sweeper = Sweeper::spawn(InMemoryRegistry::default(), |_| panic!("a bug in the callback"));
/// let monitor = sweeper.monitor();
/// tokio::time::sleep(std::time::Duration::from_secs(11)).await; // two sweeps, two panics
/// assert_eq!((monitor.sweeps(), monitor.callback_panics()), (2, 2));
/// assert!(monitor.is_running(), "the sweeper keeps sweeping");
/// sweeper.shutdown().await;
/// assert!(!monitor.is_running());
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct SweeperMonitor(Arc<MonitorState>);

#[derive(Debug, Default)]
struct MonitorState {
    running: AtomicBool,
    /// Set by [`Sweeper::abort`] before it aborts the task (so that its end is not logged as
    /// unexpected).
    aborted: AtomicBool,
    sweeps: AtomicU64,
    errors: AtomicU64,
    panics: AtomicU64,
}

impl SweeperMonitor {
    /// Whether the task runs (false once it stopped, for whatever reason).
    pub fn is_running(&self) -> bool {
        // Acquire: pairs with the Release stores in the task; a reader that sees `false` also sees
        // the counters as they were when the task ended.
        self.0.running.load(Ordering::Acquire)
    }

    /// Sweeps that returned a report.
    pub fn sweeps(&self) -> u64 {
        // Relaxed: a statistic.
        self.0.sweeps.load(Ordering::Relaxed)
    }

    /// Sweeps or acknowledgements that failed (the backend could not answer).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let sweeper = worker_registry::Sweeper::spawn(worker_registry::InMemoryRegistry::default(), |_| {});
    /// assert_eq!(sweeper.monitor().errors(), 0);
    /// # }
    /// ```
    pub fn errors(&self) -> u64 {
        // Relaxed: a statistic.
        self.0.errors.load(Ordering::Relaxed)
    }

    /// Panics caught in the callback (or in the backend's sweep or acknowledgement).
    pub fn callback_panics(&self) -> u64 {
        // Relaxed: a statistic.
        self.0.panics.load(Ordering::Relaxed)
    }

    fn count(counter: &AtomicU64) {
        // Relaxed: a statistic.
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Marks the monitor stopped however the task ends (asked to, dropped with its runtime, or a panic
/// that escaped), and says so in the log.
struct RunningGuard {
    monitor: SweeperMonitor,
    asked: bool,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        // Release: see `SweeperMonitor::is_running`.
        self.monitor.0.running.store(false, Ordering::Release);
        // Relaxed: only this flag's own value matters; `abort` sets it before aborting the task.
        if self.asked || self.monitor.0.aborted.load(Ordering::Relaxed) {
            tracing::info!("sweeper stopped");
        } else {
            tracing::error!(
                "sweeper stopped without being asked to (its runtime shut down): the registry is no \
                 longer swept, dead workers are not noticed and the status snapshot is frozen"
            );
        }
    }
}

/// Runs `fut`, turning a panic inside any of its polls into `Err` (as `futures`'
/// `FutureExt::catch_unwind`, which is not worth a dependency for these few lines).
async fn caught<F: Future>(fut: F) -> Result<F::Output, Box<dyn Any + Send>> {
    let mut fut = pin!(fut);
    std::future::poll_fn(
        move |cx| match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        },
    )
    .await
}

/// One tick of the task: a sweep, the callback on its report, and the acknowledgement of the
/// released events the callback did not defer. A failure or a panic is counted and logged; the
/// next tick tries again.
async fn tick<R, F, Fut>(registry: &R, on_report: &mut F, state: &SweeperMonitor)
where
    R: Maintenance,
    F: FnMut(SweepReport) -> Fut,
    Fut: Future,
    Fut::Output: Into<Deferred>,
{
    let report = match caught(registry.sweep()).await {
        Ok(Ok(report)) => report,
        Ok(Err(e)) => {
            tracing::warn!("sweep failed, trying again at the next tick: {e}");
            SweeperMonitor::count(&state.0.errors);
            return;
        }
        Err(panic) => {
            tracing::error!(
                "sweep panicked (a backend bug), sweeping again at the next tick: {}",
                panic_message(&*panic)
            );
            SweeperMonitor::count(&state.0.panics);
            return;
        }
    };
    SweeperMonitor::count(&state.0.sweeps);
    let released = report.released.clone();
    // The synchronous part of the callback runs inside `caught` too.
    let outcome = caught(async { on_report(report).await.into() }).await;
    let to_ack: Vec<ReleasedEvent> = match outcome {
        Ok(deferred) => {
            let deferred: Deferred = deferred;
            let keep: HashSet<_> = deferred
                .0
                .iter()
                .map(|e| (&e.target, &e.delivery))
                .collect();
            released
                .into_iter()
                .filter(|e| !keep.contains(&(&e.target, &e.delivery)))
                .collect()
        }
        Err(panic) => {
            SweeperMonitor::count(&state.0.panics);
            let ids: Vec<String> = released.iter().map(ToString::to_string).collect();
            tracing::error!(
                not_acknowledged = ?ids,
                "sweep callback panicked: {}; its released events may not have been re-dispatched (not acknowledged); sweeping again at the next tick",
                panic_message(&*panic),
            );
            Vec::new()
        }
    };
    if !to_ack.is_empty() {
        acknowledge(registry, &to_ack, state).await;
    }
}

/// Acknowledges re-dispatched released events; a failure or a panic is counted and logged (the
/// events are offered again after `release_ack_timeout` by a shared backend).
async fn acknowledge<R: Maintenance>(
    registry: &R,
    to_ack: &[ReleasedEvent],
    state: &SweeperMonitor,
) {
    match caught(registry.acknowledge(to_ack)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!("acknowledging {} released events failed: {e}", to_ack.len());
            SweeperMonitor::count(&state.0.errors);
        }
        Err(panic) => {
            tracing::error!(
                "acknowledge panicked (a backend bug): {}",
                panic_message(&*panic)
            );
            SweeperMonitor::count(&state.0.panics);
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic payload that is not a string)")
}

impl Sweeper {
    /// Spawns the task on the current tokio runtime; `on_report` sees every report, and the
    /// released events in it are acknowledged when it returns.
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
    /// networked backend's `admit`, say). Its future's output is `()` or a [`Deferred`]: the
    /// released events are acknowledged once it completes, except the deferred ones.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use worker_registry::{Admission, Deferred, DynRegistry, InMemoryRegistry, Sweeper, WorkerRegistry, WorkerRegistryExt};
    ///
    /// let registry = DynRegistry::new(InMemoryRegistry::default());
    /// let router = registry.clone();
    /// let sweeper = Sweeper::spawn_async(registry.clone(), move |report| {
    ///     let router = router.clone();
    ///     async move {
    ///         let mut later = Vec::new();
    ///         for e in &report.released {
    ///             if !matches!(router.admit(&e.target, &e.delivery).await, Ok(Admission::Assigned(_))) {
    ///                 later.push(e.clone()); // not placed: do not acknowledge it
    ///             }
    ///         }
    ///         Deferred::new(later)
    ///     }
    /// });
    /// sweeper.shutdown().await;
    /// # }
    /// ```
    pub fn spawn_async<R, F, Fut>(registry: R, mut on_report: F) -> Self
    where
        R: WorkerRegistry + Maintenance + 'static,
        F: FnMut(SweepReport) -> Fut + Send + 'static,
        Fut: Future + Send,
        Fut::Output: Into<Deferred>,
    {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let period = registry.config().sweep_interval();
        let monitor = SweeperMonitor::default();
        // Release: see `SweeperMonitor::is_running` (set before the task can observe anything).
        monitor.0.running.store(true, Ordering::Release);
        let state = monitor.clone();
        let task = tokio::spawn(async move {
            let mut guard = RunningGuard {
                monitor: state.clone(),
                asked: false,
            };
            let first = Instant::now()
                .checked_add(period)
                .unwrap_or_else(Instant::now);
            let mut ticks = interval_at(first, period.max(Duration::from_millis(1)));
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                // The first of: shut down, the tick, or a wake (written out rather than with
                // `select!`, so the default build needs no `tokio/macros`; checked in this
                // order, so a shutdown wins over a due sweep).
                let next = {
                    let mut wake = pin!(registry.wake());
                    std::future::poll_fn(|cx| {
                        if Pin::new(&mut stopped).poll(cx).is_ready() {
                            Poll::Ready(Next::Stop)
                        } else if ticks.poll_tick(cx).is_ready() {
                            Poll::Ready(Next::Tick)
                        } else if wake.as_mut().poll(cx).is_ready() {
                            Poll::Ready(Next::Wake)
                        } else {
                            Poll::Pending
                        }
                    })
                    .await
                };
                match next {
                    Next::Stop => break,
                    Next::Tick => tick(&registry, &mut on_report, &state).await,
                    // Deliveries promoted by an exit wait to be handed over: sweep now (the
                    // next tick counts from here).
                    Next::Wake => {
                        ticks.reset();
                        tick(&registry, &mut on_report, &state).await;
                    }
                }
            }
            guard.asked = true;
        });
        Self {
            stop: Some(stop),
            task,
            monitor,
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
        self.monitor.errors()
    }

    /// The task's health, to watch or export as metrics.
    pub fn monitor(&self) -> SweeperMonitor {
        self.monitor.clone()
    }

    /// Stops the task at once, wherever it is, as if its process had been killed: a sweep or a
    /// callback in progress is abandoned, and the released events handed to it are not
    /// acknowledged (a shared backend offers them to another replica after
    /// [`release_ack_timeout`](crate::RegistryConfig::release_ack_timeout); the in-memory backend
    /// does not hand them over again). For simulating a replica that dies; a router that stops
    /// calls [`shutdown`](Self::shutdown).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use worker_registry::{InMemoryRegistry, Sweeper};
    ///
    /// let sweeper = Sweeper::spawn(InMemoryRegistry::default(), |_| {});
    /// let monitor = sweeper.monitor();
    /// sweeper.abort().await;
    /// assert!(!monitor.is_running());
    /// # }
    /// ```
    pub async fn abort(mut self) {
        // Relaxed: the abort below reaches the task through its state, which orders this store
        // before the guard's load when the aborted task is dropped.
        self.monitor.0.aborted.store(true, Ordering::Relaxed);
        self.task.abort();
        let _ = (&mut self.task).await;
        // A task aborted before its first poll never made the guard that would say so.
        // Release: see `SweeperMonitor::is_running`.
        self.monitor.0.running.store(false, Ordering::Release);
    }

    /// Stops the task and waits for it (a sweep in progress finishes first).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InMemoryRegistry, RegistryConfig, TokioClock};

    fn config() -> RegistryConfig {
        RegistryConfig::builder()
            .heartbeat_interval(Duration::from_secs(1))
            .missed_heartbeats(2)
            .sweep_interval(Duration::from_secs(1))
            .startup_grace(Duration::ZERO)
            .build()
            .unwrap()
    }

    /// A callback that panics on its first two reports: the sweeper keeps sweeping, counts both,
    /// does not acknowledge what they held, and the third report is handled normally.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_callback_is_caught_counted_and_sweeping_goes_on() {
        let registry = InMemoryRegistry::with_clock(config(), TokioClock::new());
        let calls = Arc::new(AtomicU64::new(0));
        let seen = calls.clone();
        let sweeper = Sweeper::spawn(registry.clone(), move |_| {
            // Relaxed: a test counter read after the sweeps it counts.
            if seen.fetch_add(1, Ordering::Relaxed) < 2 {
                panic!("callback bug");
            }
        });
        let monitor = sweeper.monitor();
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        assert_eq!(monitor.callback_panics(), 2);
        assert_eq!(monitor.sweeps(), 3);
        assert!(monitor.is_running());
        assert_eq!(registry.status().version, 3, "every tick swept");
        sweeper.shutdown().await;
        assert!(!monitor.is_running());
    }

    /// An async callback that panics after an await point is caught too.
    #[tokio::test(start_paused = true)]
    async fn a_callback_panicking_across_an_await_is_caught() {
        let registry = InMemoryRegistry::with_clock(config(), TokioClock::new());
        let sweeper = Sweeper::spawn_async(registry.clone(), |_| async {
            tokio::task::yield_now().await;
            if true {
                panic!("late bug");
            }
        });
        let monitor = sweeper.monitor();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        assert_eq!((monitor.sweeps(), monitor.callback_panics()), (2, 2));
        assert!(monitor.is_running());
        sweeper.shutdown().await;
    }

    #[test]
    fn deferred_converts_from_unit_and_vec() {
        assert_eq!(Deferred::from(()), Deferred::default());
        assert!(Deferred::from(Vec::new()).events().is_empty());
    }

    /// The longest durations a configuration accepts do not make the task panic (an `Instant`
    /// overflow killed it silently before durations were bounded).
    #[tokio::test(start_paused = true)]
    async fn the_longest_intervals_are_scheduled_without_overflow() {
        let year = crate::config::MAX_DURATION;
        let config = RegistryConfig::builder()
            .heartbeat_interval(year / 2)
            .missed_heartbeats(2)
            .sweep_interval(year)
            .claim_retention(year)
            .dead_retention(year)
            .suspect_grace(year)
            .max_in_flight(year)
            .drain_deadline(year)
            .release_ack_timeout(year)
            .build()
            .unwrap();
        let registry = InMemoryRegistry::with_clock(config, TokioClock::new());
        let sweeper = Sweeper::spawn(registry.clone(), |_| {});
        let monitor = sweeper.monitor();
        tokio::time::sleep(year + Duration::from_secs(1)).await;
        assert!(monitor.is_running());
        assert_eq!(monitor.sweeps(), 1);
        sweeper.shutdown().await;
    }

    /// Dropping the runtime ends the task without `shutdown`: the monitor says it stopped.
    #[test]
    fn the_monitor_reports_a_task_that_ended_with_its_runtime() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let monitor = rt.block_on(async {
            let registry = InMemoryRegistry::with_clock(config(), TokioClock::new());
            let sweeper = Sweeper::spawn(registry.clone(), |_| {});
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            assert_eq!(registry.status().version, 1);
            let monitor = sweeper.monitor();
            std::mem::forget(sweeper); // neither shut down nor dropped: only the runtime ends it
            monitor
        });
        assert!(monitor.is_running());
        drop(rt);
        assert!(!monitor.is_running());
    }
}
