//! The waiting room, as the contract states it (on `WorkerRegistry::admit_with`, "The waiting room"):
//! parking within the bounds, a parked pair's redelivery a duplicate, promotion when a death frees
//! room (the targets behind a draining worker that died first, then one target per repository
//! owner in turn, each owner's targets in arrival order, a target with all of its deliveries),
//! the per-owner cap on live workers, expiry past `max_wait`.
//!
//! Where the text leaves a choice open the model makes the in-memory backend's choice and says
//! so: promotion happens at the death itself (handed over in the next sweep's report), and again
//! in every sweep; an owner keeps its place in the round-robin while any of its targets is in
//! line, even one that left the line and came back (lines are cleaned when they are reached);
//! a promotion that finds its pair already placed (by a redelivery onto a live worker) drops it
//! silently (the in-memory backend counts that as a duplicate, and so does the model); a parking
//! refused only by the room's bounds while others wait for capacity is placed after all if
//! capacity allows.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::{wall, Model};
use crate::api::events::Event;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{Admission, AlreadyClaimed, ClaimState, Rejection, Waiting};
use crate::api::payload::Payload;
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::waiting::{ExpireReason, ExpiredWaiting};
use crate::clock::millis;

/// The repository owner a target counts against (before the slash).
pub(super) fn owner(t: &Target) -> String {
    t.repo()
        .split_once('/')
        .map_or(t.repo(), |(o, _)| o)
        .to_owned()
}

/// Where a waiting target waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In its owner's line, for capacity.
    Line,
    /// Behind its draining worker.
    Behind(WorkerId),
    /// Its draining worker died: first in line.
    First,
}

/// One parked delivery.
#[derive(Clone)]
struct Item {
    /// Arrival number.
    seq: u64,
    delivery: DeliveryId,
    /// Parked at (ms).
    at: u64,
    payload: Option<Payload>,
}

struct Waiter {
    /// In arrival order.
    items: VecDeque<Item>,
    place: Place,
}

/// The room's state.
#[derive(Default)]
pub(super) struct Room {
    waiters: BTreeMap<Target, Waiter>,
    /// Per owner, the targets in line (entries of targets that left since are skipped).
    lines: BTreeMap<String, VecDeque<Target>>,
    /// The owners with a line, in round-robin order.
    ring: VecDeque<String>,
    /// Targets whose draining worker died, in the order of the deaths.
    first: VecDeque<Target>,
    /// Targets behind each draining worker.
    behind: BTreeMap<WorkerId, Vec<Target>>,
    /// Every parking in arrival order: (arrival, parked at, target).
    arrivals: VecDeque<(u64, u64, Target)>,
    /// Targets in line or first (what an arrival needing a new worker defers to).
    contenders: usize,
    len: usize,
    seq: u64,
    /// Promoted by a death, for the next sweep's report.
    handover: Vec<ReleasedEvent>,
}

impl Room {
    /// The parked delivery of this pair, if it waits.
    fn item(&self, t: &Target, d: &DeliveryId) -> Option<&Item> {
        self.waiters.get(t)?.items.iter().find(|i| i.delivery == *d)
    }

    /// Promoted deliveries awaiting the next sweep's report.
    pub(super) fn handed_over(&self) -> u64 {
        self.handover.len() as u64
    }

