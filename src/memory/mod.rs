//! The registry in one process's memory, with no global lock on any hot path, in two surfaces
//! with distinct names:
//!
//! * [`InMemoryRegistry`] implements the contract traits ([`WorkerRegistry`](crate::WorkerRegistry),
//!   [`Maintenance`](crate::Maintenance), [`Subscribe`](crate::Subscribe)) and has no inherent
//!   method named like one of theirs: `registry.admit(..)` is the trait's, fallible and async, the
//!   call that works unchanged on the Redis and PostgreSQL backends. Code against it.
//! * [`Direct`], reached by [`InMemoryRegistry::direct`], holds the state and answers the same
//!   calls synchronously and infallibly where nothing can fail (`direct.admit(..)` is an
//!   [`Admission`](crate::Admission), in nanoseconds, with no future to poll), plus what only a
//!   process-local registry can offer ([`WorkerHandle`], [`Direct::status_with`],
//!   [`Direct::claim_count`]). It is for the code that is tied to this backend anyway: benches,
//!   model checks, a single-process router's hot path that measured the difference.
//!
//! The trait's futures are already complete (`std::future::Ready` around the `Direct` call), so
//! awaiting them costs nothing beyond the call; the split is about names, not speed. This is the
//! shape of moka's `sync::Cache` and `future::Cache`: one name per surface, so neither's methods
//! shadow the other's and each is documented once (the contract's semantics on the traits, this
//! backend's locking and cost on `Direct`).
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use worker_registry::memory::{Direct, InMemoryRegistry};
//! use worker_registry::{Admission, DeliveryId, Target, WorkerRegistry, WorkerRegistryExt};
//!
//! let registry = InMemoryRegistry::default();
//! let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
//! let Ok(Admission::Assigned(a)) = registry.admit(&t, &d).await else { panic!() }; // any backend
//! let direct: &Direct = registry.direct(); // this one, in place, on the same state
//! assert!(direct.heartbeat(a.worker).is_ok());
//! # }
//! ```
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`Direct`] and [`InMemoryRegistry`], their shared state and reads (`status`, `stats`) |
//! | `claims.rs` | where a claim stands; `claim`, `release`, `complete`, the `payload` lookup |
//! | `table.rs` | the claims table: per-shard index, in-flight slab, retained ring in completion order |
//! | `assignment.rs` | `assign`, `admit`, `admit_with`, and worker creation under the capacity limit |
//! | `budget.rs` | the payload budget: bytes of payloads held, reserved by CAS |
//! | `lifecycle.rs` | heartbeats, loop reports, drain, register/deregister, death bookkeeping |
//! | `handle.rs` | [`WorkerHandle`], a worker's own lookup-free handle |
//! | `record.rs` | a worker's record and its display copy |
//! | `cell.rs` | the CAS cell around the pure state word of `crate::state` |
//! | `sweep.rs` | the maintenance pass |
//! | `roster.rs` | the sweep's list of workers and the snapshot buffer it recycles |
//! | `stall.rs` | the stall rule: time the registry itself did not run is not held against workers |
//! | `events.rs` | where lifecycle events are emitted |
//! | `counters.rs` | striped statistics counters |
//! | `waiting.rs` | the waiting room: parked deliveries per target, per owner, in arrival order |
//! | `parking.rs` | parking a refused admission, the per-owner cap, promotion and expiry |
//! | `contract.rs` | the contract traits on [`InMemoryRegistry`], with already-completed futures |

mod assignment;
mod budget;
mod cell;
mod claims;
mod contract;
mod counters;
mod events;
mod handle;
mod lifecycle;
mod parking;
mod record;
mod roster;
mod stall;
mod sweep;
mod table;
mod waiting;

use std::fmt;
use std::time::{Duration, SystemTime};

pub use self::handle::WorkerHandle;

use self::budget::Budget;
use self::counters::{Counters, Gauges};
use self::events::EventHub;
use self::record::WorkerRecord;
use self::roster::Roster;
use self::stall::StallWatch;
use self::sweep::SweepState;
use self::table::ClaimTable;
use self::waiting::Room;
use crate::api::ids::{Target, WorkerId};
use crate::api::snapshot::StatusSnapshot;
use crate::api::stats::Stats;
use crate::clock::{millis, Clock, SystemClock};
use crate::config::RegistryConfig;
use crate::sync::{self, Arc, AtomicU64, AtomicUsize, Mutex, Ordering, ShardMap, SnapshotCell};

