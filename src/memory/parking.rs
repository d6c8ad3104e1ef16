//! The registry's side of the waiting room (`waiting.rs` holds the room itself): parking a
//! refused admission, the per-owner cap on live workers, promotion at a death, and the sweep's
//! handover, promotion and expiry.

use std::time::Duration;

use super::assignment::{Carry, Placing};
use super::record::WorkerRecord;
use super::waiting::{owner_of, Parked, Room};
use super::Direct;
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target};
use crate::api::outcome::{Admission, AlreadyClaimed, ClaimState, Rejection, Waiting};
use crate::api::payload::Payload;
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::waiting::{ExpireReason, ExpiredWaiting};
use crate::clock::Clock;
use crate::sync::{self, AtomicUsize, Op, Ordering};

impl<C: Clock> Direct<C> {
    /// Parks a refused admission, or answers the refusal if the room (or the owner's share) is
    /// full, or the payload budget refused it (never parked: only a duplicate changes that
    /// answer). Only called with the waiting room on.
    ///
    /// **Locking behaviour:** the room's mutex, and under it one claims-shard lock (the pair may
    /// have been promoted since it was refused) and, for a draining target, one workers-shard
    /// read lock. The pair counts in `Inner::waiting` from before that claims-shard lock until it
    /// is found not to park, or leaves the room: a bare [`claim`](Self::claim) reads the count
    /// under the same shard lock and takes the room's mutex only while it is not zero.
    #[cold]
    #[inline(never)]
    pub(super) fn park(
        &self,
        target: &Target,
        event: &DeliveryId,
        reason: Rejection,
        payload: Option<&Payload>,
    ) -> Admission {
        let Some(room) = &self.inner.room else {
            return Admission::Rejected(reason);
        };
        let cfg = &self.inner.config;
        let now = self.now_ms();
        let mut room = sync::lock(room);
        // Counted before the probe below, so that a bare claim of the pair that locks its shard
        // after the probe finds the count above zero and waits for this room's mutex; given back
        // on every way out unless the pair is parked.
        let counted = Counted::new(&self.inner.waiting);
        // Promoted (or admitted by a redelivery) between the refusal and this lock.
        if let Some(dup) = self.probe(target, event) {
            drop(room);
            self.inner.counters.duplicates.inc();
            return Admission::Duplicate(dup);
        }
        if let Some(at) = room.waits_since(target, event) {
            drop(room);
            return self.waiting_duplicate(at);
        }
        if let Rejection::PayloadBudget { .. } = reason {
            return Admission::Rejected(reason);
        }
        // A parked delivery holds its payload: its bytes are reserved first (and given back if
        // it is not parked after all).
        let size = payload.map(Payload::size);
        if let Some(size) = size {
            if let Err(r) = self.inner.payloads.reserve(size, 0) {
                return Admission::Rejected(r);
            }
        }
        let blocker = match reason {
            Rejection::TargetDraining { worker } => self
                .inner
                .workers
                .get_with(&worker, |rec| rec.clone())
                .filter(|rec| !rec.state.load().is_dead()),
            _ => None,
        };
        let parked = room.park(
            target,
            event,
            payload,
            blocker,
            now,
            (cfg.max_waiting(), cfg.max_waiting_per_owner()),
        );
        if matches!(parked, Parked::At(_)) {
            // It waits: the room's departures give the count back (`publish_room`).
            counted.keep();
        } else {
            drop(counted);
        }
        self.publish_room(&mut room);
        drop(room);
        if let (Some(size), false) = (size, matches!(parked, Parked::At(_))) {
            self.inner.payloads.release(size);
        }
        self.park_answer(parked, reason, target, event, payload)
    }

