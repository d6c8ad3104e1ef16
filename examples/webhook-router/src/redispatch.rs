//! Re-dispatch of released deliveries: the [`Sweeper`](worker_registry::Sweeper)'s callback.
//! Events the registry released (their worker died) are admitted again through
//! [`crate::dispatch`]; those that cannot be placed yet are kept for the next sweep, and those
//! of this sweep deferred (not acknowledged, so a shared backend may offer them to another
//! replica). The [`Redispatcher`] holds the [`Dispatcher`] it places them with, the
//! [`Lifecycle`] (a dead worker is killed before its events go on) and the [`Outstanding`]
//! events it keeps, and counts what it placed again.

use crate::dispatch::Dispatcher;
use crate::lifecycle::Lifecycle;
use crate::metrics::RouterMetrics;
use crate::outcome::{Dispatch, Source};
use crate::outstanding::Outstanding;
use crate::telemetry;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracing::Instrument;
use worker_registry::{
    Deferred, DeliveryId, DynRegistry, Maintenance, Payload, ReleaseReason, ReleasedEvent,
    SweepReport, Target, WorkerId, WorkerRegistry,
};

/// A released event's identity: one delivery to one target.
type Key = (Target, DeliveryId);

fn key(e: &ReleasedEvent) -> Key {
    (e.target.clone(), e.delivery.clone())
}

/// What one pass over the waiting events made of them.
#[derive(Default)]
struct Placed {
    /// Deferred by an earlier sweep and placed now: to acknowledge here.
    late: Vec<ReleasedEvent>,
    /// Not placed: kept for the next sweep.
    still: Vec<ReleasedEvent>,
}

/// The re-dispatcher of one router replica: the sweeper's callback (see the [module
/// documentation](self)).
pub struct Redispatcher {
    /// Places each released event again.
    dispatcher: Arc<Dispatcher>,
    registry: DynRegistry,
    metrics: RouterMetrics,
    /// Kills a dead worker before its events go on; forgets the stopped ones.
    lifecycle: Arc<Lifecycle>,
    /// Where the events that cannot be placed yet wait, and parked deliveries are forgotten.
    outstanding: Arc<Outstanding>,
    /// Released events admitted again so far.
    redispatched: AtomicU64,
}

impl Redispatcher {
    /// The re-dispatcher that places released events through `dispatcher`.
    pub(crate) fn new(
        dispatcher: Arc<Dispatcher>,
        registry: DynRegistry,
        metrics: RouterMetrics,
        lifecycle: Arc<Lifecycle>,
        outstanding: Arc<Outstanding>,
    ) -> Self {
        Self {
            dispatcher,
            registry,
            metrics,
            lifecycle,
            outstanding,
            redispatched: AtomicU64::new(0),
        }
    }

    /// Released events admitted again so far.
    pub fn redispatched(&self) -> u64 {
        // Relaxed: a statistic; nothing is published through it.
        self.redispatched.load(Ordering::Relaxed)
    }
}

impl Redispatcher {
    /// The sweeper callback: re-dispatch released events (keeping, and deferring, those that cannot
    /// be placed yet), then forget the mailboxes of dead workers whose task has stopped.
    pub async fn after_sweep(&self, report: SweepReport) -> Deferred {
        for (id, reason) in &report.died {
            tracing::warn!(worker = %id, %reason, "worker declared dead");
        }
        // Kill before re-dispatch: a dead worker's process is gone before its events go on.
        let died: Vec<WorkerId> = report.died.iter().map(|(id, _)| *id).collect();
        let cap = self.registry.config().heartbeat_interval();
        self.lifecycle.kill_dead(&died, cap).await;
        self.lifecycle
            .containers()
            .ledger()
            .released(&report.released);
        self.outstanding.unparked(&report);
        if let Some(remote) = self.lifecycle.remote() {
            // Their owners may be gone (that may be why they died): nobody else forgets them.
            remote.forget(&died).await;
        }
        let fresh: HashSet<Key> = report.released.iter().map(key).collect();
        let queue = self.waiting_with(&report.released);
        let placed = self.place_again(queue, &fresh).await;
        // Events deferred by an earlier sweep and placed now are acknowledged here (this sweep's
        // own are acknowledged by the sweeper, unless deferred below).
        if !placed.late.is_empty() {
            if let Err(e) = self.registry.acknowledge(&placed.late).await {
                tracing::warn!(
                    "acknowledging {} re-dispatched events failed: {e}",
                    placed.late.len()
                );
            }
        }
        let deferred: Vec<ReleasedEvent> = placed
            .still
            .iter()
            .filter(|e| fresh.contains(&key(e)))
            .cloned()
            .collect();
        self.outstanding.keep_pending(placed.still);
        self.lifecycle.forget_stopped_workers().await;
        Deferred::new(deferred)
    }

