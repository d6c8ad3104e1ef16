//! Claims: where a (target, delivery) pair stands, and the calls that change it (`claim`,
//! `release`, `complete`, `complete_by`). The storage is the claims table (`table.rs`).

use super::record::WorkerRecord;
use super::table::{pair_hash, DeliveryKey, Found, Hit, InFlight, Loc, PutOutcome, Shard};
use super::Direct;
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{AlreadyClaimed, ClaimOutcome, ClaimState};
use crate::api::payload::Payload;
use crate::api::report::ReleaseReason;
use crate::api::status::Status;
use crate::clock::Clock;
use crate::state::Word;
use crate::sync::{self, Arc, Ordering};

/// Where an in-flight claim stands at a given time (a retained one is a duplicate until its
/// retention ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Its worker is alive: a redelivery is a duplicate.
    InFlight,
    /// Its worker died, it was stuck, or an unbound claim was never picked up: a redelivery runs
    /// again.
    Released(ReleaseReason),
}

impl InFlight {
    /// Where this in-flight claim stands at `now_ms` (`unbound_ms`: how long a bare claim may
    /// wait for its completion).
    #[inline]
    pub(crate) fn standing(&self, now_ms: u64, unbound_ms: u64) -> Standing {
        self.standing_lazy(|| now_ms, unbound_ms)
    }

    /// As [`standing`](Self::standing), reading the time only if it matters (a bare claim).
    #[inline]
    pub(crate) fn standing_lazy(&self, now_ms: impl FnOnce() -> u64, unbound_ms: u64) -> Standing {
        self.standing_seen(now_ms, unbound_ms).0
    }

    /// As [`standing_lazy`](Self::standing_lazy), also returning the holder's id and its state
    /// word as it was read for the decision (one load: the answer to a duplicate reads it from
    /// there).
    #[inline]
    pub(crate) fn standing_seen(
        &self,
        now_ms: impl FnOnce() -> u64,
        unbound_ms: u64,
    ) -> (Standing, Option<(WorkerId, Word)>) {
        if self.stuck {
            return (Standing::Released(ReleaseReason::Stuck), None);
        }
        match &self.holder {
            Some(rec) => {
                let id = rec.id;
                let w = rec.state.load();
                match w.status() {
                    Status::Dead(reason) => (
                        Standing::Released(ReleaseReason::WorkerDied(reason)),
                        Some((id, w)),
                    ),
                    _ => (Standing::InFlight, Some((id, w))),
                }
            }
            None if now_ms().saturating_sub(self.claimed_at) > unbound_ms => {
                (Standing::Released(ReleaseReason::Unbound), None)
            }
            None => (Standing::InFlight, None),
        }
    }
}

impl<C: Clock> Direct<C> {
    /// Records that this (target, delivery) is being handled, unless it already is (AC2).
    ///
    /// A bare claim is bound to no worker; [`admit`](Self::admit) claims and assigns in one step and is
    /// what a router normally calls. An unbound claim that is neither completed nor released within
    /// the heartbeat timeout is released (as if its worker had died), so nothing is lost.
    ///
    /// A parked pair (the waiting room) is claimed already: the answer is the duplicate `admit`
    /// gives ([`ClaimState::Waiting`], no holder), and it stays parked.
    ///
    /// **Locking behaviour:** one claims-shard lock: the probe and the insert are one critical
    /// section, so there is no window between the check and the insert. With the waiting room
    /// on, that section also reads the count of deliveries parked or being parked (an atomic);
    /// only while it is not zero does the claim leave the section, take the room's mutex and
    /// then the shard's lock again, deciding under both. A pair is never both parked and
    /// bare-claimed: parking counts the pair before it probes the claims (the same shard lock)
    /// under the room's mutex, so a claim that locks the shard after that probe sees the count
    /// and waits for the room, and one that locked it before is found by the probe. No
    /// allocation once the shard has room.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{ClaimOutcome, DeliveryId, memory::Direct, Target};
    ///
    /// let registry = Direct::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// assert_eq!(registry.claim(&t, &e), ClaimOutcome::Claimed);
    /// assert!(matches!(registry.claim(&t, &e), ClaimOutcome::AlreadyClaimed(_)));
    /// ```
    pub fn claim(&self, target: &Target, event: &DeliveryId) -> ClaimOutcome {
        let now = self.now_ms();
        let hash = pair_hash(target, event.key_hash());
        let room_on = self.inner.room.is_some();
        let decided = self.inner.claims.with(hash, |shard| {
            // Relaxed: the shard's mutex orders it. A park of this pair counts it before its
            // probe takes this lock: if that probe came first, this read sees the count.
            if room_on && self.inner.waiting.load(Ordering::Relaxed) > 0 {
                return None;
            }
            Some(self.claim_locked(shard, hash, target, event, now))
        });
        let outcome = match decided {
            Some(outcome) => outcome,
            None => self.claim_beside_the_room(hash, target, event, now),
        };
        match outcome {
            ClaimOutcome::AlreadyClaimed(_) => self.inner.counters.duplicates.inc(),
            _ => {
                // An unbound claim is released after the heartbeat timeout: the sweep must look.
                // Relaxed: a deadline hint; the sweep that acts on it locks the shard.
                let due = now.saturating_add(self.inner.limits.timeout_ms + 1);
                self.inner
                    .claims_next_check
                    .fetch_min(due, Ordering::Relaxed);
            }
        }
        outcome
    }

