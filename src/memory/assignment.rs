//! Assignment: `assign` and `admit` (claim and assign in one critical section), and the creation
//! of workers under the capacity limit.

use super::record::WorkerRecord;
use super::table::{pair_hash, DeliveryKey, InFlight, Loc, Shard};
use super::Direct;
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{Admission, AlreadyClaimed, AssignOutcome, Assignment, Rejection};
use crate::api::payload::Payload;
use crate::clock::Clock;
use crate::state::{self, Word};
use crate::sync::{Arc, Op, Ordering};

impl<C: Clock> Direct<C> {
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
    /// use worker_registry::{AssignOutcome, memory::Direct, RegistryConfig, Rejection, Target};
    ///
    /// let registry = Direct::new(RegistryConfig::builder().max_workers(1).build().unwrap());
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
        match self.assign_at(target, now, false, true) {
            Ok((a, _)) => AssignOutcome::Assigned(a),
            Err(r) => {
                self.count_rejection(&r);
                AssignOutcome::Rejected(r)
            }
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
    /// **Locking behaviour:** one claims-shard lock for the whole decision (a duplicate is one probe
    /// under it); a new delivery holds it while it assigns (targets shard, then workers shard). No
    /// allocation on either path once the shard has room.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Admission, DeliveryId, memory::Direct, Target};
    ///
    /// let registry = Direct::default();
    /// let t = Target::new("o/r", 1).unwrap();
    /// let Admission::Assigned(first) = registry.admit(&t, &DeliveryId::new("a").unwrap()) else { panic!() };
    /// let Admission::Assigned(second) = registry.admit(&t, &DeliveryId::new("b").unwrap()) else { panic!() };
    /// assert_eq!(first.worker, second.worker);
    /// assert!(second.token > first.token);
    /// ```
    pub fn admit(&self, target: &Target, event: &DeliveryId) -> Admission {
        match self.admit_unparked(target, event, PLAIN) {
            Admission::Rejected(r) => self.refused_admission(target, event, r, None),
            other => other,
        }
    }

    /// [`admit`](Self::admit), carrying the delivery's payload (see
    /// [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with)): refused with
    /// [`RegistryError::PayloadTooLarge`] past `max_payload_bytes`, before anything else; stored
    /// with the claim (or the parked delivery) under the same lock, its bytes reserved against
    /// `payload_budget` by one CAS, refused with
    /// [`Rejection::PayloadBudget`] (no claim) if they do not fit.
    ///
    /// **Locking behaviour:** as [`admit`](Self::admit), plus one compare-and-swap on the budget
    /// counter (under the claims-shard lock) when the delivery is new; a completion gives the
    /// bytes back outside the lock. Without a payload it is `admit`.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Admission, DeliveryId, memory::Direct, Payload, Target};
    ///
    /// let registry = Direct::default();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
    /// let p = Payload::builder("ping", &b"{}"[..]).build().unwrap();
    /// assert!(matches!(registry.admit_with(&t, &d, Some(&p)), Ok(Admission::Assigned(_))));
    /// assert_eq!(registry.stats().payload_bytes_held, p.size());
    /// ```
    #[inline]
    pub fn admit_with(
        &self,
        target: &Target,
        event: &DeliveryId,
        payload: Option<&Payload>,
    ) -> Result<Admission, RegistryError> {
        let Some(p) = payload else {
            return Ok(self.admit(target, event));
        };
        let limit = self.inner.config.max_payload_bytes();
        if p.size() > limit {
            self.inner.counters.payloads_too_large.inc();
            return Err(RegistryError::PayloadTooLarge {
                size: p.size(),
                limit,
            });
        }
        let how = Placing {
            defer: true,
            carry: Carry::Fresh(p),
        };
        Ok(match self.admit_unparked(target, event, &how) {
            Admission::Rejected(r) => self.refused_admission(target, event, r, Some(p)),
            other => other,
        })
    }

    /// A refused admission: parked if the room is on (and has space), else the refusal, counted
    /// (only a refusal answered counts as one: a parked admission is not a rejection). A refusal
    /// for the payload budget is never parked (but is a duplicate if the pair waits).
    #[cold]
    #[inline(never)]
    fn refused_admission(
        &self,
        target: &Target,
        event: &DeliveryId,
        r: Rejection,
        payload: Option<&Payload>,
    ) -> Admission {
        let out = if self.inner.room.is_some() {
            self.park(target, event, r, payload)
        } else {
            Admission::Rejected(r)
        };
        if let Admission::Rejected(r) = &out {
            self.count_rejection(r);
        }
        out
    }

    /// Counts a refusal answered to the caller.
    #[cold]
    pub(super) fn count_rejection(&self, r: &Rejection) {
        let c = &self.inner.counters;
        match r {
            Rejection::CapacityFull { .. } => c.rejected_capacity.inc(),
            Rejection::TargetDraining { .. } => c.rejected_draining.inc(),
            Rejection::PayloadBudget { .. } => c.rejected_payload_budget.inc(),
        }
    }

    /// [`admit`](Self::admit) without parking, placed as `how` says: with `defer`, a new worker
    /// is not created while targets wait for capacity (see `waiting.rs`); `carry` is the payload
    /// to store with the claim.
    #[inline]
    pub(super) fn admit_unparked(
        &self,
        target: &Target,
        event: &DeliveryId,
        how: &Placing<'_>,
    ) -> Admission {
        let hash = pair_hash(target, event.key_hash());
        // The lock, the probe and a duplicate's answer in this one frame (no closure, no call).
        let table = &self.inner.claims;
        let place = table.shard(hash);
        let mut shard = table.lock(&place);
        // Read the clock only when needed: a redelivery of an in-flight delivery does not.
        let mut read: Option<u64> = None;
        let mut now = || *read.get_or_insert_with(|| self.now_ms());
        let found = shard.lookup(hash, target, event);
        if let Some(dup) = found.and_then(|(_, hit)| self.duplicate_of(hit, &mut now)) {
            shard.count_duplicate();
            return Admission::Duplicate(dup);
        }
        let loc = found.map(|(loc, _)| loc);
        let now = now();
        self.admit_new(&mut shard, hash, loc, target, event, now, how)
    }

    /// The rest of `admit_unparked` for a delivery that is not a duplicate, still under the
    /// claims shard's lock: reserves a fresh payload's bytes, assigns the target and records the
    /// claim (with its payload) where `loc` pointed (or anew). Out of line, so that the duplicate
    /// path keeps a small frame.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn admit_new(
        &self,
        shard: &mut Shard,
        hash: u64,
        loc: Option<Loc>,
        target: &Target,
        event: &DeliveryId,
        now: u64,
        how: &Placing<'_>,
    ) -> Admission {
        let (defer, carry) = (how.defer, how.carry);
        // Reserved before the assignment, which cannot be undone; given back if it fails.
        let reserved = match carry {
            Carry::Fresh(p) => match self.reserve_fresh(shard, loc, p) {
                Ok(size) => Some(size),
                Err(r) => return Admission::Rejected(r),
            },
            Carry::Nothing | Carry::Reserved(_) => None,
        };
        match self.assign_at(target, now, true, defer) {
            Ok((assignment, holder)) => {
                // The claim keeps the worker's own copy of the target: one shared allocation
                // for all of a worker's claims, whoever parsed the delivery.
                let kept = holder
                    .as_ref()
                    .and_then(|h| h.target.clone())
                    .unwrap_or_else(|| target.clone());
                let claim = InFlight {
                    payload: carry.payload().cloned(),
                    hash,
                    target: kept,
                    delivery: DeliveryKey::of(event),
                    holder,
                    claimed_at: now,
                    stuck: false,
                };
                self.put_claim(shard, hash, loc, claim);
                Admission::Assigned(assignment)
            }
            // A released or expired claim stays as it was (it blocks nothing, and the sweep
            // still reports it); a vacant slot stays vacant; a reservation is given back.
            Err(rejection) => {
                if let Some(size) = reserved {
                    self.inner.payloads.release(size);
                }
                Admission::Rejected(rejection)
            }
        }
    }

