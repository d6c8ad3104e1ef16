//! The waiting room: deliveries parked because their target could not be placed (no capacity, or
//! its worker draining), promoted when room appears (by the death or exit that frees it, and by
//! the sweep), dropped past `max_wait`.
//!
//! Everything here is the slow path. The room is one mutex, taken only by an admission that was
//! already refused (to park it), by a worker's death while deliveries wait (to promote into its
//! slot), by the sweep (to hand over, promote and expire) and by a bare claim only while
//! deliveries are parked or being parked; a duplicate, a sticky admit and a heartbeat never
//! touch it. The hot paths read two atomic counts of it:
//! [`Inner::contenders`](super::Inner), targets waiting for capacity (while it is not zero, an
//! admission that would create a worker parks instead, so arrivals do not overtake the
//! deliveries already waiting for the slot that just freed), and `Inner::waiting`, deliveries
//! parked or being parked (while it is zero, a bare claim decides under its claims-shard lock
//! alone; see `claims.rs`).
//!
//! Layout, so that no call walks every waiting entry:
//!
//! * `targets`: each waiting target's deliveries, in arrival order, and where the target waits;
//! * `owners` + `ring`: targets waiting for capacity, in arrival order per repository owner, and
//!   a round-robin ring of the owners that have some (promotion takes one target per owner in
//!   turn);
//! * `blocked`: targets waiting for their draining worker to exit, by that worker; its death
//!   moves them to `ready` (in the order of the deaths), which promotion serves first (the dead
//!   worker's slot is theirs); the sweep checks each blocking worker left once, for a death
//!   that raced the parking behind it;
//! * `handover`: deliveries a death promoted, for the next sweep's report;
//! * `order`: every parked delivery in arrival order, for expiry from the front (entries promoted
//!   since are skipped when they reach the front).
//!
//! Lock order: sweep mutex → room → claims shard → targets shard → workers shard. Parking and a
//! death take the room with no map lock held.

use std::collections::{HashMap, VecDeque};

use super::record::WorkerRecord;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::payload::Payload;
use crate::api::report::ReleasedEvent;
use crate::sync::Arc;

/// The repository owner a target counts against (the part of `owner/repo` before the slash).
pub(crate) fn owner_of(target: &Target) -> &str {
    target
        .repo()
        .split_once('/')
        .map_or(target.repo(), |(o, _)| o)
}

/// One parked delivery.
pub(crate) struct Item {
    /// Arrival number (unique, increasing).
    pub(crate) seq: u64,
    pub(crate) delivery: DeliveryId,
    /// When it was parked (registry ms).
    pub(crate) at: u64,
    /// What it was admitted with (its bytes reserved in the payload budget while it waits).
    pub(crate) payload: Option<Payload>,
}

/// Where a waiting target waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// In its owner's queue, for capacity.
    Queued,
    /// Behind its draining worker.
    Blocked(WorkerId),
    /// Its draining worker is dead: first in line.
    Ready,
}

/// One waiting target.
pub(crate) struct Queue {
    pub(crate) items: VecDeque<Item>,
    pub(crate) place: Place,
}

/// The room's state, behind its mutex.
#[derive(Default)]
pub(crate) struct Room {
    pub(crate) targets: HashMap<Target, Queue>,
    /// Per owner, targets waiting for capacity (may hold targets since promoted or dropped:
    /// skipped when they reach the front).
    owners: HashMap<String, VecDeque<Target>>,
    /// Owners with a non-empty queue in `owners`, in round-robin order.
    ring: VecDeque<String>,
    /// Deliveries waiting per owner (for `max_waiting_per_owner`).
    per_owner: HashMap<String, usize>,
    /// Targets behind a draining worker, by that worker.
    pub(crate) blocked: HashMap<WorkerId, (Arc<WorkerRecord>, Vec<Target>)>,
    /// Targets whose draining worker died, in the order that was found.
    ready: VecDeque<Target>,
    /// Every parked delivery, in arrival order: (seq, parked at, target).
    order: VecDeque<(u64, u64, Target)>,
    /// Deliveries waiting.
    pub(crate) len: usize,
    /// Deliveries that left since the registry last took this tally (to lower
    /// [`Inner::waiting`](super::Inner) by, see `publish_room`).
    pub(crate) left: usize,
    /// Targets waiting for capacity (queued or ready).
    pub(crate) contenders: usize,
    seq: u64,
    /// Deliveries promoted outside a sweep (by a death), for the next sweep's report.
    pub(crate) handover: Vec<ReleasedEvent>,
}