    /// What [`park`](Self::park) answers once the room has said where the pair stands.
    fn park_answer(
        &self,
        parked: Parked,
        reason: Rejection,
        target: &Target,
        event: &DeliveryId,
        payload: Option<&Payload>,
    ) -> Admission {
        match parked {
            Parked::At(position) => {
                self.inner.counters.parked.inc();
                Admission::Waiting(Waiting::new(position, reason))
            }
            Parked::Duplicate(at) => self.waiting_duplicate(at),
            // Refused only because others wait for capacity (and there is no room to wait
            // with them): place it after all, if capacity allows.
            Parked::Full if matches!(reason, Rejection::CapacityFull { .. }) => {
                let carry = payload.map_or(Carry::Nothing, Carry::Fresh);
                self.admit_unparked(
                    target,
                    event,
                    &Placing {
                        defer: false,
                        carry,
                    },
                )
            }
            Parked::Full => Admission::Rejected(reason),
        }
    }

    /// The answer to a redelivery of a pair parked since `at`, counted.
    fn waiting_duplicate(&self, at: u64) -> Admission {
        self.inner.counters.duplicates.inc();
        Admission::Duplicate(AlreadyClaimed::new(
            None,
            self.wall_at(at),
            ClaimState::Waiting,
        ))
    }

    /// Copies the room's count of contenders to the atomic `assign_at` reads, and takes the
    /// deliveries that left the room since the last call out of `Inner::waiting`. Called under
    /// the room's mutex after every change to the room.
    fn publish_room(&self, room: &mut Room) {
        // Relaxed: a hint (see `assign_at`); the room's mutex orders the room itself.
        self.inner
            .contenders
            .store(room.contenders, Ordering::Relaxed);
        let left = std::mem::take(&mut room.left);
        if left > 0 {
            // Relaxed: lowered only once these deliveries are out of the room; a bare claim that
            // still sees them counted takes the room's mutex and finds them gone (late is safe,
            // early would not be).
            self.inner.waiting.fetch_sub(left, Ordering::Relaxed);
        }
    }

    /// Takes one of the owner's live-worker slots (`max_workers_per_owner`), if it is capped.
    ///
    /// **Locking behaviour:** nothing unless the cap is on; then one owners-shard write lock (a
    /// leaf: nothing else is locked under it).
    pub(super) fn owner_room(&self, target: &Target) -> Result<(), RegistryError> {
        let cap = self.inner.config.max_workers_per_owner();
        if cap == 0 {
            return Ok(());
        }
        self.inner
            .owner_live
            .update(owner_of(target).to_owned(), |slot| match slot {
                Some(n) if *n >= cap => (
                    Op::Keep,
                    Err(RegistryError::Rejected(Rejection::CapacityFull {
                        limit: cap,
                    })),
                ),
                Some(n) => {
                    *n += 1;
                    (Op::Keep, Ok(()))
                }
                None => (Op::Put(1), Ok(())),
            })
    }