    /// Reserves a fresh payload's bytes for the claim about to be recorded where `loc` points
    /// (out of line: an admission without a payload does not carry this code in its frame). A
    /// released claim there frees its payload in the same step: its bytes count as available
    /// (see `Budget::reserve`). Returns the bytes reserved.
    #[inline(never)]
    fn reserve_fresh(
        &self,
        shard: &mut Shard,
        loc: Option<Loc>,
        p: &Payload,
    ) -> Result<u64, Rejection> {
        let credit = Self::released_payload(shard, loc);
        self.inner.payloads.reserve(p.size(), credit)?;
        Ok(p.size())
    }

    /// Whether (target, delivery) is in flight or retained: the duplicate check of `admit` alone.
    pub(super) fn probe(&self, target: &Target, event: &DeliveryId) -> Option<AlreadyClaimed> {
        let hash = pair_hash(target, event.key_hash());
        self.inner.claims.with(hash, |shard| {
            let mut read: Option<u64> = None;
            let mut now = || *read.get_or_insert_with(|| self.now_ms());
            let loc = shard.find(hash, target, event)?;
            self.duplicate_at(shard, loc, &mut now)
        })
    }

    /// Assigns `target` at `now`; with `want_holder`, also returns the worker record for a claim.
    /// With `defer`, a target without a worker gets none while others wait for capacity (it is
    /// refused as if capacity were full, and parked by the caller). Inlined into its callers
    /// (`admit`'s new delivery above all): out of line it costs a call and a frame per admission.
    #[inline(always)]
    pub(super) fn assign_at(
        &self,
        target: &Target,
        now: u64,
        want_holder: bool,
        defer: bool,
    ) -> Result<(Assignment, Option<Arc<WorkerRecord>>), Rejection> {
        let inner = &*self.inner;
        // Fast path: the target has a worker; try to assign onto it under the shard read lock.
        let fast = inner.targets.get_with(target, |rec| {
            Self::assign_existing(rec, want_holder).map_err(|w| (w, rec.id))
        });
        let r = match fast {
            Some(Ok(found)) => Ok(found),
            Some(Err((w, id))) if !w.is_dead() => Err(Rejection::TargetDraining { worker: id }),
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
                // Vacant, or mapped to a dead worker: create one if capacity allows, and unless
                // targets already wait for capacity (they come first). Relaxed: a hint; a stale
                // zero lets one arrival overtake the waiting ones (fairness, not safety), a stale
                // non-zero parks it until the next sweep promotes it.
                let queued = defer && inner.contenders.load(Ordering::Relaxed) > 0;
                let created = if queued {
                    Err(RegistryError::Rejected(Rejection::CapacityFull {
                        limit: inner.config.max_workers(),
                    }))
                } else {
                    self.owner_room(target).and_then(|()| {
                        self.create_worker(Some(target.clone()), now, true, want_holder)
                            .inspect_err(|_| self.owner_leave(target))
                    })
                };
                match created {
                    Ok(rec) => {
                        let a = Assignment {
                            worker: rec.id,
                            token: rec.token(),
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
                                limit: inner.config.max_workers(),
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
            // Refusals are counted where they are answered (`count_rejection`).
            Err(_) => {}
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
        // The claim is counted on the worker before the CAS that places it: a death that follows
        // the CAS then sees it (and has the sweep release it); a refused CAS takes it back.
        if want_holder {
            rec.hold();
        }
        if let Err(w) = rec.state.transition(state::assign) {
            if want_holder {
                rec.unhold();
            }
            return Err(w);
        }
        let a = Assignment {
            worker: rec.id,
            token: rec.next_token(),
            new: false,
        };
        Ok((a, want_holder.then(|| rec.clone())))
    }

    /// Reserves capacity and creates (and indexes) a worker record.
    pub(super) fn create_worker(
        &self,
        target: Option<Target>,
        now: u64,
        assigned: bool,
        holds_claim: bool,
    ) -> Result<Arc<WorkerRecord>, RegistryError> {
        let inner = &*self.inner;
        let limit = inner.config.max_workers();
        // AcqRel: the reservation must be totally ordered with every other reservation and release
        // on this one counter (which any ordering gives for a RMW); Acquire/Release additionally
        // makes a released slot's death visible to the thread that reuses it.
        inner
            .live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .map_err(|_| RegistryError::Rejected(Rejection::CapacityFull { limit }))?;
        // Relaxed: ids need only be unique, which the RMW guarantees; nothing is published. They
        // start at the registry's start time (see `first_id`), so they are unique across restarts.
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
            holds_claim,
        ));
        inner.events.created(&rec);
        inner.workers.insert(id, rec.clone());
        // The roster lives as long as the registry, so the receiver is never gone.
        let _ = inner.newborns.send(rec.clone());
        Ok(rec)
    }
}

/// The payload an admission stores with its claim, and whether its bytes are reserved yet.
#[derive(Clone, Copy)]
pub(super) enum Carry<'a> {
    /// No payload.
    Nothing,
    /// A payload whose bytes the admission reserves (and gives back if it places nothing).
    Fresh(&'a Payload),
    /// A parked delivery's payload, whose bytes its parking reserved: a placement takes the
    /// reservation over, a refusal leaves it with the parked delivery.
    Reserved(&'a Payload),
}

/// How [`Direct::admit_unparked`] places a delivery that is not a duplicate: whether it defers to
/// targets waiting for capacity, and the payload it stores with the claim. Passed by reference,
/// one pointer (a plain admission's is a constant), so that the duplicate path's frame is what it
/// was before payloads (the instruction gate's `admit_duplicate`).
#[derive(Clone, Copy)]
pub(super) struct Placing<'a> {
    pub(super) defer: bool,
    pub(super) carry: Carry<'a>,
}

/// A plain admission: deferring, no payload.
pub(super) const PLAIN: &Placing<'static> = &Placing {
    defer: true,
    carry: Carry::Nothing,
};

impl<'a> Carry<'a> {
    fn payload(self) -> Option<&'a Payload> {
        match self {
            Self::Nothing => None,
            Self::Fresh(p) | Self::Reserved(p) => Some(p),
        }
    }
}

/// The wall-clock instant worker ids count from: 2026-01-01T00:00:00Z (seconds since the Unix
/// epoch). At one id per millisecond, [`WorkerId::MAX`] is reached in the year 2583.
pub(crate) const ID_EPOCH_SECS: u64 = 1_767_225_600;

/// The first id a registry started at `wall` hands out: milliseconds since [`ID_EPOCH_SECS`], and
/// at least 1. A registry that starts later than another one created its last worker starts
/// above all of its ids, as long as that one created fewer workers than milliseconds passed
/// between the two starts (and the wall clock did not step back).
pub(crate) fn first_id(wall: std::time::SystemTime) -> u64 {
    let epoch = std::time::UNIX_EPOCH + std::time::Duration::from_secs(ID_EPOCH_SECS);
    wall.duration_since(epoch)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .max(1)
}
