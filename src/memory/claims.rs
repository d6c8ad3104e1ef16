//! Claims: which (target, delivery) pairs are being handled or were handled recently, and the
//! calls that change them (`claim`, `release`, `complete`, `complete_by`).
//!
//! The claims map is keyed by `(Target, DeliveryId)`. Looking a pair up must not allocate (the
//! redelivery path is hot), yet the map owns its keys, so lookups borrow the key as
//! `dyn ClaimKeyRef`: a pair of references hashes and compares exactly like the owned key.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

#[cfg(worker_registry_loom)]
use super::faults::Fault;
use super::record::WorkerRecord;
use super::InMemoryRegistry;
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{AlreadyClaimed, ClaimOutcome, ClaimState};
use crate::api::report::ReleaseReason;
use crate::api::status::Status;
use crate::clock::Clock;
use crate::sync::{Arc, Op, Ordering};

/// The owned key of a claim.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ClaimKey {
    pub(crate) target: Target,
    pub(crate) event: DeliveryId,
}

/// Anything that can stand for a claim key in a lookup.
pub(crate) trait ClaimKeyRef {
    fn target(&self) -> &Target;
    fn event(&self) -> &DeliveryId;
}

impl ClaimKeyRef for ClaimKey {
    fn target(&self) -> &Target {
        &self.target
    }
    fn event(&self) -> &DeliveryId {
        &self.event
    }
}

impl ClaimKeyRef for (&Target, &DeliveryId) {
    fn target(&self) -> &Target {
        self.0
    }
    fn event(&self) -> &DeliveryId {
        self.1
    }
}

impl<'a> Borrow<dyn ClaimKeyRef + 'a> for ClaimKey {
    fn borrow(&self) -> &(dyn ClaimKeyRef + 'a) {
        self
    }
}

impl Hash for dyn ClaimKeyRef + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.target().hash(state);
        self.event().hash(state);
    }
}

impl PartialEq for dyn ClaimKeyRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.target() == other.target() && self.event() == other.event()
    }
}

impl Eq for dyn ClaimKeyRef + '_ {}

impl Hash for ClaimKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Must hash exactly as the borrowed form does.
        (self as &dyn ClaimKeyRef).hash(state);
    }
}

/// One claim. Mutated only under its map shard's write lock, so its fields are plain.
pub(crate) struct Claim {
    /// The worker handling it; `None` for a bare claim not yet bound to one.
    pub(crate) holder: Option<Arc<WorkerRecord>>,
    pub(crate) claimed_at: u64,
    pub(crate) completed_at: Option<u64>,
}

/// Where a claim stands at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Its worker is alive and it is not completed: a redelivery is a duplicate.
    InFlight,
    /// Completed within the retention window: a redelivery is a duplicate.
    Completed,
    /// Its worker died (or an unbound claim was never picked up): a redelivery runs again.
    Released(ReleaseReason),
    /// Completed longer ago than the retention window: forgotten.
    Expired,
}

impl Claim {
    pub(crate) fn standing(&self, now_ms: u64, retention_ms: u64, unbound_ms: u64) -> Standing {
        if let Some(done) = self.completed_at {
            return if now_ms.saturating_sub(done) > retention_ms {
                Standing::Expired
            } else {
                Standing::Completed
            };
        }
        match &self.holder {
            Some(rec) => match rec.state.load().status() {
                Status::Dead(reason) => Standing::Released(ReleaseReason::WorkerDied(reason)),
                _ => Standing::InFlight,
            },
            None if now_ms.saturating_sub(self.claimed_at) > unbound_ms => {
                Standing::Released(ReleaseReason::Unbound)
            }
            None => Standing::InFlight,
        }
    }
}

