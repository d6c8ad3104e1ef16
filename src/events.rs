//! Lifecycle [`Event`]s and their fan-out to subscribers ([`Registry::subscribe`]).
//!
//! The registry publishes an event when a worker is created, set draining, marked suspect, or dies,
//! and when a sweep releases a target's work for re-dispatch. Nothing is published on the hot
//! paths that do not change a worker's status (duplicate detection, sticky assignment, heartbeats).
//!
//! Fan-out is a [`tokio::sync::broadcast`] channel with a fixed ring of [`EVENT_BUFFER`] slots,
//! created by the first [`subscribe`](Registry::subscribe): publishing never waits for a
//! subscriber. A subscriber that falls more than [`EVENT_BUFFER`] events behind loses the oldest
//! ones; its next receive reports how many with [`RecvError::Lagged`], and the registry counts
//! them ([`Registry::events_missed`]).
//!
//! A worker's `WorkerCreated` is published just before the worker becomes visible in the maps, so
//! it always precedes the worker's other events; on the assignment path that happens under the
//! target's shard lock. The channel's own lock is a leaf: sending never calls back into the
//! registry, and receivers are woken after it is released.
//!
//! Without the `tokio` feature, and under `--cfg worker_registry_loom` (tokio's channel is not
//! loom-aware), the hub compiles to nothing and the emission points are empty inline functions.
//!
//! [`Registry::subscribe`]: crate::Registry::subscribe
//! [`Registry::events_missed`]: crate::Registry::events_missed
//! [`Registry`]: crate::Registry

use std::fmt;

use crate::ids::{EventId, Target, WorkerId};
use crate::state::DeadReason;

pub(crate) use hub::EventHub;
#[cfg(all(feature = "tokio", not(worker_registry_loom)))]
pub use hub::Subscription;

/// Events a subscriber may fall behind by before it starts losing the oldest ones.
///
/// # Examples
///
/// ```
/// assert!(worker_registry::EVENT_BUFFER >= 64);
/// ```
pub const EVENT_BUFFER: usize = 1024;

/// A change in a worker's life, as published to [`subscribe`](crate::Registry::subscribe)rs.
///
/// Events about one worker are published in the order of its transitions: `WorkerCreated` always
/// first, then `WorkerDraining` / `WorkerSuspect`, and `WorkerDied` last. The one exception: two
/// transitions of the same worker made at the same instant on different threads (a drain racing
/// the worker's own exit, say) are published in the order the threads reach the channel, so
/// `WorkerDraining` may follow `WorkerDied`; the worker's status word, and the death, are what
/// count. `TargetReleased` comes from the sweep that found the released work, after the deaths
/// it reports.
///
/// # Examples
///
/// ```
/// use worker_registry::{DeadReason, Event, WorkerId};
///
/// let e = Event::WorkerDied { worker: WorkerId::new(3), target: None, reason: DeadReason::Exited };
/// assert_eq!(e.worker(), Some(WorkerId::new(3)));
/// assert_eq!(e.kind(), "worker_died");
/// assert_eq!(e.to_string(), "worker 3 died (exited)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A worker was created: spawned by an assignment for `target`, or registered (no target).
    WorkerCreated {
        /// The new worker.
        worker: WorkerId,
        /// Its target, if it was spawned for one.
        target: Option<Target>,
    },
    /// A busy worker was set draining: it takes nothing new and exits when its loop finishes.
    /// (An idle worker that is drained exits at once: it gets a `WorkerDied` instead.)
    WorkerDraining {
        /// The worker.
        worker: WorkerId,
        /// Its target, if any.
        target: Option<Target>,
    },
    /// The mass-staleness brake marked a silent worker suspect instead of dead.
    WorkerSuspect {
        /// The worker.
        worker: WorkerId,
        /// Its target, if any.
        target: Option<Target>,
    },
    /// A worker died; its capacity slot is free and its target unassigned.
    WorkerDied {
        /// The worker.
        worker: WorkerId,
        /// Its target, if any (now unassigned).
        target: Option<Target>,
        /// How it died.
        reason: DeadReason,
    },
    /// A sweep released work on this target: its worker died in that sweep, and/or deliveries
    /// that were in flight on a dead worker are listed in `events` for re-dispatch.
    TargetReleased {
        /// The target.
        target: Target,
        /// In-flight deliveries released (possibly none).
        events: Vec<EventId>,
    },
}