    /// Gives back one of the owner's live-worker slots (a worker of its died, or was not made).
    pub(super) fn owner_leave(&self, target: &Target) {
        if self.inner.config.max_workers_per_owner() == 0 {
            return;
        }
        self.inner
            .owner_live
            .update(owner_of(target).to_owned(), |slot| match slot {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    (Op::Keep, ())
                }
                Some(_) => (Op::Remove, ()),
                None => (Op::Keep, ()),
            });
    }

    /// Whether the owner holds its cap of live workers now.
    fn owner_full(&self, target: &Target) -> bool {
        let cap = self.inner.config.max_workers_per_owner();
        cap > 0
            && self
                .inner
                .owner_live
                .get_with(owner_of(target), |n| *n >= cap)
                .unwrap_or(false)
    }

    /// The sweep's step: hand over what deaths promoted since the last sweep, drop deliveries that
    /// waited past `max_wait`, then promote the oldest that fit (see [`fill`](Self::fill)).
    ///
    /// **Locking behaviour:** called under the sweep mutex; takes the room's mutex, and under it
    /// what `admit` takes for each promoted delivery.
    pub(super) fn promote(&self, now: u64, report: &mut SweepReport) {
        let Some(room) = &self.inner.room else {
            return;
        };
        let cfg = &self.inner.config;
        let mut room = sync::lock(room);
        report.released.append(&mut room.handover);
        let limit = cfg.max_wait();
        let cutoff = now.checked_sub(crate::clock::millis(limit));
        // The payloads of dropped deliveries, freed once the room is unlocked.
        let mut freed = Vec::new();
        if let Some(cutoff) = cutoff {
            for (target, item) in room.expire(cutoff) {
                report.expired_waiting.push(ExpiredWaiting::new(
                    target,
                    item.delivery,
                    Duration::from_millis(now.saturating_sub(item.at)),
                    ExpireReason::WaitedTooLong { limit },
                ));
                freed.extend(item.payload);
            }
        }
        self.inner
            .counters
            .waiting_expired
            .add(report.expired_waiting.len() as u64);
        // A safety net: every death unblocks its own waiters (`after_death`); one that raced a
        // parking behind it is found here.
        room.unblock_dead();
        self.fill(&mut room, &mut report.released);
        report.waiting = room.len;
        self.publish_room(&mut room);
        drop(room);
        for p in freed {
            self.drop_payload(Some(p));
        }
    }

    /// Promotion when room appears: called by the winner of the CAS that killed `rec` (an exit,
    /// a deregistration, a death found by the sweep), once its slot is free and its target
    /// unmapped. The targets parked behind `rec` move to the front of the line (so the order of
    /// the deaths is the order of their successors), then, with `promote` (outside the sweep,
    /// which promotes once at its end), the oldest waiting deliveries that fit are placed at once (see [`fill`](Self::fill)); they are handed
    /// over in the next sweep's report (and the sweeper woken for it, see
    /// [`Maintenance::wake`](crate::Maintenance::wake)).
    ///
    /// Bounded: one death frees one slot, so at most one new worker is made; the other steps are
    /// the targets behind `rec` (one) and targets placed on a live worker of theirs, each waiting
    /// delivery placed at most once.
    ///
    /// **Locking behaviour:** nothing unless deliveries wait; then the room's mutex, and under it
    /// what `admit` takes for each promoted delivery. Never called with a map lock held.
    pub(super) fn after_death(&self, rec: &WorkerRecord, promote: bool) {
        let Some(room) = &self.inner.room else {
            return;
        };
        // Relaxed: a hint. A delivery parked concurrently that this read misses is unblocked and
        // promoted by the next sweep (`unblock_dead`, `fill`): later, never lost.
        if self.inner.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut room = sync::lock(room);
        room.unblock(rec.id);
        if !promote {
            return;
        }
        let mut handed = std::mem::take(&mut room.handover);
        let before = handed.len();
        self.fill(&mut room, &mut handed);
        let promoted = handed.len() > before;
        room.handover = handed;
        self.publish_room(&mut room);
        drop(room);
        if promoted {
            self.inner.wake.notify();
        }
    }

    /// Promotes the oldest waiting deliveries that fit, into `out`: each target whose draining
    /// worker died first, then one target per owner in turn.
    ///
    /// Bounded: each delivery parked is promoted or dropped once; a target that does not fit ends
    /// the step (capacity is full) or is set aside (its worker drains, its owner is at its cap),
    /// and at most one pass over the owners is spent on owners at their cap (set aside, and put
    /// back in their place if nothing after them was placed).
    fn fill(&self, room: &mut Room, out: &mut Vec<ReleasedEvent>) {
        let mut skips = (0usize, 0usize);
        while let Some(target) = room.candidate() {
            if self.owner_full(&target) && !self.has_live_worker(&target) {
                if skips.0 + skips.1 >= room.contenders {
                    break;
                }
                room.skip(&mut skips);
                continue;
            }
            let mut blocker = None;
            let mut full = false;
            while let Some((item, payload)) = room.front(&target) {
                // Its parking reserved the payload's bytes: the claim takes them over.
                let carry = payload.as_ref().map_or(Carry::Nothing, Carry::Reserved);
                match self.admit_unparked(
                    &target,
                    &item,
                    &Placing {
                        defer: false,
                        carry,
                    },
                ) {
                    Admission::Assigned(a) => {
                        room.pop(&target);
                        self.inner.counters.promoted.inc();
                        out.push(
                            ReleasedEvent::promoted(target.clone(), item, a).with_payload(payload),
                        );
                    }
                    // Its redelivery was placed meanwhile: nothing left to hand over, and the
                    // parked copy of the payload goes.
                    Admission::Duplicate(_) => {
                        room.pop(&target);
                        self.drop_payload(payload);
                    }
                    Admission::Rejected(Rejection::TargetDraining { worker }) => {
                        blocker = self.inner.workers.get_with(&worker, |r| r.clone());
                        if blocker.is_none() {
                            // Purged already: it is dead; try again next sweep.
                            full = true;
                        }
                        break;
                    }
                    Admission::Rejected(_) | Admission::Waiting(_) => {
                        full = true;
                        break;
                    }
                }
            }
            if full {
                break;
            }
            skips = (0, 0);
            room.settle(&target, blocker);
        }
        room.unskip(&mut skips);
    }

    /// The payload of the pair if it waits (under the room's mutex), else what `stored` finds in
    /// the claims table under that same mutex (a promotion, which moves a delivery from the room
    /// to the table, holds it too).
    pub(super) fn waiting_payload(
        &self,
        target: &Target,
        event: &DeliveryId,
        stored: impl FnOnce() -> Option<Payload>,
    ) -> Option<Payload> {
        let Some(room) = &self.inner.room else {
            return stored();
        };
        let room = sync::lock(room);
        match room.payload(target, event) {
            Some(waiting) => waiting,
            None => stored(),
        }
    }

    /// Whether `target` has a live worker (so placing it takes no new slot).
    fn has_live_worker(&self, target: &Target) -> bool {
        self.inner
            .targets
            .get_with(target, |rec| !rec.state.load().is_dead())
            .unwrap_or(false)
    }
}