/// What [`Room::park`] did.
pub(crate) enum Parked {
    /// Parked at this position (deliveries waiting, itself included).
    At(usize),
    /// The same pair waits already, since this time (registry ms).
    Duplicate(u64),
    /// The room (or the owner's share of it) is full.
    Full,
}

impl Room {
    /// Parks one delivery for `target` (blocked behind `blocker` if it is draining), unless the pair
    /// waits already or a limit is reached.
    pub(crate) fn park(
        &mut self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
        blocker: Option<Arc<WorkerRecord>>,
        now: u64,
        (max, per_owner): (usize, usize),
    ) -> Parked {
        if let Some(at) = self.waits_since(target, delivery) {
            return Parked::Duplicate(at);
        }
        let owner = owner_of(target);
        let mine = self.per_owner.get(owner).copied().unwrap_or(0);
        if self.len >= max || mine >= per_owner {
            return Parked::Full;
        }
        self.seq += 1;
        let item = Item {
            seq: self.seq,
            delivery: delivery.clone(),
            at: now,
            payload: payload.cloned(),
        };
        self.order.push_back((self.seq, now, target.clone()));
        *self.per_owner.entry(owner.to_owned()).or_default() += 1;
        self.len += 1;
        if let Some(q) = self.targets.get_mut(target) {
            // The target waits already (for capacity, or behind its worker): join its queue.
            q.items.push_back(item);
            return Parked::At(self.len);
        }
        let place = match blocker {
            Some(rec) => {
                let id = rec.id;
                self.blocked
                    .entry(id)
                    .or_insert_with(|| (rec, Vec::new()))
                    .1
                    .push(target.clone());
                Place::Blocked(id)
            }
            None => {
                self.enqueue(target);
                Place::Queued
            }
        };
        self.targets.insert(
            target.clone(),
            Queue {
                items: VecDeque::from([item]),
                place,
            },
        );
        Parked::At(self.len)
    }

    /// When the pair was parked, if it waits (a walk of the target's own queue, at most
    /// `max_waiting_per_owner` long).
    pub(crate) fn waits_since(&self, target: &Target, delivery: &DeliveryId) -> Option<u64> {
        let q = self.targets.get(target)?;
        Some(q.items.iter().find(|i| i.delivery == *delivery)?.at)
    }

    /// Puts `target` at the back of its owner's capacity queue.
    fn enqueue(&mut self, target: &Target) {
        let owner = owner_of(target);
        let q = self.owners.entry(owner.to_owned()).or_default();
        if q.is_empty() {
            self.ring.push_back(owner.to_owned());
        }
        q.push_back(target.clone());
        self.contenders += 1;
    }

    /// Moves the targets behind workers that are dead now to the front of the line. Visits each
    /// blocking worker once.
    pub(crate) fn unblock_dead(&mut self) {
        let mut freed = Vec::new();
        self.blocked.retain(|id, (rec, targets)| {
            if rec.state.load().is_dead() {
                freed.extend(targets.drain(..).map(|t| (*id, t)));
                false
            } else {
                true
            }
        });
        for (id, t) in freed {
            self.make_ready(id, t);
        }
    }

    /// Moves the targets behind `worker` (dead now) to the front of the line.
    pub(crate) fn unblock(&mut self, worker: WorkerId) {
        if let Some((_, targets)) = self.blocked.remove(&worker) {
            for t in targets {
                self.make_ready(worker, t);
            }
        }
    }

    /// `t`, blocked behind the dead `id`, is first in line now; only if it still waits behind
    /// that worker (it may have left, and come back).
    fn make_ready(&mut self, id: WorkerId, t: Target) {
        if let Some(q) = self
            .targets
            .get_mut(&t)
            .filter(|q| q.place == Place::Blocked(id))
        {
            q.place = Place::Ready;
            self.ready.push_back(t);
            self.contenders += 1;
        }
    }

    /// The next target to promote: a target whose draining worker died, else the front target of
    /// the owner at the front of the ring (stale entries dropped on the way).
    pub(crate) fn candidate(&mut self) -> Option<Target> {
        while let Some(t) = self.ready.front() {
            if self.targets.get(t).is_some_and(|q| q.place == Place::Ready) {
                return Some(t.clone());
            }
            self.ready.pop_front();
        }
        while let Some(owner) = self.ring.front() {
            let q = self.owners.get_mut(owner.as_str());
            let Some(q) = q else {
                self.ring.pop_front();
                continue;
            };
            while let Some(t) = q.front() {
                if self
                    .targets
                    .get(t)
                    .is_some_and(|w| w.place == Place::Queued)
                {
                    return Some(t.clone());
                }
                q.pop_front();
            }
            let owner = self.ring.pop_front().unwrap_or_default();
            self.owners.remove(&owner);
        }
        None
    }