impl Event {
    /// A stable snake_case name for the variant (for logs and labels).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Event, WorkerId};
    ///
    /// let e = Event::WorkerCreated { worker: WorkerId::new(1), target: None };
    /// assert_eq!(e.kind(), "worker_created");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Self::WorkerCreated { .. } => "worker_created",
            Self::WorkerDraining { .. } => "worker_draining",
            Self::WorkerSuspect { .. } => "worker_suspect",
            Self::WorkerDied { .. } => "worker_died",
            Self::TargetReleased { .. } => "target_released",
        }
    }

    /// The worker the event is about (none for `TargetReleased`).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Event, Target};
    ///
    /// let e = Event::TargetReleased { target: Target::new("o/r", 1).unwrap(), events: vec![] };
    /// assert_eq!(e.worker(), None);
    /// ```
    pub fn worker(&self) -> Option<WorkerId> {
        match self {
            Self::WorkerCreated { worker, .. }
            | Self::WorkerDraining { worker, .. }
            | Self::WorkerSuspect { worker, .. }
            | Self::WorkerDied { worker, .. } => Some(*worker),
            Self::TargetReleased { .. } => None,
        }
    }

    /// The target the event is about, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Event, Target, WorkerId};
    ///
    /// let t = Target::new("o/r", 1).unwrap();
    /// let e = Event::WorkerCreated { worker: WorkerId::new(1), target: Some(t.clone()) };
    /// assert_eq!(e.target(), Some(&t));
    /// ```
    pub fn target(&self) -> Option<&Target> {
        match self {
            Self::WorkerCreated { target, .. }
            | Self::WorkerDraining { target, .. }
            | Self::WorkerSuspect { target, .. }
            | Self::WorkerDied { target, .. } => target.as_ref(),
            Self::TargetReleased { target, .. } => Some(target),
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = |t: &Option<Target>| t.as_ref().map(|t| format!(" on {t}")).unwrap_or_default();
        match self {
            Self::WorkerCreated { worker, target } => {
                write!(f, "worker {worker} created{}", on(target))
            }
            Self::WorkerDraining { worker, target } => {
                write!(f, "worker {worker} draining{}", on(target))
            }
            Self::WorkerSuspect { worker, target } => {
                write!(f, "worker {worker} suspect{}", on(target))
            }
            Self::WorkerDied {
                worker,
                target,
                reason,
            } => write!(f, "worker {worker} died{} ({reason})", on(target)),
            Self::TargetReleased { target, events } => {
                write!(f, "target {target} released with {} event(s)", events.len())
            }
        }
    }
}

/// Why [`Subscription::recv`] returned no event.
///
/// # Examples
///
/// ```
/// use worker_registry::RecvError;
///
/// assert_eq!(RecvError::Lagged { missed: 3 }.to_string(), "subscriber lagged: 3 event(s) missed");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecvError {
    /// The subscriber fell more than [`EVENT_BUFFER`] events behind: this many of the oldest were
    /// dropped for it. Receiving again continues with the oldest event still buffered.
    Lagged {
        /// Events this subscriber will never see.
        missed: u64,
    },
    /// The registry was dropped and every buffered event has been received.
    Closed,
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lagged { missed } => write!(f, "subscriber lagged: {missed} event(s) missed"),
            Self::Closed => f.write_str("registry closed"),
        }
    }
}

impl std::error::Error for RecvError {}

#[cfg(all(feature = "tokio", not(worker_registry_loom)))]
mod hub {
    use std::collections::BTreeMap;
    use std::sync::OnceLock;

    use tokio::sync::broadcast;

    use super::{Event, RecvError, EVENT_BUFFER};
    use crate::ids::{EventId, Target};
    use crate::state::{DeadReason, Status, Word};
    use crate::sweep::SweepReport;
    use crate::sync::{Arc, AtomicU64, Ordering};
    use crate::worker::WorkerRecord;

    /// The publishing side: a broadcast sender made on first subscription.
    ///
    /// Compiled only with tokio and without loom; `OnceLock` is therefore std's (not a shared
    /// primitive loom models need to see).
    pub(crate) struct EventHub {
        sender: OnceLock<broadcast::Sender<Event>>,
        /// Events dropped for lagging subscribers, summed over all of them.
        missed: Arc<AtomicU64>,
    }