    /// `claim` while deliveries are parked or being parked: the room's mutex first, so a parked
    /// pair answers a duplicate (`Waiting`) and no park of the pair runs meanwhile, then the
    /// claims shard's lock over the decision.
    #[cold]
    #[inline(never)]
    fn claim_beside_the_room(
        &self,
        hash: u64,
        target: &Target,
        event: &DeliveryId,
        now: u64,
    ) -> ClaimOutcome {
        let room = self.inner.room.as_ref().map(sync::lock);
        if let Some(at) = room.as_ref().and_then(|r| r.waits_since(target, event)) {
            drop(room);
            return ClaimOutcome::AlreadyClaimed(AlreadyClaimed::new(
                None,
                self.wall_at(at),
                ClaimState::Waiting,
            ));
        }
        let outcome = self.inner.claims.with(hash, |shard| {
            self.claim_locked(shard, hash, target, event, now)
        });
        drop(room);
        outcome
    }

    /// The bare claim's decision, under the pair's claims-shard lock: a duplicate, or a new
    /// unbound claim recorded.
    #[inline]
    fn claim_locked(
        &self,
        shard: &mut Shard,
        hash: u64,
        target: &Target,
        event: &DeliveryId,
        now: u64,
    ) -> ClaimOutcome {
        let loc = shard.find(hash, target, event);
        if let Some(dup) = loc.and_then(|l| self.duplicate_at(shard, l, &mut || now)) {
            return ClaimOutcome::AlreadyClaimed(dup);
        }
        let claim = InFlight {
            payload: None,
            hash,
            target: target.clone(),
            delivery: DeliveryKey::of(event),
            holder: None,
            claimed_at: now,
            stuck: false,
        };
        self.put_claim(shard, hash, loc, claim);
        ClaimOutcome::Claimed
    }

    /// Removes an in-flight claim (for example when the router could not dispatch the event), so a
    /// redelivery is admitted again.
    ///
    /// **Locking behaviour:** one claims-shard lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{ClaimOutcome, DeliveryId, memory::Direct, Target};
    ///
    /// let registry = Direct::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// registry.claim(&t, &e);
    /// registry.release(&t, &e).unwrap();
    /// assert_eq!(registry.claim(&t, &e), ClaimOutcome::Claimed);
    /// ```
    pub fn release(&self, target: &Target, event: &DeliveryId) -> Result<(), RegistryError> {
        let hash = pair_hash(target, event.key_hash());
        let unknown = || RegistryError::unknown_claim(target, event);
        self.inner
            .claims
            .with(hash, |shard| {
                let Some(loc) = shard.find(hash, target, event) else {
                    return Err(unknown());
                };
                if let Found::Retained(c) = shard.get(loc) {
                    // Its retention ended: forgotten, as for `claim` and `complete`; the next sweep
                    // removes and counts it.
                    let expired = self.now_ms().saturating_sub(c.completed_at)
                        > self.inner.limits.claim_retention_ms;
                    return Err(if expired {
                        unknown()
                    } else {
                        RegistryError::claim_completed(target, event)
                    });
                }
                let old = shard.remove(hash, loc);
                if let Some(old) = &old {
                    unhold(old.holder.as_ref());
                }
                Ok(old.and_then(|c| c.payload))
            })
            .map(|payload| self.drop_payload(payload))
    }