    /// Every payload waiting.
    pub(super) fn payloads(&self) -> impl Iterator<Item = &Payload> + '_ {
        self.waiters
            .values()
            .flat_map(|w| w.items.iter().filter_map(|i| i.payload.as_ref()))
    }

    fn per_owner(&self, o: &str) -> usize {
        self.waiters
            .iter()
            .filter(|(t, _)| owner(t) == o)
            .map(|(_, w)| w.items.len())
            .sum()
    }

    fn line_up(&mut self, t: &Target) {
        let o = owner(t);
        let line = self.lines.entry(o.clone()).or_default();
        if line.is_empty() {
            self.ring.push_back(o);
        }
        line.push_back(t.clone());
        self.contenders += 1;
    }

    /// The next target to promote (stale entries dropped on the way).
    fn candidate(&mut self) -> Option<Target> {
        while let Some(t) = self.first.front() {
            if self.waiters.get(t).is_some_and(|w| w.place == Place::First) {
                return Some(t.clone());
            }
            self.first.pop_front();
        }
        while let Some(o) = self.ring.front().cloned() {
            let line = self.lines.entry(o.clone()).or_default();
            while let Some(t) = line.front() {
                if self.waiters.get(t).is_some_and(|w| w.place == Place::Line) {
                    return Some(t.clone());
                }
                line.pop_front();
            }
            self.ring.pop_front();
            self.lines.remove(&o);
        }
        None
    }

    /// The candidate goes to the back of its line (its owner is at its cap); remembered in
    /// `aside` (its line: `first` or not).
    fn set_aside(&mut self, aside: &mut Vec<bool>) {
        if let Some(t) = self.first.pop_front() {
            self.first.push_back(t);
            aside.push(true);
        } else if let Some(o) = self.ring.pop_front() {
            self.ring.push_back(o);
            aside.push(false);
        }
    }

    /// A pass that placed nothing after setting candidates aside puts them back in their place.
    fn put_back(&mut self, aside: &mut Vec<bool>) {
        while let Some(first) = aside.pop() {
            if first {
                if let Some(t) = self.first.pop_back() {
                    self.first.push_front(t);
                }
            } else if let Some(o) = self.ring.pop_back() {
                self.ring.push_front(o);
            }
        }
    }

    /// The candidate `t` is done for now: promoted, emptied, or behind `blocker`.
    fn settle(&mut self, t: &Target, blocker: Option<WorkerId>) {
        let Some(place) = self.waiters.get(t).map(|w| w.place) else {
            return;
        };
        match place {
            Place::First => {
                self.first.pop_front();
            }
            Place::Line => {
                let o = owner(t);
                if let Some(line) = self.lines.get_mut(&o) {
                    line.pop_front();
                }
                if self.ring.front() == Some(&o) {
                    self.ring.pop_front();
                    if self.lines.get(&o).is_some_and(|l| !l.is_empty()) {
                        self.ring.push_back(o);
                    } else {
                        self.lines.remove(&o);
                    }
                }
            }
            Place::Behind(_) => return,
        }
        self.contenders -= 1;
        if self.waiters[t].items.is_empty() {
            self.waiters.remove(t);
        } else if let Some(id) = blocker {
            self.waiters.get_mut(t).expect("waits").place = Place::Behind(id);
            self.behind.entry(id).or_default().push(t.clone());
        } else {
            self.waiters.get_mut(t).expect("waits").place = Place::Line;
            self.line_up(t);
        }
    }

    /// The targets behind the dead `id` go first.
    fn unblock(&mut self, id: WorkerId) {
        for t in self.behind.remove(&id).unwrap_or_default() {
            if let Some(w) = self
                .waiters
                .get_mut(&t)
                .filter(|w| w.place == Place::Behind(id))
            {
                w.place = Place::First;
                self.first.push_back(t);
                self.contenders += 1;
            }
        }
    }
}

/// What parking did.
enum Parked {
    At(usize),
    Duplicate(u64),
    Full,
}

impl Model {
    /// Deliveries waiting now.
    pub(super) fn waiting(&self) -> usize {
        self.room.as_ref().map_or(0, |r| r.len)
    }

    /// Whether an admission needing a new worker defers to targets waiting for capacity.
    pub(super) fn contended(&self) -> bool {
        self.room.as_ref().is_some_and(|r| r.contenders > 0)
    }

    /// When the pair was parked, if it waits.
    pub(super) fn waits_since(&self, target: &Target, delivery: &DeliveryId) -> Option<u64> {
        Some(self.room.as_ref()?.item(target, delivery)?.at)
    }