/// The in-memory worker registry: duplicate-delivery detection, sticky assignment under a capacity
/// limit, heartbeat liveness, drain, and a status snapshot that never blocks.
///
/// # Why not a `Mutex<HashMap>`?
///
/// The obvious registry is one `Mutex<HashMap<Target, Worker>>`. Every webhook, every heartbeat and
/// every status read then queues on the same lock; a status read that formats a table or a sweep
/// that walks every worker stalls all deliveries behind it, and heartbeats from hundreds of workers
/// contend with the router's hot path. Here instead:
///
/// * workers, targets and claims live in sharded maps (DashMap): a call locks one shard for the few
///   nanoseconds it touches one key, and calls on different keys mostly run in parallel;
/// * each worker's status and last heartbeat are one `AtomicU64` changed only by compare-and-swap,
///   so a heartbeat is a map read plus one CAS, and it can never be accepted by a worker the sweeper
///   is declaring dead;
/// * capacity is one atomic counter reserved by CAS before a worker is created, so the limit holds
///   under any race without a lock;
/// * `status()` loads an `Arc` to an immutable snapshot published by the last sweep (ArcSwap): it
///   never waits for anything.
///
/// Cloning an `InMemoryRegistry` is cheap and shares the same state (it is an `Arc` inside).
///
/// # What survives a restart
///
/// Only identity. Claims and workers live in this process's memory and die with it (a delivery
/// accepted but not finished is lost; GitHub does not redeliver on its own); use a shared backend
/// when that matters. Worker ids start at the clock's wall time in milliseconds since 2026-01-01
/// when the registry is made (and count up from there), so a restarted registry hands out no id,
/// and so no fencing token, that the previous process gave a container still running — as long
/// as that process created fewer workers than milliseconds passed between the two starts and the
/// wall clock did not step back. Ids reach [`WorkerId::MAX`] in the year 2583.
///
/// # Two surfaces
///
/// This type is the contract's surface: it implements [`WorkerRegistry`](crate::WorkerRegistry),
/// [`Maintenance`](crate::Maintenance) and [`Subscribe`](crate::Subscribe), with futures that are
/// already complete, and has no inherent method of the same names, so `registry.admit(..)` means
/// what it means on every backend. [`direct`](Self::direct) gives the same registry's synchronous
/// surface, [`Direct`], for code tied to this backend (see [the module](self)).
///
/// **Locking behaviour:** as [`Direct`]'s methods, which each trait method calls.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use worker_registry::{Admission, DeliveryId, HeartbeatAck, InMemoryRegistry, Target, WorkerRegistry, WorkerRegistryExt};
///
/// let registry = InMemoryRegistry::default();
/// let target = Target::new("octo/repo", 42).unwrap();
/// let delivery = DeliveryId::new("72d3162e-cc78-11e3-81ab-4c9367dc0958").unwrap();
///
/// let Ok(Admission::Assigned(a)) = registry.admit(&target, &delivery).await else { panic!() };
/// assert!(a.new); // spawn a container for worker `a.worker`
/// assert!(matches!(registry.admit(&target, &delivery).await, Ok(Admission::Duplicate(_))));
///
/// assert_eq!(registry.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));
/// registry.complete(&target, &delivery).await.unwrap();
///
/// // The same registry, synchronously:
/// assert!(matches!(registry.direct().admit(&target, &delivery), Admission::Duplicate(_)));
/// # }
/// ```
pub struct InMemoryRegistry<C: Clock = SystemClock> {
    direct: Direct<C>,
}

