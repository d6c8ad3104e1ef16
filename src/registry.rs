//! [`Registry`]: the in-memory worker registry.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::claim::{AlreadyClaimed, Claim, ClaimKey, ClaimKeyRef, ClaimState, Standing};
use crate::clock::{millis, Clock, SystemClock};
use crate::config::RegistryConfig;
use crate::error::RegistryError;
use crate::events::EventHub;
use crate::ids::{EventId, Target, WorkerId};
use crate::outcome::{Admission, AssignOutcome, Assignment, ClaimOutcome, HeartbeatAck, Rejection};
use crate::snapshot::StatusSnapshot;
use crate::state::{self, DeadReason, IsDead, Status, Word};
use crate::stats::{Counters, Stats};
use crate::sync::{self, Arc, AtomicU64, AtomicUsize, Mutex, Op, Ordering, ShardMap, SnapshotCell};
use crate::worker::{WorkerInfo, WorkerRecord};

/// LOOM TWINS ONLY: deliberately broken variants, compiled only under `cfg(worker_registry_loom)`.
#[cfg(worker_registry_loom)]
pub(crate) mod faults;
#[cfg(worker_registry_loom)]
use faults::Fault;

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
/// Cloning a `Registry` is cheap and shares the same state (it is an `Arc` inside).
///
/// **Locking behaviour:** each call locks at most one shard of each map it touches, one at a time,
/// always in the order claims → targets → workers, and never calls out while holding one; `sweep()`
/// also takes a mutex that only serialises sweeps. `status()` and [`WorkerHandle::heartbeat`] take no
/// lock at all.
///
/// # Examples
///
/// ```
/// use worker_registry::{Admission, EventId, HeartbeatAck, Registry, Target};
///
/// let registry = Registry::default();
/// let target = Target::new("octo/repo", 42).unwrap();
/// let delivery = EventId::new("72d3162e-cc78-11e3-81ab-4c9367dc0958").unwrap();
///
/// let Admission::Assigned(a) = registry.admit(&target, &delivery) else { panic!() };
/// assert!(a.new); // spawn a container for worker `a.worker`
/// assert!(matches!(registry.admit(&target, &delivery), Admission::Duplicate(_)));
///
/// assert_eq!(registry.heartbeat(a.worker), Ok(HeartbeatAck::Active));
/// registry.complete(&target, &delivery).unwrap();
/// ```
pub struct Registry<C: Clock = SystemClock> {
    pub(crate) inner: Arc<Inner<C>>,
}

impl<C: Clock> Clone for Registry<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Clock> fmt::Debug for Registry<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("live_workers", &self.live_workers())
            .field("max_workers", &self.inner.config.max_workers)
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
}

pub(crate) struct Inner<C> {
    pub(crate) config: RegistryConfig,
    pub(crate) limits: Limits,
    pub(crate) clock: C,
    /// The wall-clock time at the monotonic clock's origin (for display).
    pub(crate) wall_origin: SystemTime,
    pub(crate) workers: ShardMap<WorkerId, Arc<WorkerRecord>>,
    pub(crate) targets: ShardMap<Target, Arc<WorkerRecord>>,
    pub(crate) claims: ShardMap<ClaimKey, Claim>,
    /// Non-dead workers, reserved before creation and released by whoever kills one.
    pub(crate) live: AtomicUsize,
    /// Completed claims in the claims map.
    pub(crate) retained: AtomicUsize,
    pub(crate) next_id: AtomicU64,
    pub(crate) snapshot: SnapshotCell<StatusSnapshot>,
    pub(crate) sweep_lock: Mutex<u64>,
    pub(crate) counters: Counters,
    pub(crate) events: EventHub,
    /// LOOM TWINS ONLY: the deliberate bugs injected into this registry.
    #[cfg(worker_registry_loom)]
    pub(crate) faults: faults::Faults,
}

impl Default for Registry<SystemClock> {
    /// A registry with the default configuration and the system clock.
    fn default() -> Self {
        Self::new(RegistryConfig::default())
    }
}

impl Registry<SystemClock> {
    /// A registry on the system clock. The config is validated by its builder; see
    /// [`RegistryConfig::builder`].
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Registry, RegistryConfig};
    ///
    /// let registry = Registry::new(RegistryConfig::builder().max_workers(4).build().unwrap());
    /// assert_eq!(registry.config().max_workers, 4);
    /// ```
    pub fn new(config: RegistryConfig) -> Self {
        Self::with_clock(config, SystemClock::new())
    }
}

