//! Lifecycle [`Event`]s, and (feature `tokio`) the fan-out every backend uses to hand them to
//! subscribers: [`EventSender`] and [`Subscription`].
//!
//! A registry publishes an event when a worker is created, set draining, marked suspect, or dies,
//! when a delivery is found stuck, and when a sweep releases a target's work for re-dispatch.
//! Nothing is published on the hot paths that do not change a worker's status (duplicate
//! detection, sticky assignment, heartbeats).
//!
//! Fan-out is a [`tokio::sync::broadcast`] channel with a fixed ring of [`EVENT_BUFFER`] slots,
//! created by the first subscription: publishing never waits for a subscriber. A subscriber that
//! falls more than [`EVENT_BUFFER`] events behind loses the oldest ones; its next receive reports
//! how many with [`RecvError::Lagged`], and the sender counts them ([`EventSender::missed`]). The
//! channel's own lock is a leaf: sending never calls back into the registry, and receivers are
//! woken after it is released.

use std::fmt;

use super::ids::{DeliveryId, Target, WorkerId};
use super::status::DeadReason;

#[cfg(feature = "tokio")]
pub use fanout::{EventSender, Subscription};

/// Events a subscriber may fall behind by before it starts losing the oldest ones.
///
/// # Examples
///
/// ```
/// assert!(worker_registry::events::EVENT_BUFFER >= 64);
/// ```
pub const EVENT_BUFFER: usize = 1024;