/// The synchronous surface of the in-memory registry: the state, and every call answered in
/// place, with no future (see [the module](self) for why it has a name of its own).
///
/// Each method that shares a name with a [`WorkerRegistry`](crate::WorkerRegistry) method has the
/// semantics documented there; what is described here is how this backend answers it: which locks
/// it takes, what it costs, and the result types, infallible where nothing can fail (`admit`
/// returns an [`Admission`](crate::Admission), not a `Result`). Reach it from an
/// [`InMemoryRegistry`] with [`InMemoryRegistry::direct`], or make one directly and wrap it
/// later with [`InMemoryRegistry::from`]; both views share one state.
///
/// Cloning a `Direct` is cheap and shares the same state (it is an `Arc` inside).
///
/// **Locking behaviour:** each call locks at most one shard of each map it touches, one at a time,
/// always in the order claims → targets → workers, and never calls out while holding one; `sweep()`
/// also takes a mutex that only serialises sweeps. `status()` and [`WorkerHandle::heartbeat`] take no
/// lock at all.
///
/// # Examples
///
/// ```
/// use worker_registry::{memory::Direct, Admission, DeliveryId, HeartbeatAck, Target};
///
/// let registry = Direct::default();
/// let target = Target::new("octo/repo", 42).unwrap();
/// let delivery = DeliveryId::new("72d3162e-cc78-11e3-81ab-4c9367dc0958").unwrap();
///
/// let Admission::Assigned(a) = registry.admit(&target, &delivery) else { panic!() };
/// assert!(a.new); // spawn a container for worker `a.worker`
/// assert!(matches!(registry.admit(&target, &delivery), Admission::Duplicate(_)));
///
/// assert_eq!(registry.heartbeat(a.worker), Ok(HeartbeatAck::Active));
/// registry.complete(&target, &delivery).unwrap();
/// ```
pub struct Direct<C: Clock = SystemClock> {
    pub(crate) inner: Arc<Inner<C>>,
}

impl<C: Clock> Clone for Direct<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Clock> Clone for InMemoryRegistry<C> {
    fn clone(&self) -> Self {
        Self {
            direct: self.direct.clone(),
        }
    }
}

impl<C: Clock> fmt::Debug for Direct<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Direct")
            .field("live_workers", &self.live_workers())
            .field("max_workers", &self.inner.config.max_workers())
            .finish_non_exhaustive()
    }
}

impl<C: Clock> fmt::Debug for InMemoryRegistry<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryRegistry")
            .field("live_workers", &self.direct.live_workers())
            .field("max_workers", &self.direct.inner.config.max_workers())
            .finish_non_exhaustive()
    }
}

/// Durations from the config, pre-converted to the milliseconds the state word stores.
pub(crate) struct Limits {
    pub(crate) timeout_ms: u64,
    pub(crate) startup_grace_ms: u64,
    pub(crate) claim_retention_ms: u64,
    pub(crate) dead_retention_ms: u64,
    pub(crate) suspect_grace_ms: u64,
    pub(crate) sweep_interval_ms: u64,
    pub(crate) max_in_flight_ms: u64,
    /// The longest any judgement the sweep makes waits: older stalls cannot matter any more.
    pub(crate) stall_horizon_ms: u64,
}

pub(crate) struct Inner<C> {
    pub(crate) config: RegistryConfig,
    pub(crate) limits: Limits,
    pub(crate) clock: C,
    /// The wall-clock time at the monotonic clock's origin (for display), a whole millisecond.
    pub(crate) wall_origin: SystemTime,
    /// `wall_origin` in milliseconds since the Unix epoch.
    pub(crate) wall_origin_ms: u64,
    pub(crate) workers: ShardMap<WorkerId, Arc<WorkerRecord>>,
    pub(crate) targets: ShardMap<Target, Arc<WorkerRecord>>,
    pub(crate) claims: ClaimTable,
    /// 1 when a worker holding in-flight claims died since the sweep last visited the claims.
    pub(crate) claims_due: AtomicUsize,
    /// When an in-flight claim can next become stuck or (unbound) released, in ms: the sweep
    /// visits the claims then, not before (unless a death makes them due).
    pub(crate) claims_next_check: AtomicU64,
    /// Non-dead workers, reserved before creation and released by whoever kills one.
    pub(crate) live: AtomicUsize,
    /// Bytes of payloads held, reserved when one is stored and given back when it leaves.
    pub(crate) payloads: Budget,
    pub(crate) next_id: AtomicU64,
    pub(crate) snapshot: SnapshotCell<StatusSnapshot>,
    pub(crate) sweep_lock: Mutex<SweepState>,
    /// Announces each new worker to the sweep's roster.
    pub(crate) newborns: sync::Sender<Arc<WorkerRecord>>,
    pub(crate) counters: Counters,
    pub(crate) events: EventHub,
    /// The waiting room (none when `max_waiting` is 0). Slow path only: see `waiting.rs`.
    pub(crate) room: Option<Mutex<Room>>,
    /// Targets waiting for capacity, as the room last counted them (a hint for `assign_at`).
    pub(crate) contenders: AtomicUsize,
    /// Deliveries parked in the room or being parked: counted by `park` under the room's mutex
    /// before it probes the claims, given back when the pair does not park or leaves the room.
    /// A bare `claim` that reads 0 under a claims-shard lock skips the room's mutex (see
    /// `claims.rs`); also the `waiting` gauge (exact once callers are quiet).
    pub(crate) waiting: AtomicUsize,
    /// Live spawned workers per repository owner (only with `max_workers_per_owner`).
    pub(crate) owner_live: ShardMap<String, usize>,
    /// Wakes the sweeper when a death promoted waiting deliveries (see `parking.rs`).
    pub(crate) wake: sync::Wake,
}

