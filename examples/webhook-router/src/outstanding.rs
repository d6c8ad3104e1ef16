//! What this router holds of the deliveries it accepted and has not finished, outside the
//! registry: released events waiting to be placed again (the re-dispatcher's), deliveries parked
//! in the waiting room (the dispatcher's, tracked when the registry dies with the process), and
//! the events workers stopped at the shutdown deadline handed back (the lifecycle's). Each part
//! writes its own share; [`crate::shutdown`] reads them all to report what was left.

use crate::outcome::{Unfinished, UnfinishedWhy};

use std::collections::HashSet;
use std::sync::Mutex;

use dashmap::DashMap;
use worker_registry::{DeliveryId, ReleaseReason, ReleasedEvent, SweepReport, Target, WorkerId};

/// The accepted, unfinished deliveries one router holds (see the [module documentation](self)).
#[derive(Debug, Default)]
pub struct Outstanding {
    /// Whether the registry outlives this process: its waiting room is then not tracked here.
    shared: bool,
    /// Deliveries parked in the waiting room and not promoted yet (only when not `shared`: this
    /// process then sees every promotion); what a stop that misses its deadline reports by id.
    parked: DashMap<(Target, DeliveryId), ()>,
    /// Released events not yet placed again (capacity full, or shutting down).
    pending: Mutex<Vec<ReleasedEvent>>,
    /// Events handed back by workers stopped at the shutdown deadline.
    stopped: Mutex<Vec<Unfinished>>,
}

impl Outstanding {
    /// Nothing outstanding yet; `shared`: the registry outlives this process.
    pub fn new(shared: bool) -> Self {
        Self {
            shared,
            ..Self::default()
        }
    }

    /// Whether the registry outlives this process (its waiting room is the other replicas' too).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Remembers a parked delivery, unless the registry is shared.
    pub(crate) fn parked(&self, target: &Target, delivery: &DeliveryId) {
        if !self.shared {
            self.parked.insert((target.clone(), delivery.clone()), ());
        }
    }

    /// Forgets the parked deliveries a sweep promoted or dropped.
    pub(crate) fn unparked(&self, report: &SweepReport) {
        if self.parked.is_empty() {
            return;
        }
        let promoted = report
            .released
            .iter()
            .filter(|e| e.reason == ReleaseReason::Promoted)
            .map(|e| (&e.target, &e.delivery));
        let dropped = report
            .expired_waiting
            .iter()
            .map(|e| (&e.target, &e.delivery));
        for (t, d) in promoted.chain(dropped) {
            self.parked.remove(&(t.clone(), d.clone()));
        }
    }

    /// Released events waiting to be placed again.
    pub fn pending(&self) -> usize {
        self.pending.lock().map_or(0, |p| p.len())
    }

    /// The released events waiting to be placed again, taken out.
    pub(crate) fn take_pending(&self) -> Vec<ReleasedEvent> {
        self.pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }

    /// Keeps `events` to be placed again after the next sweep.
    pub(crate) fn keep_pending(&self, events: Vec<ReleasedEvent>) {
        if let Ok(mut p) = self.pending.lock() {
            p.extend(events);
        }
    }

    /// Records the events `worker`, stopped at the shutdown deadline, handed back.
    pub(crate) fn stopped(
        &self,
        worker: WorkerId,
        events: impl IntoIterator<Item = (Target, DeliveryId)>,
    ) {
        if let Ok(mut stopped) = self.stopped.lock() {
            stopped.extend(events.into_iter().map(|(target, delivery)| Unfinished {
                target,
                delivery,
                why: UnfinishedWhy::StoppedAtDeadline { worker },
            }));
        }
    }

    /// Everything accepted and not completed that this router knows of, once its workers are
    /// stopped: what stopped workers handed back, released events not re-dispatched, and
    /// `released` (the final sweep's), then what is still parked, one entry per delivery.
    pub(crate) fn unfinished(&self, released: &[ReleasedEvent]) -> Vec<Unfinished> {
        let mut out: Vec<Unfinished> = self.stopped.lock().map(|s| s.clone()).unwrap_or_default();
        let pending = self.pending.lock().map(|p| p.clone()).unwrap_or_default();
        let mut seen: HashSet<(Target, DeliveryId)> = out
            .iter()
            .map(|u| (u.target.clone(), u.delivery.clone()))
            .collect();
        for e in pending.iter().chain(released) {
            if seen.insert((e.target.clone(), e.delivery.clone())) {
                out.push(Unfinished {
                    target: e.target.clone(),
                    delivery: e.delivery.clone(),
                    why: UnfinishedWhy::Released { reason: e.reason },
                });
            }
        }
        for entry in self.parked.iter() {
            let (target, delivery) = entry.key();
            if seen.insert((target.clone(), delivery.clone())) {
                out.push(Unfinished {
                    target: target.clone(),
                    delivery: delivery.clone(),
                    why: UnfinishedWhy::StillWaiting,
                });
            }
        }
        out
    }
}