impl<C: Clock> Registry<C> {
    /// A registry on the given clock (tests pass a [`ManualClock`](crate::ManualClock)).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{ManualClock, Registry, RegistryConfig};
    ///
    /// let clock = ManualClock::new();
    /// let registry = Registry::with_clock(RegistryConfig::default(), clock.clone());
    /// assert_eq!(registry.live_workers(), 0);
    /// ```
    pub fn with_clock(config: RegistryConfig, clock: C) -> Self {
        let ms = |d: Duration| millis(d);
        let limits = Limits {
            timeout_ms: ms(config.heartbeat_timeout()),
            startup_grace_ms: ms(config.startup_grace),
            claim_retention_ms: ms(config.claim_retention),
            dead_retention_ms: ms(config.dead_retention),
            suspect_grace_ms: ms(config.suspect_grace),
        };
        let wall_origin = clock
            .wall()
            .checked_sub(clock.now())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let shards = config.shards;
        let snapshot = StatusSnapshot::empty(config.max_workers, clock.wall());
        Self {
            inner: Arc::new(Inner {
                limits,
                wall_origin,
                workers: ShardMap::new(shards),
                targets: ShardMap::new(shards),
                claims: ShardMap::new(shards),
                live: AtomicUsize::new(0),
                retained: AtomicUsize::new(0),
                next_id: AtomicU64::new(1),
                snapshot: SnapshotCell::new(snapshot),
                sweep_lock: Mutex::new(0),
                counters: Counters::new(),
                events: EventHub::new(),
                #[cfg(worker_registry_loom)]
                faults: faults::Faults::default(),
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
        millis(self.inner.clock.now())
    }

    pub(crate) fn wall_at(&self, ms: u64) -> SystemTime {
        self.inner.wall_origin + Duration::from_millis(ms)
    }

    /// Live (non-dead) workers right now, as counted by the capacity counter.
    ///
    /// **Locking behaviour:** one atomic load.
    pub fn live_workers(&self) -> usize {
        // Acquire: pairs with the AcqRel reservations/releases; a reader sees a count no older than
        // the last transition it synchronised with.
        self.inner.live.load(Ordering::Acquire)
    }

    // ---- claims (AC2) ---------------------------------------------------------------------------

    /// Records that this (target, delivery) is being handled, unless it already is (AC2).
    ///
    /// A bare claim is bound to no worker; [`admit`](Self::admit) claims and assigns in one step and is
    /// what a router normally calls. An unbound claim that is neither completed nor released within
    /// the heartbeat timeout is released (as if its worker had died), so nothing is lost.
    ///
    /// **Locking behaviour:** a duplicate is detected under one claims-shard read lock, without
    /// allocating; a new claim takes that shard's write lock once (the entry API: no window between
    /// the check and the insert).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{ClaimOutcome, EventId, Registry, Target};
    ///
    /// let registry = Registry::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), EventId::new("d-1").unwrap());
    /// assert_eq!(registry.claim(&t, &e), ClaimOutcome::Claimed);
    /// assert!(matches!(registry.claim(&t, &e), ClaimOutcome::AlreadyClaimed(_)));
    /// ```
    pub fn claim(&self, target: &Target, event: &EventId) -> ClaimOutcome {
        let now = self.now_ms();
        if let Some(dup) = self.live_claim(target, event, now) {
            self.inner.counters.duplicates.inc();
            return ClaimOutcome::AlreadyClaimed(dup);
        }
        #[cfg(worker_registry_loom)] // LOOM TWIN ONLY: check-then-insert, see `faults`.
        if self.inner.faults.on(Fault::ClaimCheckThenInsert) {
            return self.claim_check_then_insert(target, event, now);
        }
        let key = ClaimKey {
            target: target.clone(),
            event: event.clone(),
        };
        self.inner.claims.update(key, |slot| {
            if let Some(existing) = slot {
                if let Some(dup) = self.duplicate_of(existing, now) {
                    self.inner.counters.duplicates.inc();
                    return (Op::Keep, ClaimOutcome::AlreadyClaimed(dup));
                }
                self.forget_if_completed(existing);
            }
            let claim = Claim {
                holder: None,
                claimed_at: now,
                completed_at: None,
            };
            (Op::Put(claim), ClaimOutcome::Claimed)
        })
    }

    /// Removes an in-flight claim (for example when the router could not dispatch the event), so a
    /// redelivery is admitted again.
    ///
    /// **Locking behaviour:** one claims-shard write lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{ClaimOutcome, EventId, Registry, Target};
    ///
    /// let registry = Registry::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), EventId::new("d-1").unwrap());
    /// registry.claim(&t, &e);
    /// registry.release(&t, &e).unwrap();
    /// assert_eq!(registry.claim(&t, &e), ClaimOutcome::Claimed);
    /// ```
    pub fn release(&self, target: &Target, event: &EventId) -> Result<(), RegistryError> {
        let key = ClaimKey {
            target: target.clone(),
            event: event.clone(),
        };
        self.inner.claims.update(key, |slot| match slot {
            None => (
                Op::Keep,
                Err(RegistryError::UnknownClaim {
                    target: target.clone(),
                    event: event.clone(),
                }),
            ),
            Some(c) if c.completed_at.is_some() => (
                Op::Keep,
                Err(RegistryError::ClaimCompleted {
                    target: target.clone(),
                    event: event.clone(),
                }),
            ),
            Some(_) => (Op::Remove, Ok(())),
        })
    }

    /// Marks a claim completed. It is then retained for `claim_retention` (bounded by
    /// `max_retained_claims`, oldest evicted first), so a late redelivery is still recognised.
    ///
    /// Idempotent for a completed claim. Refused with [`RegistryError::ClaimReleased`] if its worker
    /// died first (the event was released for re-dispatch; exactly one of the two wins).
    ///
    /// **Locking behaviour:** one claims-shard write lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Admission, ClaimState, EventId, Registry, Target};
    ///
    /// let registry = Registry::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), EventId::new("d-1").unwrap());
    /// registry.admit(&t, &e);
    /// registry.complete(&t, &e).unwrap();
    /// let Admission::Duplicate(d) = registry.admit(&t, &e) else { panic!() };
    /// assert_eq!(d.state, ClaimState::Completed);
    /// ```
    pub fn complete(&self, target: &Target, event: &EventId) -> Result<(), RegistryError> {
        self.complete_inner(target, event, None)
    }

    /// Like [`complete`](Self::complete), but fenced: only `worker`, the claim's holder, may complete
    /// it. A worker that was declared dead and whose event was re-admitted onto another worker gets
    /// [`RegistryError::NotHolder`] instead of completing the new worker's claim. Workers should
    /// complete through this (or [`WorkerHandle::complete`]).
    ///
    /// **Locking behaviour:** one claims-shard write lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Admission, EventId, Registry, RegistryError, Target, WorkerId};
    ///
    /// let registry = Registry::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), EventId::new("d-1").unwrap());
    /// let Admission::Assigned(a) = registry.admit(&t, &e) else { panic!() };
    /// let stranger = WorkerId::new(a.worker.get() + 1);
    /// assert!(matches!(registry.complete_by(stranger, &t, &e), Err(RegistryError::NotHolder { .. })));
    /// registry.complete_by(a.worker, &t, &e).unwrap();
    /// ```
    pub fn complete_by(
        &self,
        worker: WorkerId,
        target: &Target,
        event: &EventId,
    ) -> Result<(), RegistryError> {
        self.complete_inner(target, event, Some(worker))
    }

    fn complete_inner(
        &self,
        target: &Target,
        event: &EventId,
        by: Option<WorkerId>,
    ) -> Result<(), RegistryError> {
        let now = self.now_ms();
        #[cfg(worker_registry_loom)] // LOOM TWIN ONLY: check-then-write, see `faults`.
        if self.inner.faults.on(Fault::CompleteCheckThenWrite) {
            return self.complete_check_then_write(target, event, now);
        }
        let limits = &self.inner.limits;
        let unknown = || RegistryError::UnknownClaim {
            target: target.clone(),
            event: event.clone(),
        };
        // Looked up by reference (no key clone): completing never inserts.
        let key: &dyn ClaimKeyRef = &(target, event);
        let res = self
            .inner
            .claims
            .get_mut_with(key, |c| {
                let holder = c.holder.as_ref().map(|h| h.id);
                if let Some(worker) = by.filter(|w| holder != Some(*w)) {
                    return Err(RegistryError::NotHolder {
                        target: target.clone(),
                        event: event.clone(),
                        holder,
                        worker,
                    });
                }
                match c.standing(now, limits.claim_retention_ms, limits.timeout_ms) {
                    Standing::Completed => Ok(false),
                    Standing::InFlight => {
                        c.completed_at = Some(now);
                        // AcqRel: the count gates eviction; pairs with the sweeper's reads.
                        self.inner.retained.fetch_add(1, Ordering::AcqRel);
                        Ok(true)
                    }
                    Standing::Released => Err(RegistryError::ClaimReleased {
                        target: target.clone(),
                        event: event.clone(),
                        holder,
                    }),
                    Standing::Expired => Err(unknown()),
                }
            })
            .unwrap_or_else(|| Err(unknown()));
        if let Ok(true) = res {
            self.inner.counters.claims_completed.inc();
            self.evict_if_far_over_limit(now);
        }
        res.map(|_| ())
    }

    /// The live claim on this pair, if any, looked up without allocating.
    #[inline]
    fn live_claim(&self, target: &Target, event: &EventId, now: u64) -> Option<AlreadyClaimed> {
        let key: &dyn ClaimKeyRef = &(target, event);
        self.inner
            .claims
            .get_with(key, |c| self.duplicate_of(c, now))
            .flatten()
    }

    /// If `c` blocks a new delivery at `now`, the answer to give.
    #[inline]
    fn duplicate_of(&self, c: &Claim, now: u64) -> Option<AlreadyClaimed> {
        let limits = &self.inner.limits;
        let state = match c.standing(now, limits.claim_retention_ms, limits.timeout_ms) {
            Standing::InFlight => ClaimState::InFlight,
            Standing::Completed => ClaimState::Completed,
            Standing::Released | Standing::Expired => return None,
        };
        Some(AlreadyClaimed {
            holder: c.holder.as_ref().map(|h| h.id),
            since: self.wall_at(c.claimed_at),
            state,
        })
    }

    /// A completed claim is about to be replaced: it no longer counts as retained.
    fn forget_if_completed(&self, c: &Claim) {
        if c.completed_at.is_some() {
            // AcqRel: see `complete`.
            self.inner.retained.fetch_sub(1, Ordering::AcqRel);
        }
    }

    // ---- assignment (AC3) -----------------------------------------------------------------------

    /// Places `target` on a worker (AC3): its existing worker while that one is active, otherwise a
    /// new worker if fewer than `max_workers` are alive.
    ///
    /// **Locking behaviour:** the sticky case is one targets-shard read lock and one CAS on the
    /// worker's state word; creating a worker takes that targets shard's write lock and then one
    /// workers-shard write lock. Capacity is reserved by CAS on one counter, never a lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{AssignOutcome, Registry, RegistryConfig, Rejection, Target};
    ///
    /// let registry = Registry::new(RegistryConfig::builder().max_workers(1).build().unwrap());
    /// let a = Target::new("o/a", 1).unwrap();
    /// let AssignOutcome::Assigned(first) = registry.assign(&a) else { panic!() };
    /// let AssignOutcome::Assigned(again) = registry.assign(&a) else { panic!() };
    /// assert_eq!((first.worker, again.new), (again.worker, false));
    /// assert_eq!(
    ///     registry.assign(&Target::new("o/b", 1).unwrap()),
    ///     AssignOutcome::Rejected(Rejection::CapacityFull { limit: 1 })
    /// );
    /// ```
    pub fn assign(&self, target: &Target) -> AssignOutcome {
        let now = self.now_ms();
        match self.assign_at(target, now, false) {
            Ok((a, _)) => AssignOutcome::Assigned(a),
            Err(r) => AssignOutcome::Rejected(r),
        }
    }

    /// Claims the delivery and places its target in one step: what a router calls per webhook.
    ///
    /// * a redelivery of an in-flight or recently completed (target, delivery) is a
    ///   [`Admission::Duplicate`], with the worker holding it;
    /// * otherwise the target is assigned as by [`assign`](Self::assign), and the claim is recorded,
    ///   held by that worker, in the same critical section;
    /// * if assignment is rejected, **no claim is left behind**: the redelivery can be admitted later.
    ///
    /// **Locking behaviour:** a duplicate is one claims-shard read lock, no allocation. A new delivery
    /// holds its claims-shard write lock while it assigns (targets shard, then workers shard).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Admission, EventId, Registry, Target};
    ///
    /// let registry = Registry::default();
    /// let t = Target::new("o/r", 1).unwrap();
    /// let Admission::Assigned(first) = registry.admit(&t, &EventId::new("a").unwrap()) else { panic!() };
    /// let Admission::Assigned(second) = registry.admit(&t, &EventId::new("b").unwrap()) else { panic!() };
    /// assert_eq!(first.worker, second.worker);
    /// assert!(second.generation > first.generation);
    /// ```
    pub fn admit(&self, target: &Target, event: &EventId) -> Admission {
        let now = self.now_ms();
        if let Some(dup) = self.live_claim(target, event, now) {
            self.inner.counters.duplicates.inc();
            return Admission::Duplicate(dup);
        }
        #[cfg(worker_registry_loom)] // LOOM TWIN ONLY: check-then-insert, see `faults`.
        if self.inner.faults.on(Fault::ClaimCheckThenInsert) {
            return self.admit_check_then_insert(target, event, now);
        }
        let key = ClaimKey {
            target: target.clone(),
            event: event.clone(),
        };
        self.inner.claims.update(key, |slot| {
            if let Some(existing) = &slot {
                if let Some(dup) = self.duplicate_of(existing, now) {
                    self.inner.counters.duplicates.inc();
                    return (Op::Keep, Admission::Duplicate(dup));
                }
            }
            match self.assign_at(target, now, true) {
                Ok((assignment, holder)) => {
                    if let Some(existing) = &slot {
                        self.forget_if_completed(existing);
                    }
                    let claim = Claim {
                        holder,
                        claimed_at: now,
                        completed_at: None,
                    };
                    (Op::Put(claim), Admission::Assigned(assignment))
                }
                // A released or expired claim stays as it was (it blocks nothing, and the sweeper
                // still reports it); a vacant slot stays vacant.
                Err(rejection) => (Op::Keep, Admission::Rejected(rejection)),
            }
        })
    }

    /// Assigns `target` at `now`; with `want_holder`, also returns the worker record for a claim.
    fn assign_at(
        &self,
        target: &Target,
        now: u64,
        want_holder: bool,
    ) -> Result<(Assignment, Option<Arc<WorkerRecord>>), Rejection> {
        let inner = &*self.inner;
        // Fast path: the target has a worker; try to assign onto it under the shard read lock.
        let fast = inner.targets.get_with(target, |rec| {
            Self::assign_existing(rec, want_holder).map_err(|w| (w, rec.id))
        });
        let r = match fast {
            Some(Ok(found)) => Ok(found),
            Some(Err((w, id))) if !w.is_dead() => Err(Rejection::TargetDraining { worker: id }),
            // LOOM TWIN ONLY: create and map outside the lookup's lock, see `faults`.
            #[cfg(worker_registry_loom)]
            _ if inner.faults.on(Fault::TargetCheckThenInsert) => {
                self.assign_check_then_insert(target, now, want_holder)
            }
            // No worker, or a dead one not yet unmapped: decide under the shard's write lock.
            _ => inner.targets.update(target.clone(), |slot| {
                if let Some(rec) = &slot {
                    match Self::assign_existing(rec, want_holder) {
                        Ok(found) => return (Op::Keep, Ok(found)),
                        Err(w) if !w.is_dead() => {
                            return (Op::Keep, Err(Rejection::TargetDraining { worker: rec.id }))
                        }
                        Err(_) => {}
                    }
                }
                // Vacant, or mapped to a dead worker: create one if capacity allows.
                match self.create_worker(Some(target.clone()), now, true) {
                    Ok(rec) => {
                        let a = Assignment {
                            worker: rec.id,
                            generation: rec.generation(),
                            new: true,
                        };
                        let holder = want_holder.then(|| rec.clone());
                        (Op::Put(rec), Ok((a, holder)))
                    }
                    Err(_) => {
                        let op = if slot.is_some() { Op::Remove } else { Op::Keep };
                        (
                            op,
                            Err(Rejection::CapacityFull {
                                limit: inner.config.max_workers,
                            }),
                        )
                    }
                }
            }),
        };
        let c = &inner.counters;
        match &r {
            Ok((a, _)) if a.new => c.admitted_new.inc(),
            Ok(_) => c.admitted_sticky.inc(),
            Err(Rejection::CapacityFull { .. }) => c.rejected_capacity.inc(),
            Err(Rejection::TargetDraining { .. }) => c.rejected_draining.inc(),
        }
        r
    }

    /// One CAS: an active worker becomes busy with one more assignment; anything else is refused
    /// with the word seen.
    #[inline]
    fn assign_existing(
        rec: &Arc<WorkerRecord>,
        want_holder: bool,
    ) -> Result<(Assignment, Option<Arc<WorkerRecord>>), Word> {
        rec.state.transition(state::assign)?;
        let a = Assignment {
            worker: rec.id,
            generation: rec.next_generation(),
            new: false,
        };
        Ok((a, want_holder.then(|| rec.clone())))
    }

    /// Reserves capacity and creates (and indexes) a worker record.
    fn create_worker(
        &self,
        target: Option<Target>,
        now: u64,
        assigned: bool,
    ) -> Result<Arc<WorkerRecord>, RegistryError> {
        let inner = &*self.inner;
        let limit = inner.config.max_workers;
        // LOOM TWIN ONLY: `checked` means a separate load already compared, see `faults`.
        #[cfg(worker_registry_loom)]
        let checked = self.capacity_check_only(limit)?;
        #[cfg(not(worker_registry_loom))]
        let checked = false;
        // AcqRel: the reservation must be totally ordered with every other reservation and release
        // on this one counter (which any ordering gives for a RMW); Acquire/Release additionally
        // makes a released slot's death visible to the thread that reuses it.
        inner
            .live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (checked || n < limit).then_some(n + 1)
            })
            .map_err(|_| RegistryError::CapacityFull { limit })?;
        // Relaxed: ids need only be unique, which the RMW guarantees; nothing is published.
        let raw = inner.next_id.fetch_add(1, Ordering::Relaxed);
        if raw > WorkerId::MAX {
            // AcqRel: returns the reservation (see above).
            inner.live.fetch_sub(1, Ordering::AcqRel);
            return Err(RegistryError::IdsExhausted);
        }
        let id = WorkerId::new(raw);
        let rec = Arc::new(WorkerRecord::new(
            id,
            target,
            now,
            inner.clock.wall(),
            assigned,
        ));
        #[cfg(worker_registry_loom)] // LOOM TWIN ONLY: load-then-store transitions, see `faults`.
        self.fault_prepare_record(&rec);
        inner.events.created(&rec);
        inner.workers.insert(id, rec.clone());
        Ok(rec)
    }

    /// Bookkeeping after the CAS that killed `rec` (called exactly once, by that CAS's winner): free
    /// the capacity slot, unmap the target, count the death.
    pub(crate) fn on_death(&self, rec: &Arc<WorkerRecord>, reason: DeadReason, now: u64) {
        rec.record_death(now);
        // AcqRel: see `create_worker`.
        self.inner.live.fetch_sub(1, Ordering::AcqRel);
        if let Some(t) = &rec.target {
            self.inner
                .targets
                .remove_if(t, |mapped| Arc::ptr_eq(mapped, rec));
        }
        self.inner.counters.death(reason).inc();
        self.inner.events.died(rec, reason);
    }

    // ---- workers: heartbeat, activity, register, drain (AC1, AC4, AC5) ---------------------------

    /// Records a heartbeat (AC4). Tells a live worker whether it is active or draining; refuses a dead
    /// one (it has been fenced: its target may already be on another worker) and an unknown id.
    ///
    /// **Locking behaviour:** one workers-shard read lock and one CAS; no allocation.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{HeartbeatAck, Registry};
    ///
    /// let registry = Registry::default();
    /// let w = registry.register().unwrap();
    /// assert_eq!(registry.heartbeat(w.id()), Ok(HeartbeatAck::Active));
    /// ```
    #[inline]
    pub fn heartbeat(&self, id: WorkerId) -> Result<HeartbeatAck, RegistryError> {
        let now = self.now_ms();
        let r = self
            .inner
            .workers
            .get_with(&id, |rec| Self::beat(rec, now))
            .unwrap_or(Err(RegistryError::UnknownWorker { id }));
        self.count_beat(&r);
        r
    }

    #[inline]
    fn beat(rec: &WorkerRecord, now: u64) -> Result<HeartbeatAck, RegistryError> {
        match rec.state.transition(|w| state::beat(w, now)) {
            Ok((_, w)) if w.is_active() => Ok(HeartbeatAck::Active),
            Ok(_) => Ok(HeartbeatAck::Draining),
            Err(IsDead(w)) => Err(dead_error(rec.id, w)),
        }
    }

    #[inline]
    fn count_beat(&self, r: &Result<HeartbeatAck, RegistryError>) {
        let c = &self.inner.counters;
        if r.is_ok() {
            c.heartbeats.inc();
        } else {
            c.heartbeats_refused.inc();
        }
    }

    fn record(&self, id: WorkerId) -> Result<Arc<WorkerRecord>, RegistryError> {
        self.inner
            .workers
            .get_with(&id, Arc::clone)
            .ok_or(RegistryError::UnknownWorker { id })
    }

    /// Applies a transition to `rec`, doing the death bookkeeping if it killed the worker.
    fn apply(
        &self,
        rec: &Arc<WorkerRecord>,
        f: impl FnMut(Word) -> Result<Word, IsDead>,
    ) -> Result<Status, RegistryError> {
        let now = self.now_ms();
        match rec.state.transition(f) {
            Ok((old, new)) => {
                self.inner.events.transition(rec, old, new);
                if let (false, Status::Dead(reason)) = (old.is_dead(), new.status()) {
                    self.on_death(rec, reason, now);
                }
                Ok(new.status())
            }
            Err(IsDead(w)) => Err(dead_error(rec.id, w)),
        }
    }

    /// The worker reports that it started a loop (it is busy).
    ///
    /// **Locking behaviour:** one workers-shard read lock and one CAS.
    pub fn loop_started(&self, id: WorkerId) -> Result<Status, RegistryError> {
        self.apply(&self.record(id)?, state::loop_started)
    }

    /// The worker reports that its loop finished: it becomes idle, or, if it was draining, dead with
    /// reason [`DeadReason::Exited`] (AC5), releasing its target and capacity slot.
    ///
    /// **Locking behaviour:** one workers-shard read lock and one CAS; on exit, one targets-shard
    /// write lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{AssignOutcome, DeadReason, Registry, Status, Target};
    ///
    /// let registry = Registry::default();
    /// let AssignOutcome::Assigned(a) = registry.assign(&Target::new("o/r", 1).unwrap()) else { panic!() };
    /// assert_eq!(registry.drain(a.worker), Ok(Status::Draining));
    /// assert_eq!(registry.loop_finished(a.worker), Ok(Status::Dead(DeadReason::Exited)));
    /// ```
    pub fn loop_finished(&self, id: WorkerId) -> Result<Status, RegistryError> {
        self.apply(&self.record(id)?, state::loop_finished)
    }

    /// Sets a worker draining (AC5): it gets no new assignment, its heartbeats are still accepted (and
    /// answered with [`HeartbeatAck::Draining`]), and when its current loop finishes (or it exits)
    /// it is dead with reason [`DeadReason::Exited`]. A worker that is idle has no loop to finish and
    /// exits at once. Idempotent; a dead worker is refused with its status.
    ///
    /// **Locking behaviour:** one workers-shard read lock and one CAS.
    pub fn drain(&self, id: WorkerId) -> Result<Status, RegistryError> {
        self.apply(&self.record(id)?, state::drain)
    }

    /// Drains every live worker (router shutdown). Returns how many were set draining and how many
    /// exited at once because they were idle.
    ///
    /// **Locking behaviour:** visits the workers shard by shard (read locks) to collect them, then
    /// drains each as [`drain`](Self::drain) does, holding no map lock.
    pub fn drain_all(&self) -> DrainAll {
        let mut recs = Vec::new();
        self.inner.workers.for_each(|_, rec| {
            if !rec.state.load().is_dead() {
                recs.push(rec.clone());
            }
        });
        let mut out = DrainAll::default();
        for rec in &recs {
            match self.apply(rec, state::drain) {
                Ok(Status::Draining) => out.draining += 1,
                Ok(Status::Dead(_)) => out.exited += 1,
                _ => {}
            }
        }
        out
    }

    /// Registers a worker that started by itself and pulls work elsewhere (the worker-pool model).
    /// It has no target and counts against `max_workers`; it shares heartbeats, drain, sweep and
    /// status with spawned workers. Its deadline starts now, with the start-up grace.
    ///
    /// **Locking behaviour:** one CAS on the capacity counter and one workers-shard write lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeadReason, Registry};
    ///
    /// let registry = Registry::default();
    /// let worker = registry.register().unwrap();
    /// worker.heartbeat().unwrap();
    /// assert_eq!(worker.deregister(), Ok(DeadReason::Deregistered));
    /// ```
    pub fn register(&self) -> Result<WorkerHandle<C>, RegistryError> {
        let rec = self.create_worker(None, self.now_ms(), false)?;
        Ok(WorkerHandle {
            rec,
            registry: self.clone(),
        })
    }

    /// A clean exit: the worker is dead with reason [`DeadReason::Exited`] if it was draining,
    /// [`DeadReason::Deregistered`] if it was active. Its in-flight claims are released.
    ///
    /// **Locking behaviour:** one workers-shard read lock, one CAS, one targets-shard write lock.
    pub fn deregister(&self, id: WorkerId) -> Result<DeadReason, RegistryError> {
        match self.apply(&self.record(id)?, state::deregister)? {
            Status::Dead(reason) => Ok(reason),
            // `state::deregister` only returns dead words.
            _ => Err(RegistryError::UnknownWorker { id }),
        }
    }

    /// A handle on a worker for the worker's own calls (heartbeat without a map lookup).
    ///
    /// **Locking behaviour:** one workers-shard read lock.
    pub fn handle(&self, id: WorkerId) -> Result<WorkerHandle<C>, RegistryError> {
        Ok(WorkerHandle {
            rec: self.record(id)?,
            registry: self.clone(),
        })
    }

    /// The current state of one worker, read now (not from the snapshot).
    ///
    /// **Locking behaviour:** one workers-shard read lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Registry, Status};
    ///
    /// let registry = Registry::default();
    /// let w = registry.register().unwrap();
    /// assert_eq!(registry.worker(w.id()).unwrap().status, Status::Active);
    /// ```
    pub fn worker(&self, id: WorkerId) -> Option<WorkerInfo> {
        let now = self.now_ms();
        let origin = self.inner.wall_origin;
        self.inner
            .workers
            .get_with(&id, |rec| rec.info(rec.state.load(), now, origin))
    }

    /// The latest published snapshot of every worker (AC6). Never blocks and never waits for a
    /// sweep: it is as old as the last [`sweep`](Self::sweep), at most one sweep interval when the
    /// [`Sweeper`](crate::Sweeper) runs.
    ///
    /// **Locking behaviour:** no lock: one `ArcSwap` load and a reference-count increment (readers
    /// on several threads share that count's cache line; see [`status_with`](Self::status_with)).
    pub fn status(&self) -> Arc<StatusSnapshot> {
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
    /// use worker_registry::{EventId, Registry, Target};
    ///
    /// let registry = Registry::default();
    /// registry.admit(&Target::new("o/r", 1).unwrap(), &EventId::new("d").unwrap());
    /// registry.sweep();
    /// let (used, limit) = registry.status_with(|s| (s.capacity.used, s.capacity.limit));
    /// assert_eq!((used, limit), (1, registry.config().max_workers));
    /// ```
    #[inline]
    pub fn status_with<R>(&self, f: impl FnOnce(&StatusSnapshot) -> R) -> R {
        self.inner.snapshot.with(f)
    }

    /// The registry's cumulative counters.
    ///
    /// **Locking behaviour:** no lock: sums striped atomic counters.
    pub fn stats(&self) -> Stats {
        // Acquire: a gauge read; see `live_workers`.
        let retained = self.inner.retained.load(Ordering::Acquire);
        self.inner.counters.read(self.live_workers(), retained)
    }

    /// Number of claims in the map right now (in flight, retained, or released but not yet swept).
    ///
    /// **Locking behaviour:** read-locks each claims shard in turn.
    pub fn claim_count(&self) -> usize {
        self.inner.claims.len()
    }

    pub(crate) fn lock_sweep(&self) -> sync::MutexGuard<'_, u64> {
        sync::lock(&self.inner.sweep_lock)
    }
}

fn dead_error(id: WorkerId, w: Word) -> RegistryError {
    match w.status() {
        Status::Dead(reason) => RegistryError::WorkerDead { id, reason },
        _ => RegistryError::UnknownWorker { id },
    }
}

/// What [`Registry::drain_all`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainAll {
    /// Busy workers now draining (they exit when their loop finishes).
    pub draining: usize,
    /// Idle workers that exited at once.
    pub exited: usize,
}