impl Default for InMemoryRegistry<SystemClock> {
    /// A registry with the default configuration and the system clock.
    fn default() -> Self {
        Self::new(RegistryConfig::default())
    }
}

impl InMemoryRegistry<SystemClock> {
    /// A registry on the system clock. The config is validated by its builder; see
    /// [`RegistryConfig::builder`].
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{InMemoryRegistry, RegistryConfig, WorkerRegistry};
    ///
    /// let registry = InMemoryRegistry::new(RegistryConfig::builder().max_workers(4).build().unwrap());
    /// assert_eq!(registry.config().max_workers(), 4);
    /// ```
    pub fn new(config: RegistryConfig) -> Self {
        Self::with_clock(config, SystemClock::new())
    }
}

impl<C: Clock> InMemoryRegistry<C> {
    /// A registry on the given clock (tests pass a [`ManualClock`](crate::ManualClock)).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{InMemoryRegistry, ManualClock, RegistryConfig, WorkerRegistry};
    ///
    /// let clock = ManualClock::new();
    /// let registry = InMemoryRegistry::with_clock(RegistryConfig::default(), clock.clone());
    /// assert_eq!(registry.status().workers.len(), 0);
    /// ```
    pub fn with_clock(config: RegistryConfig, clock: C) -> Self {
        Self {
            direct: Direct::with_clock(config, clock),
        }
    }

    /// The synchronous surface of this registry, sharing its state: the same calls answered in
    /// place, for code tied to the in-memory backend (see [`Direct`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Admission, DeliveryId, InMemoryRegistry, Target, WorkerRegistryExt};
    ///
    /// let registry = InMemoryRegistry::default();
    /// let direct = registry.direct();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
    /// assert!(matches!(direct.admit(&t, &d), Admission::Assigned(_)));
    /// assert_eq!(direct.live_workers(), 1);
    /// ```
    #[inline]
    pub fn direct(&self) -> &Direct<C> {
        &self.direct
    }

    /// This registry's synchronous surface, by value (a clone of the shared state's handle).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{memory::Direct, InMemoryRegistry};
    ///
    /// let direct: Direct = InMemoryRegistry::default().into_direct();
    /// assert_eq!(direct.live_workers(), 0);
    /// ```
    pub fn into_direct(self) -> Direct<C> {
        self.direct
    }
}

impl<C: Clock> From<Direct<C>> for InMemoryRegistry<C> {
    /// The contract's surface over the same state.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{memory::Direct, InMemoryRegistry, WorkerRegistry};
    ///
    /// let direct = Direct::default();
    /// direct.register().unwrap();
    /// let registry = InMemoryRegistry::from(direct.clone());
    /// assert_eq!(registry.stats().live_workers, 1);
    /// ```
    fn from(direct: Direct<C>) -> Self {
        Self { direct }
    }
}

impl Default for Direct<SystemClock> {
    /// A registry with the default configuration and the system clock.
    fn default() -> Self {
        Self::new(RegistryConfig::default())
    }
}

impl Direct<SystemClock> {
    /// A registry on the system clock. The config is validated by its builder; see
    /// [`RegistryConfig::builder`].
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{memory::Direct, RegistryConfig};
    ///
    /// let registry = Direct::new(RegistryConfig::builder().max_workers(4).build().unwrap());
    /// assert_eq!(registry.config().max_workers(), 4);
    /// ```
    pub fn new(config: RegistryConfig) -> Self {
        Self::with_clock(config, SystemClock::new())
    }
}