impl<C: Clock> InMemoryRegistry<C> {
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
    /// use worker_registry::{ClaimOutcome, DeliveryId, InMemoryRegistry, Target};
    ///
    /// let registry = InMemoryRegistry::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// assert_eq!(registry.claim(&t, &e), ClaimOutcome::Claimed);
    /// assert!(matches!(registry.claim(&t, &e), ClaimOutcome::AlreadyClaimed(_)));
    /// ```
    pub fn claim(&self, target: &Target, event: &DeliveryId) -> ClaimOutcome {
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
    /// use worker_registry::{ClaimOutcome, DeliveryId, InMemoryRegistry, Target};
    ///
    /// let registry = InMemoryRegistry::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// registry.claim(&t, &e);
    /// registry.release(&t, &e).unwrap();
    /// assert_eq!(registry.claim(&t, &e), ClaimOutcome::Claimed);
    /// ```
    pub fn release(&self, target: &Target, event: &DeliveryId) -> Result<(), RegistryError> {
        let now = self.now_ms();
        let limits = &self.inner.limits;
        let key = ClaimKey {
            target: target.clone(),
            event: event.clone(),
        };
        let unknown = || RegistryError::UnknownClaim {
            target: target.clone(),
            delivery: event.clone(),
        };
        self.inner.claims.update(key, |slot| match slot {
            None => (Op::Keep, Err(unknown())),
            Some(c) => match c.standing(now, limits.claim_retention_ms, limits.timeout_ms) {
                Standing::Completed => (
                    Op::Keep,
                    Err(RegistryError::ClaimCompleted {
                        target: target.clone(),
                        delivery: event.clone(),
                    }),
                ),
                // Its retention ended: forgotten, as for `claim` and `complete`; the next sweep
                // removes and counts it.
                Standing::Expired => (Op::Keep, Err(unknown())),
                Standing::InFlight | Standing::Released(_) => (Op::Remove, Ok(())),
            },
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
    /// use worker_registry::{Admission, ClaimState, DeliveryId, InMemoryRegistry, Target};
    ///
    /// let registry = InMemoryRegistry::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// registry.admit(&t, &e);
    /// registry.complete(&t, &e).unwrap();
    /// let Admission::Duplicate(d) = registry.admit(&t, &e) else { panic!() };
    /// assert_eq!(d.state, ClaimState::Completed);
    /// ```
    pub fn complete(&self, target: &Target, event: &DeliveryId) -> Result<(), RegistryError> {
        self.complete_inner(target, event, None)
    }

    /// Like [`complete`](Self::complete), but fenced: only `worker`, the claim's holder, may complete
    /// it. A worker that was declared dead and whose event was re-admitted onto another worker gets
    /// [`RegistryError::NotHolder`] instead of completing the new worker's claim. Workers should
    /// complete through this (or [`WorkerHandle::complete`](crate::WorkerHandle::complete)).
    ///
    /// **Locking behaviour:** one claims-shard write lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Admission, DeliveryId, InMemoryRegistry, RegistryError, Target, WorkerId};
    ///
    /// let registry = InMemoryRegistry::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// let Admission::Assigned(a) = registry.admit(&t, &e) else { panic!() };
    /// let stranger = WorkerId::new(a.worker.get() + 1);
    /// assert!(matches!(registry.complete_by(stranger, &t, &e), Err(RegistryError::NotHolder { .. })));
    /// registry.complete_by(a.worker, &t, &e).unwrap();
    /// ```
    pub fn complete_by(
        &self,
        worker: WorkerId,
        target: &Target,
        event: &DeliveryId,
    ) -> Result<(), RegistryError> {
        self.complete_inner(target, event, Some(worker))
    }

    fn complete_inner(
        &self,
        target: &Target,
        event: &DeliveryId,
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
            delivery: event.clone(),
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
                        delivery: event.clone(),
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
                    Standing::Released(reason) => Err(RegistryError::ClaimReleased {
                        target: target.clone(),
                        delivery: event.clone(),
                        holder,
                        reason,
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
    pub(super) fn live_claim(
        &self,
        target: &Target,
        event: &DeliveryId,
        now: u64,
    ) -> Option<AlreadyClaimed> {
        let key: &dyn ClaimKeyRef = &(target, event);
        self.inner
            .claims
            .get_with(key, |c| self.duplicate_of(c, now))
            .flatten()
    }

    /// If `c` blocks a new delivery at `now`, the answer to give.
    #[inline]
    pub(super) fn duplicate_of(&self, c: &Claim, now: u64) -> Option<AlreadyClaimed> {
        let limits = &self.inner.limits;
        let state = match c.standing(now, limits.claim_retention_ms, limits.timeout_ms) {
            Standing::InFlight => ClaimState::InFlight,
            Standing::Completed => ClaimState::Completed,
            Standing::Released(_) | Standing::Expired => return None,
        };
        Some(AlreadyClaimed {
            holder: c.holder.as_ref().map(|h| h.id),
            since: self.wall_at(c.claimed_at),
            state,
        })
    }

    /// A completed claim is about to be replaced: it no longer counts as retained.
    pub(super) fn forget_if_completed(&self, c: &Claim) {
        if c.completed_at.is_some() {
            // AcqRel: see `complete`.
            self.inner.retained.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