    impl EventHub {
        pub(crate) fn new() -> Self {
            Self {
                sender: OnceLock::new(),
                missed: Arc::new(AtomicU64::new(0)),
            }
        }

        pub(crate) fn subscribe(&self) -> Subscription {
            let sender = self
                .sender
                .get_or_init(|| broadcast::channel(EVENT_BUFFER).0);
            Subscription {
                rx: sender.subscribe(),
                missed: self.missed.clone(),
            }
        }

        pub(crate) fn missed(&self) -> u64 {
            // Relaxed: a statistics total; nothing is published through it.
            self.missed.load(Ordering::Relaxed)
        }

        /// Sends if anyone ever subscribed. With no live receiver the event is dropped.
        #[inline]
        fn send(&self, make: impl FnOnce() -> Event) {
            if let Some(sender) = self.sender.get() {
                let _ = sender.send(make());
            }
        }

        #[inline]
        pub(crate) fn created(&self, rec: &WorkerRecord) {
            self.send(|| Event::WorkerCreated {
                worker: rec.id,
                target: rec.target.clone(),
            });
        }

        /// Publishes `WorkerDraining` if this transition is the one that set `rec` draining.
        #[inline]
        pub(crate) fn transition(&self, rec: &WorkerRecord, old: Word, new: Word) {
            if new.status() == Status::Draining && old.status() != Status::Draining {
                self.send(|| Event::WorkerDraining {
                    worker: rec.id,
                    target: rec.target.clone(),
                });
            }
        }

        #[inline]
        pub(crate) fn suspect(&self, rec: &WorkerRecord) {
            self.send(|| Event::WorkerSuspect {
                worker: rec.id,
                target: rec.target.clone(),
            });
        }

        #[inline]
        pub(crate) fn died(&self, rec: &WorkerRecord, reason: DeadReason) {
            self.send(|| Event::WorkerDied {
                worker: rec.id,
                target: rec.target.clone(),
                reason,
            });
        }

        /// One `TargetReleased` per target the sweep released work on, in target order.
        pub(crate) fn released(&self, report: &SweepReport) {
            let Some(sender) = self.sender.get() else {
                return;
            };
            if report.released_targets.is_empty() && report.released_events.is_empty() {
                return;
            }
            if sender.receiver_count() == 0 {
                return;
            }
            let mut by_target: BTreeMap<&Target, Vec<EventId>> = BTreeMap::new();
            for t in &report.released_targets {
                by_target.entry(t).or_default();
            }
            for (t, e) in &report.released_events {
                by_target.entry(t).or_default().push(e.clone());
            }
            for (target, events) in by_target {
                let _ = sender.send(Event::TargetReleased {
                    target: target.clone(),
                    events,
                });
            }
        }
    }

    /// A subscription to a registry's lifecycle [`Event`]s, from
    /// [`Registry::subscribe`](crate::Registry::subscribe).
    ///
    /// It sees every event published after it was made, in publication order, unless it falls
    /// more than [`EVENT_BUFFER`] events behind: then the oldest are dropped for it, and the next
    /// receive says how many ([`RecvError::Lagged`]). Dropping it unsubscribes.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{Event, Registry};
    ///
    /// let registry = Registry::default();
    /// let mut events = registry.subscribe();
    /// let w = registry.register().unwrap();
    /// assert_eq!(
    ///     events.recv().await.unwrap(),
    ///     Event::WorkerCreated { worker: w.id(), target: None }
    /// );
    /// # }
    /// ```
    #[derive(Debug)]
    pub struct Subscription {
        rx: broadcast::Receiver<Event>,
        missed: Arc<AtomicU64>,
    }

    impl Subscription {
        /// Waits for the next event.
        ///
        /// Returns [`RecvError::Lagged`] once after events were dropped for this subscriber
        /// (receive again to continue), and [`RecvError::Closed`] when the registry is gone and
        /// everything buffered has been received. Cancel-safe.
        ///
        /// # Examples
        ///
        /// See [`Subscription`].
        pub async fn recv(&mut self) -> Result<Event, RecvError> {
            let r = self.rx.recv().await;
            self.map(r.map_err(|e| match e {
                broadcast::error::RecvError::Lagged(n) => Lag::Lagged(n),
                broadcast::error::RecvError::Closed => Lag::Closed,
            }))
        }