    /// The events waiting from earlier sweeps, taken out, and `released` added once each (a shared
    /// backend may offer a deferred event again: one copy is kept).
    fn waiting_with(&self, released: &[ReleasedEvent]) -> Vec<ReleasedEvent> {
        let mut queue = self.outstanding.take_pending();
        let known: HashSet<Key> = queue.iter().map(key).collect();
        queue.extend(
            released
                .iter()
                .filter(|e| !known.contains(&key(e)))
                .cloned(),
        );
        queue
    }

    /// Admits each of `queue` again; `fresh` are this sweep's own.
    async fn place_again(&self, queue: Vec<ReleasedEvent>, fresh: &HashSet<Key>) -> Placed {
        let mut placed = Placed::default();
        for event in queue {
            // A trace of its own, linked to the one it was handed over in (if this process had it).
            let original = self
                .lifecycle
                .containers()
                .traces()
                .take(&event.target, &event.delivery);
            let span =
                telemetry::redispatch_span(&event.target, &event.delivery, original.as_ref());
            let payload = self.released_payload(&event).await;
            let d = match (event.reason, event.assignment) {
                // Placed by the registry already (its claim is in flight on that worker):
                // deliver it there; admitting it again would be a duplicate.
                (ReleaseReason::Promoted, Some(a)) => {
                    let d = self
                        .dispatcher
                        .deliver(&event.target, &event.delivery, a, payload.as_ref())
                        .instrument(span)
                        .await;
                    self.metrics.admission(Source::Promotion, d.admission());
                    d
                }
                _ => {
                    let (t, id) = (&event.target, &event.delivery);
                    self.dispatcher
                        .dispatch(t, id, payload.as_ref(), Source::Redispatch)
                        .instrument(span)
                        .await
                }
            };
            match d {
                // Queued behind a full mailbox is placed too: the worker holds it in order.
                Dispatch::Assigned(a) | Dispatch::Overflowed { assignment: a, .. }
                    if event.reason == ReleaseReason::Promoted =>
                {
                    // Counted by the registry (promoted) and the admissions metric (promotion).
                    tracing::info!(target = %event.target, delivery = %event.delivery, worker = %a.worker, "promoted delivery dispatched");
                    if !fresh.contains(&key(&event)) {
                        placed.late.push(event);
                    }
                }
                Dispatch::Assigned(a) | Dispatch::Overflowed { assignment: a, .. } => {
                    tracing::info!(target = %event.target, delivery = %event.delivery, worker = %a.worker, "released event re-dispatched");
                    // Relaxed: a statistic.
                    self.redispatched.fetch_add(1, Ordering::Relaxed);
                    self.metrics.redispatched.inc();
                    if !fresh.contains(&key(&event)) {
                        placed.late.push(event);
                    }
                }
                // Someone (a GitHub redelivery) placed it again first, or the registry parked it
                // (it hands it over again when promoted): either way the registry has it.
                Dispatch::Duplicate(_) | Dispatch::Waiting(_) => {
                    if !fresh.contains(&key(&event)) {
                        placed.late.push(event);
                    }
                }
                Dispatch::Rejected(_)
                | Dispatch::RoomFull(_)
                | Dispatch::Backlog { .. }
                | Dispatch::Unreachable { .. }
                | Dispatch::Closing
                | Dispatch::Unavailable(_)
                // Not reached: only the routing policy (`Routing::apply`) answers these.
                | Dispatch::Drained { .. }
                | Dispatch::AlreadyDraining { .. }
                | Dispatch::NoWorker(_)
                | Dispatch::Ignored => {
                    // A promoted delivery that could not be handed to its worker had its claim
                    // released (see `settle`): next time it is admitted like a released one.
                    let mut event = event;
                    event.assignment = None;
                    placed.still.push(event)
                }
            }
        }
        placed
    }

    /// What GitHub sent with a released or promoted delivery: the event's own copy, else (an
    /// event offered again by a shared backend after an earlier hand-over) the registry's, looked
    /// up by (target, delivery); `None` only if the registry holds none for it any more (the
    /// delivery is then handed on without, and logged).
    async fn released_payload(&self, event: &ReleasedEvent) -> Option<Payload> {
        if event.payload.is_some() {
            return event.payload.clone();
        }
        let registry = &self.registry;
        match registry.payload(&event.target, &event.delivery).await {
            Ok(Some(p)) => Some(p),
            Ok(None) => {
                tracing::warn!(target = %event.target, delivery = %event.delivery, "the registry holds no payload for a released delivery: it is handed on without one");
                None
            }
            Err(e) => {
                tracing::warn!(target = %event.target, delivery = %event.delivery, "the payload of a released delivery could not be read ({e}): it is handed on without one");
                None
            }
        }
    }
}