/// A park in progress, counted in `Inner::waiting` (deliveries parked or being parked) from
/// before its probe of the claims. Dropped, it gives the count back (the pair did not park, on
/// whichever way out); [`keep`](Self::keep) leaves it counted while the pair waits.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    /// Counts one park; call with the room's mutex held, before the probe.
    fn new(count: &'a AtomicUsize) -> Self {
        // Relaxed: ordered before any later bare claim of the pair by the claims-shard mutex
        // that the probe after this takes (the claim reads the count under that lock).
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }

    /// The pair is parked: it stays counted until it leaves the room.
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        // Relaxed: the pair is not in the room (it never went in); a claim that still sees it
        // counted only takes the room's mutex for nothing.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use crate::api::ids::{DeliveryId, Target};
    use crate::api::outcome::Admission;
    use crate::clock::ManualClock;
    use crate::config::RegistryConfig;
    use crate::memory::Direct;

    /// The per-owner counts hold an entry only while the owner has live workers: the last one's
    /// death removes it, so the map does not grow with every owner ever seen.
    #[test]
    fn an_owner_with_no_live_worker_left_has_no_entry() {
        let config = RegistryConfig::builder()
            .max_workers(8)
            .max_workers_per_owner(2)
            .build()
            .unwrap();
        let r = Direct::with_clock(config, ManualClock::new());
        let count = |owner: &str| r.inner.owner_live.get_with(owner, |n| *n);
        let mut workers = Vec::new();
        for n in 1..=2 {
            let t = Target::new("someone/repo", n).unwrap();
            let Admission::Assigned(a) = r.admit(&t, &DeliveryId::new("d").unwrap()) else {
                panic!("room for two of the owner's workers")
            };
            workers.push(a.worker);
        }
        assert_eq!(count("someone"), Some(2));
        r.deregister(workers[0]).unwrap();
        assert_eq!(count("someone"), Some(1));
        r.deregister(workers[1]).unwrap();
        assert_eq!(
            count("someone"),
            None,
            "the entry goes with the last worker"
        );
    }
}