impl<C: Clock> Direct<C> {
    /// A registry on the given clock (tests pass a [`ManualClock`](crate::ManualClock)).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{memory::Direct, ManualClock, RegistryConfig};
    ///
    /// let clock = ManualClock::new();
    /// let registry = Direct::with_clock(RegistryConfig::default(), clock.clone());
    /// assert_eq!(registry.live_workers(), 0);
    /// ```
    pub fn with_clock(config: RegistryConfig, clock: C) -> Self {
        let ms = |d: Duration| millis(d);
        let limits = Limits {
            timeout_ms: ms(config.heartbeat_timeout()),
            startup_grace_ms: ms(config.startup_grace()),
            claim_retention_ms: ms(config.claim_retention()),
            dead_retention_ms: ms(config.dead_retention()),
            suspect_grace_ms: ms(config.suspect_grace()),
            sweep_interval_ms: ms(config.sweep_interval()),
            max_in_flight_ms: ms(config.max_in_flight()),
            stall_horizon_ms: ms(config.heartbeat_timeout() + config.startup_grace())
                .max(ms(config.max_in_flight()))
                .max(ms(config.suspect_grace())),
        };
        // Whole milliseconds, so that `wall_at` and a duplicate's `since` (an addition to
        // `wall_origin_ms`) name the same instant.
        let wall_origin_ms = clock
            .wall()
            .checked_sub(clock.now())
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, millis);
        let wall_origin = SystemTime::UNIX_EPOCH + Duration::from_millis(wall_origin_ms);
        let shards = config.shards();
        let (roster, newborns) = Roster::new();
        let snapshot = StatusSnapshot::empty(config.max_workers(), clock.wall());
        Self {
            inner: Arc::new(Inner {
                limits,
                wall_origin,
                wall_origin_ms,
                workers: ShardMap::new(shards),
                targets: ShardMap::new(shards),
                claims: ClaimTable::new(shards),
                claims_due: AtomicUsize::new(0),
                claims_next_check: AtomicU64::new(0),
                live: AtomicUsize::new(0),
                payloads: Budget::new(config.payload_budget()),
                next_id: AtomicU64::new(assignment::first_id(clock.wall())),
                snapshot: SnapshotCell::new(snapshot),
                sweep_lock: Mutex::new(SweepState {
                    version: 0,
                    stall: StallWatch::new(),
                    roster,
                }),
                newborns,
                counters: Counters::new(),
                events: EventHub::new(),
                room: (config.max_waiting() > 0).then(|| Mutex::new(Room::default())),
                contenders: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                owner_live: ShardMap::new(shards),
                wake: sync::Wake::new(),
                config,
                clock,
            }),
        }
    }

    /// The configuration this registry runs with.
    pub fn config(&self) -> &RegistryConfig {
        &self.inner.config
    }

    /// The registry's clock.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    #[inline]
    pub(crate) fn now_ms(&self) -> u64 {
        self.inner.clock.now_millis()
    }

    pub(crate) fn wall_at(&self, ms: u64) -> SystemTime {
        self.inner.wall_origin + Duration::from_millis(ms)
    }

    /// [`wall_at`](Self::wall_at) in milliseconds since the Unix epoch (one addition: what a
    /// duplicate's answer carries).
    #[inline]
    pub(crate) fn wall_ms_at(&self, ms: u64) -> u64 {
        self.inner.wall_origin_ms.saturating_add(ms)
    }

    /// Live (non-dead) workers right now, as counted by the capacity counter.
    ///
    /// **Locking behaviour:** one atomic load.
    pub fn live_workers(&self) -> usize {
        // Acquire: pairs with the AcqRel reservations/releases; a reader sees a count no older than
        // the last transition it synchronised with.
        self.inner.live.load(Ordering::Acquire)
    }

    /// The latest published snapshot of every worker (see [`WorkerRegistry::status`]): as old as
    /// the last [`sweep`](Self::sweep).
    ///
    /// [`WorkerRegistry::status`]: crate::WorkerRegistry::status
    ///
    /// **Locking behaviour:** no lock: one `ArcSwap` load and a reference-count increment (readers
    /// on several threads share that count's cache line; see [`status_with`](Self::status_with)).
    pub fn status(&self) -> std::sync::Arc<StatusSnapshot> {
        self.inner.snapshot.load()
    }

    /// Runs `f` on the latest published snapshot (the one [`status`](Self::status) would return)
    /// without taking a reference to it: the cheapest way to read a few fields, such as counts or
    /// capacity, on a hot path.
    ///
    /// **Locking behaviour:** no lock and no shared write: the snapshot is pinned by a per-thread
    /// slot for the duration of `f` (so keep `f` short, and clone what must outlive it).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeliveryId, memory::Direct, Target};
    ///
    /// let registry = Direct::default();
    /// registry.admit(&Target::new("o/r", 1).unwrap(), &DeliveryId::new("d").unwrap());
    /// registry.sweep();
    /// let (used, limit) = registry.status_with(|s| (s.capacity.used, s.capacity.limit));
    /// assert_eq!((used, limit), (1, registry.config().max_workers()));
    /// ```
    #[inline]
    pub fn status_with<R>(&self, f: impl FnOnce(&StatusSnapshot) -> R) -> R {
        self.inner.snapshot.with(f)
    }

    /// The registry's cumulative counters and gauges (see [`WorkerRegistry::stats`]).
    ///
    /// **Locking behaviour:** no lock: sums striped atomic counters and loads the snapshot.
    ///
    /// [`WorkerRegistry::stats`]: crate::WorkerRegistry::stats
    pub fn stats(&self) -> Stats {
        let inner = &*self.inner;
        let snapshot_age =
            self.status_with(|s| inner.clock.now().saturating_sub(s.taken_at_monotonic));
        inner.counters.read(Gauges {
            live_workers: self.live_workers(),
            retained_claims: inner.claims.retained(),
            events_missed: self.events_missed(),
            snapshot_age,
            // Relaxed: a gauge.
            waiting: inner.waiting.load(Ordering::Relaxed),
            shard_duplicates: inner.claims.duplicates(),
            payloads_held: inner.payloads.count(),
            payload_bytes_held: inner.payloads.bytes(),
        })
    }

    /// Lifecycle events dropped for subscribers that fell behind, summed over all of them.
    ///
    /// **Locking behaviour:** no lock: one atomic load.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(worker_registry::memory::Direct::default().events_missed(), 0);
    /// ```
    pub fn events_missed(&self) -> u64 {
        #[cfg(feature = "tokio")]
        {
            self.inner.events.sender.missed()
        }
        #[cfg(not(feature = "tokio"))]
        {
            0
        }
    }

    /// Subscribes to lifecycle events published from now on (see
    /// [`Subscribe`](crate::Subscribe)).
    ///
    /// **Locking behaviour:** takes the event channel's internal lock once. Publishing takes it
    /// once per event, only on the paths that publish (worker creation, drain, suspicion, death,
    /// a stuck delivery, a sweep that released work) and only after someone subscribed; duplicate
    /// detection, sticky assignment and heartbeats never touch it.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeadReason, Event, memory::Direct};
    ///
    /// let registry = Direct::default();
    /// let mut events = registry.subscribe();
    /// let w = registry.register().unwrap();
    /// w.deregister().unwrap();
    /// assert!(matches!(events.try_recv(), Ok(Some(Event::WorkerCreated { .. }))));
    /// assert_eq!(
    ///     events.try_recv(),
    ///     Ok(Some(Event::WorkerDied { worker: w.id(), target: None, reason: DeadReason::Deregistered }))
    /// );
    /// ```
    #[cfg(feature = "tokio")]
    pub fn subscribe(&self) -> crate::Subscription {
        self.inner.events.sender.subscribe()
    }

    /// What the registry holds unfinished now (see [`WorkerRegistry::audit`]): claims in flight
    /// (those of dead workers, not yet swept, count as released), promoted deliveries awaiting the
    /// next sweep's report, the waiting room's count and the live workers.
    ///
    /// **Locking behaviour:** locks each claims shard in turn, visiting its in-flight claims
    /// (proportional to the claims in flight), then the waiting room's lock once.
    ///
    /// [`WorkerRegistry::audit`]: crate::WorkerRegistry::audit
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{memory::Direct, DeliveryId, Target};
    ///
    /// let registry = Direct::default();
    /// registry.admit(&Target::new("o/r", 1).unwrap(), &DeliveryId::new("d").unwrap());
    /// assert_eq!(registry.audit().in_flight, 1);
    /// ```
    pub fn audit(&self) -> crate::Audit {
        let inner = &*self.inner;
        let (in_flight, released) = inner.claims.by_holder();
        let handover = inner
            .room
            .as_ref()
            .map_or(0, |room| sync::lock(room).handover.len());
        crate::Audit {
            live_workers: self.live_workers() as u64,
            in_flight: in_flight as u64,
            released: (released + handover) as u64,
            // Relaxed: a gauge, exact once callers are quiet.
            waiting: inner.waiting.load(Ordering::Relaxed) as u64,
        }
    }

    /// Number of claims in the map right now (in flight, retained, or released but not yet swept).
    ///
    /// **Locking behaviour:** locks each claims shard in turn.
    pub fn claim_count(&self) -> usize {
        self.inner.claims.counts().1
    }

    pub(crate) fn lock_sweep(&self) -> sync::MutexGuard<'_, SweepState> {
        sync::lock(&self.inner.sweep_lock)
    }
}