    /// Marks a claim completed. It is then retained for `claim_retention` (bounded by
    /// `max_retained_claims`, oldest evicted first), so a late redelivery is still recognised.
    ///
    /// Idempotent for a completed claim. Refused with [`RegistryError::ClaimReleased`] if its worker
    /// died first (the event was released for re-dispatch; exactly one of the two wins).
    ///
    /// **Locking behaviour:** one claims-shard lock. At the retained bound, the completion then
    /// evicts the oldest retained claim: one read of each shard's oldest completion time (a word
    /// per shard) and one more shard lock. No allocation once the shard has room.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Admission, ClaimState, DeliveryId, memory::Direct, Target};
    ///
    /// let registry = Direct::default();
    /// let (t, e) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// registry.admit(&t, &e);
    /// registry.complete(&t, &e).unwrap();
    /// let Admission::Duplicate(d) = registry.admit(&t, &e) else { panic!() };
    /// assert_eq!(d.state, ClaimState::Completed);
    /// ```
    pub fn complete(&self, target: &Target, event: &DeliveryId) -> Result<(), RegistryError> {
        self.complete_as(None, target, event)
    }

    /// Like [`complete`](Self::complete), but fenced: only `worker`, the claim's holder, may complete
    /// it. A worker that was declared dead and whose event was re-admitted onto another worker gets
    /// [`RegistryError::NotHolder`] instead of completing the new worker's claim. Workers should
    /// complete through this (or [`WorkerHandle::complete`]).
    ///
    /// [`WorkerHandle::complete`]: crate::WorkerHandle::complete
    ///
    /// **Locking behaviour:** as [`complete`](Self::complete).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Admission, DeliveryId, memory::Direct, RegistryError, Target, WorkerId};
    ///
    /// let registry = Direct::default();
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
        self.complete_as(Some(worker), target, event)
    }

    pub(crate) fn complete_as(
        &self,
        by: Option<WorkerId>,
        target: &Target,
        event: &DeliveryId,
    ) -> Result<(), RegistryError> {
        let limits = &self.inner.limits;
        let unknown = || RegistryError::unknown_claim(target, event);
        let not_holder = |holder: Option<WorkerId>, worker| RegistryError::NotHolder {
            target: target.clone(),
            delivery: event.clone(),
            holder,
            worker,
        };
        let hash = pair_hash(target, event.key_hash());
        let mut completed_by: Option<Arc<WorkerRecord>> = None;
        let mut payload: Option<Payload> = None;
        let res = self.inner.claims.with(hash, |shard| {
            // Read under the lock: each shard's completions are then in time order.
            let now = self.now_ms();
            let Some(loc) = shard.find(hash, target, event) else {
                return Err(unknown());
            };
            match shard.get(loc) {
                Found::Retained(c) => {
                    let holder = c.holder();
                    if let Some(worker) = by.filter(|w| holder != Some(*w)) {
                        return Err(not_holder(holder, worker));
                    }
                    if now.saturating_sub(c.completed_at) > limits.claim_retention_ms {
                        Err(unknown())
                    } else {
                        Ok(false)
                    }
                }
                Found::InFlight(c) => {
                    let holder = c.holder.as_ref().map(|h| h.id);
                    if let Some(worker) = by.filter(|w| holder != Some(*w)) {
                        return Err(not_holder(holder, worker));
                    }
                    match c.standing(now, limits.timeout_ms) {
                        Standing::InFlight => {
                            completed_by = c.holder.clone();
                            payload = shard.complete(hash, loc, now);
                            Ok(true)
                        }
                        Standing::Released(reason) => Err(RegistryError::ClaimReleased {
                            target: target.clone(),
                            delivery: event.clone(),
                            holder,
                            reason,
                        }),
                    }
                }
            }
        });
        if let Ok(true) = res {
            // The work is done: its payload goes with it (freed here, outside the lock).
            self.drop_payload(payload);
            unhold(completed_by.as_ref());
            self.inner.counters.claims_completed.inc();
            let table = &self.inner.claims;
            if table.add_retained(1) > self.inner.config.max_retained_claims()
                && table.evict_oldest()
            {
                self.inner.counters.claims_evicted.inc();
            }
        }
        res.map(|_| ())
    }

    /// If the claim at `loc` blocks a new delivery now, the answer to give. `now` is asked for
    /// only when the answer depends on the time (an in-flight claim held by a worker does not).
    #[inline]
    pub(super) fn duplicate_at(
        &self,
        shard: &mut Shard,
        loc: Loc,
        now: &mut impl FnMut() -> u64,
    ) -> Option<AlreadyClaimed> {
        self.duplicate_of(shard.hit(loc), now)
    }

    /// If the claim `hit` blocks a new delivery now, the answer to give (as
    /// [`duplicate_at`](Self::duplicate_at), for a claim the probe handed out).
    #[inline(always)]
    pub(super) fn duplicate_of(
        &self,
        hit: Hit<'_>,
        now: &mut impl FnMut() -> u64,
    ) -> Option<AlreadyClaimed> {
        let limits = &self.inner.limits;
        match hit {
            Hit::InFlight(c) => match c.standing_seen(&mut *now, limits.timeout_ms) {
                // Unstarted: held by a live worker (a dead one is `Released`) that has never
                // beaten, read from the word the decision was made on.
                (Standing::InFlight, seen) => Some(
                    AlreadyClaimed::at_unix_ms(
                        seen.map(|(id, _)| id),
                        self.wall_ms_at(c.claimed_at),
                        ClaimState::InFlight,
                    )
                    .with_unstarted(seen.is_some_and(|(_, w)| !w.has_beaten())),
                ),
                _ => None,
            },
            Hit::Retained(c) => (now().saturating_sub(c.completed_at) <= limits.claim_retention_ms)
                .then(|| {
                    AlreadyClaimed::at_unix_ms(
                        c.holder(),
                        self.wall_ms_at(c.claimed_at()),
                        ClaimState::Completed,
                    )
                }),
        }
    }

    /// Records `claim` in `shard` where `loc` pointed (a claim that no longer blocks the pair:
    /// released, or retained past its retention) or anew, keeping the counts exact.
    pub(super) fn put_claim(
        &self,
        shard: &mut Shard,
        hash: u64,
        loc: Option<Loc>,
        claim: InFlight,
    ) {
        match shard.put(hash, loc, claim) {
            PutOutcome::Inserted => {}
            PutOutcome::Replaced { holder, payload } => {
                unhold(holder.as_ref());
                // A released claim taken back before the sweep reported it: its payload goes
                // (freed here, under the lock: the rare path of a redelivery within a sweep
                // interval of its worker's death).
                self.drop_payload(payload);
            }
            PutOutcome::ReplacedRetained => self.inner.claims.sub_retained(1),
        }
    }

    /// Gives back the budget of a payload the registry no longer holds (and drops it).
    #[inline]
    pub(super) fn drop_payload(&self, payload: Option<Payload>) {
        if let Some(p) = payload {
            self.inner.payloads.release(p.size());
        }
    }

    /// The payload of a released in-flight claim at `loc` (what taking the pair back frees).
    pub(super) fn released_payload(shard: &mut Shard, loc: Option<Loc>) -> u64 {
        match loc.map(|l| shard.get(l)) {
            Some(Found::InFlight(old)) => old.payload.as_ref().map_or(0, Payload::size),
            _ => 0,
        }
    }

    /// The payload stored with the pair's claim (see
    /// [`WorkerRegistry::payload`](crate::WorkerRegistry::payload)): in flight, waiting, or
    /// released and not yet handed over by a sweep; `None` otherwise.
    ///
    /// **Locking behaviour:** one claims-shard lock; if the pair has no live claim and the
    /// waiting room is on, then the room's mutex and, under it, that claims-shard lock again (so
    /// that a delivery promoted meanwhile is found on one side or the other). Clones the payload
    /// (one reference count).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeliveryId, memory::Direct, Payload, Target};
    ///
    /// let registry = Direct::default();
    /// let (t, d) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// let p = Payload::builder("ping", &b"{}"[..]).build().unwrap();
    /// registry.admit_with(&t, &d, Some(&p)).unwrap();
    /// assert_eq!(registry.payload(&t, &d), Some(p));
    /// ```
    pub fn payload(&self, target: &Target, event: &DeliveryId) -> Option<Payload> {
        let hash = pair_hash(target, event.key_hash());
        let now = || self.now_ms();
        // The pair's in-flight claim's payload (`Some(None)`: a claim without one), a live one
        // only with `live`.
        let stored = |live: bool| {
            self.inner.claims.with(hash, |shard| {
                let loc = shard.find(hash, target, event)?;
                match shard.get(loc) {
                    Found::InFlight(c) => (!live
                        || c.standing_lazy(now, self.inner.limits.timeout_ms)
                            == Standing::InFlight)
                        .then(|| c.payload.clone()),
                    Found::Retained(_) => None,
                }
            })
        };
        // In flight first (a bare claim of a waiting pair is in flight, without a payload), then
        // waiting, then a released claim not yet handed over.
        if let Some(p) = stored(true) {
            return p;
        }
        self.waiting_payload(target, event, || stored(false).flatten())
    }
}

/// One in-flight claim fewer for `holder` (it completed, was released or replaced).
#[inline]
pub(super) fn unhold(holder: Option<&Arc<WorkerRecord>>) {
    if let Some(rec) = holder {
        rec.unhold();
    }
}