/// A worker's own handle on its record: heartbeats through it skip the map lookup (one CAS).
///
/// # Examples
///
/// ```
/// use worker_registry::{HeartbeatAck, Registry};
///
/// let registry = Registry::default();
/// let me = registry.register().unwrap();
/// assert_eq!(me.heartbeat(), Ok(HeartbeatAck::Active));
/// registry.drain(me.id()).unwrap(); // idle: exits at once
/// assert!(me.heartbeat().is_err());
/// ```
pub struct WorkerHandle<C: Clock = SystemClock> {
    rec: Arc<WorkerRecord>,
    registry: Registry<C>,
}

impl<C: Clock> Clone for WorkerHandle<C> {
    fn clone(&self) -> Self {
        Self {
            rec: self.rec.clone(),
            registry: self.registry.clone(),
        }
    }
}

impl<C: Clock> fmt::Debug for WorkerHandle<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("id", &self.rec.id)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> WorkerHandle<C> {
    /// The worker's id.
    pub fn id(&self) -> WorkerId {
        self.rec.id
    }

    /// The worker's target, if it was spawned for one.
    pub fn target(&self) -> Option<&Target> {
        self.rec.target.as_ref()
    }

    /// Heartbeats (see [`Registry::heartbeat`]).
    ///
    /// **Locking behaviour:** no lock: one clock read and one CAS.
    #[inline]
    pub fn heartbeat(&self) -> Result<HeartbeatAck, RegistryError> {
        let r = Registry::<C>::beat(&self.rec, self.registry.now_ms());
        self.registry.count_beat(&r);
        r
    }

    /// See [`Registry::loop_started`].
    pub fn loop_started(&self) -> Result<Status, RegistryError> {
        self.registry.apply(&self.rec, state::loop_started)
    }

    /// See [`Registry::loop_finished`].
    pub fn loop_finished(&self) -> Result<Status, RegistryError> {
        self.registry.apply(&self.rec, state::loop_finished)
    }

    /// Completes a claim this worker holds (see [`Registry::complete_by`]): refused with
    /// [`RegistryError::NotHolder`] if the claim now belongs to another worker.
    pub fn complete(&self, target: &Target, event: &EventId) -> Result<(), RegistryError> {
        self.registry.complete_by(self.rec.id, target, event)
    }

    /// See [`Registry::deregister`].
    pub fn deregister(&self) -> Result<DeadReason, RegistryError> {
        match self.registry.apply(&self.rec, state::deregister)? {
            Status::Dead(reason) => Ok(reason),
            _ => Err(RegistryError::UnknownWorker { id: self.rec.id }),
        }
    }

    /// This worker's current state.
    pub fn info(&self) -> WorkerInfo {
        self.rec.info(
            self.rec.state.load(),
            self.registry.now_ms(),
            self.registry.inner.wall_origin,
        )
    }
}