    /// `target` (the last [`candidate`](Self::candidate)) is done for now: promoted, emptied, or
    /// blocked behind `blocker`. Its owner moves to the back of the ring.
    pub(crate) fn settle(&mut self, target: &Target, blocker: Option<Arc<WorkerRecord>>) {
        let Some(q) = self.targets.get_mut(target) else {
            return;
        };
        let was = q.place;
        match was {
            Place::Ready => {
                self.ready.pop_front();
            }
            Place::Queued => {
                let owner = owner_of(target);
                if let Some(oq) = self.owners.get_mut(owner) {
                    oq.pop_front();
                }
                if self.ring.front().is_some_and(|o| o == owner) {
                    self.ring.pop_front();
                    if self.owners.get(owner).is_some_and(|oq| !oq.is_empty()) {
                        self.ring.push_back(owner.to_owned());
                    } else {
                        self.owners.remove(owner);
                    }
                }
            }
            Place::Blocked(_) => return,
        }
        self.contenders -= 1;
        if q.items.is_empty() {
            self.targets.remove(target);
            return;
        }
        if let Some(rec) = blocker {
            q.place = Place::Blocked(rec.id);
            self.blocked
                .entry(rec.id)
                .or_insert_with(|| (rec, Vec::new()))
                .1
                .push(target.clone());
        } else {
            // Promoted while deliveries remain is not possible (a placed target takes all of its
            // queue); keep it in line rather than lose it.
            q.place = Place::Queued;
            self.enqueue(target);
        }
    }

    /// The delivery at the front of `target`'s queue, and its payload.
    pub(crate) fn front(&self, target: &Target) -> Option<(DeliveryId, Option<Payload>)> {
        let item = self.targets.get(target)?.items.front()?;
        Some((item.delivery.clone(), item.payload.clone()))
    }

