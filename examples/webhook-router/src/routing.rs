//! The routing policy carried out: what a `start`, `reach`, `drain` or `ignore`
//! [`Decision`] (the [`crate::policy`] table's answer for an event) does for one pull request of
//! a delivery. `start` and a `reach` whose pull request has a live worker go to
//! [`crate::dispatch`]; a `drain` is dispatched as the worker's last event, then drains it; a
//! `reach` or `drain` without a worker starts none and is recorded as handled. [`Routing`] holds
//! the [`Dispatcher`], the registry, the [`Lifecycle`] (which worker of this router serves a pull
//! request) and reads the [`Closing`] flag.

use crate::closing::Closing;
use crate::dispatch::Dispatcher;
use crate::lifecycle::Lifecycle;
use crate::outcome::{Dispatch, Source};
use crate::policy::Decision;
use worker_registry::WorkerRegistryExt;

use std::sync::Arc;

use worker_registry::{
    ClaimOutcome, DeliveryId, DynRegistry, Payload, RegistryError, Rejection, Status, Target,
    WorkerId, WorkerRegistry,
};

/// The routing policy's decisions carried out (see the [module documentation](self)).
pub struct Routing {
    /// Admits and hands over what a decision sends to a worker.
    dispatcher: Arc<Dispatcher>,
    registry: DynRegistry,
    /// Which worker of this router serves a pull request.
    lifecycle: Arc<Lifecycle>,
    /// Read: a `reach` or `drain` is refused once it is set.
    closing: Closing,
}

impl Routing {
    /// The routing over `dispatcher`.
    pub(crate) fn new(
        dispatcher: Arc<Dispatcher>,
        registry: DynRegistry,
        lifecycle: Arc<Lifecycle>,
        closing: Closing,
    ) -> Self {
        Self {
            dispatcher,
            registry,
            lifecycle,
            closing,
        }
    }
}

impl Routing {
    /// The live worker that serves `target`, if there is one: this router's own (checked live in the
    /// registry), else one the published snapshot lists (another replica's, with a shared backend).
    pub async fn live_worker_of(&self, target: &Target) -> Result<Option<WorkerId>, RegistryError> {
        let local = self.lifecycle.worker_of(target);
        if let Some(w) = local {
            match self.registry.worker(w).await? {
                Some(info) if info.status.is_alive() => return Ok(Some(w)),
                _ => {
                    self.lifecycle.not_serving(target, w);
                }
            }
        }
        // Only when this router has none; the snapshot holds at most max_workers live workers.
        let snapshot = self.registry.status();
        Ok(snapshot
            .workers
            .iter()
            .find(|w| w.status.is_alive() && w.target.as_ref() == Some(target))
            .map(|w| w.id))
    }

    /// A `reach` or `drain` event whose pull request has no worker is handled by doing nothing, and
    /// recorded as handled (a bare claim, completed at once), so that a redelivery is answered as
    /// the duplicate it is, whatever has happened to workers since.
    async fn handled_without_worker(
        &self,
        decision: Decision,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Dispatch {
        match self.registry.claim(target, delivery).await {
            Ok(ClaimOutcome::Claimed) => match self.registry.complete(target, delivery).await {
                Ok(()) => Dispatch::NoWorker(decision),
                // Unrecorded: the bare claim expires after the heartbeat timeout; answer 503 so
                // that the delivery is sent again rather than counted as handled.
                Err(e) => Dispatch::Unavailable(e),
            },
            Ok(ClaimOutcome::AlreadyClaimed(d)) => Dispatch::Duplicate(d),
            Err(e) => Dispatch::Unavailable(e),
        }
    }

    /// Carries out the routing policy's `decision` for one pull request of a delivery, which
    /// carries `payload` (see [`Dispatcher::dispatch`]).
    pub async fn apply(
        &self,
        decision: Decision,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
    ) -> Dispatch {
        match decision {
            Decision::Ignore => Dispatch::Ignored,
            Decision::Start => {
                self.dispatcher
                    .dispatch(target, delivery, payload, Source::Webhook)
                    .await
            }
            Decision::Reach | Decision::Drain => {
                if self.closing.is_set() {
                    return Dispatch::Closing;
                }
                match self.live_worker_of(target).await {
                    Err(e) => Dispatch::Unavailable(e),
                    Ok(None) => {
                        self.handled_without_worker(decision, target, delivery)
                            .await
                    }
                    Ok(Some(_)) if decision == Decision::Reach => {
                        self.dispatcher
                            .dispatch(target, delivery, payload, Source::Webhook)
                            .await
                    }
                    Ok(Some(w)) => self.drain_last(target, delivery, payload, w).await,
                }
            }
        }
    }

    /// `drain` of a pull request with a live worker: the worker (or, if it died a moment ago, a
    /// new one) runs this event last, then leaves.
    async fn drain_last(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
        worker: WorkerId,
    ) -> Dispatch {
        // Already draining: nothing more to do (admitting the event would park it for the
        // successor, which a closed pull request does not want). Recorded as handled all the
        // same, so that a redelivery of this event is answered as the duplicate it is (AC2).
        if let Ok(Some(info)) = self.registry.worker(worker).await {
            if info.status == Status::Draining {
                return match self
                    .handled_without_worker(Decision::Drain, target, delivery)
                    .await
                {
                    Dispatch::NoWorker(_) => Dispatch::AlreadyDraining { worker },
                    other => other,
                };
            }
        }
        match self
            .dispatcher
            .dispatch(target, delivery, payload, Source::Webhook)
            .await
        {
            // Queued behind a full mailbox is queued too: a draining worker runs everything it
            // was handed (its overflow included) before it exits.
            Dispatch::Assigned(a) | Dispatch::Overflowed { assignment: a, .. } => {
                match self.registry.drain(a.worker).await {
                    Ok(status) => {
                        tracing::info!(%target, worker = %a.worker, %status, "pull request closed: worker drained")
                    }
                    Err(e) => {
                        tracing::warn!(%target, worker = %a.worker, "could not drain the worker of a closed pull request: {e}")
                    }
                }
                Dispatch::Drained { assignment: a }
            }
            Dispatch::Rejected(Rejection::TargetDraining { worker })
            | Dispatch::RoomFull(Rejection::TargetDraining { worker }) => {
                Dispatch::AlreadyDraining { worker }
            }
            other => other,
        }
    }
}
