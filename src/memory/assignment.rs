//! Assignment: `assign` and `admit` (claim and assign in one critical section), and the creation
//! of workers under the capacity limit.

use super::claims::{Claim, ClaimKey};
#[cfg(worker_registry_loom)]
use super::faults::Fault;
use super::record::WorkerRecord;
use super::InMemoryRegistry;
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{Admission, AssignOutcome, Assignment, Rejection};
use crate::clock::Clock;
use crate::state::{self, Word};
use crate::sync::{Arc, Op, Ordering};

impl<C: Clock> InMemoryRegistry<C> {
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
    /// use worker_registry::{AssignOutcome, InMemoryRegistry, RegistryConfig, Rejection, Target};
    ///
    /// let registry = InMemoryRegistry::new(RegistryConfig::builder().max_workers(1).build().unwrap());
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
    /// use worker_registry::{Admission, DeliveryId, InMemoryRegistry, Target};
    ///
    /// let registry = InMemoryRegistry::default();
    /// let t = Target::new("o/r", 1).unwrap();
    /// let Admission::Assigned(first) = registry.admit(&t, &DeliveryId::new("a").unwrap()) else { panic!() };
    /// let Admission::Assigned(second) = registry.admit(&t, &DeliveryId::new("b").unwrap()) else { panic!() };
    /// assert_eq!(first.worker, second.worker);
    /// assert!(second.token > first.token);
    /// ```
    pub fn admit(&self, target: &Target, event: &DeliveryId) -> Admission {
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
    pub(super) fn assign_at(
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
    ) -> Result<Arc<WorkerRecord>, RegistryError> {
        let inner = &*self.inner;
        let limit = inner.config.max_workers();
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
            .map_err(|_| RegistryError::Rejected(Rejection::CapacityFull { limit }))?;
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
}