    /// If the pair waits, its payload (`Some(None)`: it waits without one). Walks the target's
    /// own queue, as parking does (at most `max_waiting_per_owner` long).
    pub(crate) fn payload(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Option<Option<Payload>> {
        let q = self.targets.get(target)?;
        let item = q.items.iter().find(|i| i.delivery == *delivery)?;
        Some(item.payload.clone())
    }

    /// Sets the last [`candidate`](Self::candidate) aside for this pass (its owner is at its
    /// cap): it goes to the back of its line. Counted in `skips` (ready, ring) for
    /// [`unskip`](Self::unskip).
    pub(crate) fn skip(&mut self, skips: &mut (usize, usize)) {
        if let Some(t) = self.ready.pop_front() {
            self.ready.push_back(t);
            skips.0 += 1;
        } else if let Some(owner) = self.ring.pop_front() {
            self.ring.push_back(owner);
            skips.1 += 1;
        }
    }

    /// Undoes the skips since the last target settled: a pass that ends without placing the
    /// targets after them leaves the line as it was, so the owners set aside keep their turn
    /// for the next room that appears (one exit at a time would otherwise serve the same owner
    /// again and again while the others are at their cap).
    pub(crate) fn unskip(&mut self, skips: &mut (usize, usize)) {
        for _ in 0..std::mem::take(&mut skips.0) {
            if let Some(t) = self.ready.pop_back() {
                self.ready.push_front(t);
            }
        }
        for _ in 0..std::mem::take(&mut skips.1) {
            if let Some(owner) = self.ring.pop_back() {
                self.ring.push_front(owner);
            }
        }
    }

    /// Takes the front delivery of `target`'s queue (it was promoted, or its redelivery placed).
    pub(crate) fn pop(&mut self, target: &Target) -> Option<Item> {
        let item = self.targets.get_mut(target)?.items.pop_front()?;
        self.forget_one(target);
        Some(item)
    }

    fn forget_one(&mut self, target: &Target) {
        self.len -= 1;
        self.left += 1;
        let owner = owner_of(target);
        if let Some(n) = self.per_owner.get_mut(owner) {
            *n -= 1;
            if *n == 0 {
                self.per_owner.remove(owner);
            }
        }
    }

    /// Drops deliveries parked at or before `cutoff` (registry ms), oldest first: each is
    /// returned with its target. Deliveries promoted since they were parked are skipped.
    pub(crate) fn expire(&mut self, cutoff: u64) -> Vec<(Target, Item)> {
        let mut out = Vec::new();
        while let Some((seq, at, _)) = self.order.front() {
            if *at > cutoff {
                break;
            }
            let seq = *seq;
            let Some((_, _, target)) = self.order.pop_front() else {
                break;
            };
            let Some(q) = self.targets.get_mut(&target) else {
                continue;
            };
            // A target's deliveries are in arrival order, and older ones left first: if this one
            // still waits, it is at the front.
            if q.items.front().is_some_and(|i| i.seq == seq) {
                let Some(item) = q.items.pop_front() else {
                    continue;
                };
                let empty = q.items.is_empty();
                let place = q.place;
                self.forget_one(&target);
                if empty {
                    self.targets.remove(&target);
                    if matches!(place, Place::Queued | Place::Ready) {
                        // Its stale entry in a queue is skipped when reached.
                        self.contenders -= 1;
                    }
                }
                out.push((target, item));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::state;

    fn t(owner: &str, n: u64) -> Target {
        Target::new(&format!("{owner}/repo"), n).unwrap()
    }

    fn d(s: &str) -> DeliveryId {
        DeliveryId::new(s).unwrap()
    }

    /// A live, busy worker record of `target`.
    fn worker(id: u64, target: &Target) -> Arc<WorkerRecord> {
        Arc::new(WorkerRecord::new(
            WorkerId::new(id),
            Some(target.clone()),
            0,
            SystemTime::UNIX_EPOCH,
            true,
            false,
        ))
    }

    const BOUNDS: (usize, usize) = (16, 16);

    /// The safety net for a death that raced a parking behind the dying worker: `unblock_dead`
    /// moves the targets behind workers that are dead now to the front of the line, and leaves
    /// those behind live ones blocked.
    #[test]
    fn unblock_dead_readies_exactly_the_targets_behind_dead_workers() {
        let mut room = Room::default();
        let (a, b) = (t("o", 1), t("o", 2));
        let (wa, wb) = (worker(1, &a), worker(2, &b));
        assert!(matches!(
            room.park(&a, &d("a"), None, Some(wa.clone()), 0, BOUNDS),
            Parked::At(1)
        ));
        assert!(matches!(
            room.park(&b, &d("b"), None, Some(wb.clone()), 0, BOUNDS),
            Parked::At(2)
        ));
        assert_eq!(
            (room.candidate(), room.contenders),
            (None, 0),
            "both blocked"
        );

        wa.state.transition(state::deregister).expect("alive");
        room.unblock_dead();
        assert_eq!(
            room.candidate(),
            Some(a.clone()),
            "a's worker is dead: a is first"
        );
        assert_eq!(room.contenders, 1);
        assert_eq!(
            room.targets[&b].place,
            Place::Blocked(wb.id),
            "b's worker lives"
        );
        assert!(room.blocked.contains_key(&wb.id) && !room.blocked.contains_key(&wa.id));
    }

    /// Setting the candidate aside counts it in the right tally (the ready line's or the
    /// owners'), moves it to the back of its line, and `unskip` puts the line back as it was.
    #[test]
    fn skip_counts_what_it_set_aside_and_unskip_restores_the_order() {
        let mut room = Room::default();
        let (r1, r2) = (t("x", 1), t("x", 2));
        for (n, target) in [(1, &r1), (2, &r2)] {
            let w = worker(n, target);
            room.park(
                target,
                &d(&format!("r{n}")),
                None,
                Some(w.clone()),
                0,
                BOUNDS,
            );
            w.state.transition(state::deregister).expect("alive");
            room.unblock(w.id);
        }
        let (q1, q2) = (t("y", 1), t("z", 1));
        room.park(&q1, &d("q1"), None, None, 0, BOUNDS);
        room.park(&q2, &d("q2"), None, None, 0, BOUNDS);

        let mut skips = (0, 0);
        assert_eq!(room.candidate(), Some(r1.clone()));
        room.skip(&mut skips);
        assert_eq!(skips, (1, 0), "a ready target set aside");
        assert_eq!(room.candidate(), Some(r2.clone()));
        room.skip(&mut skips);
        assert_eq!(
            room.candidate(),
            Some(r1.clone()),
            "the ready line went round"
        );
        assert_eq!(skips, (2, 0));
        room.unskip(&mut skips);
        assert_eq!((skips, room.candidate()), ((0, 0), Some(r1.clone())));

        // The owners' ring: with the ready line served, the queued owners take turns.
        for r in [&r1, &r2] {
            room.pop(r);
            room.settle(r, None);
        }
        assert_eq!(room.candidate(), Some(q1.clone()));
        room.skip(&mut skips);
        assert_eq!((skips, room.candidate()), ((0, 1), Some(q2.clone())));
        room.unskip(&mut skips);
        assert_eq!((skips, room.candidate()), ((0, 0), Some(q1)));
    }
}