        /// The next event if one is buffered, `Ok(None)` if none is (yet).
        ///
        /// # Examples
        ///
        /// ```
        /// use worker_registry::{Event, Registry};
        ///
        /// let registry = Registry::default();
        /// let mut events = registry.subscribe();
        /// assert_eq!(events.try_recv(), Ok(None));
        /// let w = registry.register().unwrap();
        /// assert!(matches!(events.try_recv(), Ok(Some(Event::WorkerCreated { .. }))));
        /// ```
        pub fn try_recv(&mut self) -> Result<Option<Event>, RecvError> {
            use broadcast::error::TryRecvError;
            match self.rx.try_recv() {
                Ok(e) => Ok(Some(e)),
                Err(TryRecvError::Empty) => Ok(None),
                Err(TryRecvError::Lagged(n)) => self.map(Err(Lag::Lagged(n))).map(Some),
                Err(TryRecvError::Closed) => Err(RecvError::Closed),
            }
        }

        fn map(&self, r: Result<Event, Lag>) -> Result<Event, RecvError> {
            match r {
                Ok(e) => Ok(e),
                Err(Lag::Lagged(n)) => {
                    // Relaxed: a statistics total; nothing is published through it.
                    self.missed.fetch_add(n, Ordering::Relaxed);
                    Err(RecvError::Lagged { missed: n })
                }
                Err(Lag::Closed) => Err(RecvError::Closed),
            }
        }
    }

    enum Lag {
        Lagged(u64),
        Closed,
    }
}

#[cfg(not(all(feature = "tokio", not(worker_registry_loom))))]
mod hub {
    use crate::state::{DeadReason, Word};
    use crate::sweep::SweepReport;
    use crate::worker::WorkerRecord;

    /// No subscribers can exist (no tokio, or a loom build): every emission point is empty.
    pub(crate) struct EventHub;

    impl EventHub {
        pub(crate) fn new() -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn created(&self, _: &WorkerRecord) {}
        #[inline(always)]
        pub(crate) fn transition(&self, _: &WorkerRecord, _: Word, _: Word) {}
        #[inline(always)]
        pub(crate) fn suspect(&self, _: &WorkerRecord) {}
        #[inline(always)]
        pub(crate) fn died(&self, _: &WorkerRecord, _: DeadReason) {}
        #[inline(always)]
        pub(crate) fn released(&self, _: &SweepReport) {}
    }
}

#[cfg(all(feature = "tokio", not(worker_registry_loom)))]
impl<C: crate::clock::Clock> crate::registry::Registry<C> {
    /// Subscribes to lifecycle [`Event`]s published from now on (see [`Subscription`]).
    ///
    /// Publishing never waits for subscribers: one that falls more than [`EVENT_BUFFER`] events
    /// behind loses the oldest and is told how many ([`RecvError::Lagged`]).
    ///
    /// **Locking behaviour:** takes the event channel's internal lock once. Publishing takes it
    /// once per event, only on the paths that publish (worker creation, drain, suspicion, death,
    /// a sweep that released work) and only after someone subscribed; duplicate detection, sticky
    /// assignment and heartbeats never touch it.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeadReason, Event, Registry};
    ///
    /// let registry = Registry::default();
    /// let mut events = registry.subscribe();
    /// let w = registry.register().unwrap();
    /// w.deregister().unwrap();
    /// assert!(matches!(events.try_recv(), Ok(Some(Event::WorkerCreated { .. }))));
    /// assert_eq!(
    ///     events.try_recv(),
    ///     Ok(Some(Event::WorkerDied { worker: w.id(), target: None, reason: DeadReason::Deregistered }))
    /// );
    /// ```
    pub fn subscribe(&self) -> Subscription {
        self.inner.events.subscribe()
    }

    /// Events dropped for lagging subscribers so far, summed over all of them (counted when each
    /// subscriber learns of its loss).
    ///
    /// **Locking behaviour:** no lock: one atomic load.
    ///
    /// # Examples
    ///
    /// ```
    /// let registry = worker_registry::Registry::default();
    /// assert_eq!(registry.events_missed(), 0);
    /// ```
    pub fn events_missed(&self) -> u64 {
        self.inner.events.missed()
    }
}