    /// The payload of the pair if it waits (`Some(None)`: it waits without one).
    pub(super) fn waiting_payload(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Option<Option<Payload>> {
        Some(self.room.as_ref()?.item(target, delivery)?.payload.clone())
    }

    /// A refused admission: parked (with its payload, if the budget has room for it), a
    /// duplicate of its parked self, or (room full) refused.
    pub(super) fn park(
        &mut self,
        target: &Target,
        delivery: &DeliveryId,
        r: Rejection,
        payload: Option<&Payload>,
    ) -> Admission {
        let now = self.ms();
        let (max, per) = (
            self.config.max_waiting(),
            self.config.max_waiting_per_owner(),
        );
        if self.room.is_none() {
            return Admission::Rejected(r);
        }
        let refusal = match self.waits_since(target, delivery) {
            Some(_) => None,
            None => payload.and_then(|p| self.over_budget(p, 0)),
        };
        if let Some(refusal) = refusal {
            return Admission::Rejected(refusal);
        }
        let room = self.room.as_mut().expect("on");
        let parked = if let Some(at) = room.item(target, delivery).map(|i| i.at) {
            Parked::Duplicate(at)
        } else if room.len >= max || room.per_owner(&owner(target)) >= per {
            Parked::Full
        } else {
            room.seq += 1;
            let seq = room.seq;
            room.arrivals.push_back((seq, now, target.clone()));
            room.len += 1;
            let item = Item {
                seq,
                delivery: delivery.clone(),
                at: now,
                payload: payload.cloned(),
            };
            if let Some(w) = room.waiters.get_mut(target) {
                w.items.push_back(item);
            } else {
                let place = match r {
                    Rejection::TargetDraining { worker } => {
                        room.behind.entry(worker).or_default().push(target.clone());
                        Place::Behind(worker)
                    }
                    _ => {
                        room.line_up(target);
                        Place::Line
                    }
                };
                room.waiters.insert(
                    target.clone(),
                    Waiter {
                        items: VecDeque::from([item]),
                        place,
                    },
                );
            }
            Parked::At(room.len)
        };
        match parked {
            Parked::At(position) => {
                self.counts.parked += 1;
                Admission::Waiting(Waiting::new(position, r))
            }
            Parked::Duplicate(at) => {
                self.counts.duplicates += 1;
                Admission::Duplicate(AlreadyClaimed::new(None, wall(at), ClaimState::Waiting))
            }
            Parked::Full if matches!(r, Rejection::CapacityFull { .. }) => {
                self.admit_unparked(target, delivery, false, payload, false)
            }
            Parked::Full => Admission::Rejected(r),
        }
    }

    /// A death freed room: the targets behind `id` go first, then the oldest that fit are
    /// promoted, for the next sweep's report.
    pub(super) fn after_death(&mut self, id: WorkerId) {
        let Some(room) = self.room.as_mut() else {
            return;
        };
        if room.len == 0 {
            return;
        }
        room.unblock(id);
        if self.sweeping {
            return;
        }
        let room = self.room.as_mut().expect("on");
        let mut out = std::mem::take(&mut room.handover);
        self.fill(&mut out);
        if let Some(room) = self.room.as_mut() {
            room.handover = out;
        }
    }

    /// The sweep's step: hand over what deaths promoted, drop what waited past `max_wait`,
    /// promote what fits. Returns how many deliveries it placed (in flight now).
    pub(super) fn promote(&mut self, report: &mut SweepReport) -> usize {
        let now = self.ms();
        let limit = self.config.max_wait();
        let Some(room) = self.room.as_mut() else {
            return 0;
        };
        report.released.append(&mut room.handover);
        if let Some(cutoff) = now.checked_sub(millis(limit)) {
            while let Some(&(seq, at, _)) = room.arrivals.front() {
                if at > cutoff {
                    break;
                }
                let (_, _, t) = room.arrivals.pop_front().expect("looked at");
                let Some(w) = room.waiters.get_mut(&t) else {
                    continue;
                };
                if w.items.front().is_none_or(|i| i.seq != seq) {
                    continue; // promoted since
                }
                // Dropped, and its payload with it.
                let Item { delivery, at, .. } = w.items.pop_front().expect("looked at");
                room.len -= 1;
                if w.items.is_empty() {
                    let place = w.place;
                    room.waiters.remove(&t);
                    if matches!(place, Place::Line | Place::First) {
                        room.contenders -= 1;
                    }
                }
                report.expired_waiting.push(ExpiredWaiting::new(
                    t,
                    delivery,
                    Duration::from_millis(now.saturating_sub(at)),
                    ExpireReason::WaitedTooLong { limit },
                ));
            }
        }
        self.counts.waiting_expired += report.expired_waiting.len() as u64;
        let handed = report.released.len();
        self.fill(&mut report.released);
        report.waiting = self.waiting();
        report.released.len() - handed
    }

    /// Promotes the oldest waiting deliveries that fit, into `out`.
    fn fill(&mut self, out: &mut Vec<ReleasedEvent>) {
        let mut aside = Vec::new();
        self.fill_with(out, &mut aside);
        if let Some(room) = self.room.as_mut() {
            room.put_back(&mut aside);
        }
    }

    fn fill_with(&mut self, out: &mut Vec<ReleasedEvent>, aside: &mut Vec<bool>) {
        loop {
            let Some(t) = self.room.as_mut().and_then(Room::candidate) else {
                return;
            };
            if self.owner_full(&t) && !self.targets.contains_key(&t) {
                let room = self.room.as_mut().expect("on");
                if aside.len() >= room.contenders {
                    return;
                }
                room.set_aside(aside);
                continue;
            }
            let mut blocker = None;
            loop {
                let room = self.room.as_ref().expect("on");
                let Some(item) = room.waiters.get(&t).and_then(|w| w.items.front()).cloned() else {
                    break;
                };
                // Its parking counted the payload: the claim takes it over.
                let (d, payload) = (item.delivery, item.payload);
                match self.admit_unparked(&t, &d, false, payload.as_ref(), true) {
                    Admission::Assigned(a) => {
                        self.pop(&t);
                        self.counts.promoted += 1;
                        out.push(ReleasedEvent::promoted(t.clone(), d, a).with_payload(payload));
                    }
                    Admission::Duplicate(_) => self.pop(&t),
                    Admission::Rejected(Rejection::TargetDraining { worker }) => {
                        if self.workers.get(&worker).is_none_or(|w| w.purged) {
                            return;
                        }
                        blocker = Some(worker);
                        break;
                    }
                    Admission::Rejected(_) | Admission::Waiting(_) => return,
                }
            }
            aside.clear();
            self.room.as_mut().expect("on").settle(&t, blocker);
        }
    }

    fn pop(&mut self, t: &Target) {
        let room = self.room.as_mut().expect("on");
        if let Some(w) = room.waiters.get_mut(t) {
            if w.items.pop_front().is_some() {
                room.len -= 1;
            }
        }
    }

    /// Whether `t`'s owner holds its cap of live workers.
    pub(super) fn owner_full(&self, t: &Target) -> bool {
        let cap = self.config.max_workers_per_owner();
        let o = owner(t);
        cap > 0
            && self
                .workers
                .values()
                .filter(|w| !w.dead() && w.target.as_ref().is_some_and(|wt| owner(wt) == o))
                .count()
                >= cap
    }

    /// One event per promoted delivery, then one per dropped one (after `TargetReleased`).
    pub(super) fn publish_waiting(&self, report: &SweepReport) {
        for e in &report.released {
            if let (crate::api::report::ReleaseReason::Promoted, Some(a)) = (e.reason, e.assignment)
            {
                self.events.send(|| Event::DeliveryPromoted {
                    worker: a.worker,
                    target: e.target.clone(),
                    delivery: e.delivery.clone(),
                });
            }
        }
        for e in &report.expired_waiting {
            self.events.send(|| Event::WaitingExpired {
                target: e.target.clone(),
                delivery: e.delivery.clone(),
                reason: e.reason,
            });
        }
    }
}