/// A change in a worker's life, as published to [`Subscribe::subscribe`](crate::Subscribe)rs.
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
    /// A delivery stayed in flight longer than `max_in_flight`: its claim was released for
    /// re-dispatch and its worker drained.
    DeliveryStuck {
        /// The worker that held it.
        worker: WorkerId,
        /// The delivery's target.
        target: Target,
        /// The delivery.
        delivery: DeliveryId,
    },
    /// A sweep released work on this target: its worker died in that sweep, and/or the
    /// deliveries it hands over for re-dispatch (in flight on a dead worker, or bare claims nobody
    /// completed) are listed in `deliveries`.
    TargetReleased {
        /// The target.
        target: Target,
        /// In-flight deliveries released (possibly none).
        deliveries: Vec<DeliveryId>,
    },
    /// A shared backend's handle found that the server lost the registry's data, or that it
    /// went back in time (a restart without persistence, a failover to a replica or standby that
    /// lagged, a restore): the workers created in what was lost no longer exist. Published to
    /// this handle's subscribers only (each replica finds the loss itself), once per loss.
    /// Their containers must be stopped: the registry refuses them as unknown workers, and their
    /// ids are never handed out again.
    DataLost {
        /// The workers this handle's last snapshot listed alive that the server no longer knows.
        lost: Vec<WorkerId>,
    },
    /// A parked delivery was promoted out of the waiting room onto `worker` (and handed to the
    /// caller of the sweep that promoted it).
    DeliveryPromoted {
        /// The worker it was placed on.
        worker: WorkerId,
        /// The delivery's target.
        target: Target,
        /// The delivery.
        delivery: DeliveryId,
    },
    /// A parked delivery was dropped without being promoted.
    WaitingExpired {
        /// The delivery's target.
        target: Target,
        /// The delivery.
        delivery: DeliveryId,
        /// Why.
        reason: crate::ExpireReason,
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
            Self::DeliveryStuck { .. } => "delivery_stuck",
            Self::TargetReleased { .. } => "target_released",
            Self::DataLost { .. } => "data_lost",
            Self::DeliveryPromoted { .. } => "delivery_promoted",
            Self::WaitingExpired { .. } => "waiting_expired",
        }
    }

    /// The worker the event is about (none for `TargetReleased` and `DataLost`).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Event, Target};
    ///
    /// let e = Event::TargetReleased { target: Target::new("o/r", 1).unwrap(), deliveries: vec![] };
    /// assert_eq!(e.worker(), None);
    /// ```
    pub fn worker(&self) -> Option<WorkerId> {
        match self {
            Self::WorkerCreated { worker, .. }
            | Self::WorkerDraining { worker, .. }
            | Self::WorkerSuspect { worker, .. }
            | Self::WorkerDied { worker, .. }
            | Self::DeliveryStuck { worker, .. }
            | Self::DeliveryPromoted { worker, .. } => Some(*worker),
            Self::TargetReleased { .. } | Self::WaitingExpired { .. } | Self::DataLost { .. } => {
                None
            }
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
            Self::DeliveryStuck { target, .. }
            | Self::TargetReleased { target, .. }
            | Self::DeliveryPromoted { target, .. }
            | Self::WaitingExpired { target, .. } => Some(target),
            Self::DataLost { .. } => None,
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
            Self::DeliveryStuck {
                worker,
                target,
                delivery,
            } => write!(
                f,
                "delivery {delivery} on {target} stuck on worker {worker}: released"
            ),
            Self::TargetReleased { target, deliveries } => write!(
                f,
                "target {target} released with {} delivery(ies)",
                deliveries.len()
            ),
            Self::DataLost { lost } => write!(
                f,
                "the registry's data was lost: {} worker(s) no longer exist",
                lost.len()
            ),
            Self::DeliveryPromoted {
                worker,
                target,
                delivery,
            } => write!(
                f,
                "delivery {delivery} on {target} promoted onto worker {worker}"
            ),
            Self::WaitingExpired {
                target,
                delivery,
                reason,
            } => write!(
                f,
                "waiting delivery {delivery} on {target} dropped: {reason}"
            ),
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

#[cfg(feature = "tokio")]
mod fanout {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, OnceLock};

    use tokio::sync::broadcast;

    use super::{Event, RecvError, EVENT_BUFFER};

    /// The publishing side of a registry's lifecycle events: a broadcast channel of
    /// [`EVENT_BUFFER`] slots, made on the first [`subscribe`](Self::subscribe). Backends own one
    /// and [`send`](Self::send) what happens; a shared backend feeds it from its server's
    /// notifications so that every replica's subscribers see every event.
    ///
    /// **Locking behaviour:** `send` takes the channel's internal lock once, and only after someone
    /// subscribed; before that it is one atomic load.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::events::EventSender;
    /// use worker_registry::{Event, WorkerId};
    ///
    /// let events = EventSender::new();
    /// let mut sub = events.subscribe();
    /// events.send(|| Event::WorkerCreated { worker: WorkerId::new(1), target: None });
    /// assert!(matches!(sub.try_recv(), Ok(Some(Event::WorkerCreated { .. }))));
    /// ```
    #[derive(Debug, Default)]
    pub struct EventSender {
        sender: OnceLock<broadcast::Sender<Event>>,
        /// Events dropped for lagging subscribers, summed over all of them.
        missed: Arc<AtomicU64>,
    }

    impl EventSender {
        /// A sender nobody has subscribed to yet.
        pub fn new() -> Self {
            Self::default()
        }

        /// A subscription to every event sent from now on.
        pub fn subscribe(&self) -> Subscription {
            let sender = self
                .sender
                .get_or_init(|| broadcast::channel(EVENT_BUFFER).0);
            Subscription {
                rx: sender.subscribe(),
                missed: self.missed.clone(),
            }
        }

        /// Whether anyone is subscribed now (so that a caller can skip building costly events).
        ///
        /// # Examples
        ///
        /// ```
        /// let events = worker_registry::events::EventSender::new();
        /// assert!(!events.has_subscribers());
        /// let _sub = events.subscribe();
        /// assert!(events.has_subscribers());
        /// ```
        #[inline]
        pub fn has_subscribers(&self) -> bool {
            self.sender.get().is_some_and(|s| s.receiver_count() > 0)
        }

        /// Sends the event `make` builds, if anyone ever subscribed (`make` is not called
        /// otherwise). With no live subscriber the event is dropped.
        #[inline]
        pub fn send(&self, make: impl FnOnce() -> Event) {
            if let Some(sender) = self.sender.get() {
                let _ = sender.send(make());
            }
        }

        /// Records that `n` events were lost before reaching subscribers (a shared backend whose
        /// notification connection dropped).
        ///
        /// # Examples
        ///
        /// ```
        /// let events = worker_registry::events::EventSender::new();
        /// events.record_missed(3);
        /// assert_eq!(events.missed(), 3);
        /// ```
        pub fn record_missed(&self, n: u64) {
            // Relaxed: a statistics total; nothing is published through it.
            self.missed.fetch_add(n, Ordering::Relaxed);
        }

        /// Events dropped for lagging subscribers so far, summed over all of them (counted when
        /// each subscriber learns of its loss), plus those recorded with
        /// [`record_missed`](Self::record_missed).
        pub fn missed(&self) -> u64 {
            // Relaxed: a statistics total; nothing is published through it.
            self.missed.load(Ordering::Relaxed)
        }
    }

    /// A subscription to a registry's lifecycle [`Event`]s, from
    /// [`Subscribe::subscribe`](crate::Subscribe::subscribe).
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
    /// use worker_registry::{Event, memory::Direct};
    ///
    /// let registry = Direct::default();
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
        /// use worker_registry::{Event, memory::Direct};
        ///
        /// let registry = Direct::default();
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
