//! Dispatch to containers ([`Dispatcher`]): one (target, delivery) pair admitted by the registry
//! and handed to its worker's container by id, on this process's [`Containers`] or, with
//! replicas in other processes, on its owner replica through [`Remote`]. It holds the registry,
//! the metrics, the [`Lifecycle`] (which starts a new worker's container and records which
//! worker serves a pull request), the [`Outstanding`] deliveries (a parked one is remembered
//! there), and reads the [`Closing`] flag.
//!
//! Two paths start a worker's container: the admission that created the worker (`new: true`), and
//! the retry of one whose reply was lost: an admission that created (or placed an event on) a
//! worker committed but its answer never arrived (a timeout, a dropped connection), so its retry
//! is a duplicate naming a worker that never started ([`AlreadyClaimed::needs_start`]). Both go
//! through the worker's start claim ([`crate::lifecycle`]): whichever wins starts the container
//! and hands it its event; whichever loses hands its own event to that container, here or on the
//! winner's replica, unless it is the very delivery the winner placed (a redelivery racing the
//! admission it retries: handing it twice would run it twice). So no worker ever has two
//! containers, whatever the timing and whichever replicas its events reach.
//! Every event goes through the worker's bounded mailbox; behind a full one it waits, still
//! claimed, in the worker's bounded overflow (answered `202 waiting` with its position, see
//! [`crate::mailbox`]). A full overflow too, or an owner that cannot be reached, releases the
//! claim again and answers 503.

use crate::closing::Closing;
use crate::containers::Containers;
use crate::lifecycle::{Lifecycle, Start};
use crate::mailbox::Handover;
use crate::metrics::RouterMetrics;
use crate::outcome::{Dispatch, Source};
use crate::outstanding::Outstanding;
use crate::remote::{Owner, Remote};
use crate::telemetry::{self, TraceParent};
use crate::worker::Job;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, Instant};
use tracing::Instrument;
use worker_registry::{
    Admission, AlreadyClaimed, Assignment, DeliveryId, DynRegistry, Payload, Rejection, Target,
    WorkerId, WorkerRegistry,
};

/// The dispatcher of one router replica (see the [module documentation](self)): admission, and
/// the hand-over to the worker's container.
pub struct Dispatcher {
    registry: DynRegistry,
    metrics: RouterMetrics,
    /// Starts a new worker's container, and knows which worker serves a pull request.
    lifecycle: Arc<Lifecycle>,
    /// This process's containers (the lifecycle's), handed events by worker id.
    containers: Arc<Containers>,
    /// With replicas in other processes: the owner records and forwarding.
    remote: Option<Remote>,
    /// Where a parked delivery is remembered.
    outstanding: Arc<Outstanding>,
    /// Read: a webhook delivery is refused once it is set.
    closing: Closing,
}

impl Dispatcher {
    /// The dispatcher over `registry` that starts containers through `lifecycle`.
    pub(crate) fn new(
        registry: DynRegistry,
        metrics: RouterMetrics,
        lifecycle: Arc<Lifecycle>,
        outstanding: Arc<Outstanding>,
        closing: Closing,
    ) -> Self {
        Self {
            containers: lifecycle.containers().clone(),
            remote: lifecycle.remote().cloned(),
            registry,
            metrics,
            lifecycle,
            outstanding,
            closing,
        }
    }
}

impl Dispatcher {
    /// Admits one (target, delivery) pair, with what GitHub sent (`payload`, kept by the registry
    /// with the claim: see [`WorkerRegistry::admit_with`]), and hands it to the target's worker
    /// in a [`Job`] that carries the payload.
    ///
    /// Only the admission that created the worker (`new: true`) starts its container; every event
    /// goes through the worker's bounded mailbox, found by id on the platform (or on its owner
    /// replica).
    pub async fn dispatch(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
        source: Source,
    ) -> Dispatch {
        let span = telemetry::dispatch_span(target, delivery, source);
        let d = self
            .place(target, delivery, payload, source)
            .instrument(span.clone())
            .await;
        telemetry::record_dispatch(&span, &d);
        self.metrics.admission(source, d.admission());
        if let Dispatch::Waiting(_) = d {
            self.outstanding.parked(target, delivery);
        }
        d
    }

    async fn place(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
        source: Source,
    ) -> Dispatch {
        // A shutdown refuses new deliveries only: released ones are placed until its deadline. A
        // delivery that sees the flag clear may still race with the drain, which is fine: it is
        // caught below.
        if source == Source::Webhook && self.closing.is_set() {
            return Dispatch::Closing;
        }
        let admit = telemetry::admit_span();
        let registry = &self.registry;
        let admission = registry
            .admit_with(target, delivery, payload)
            .instrument(admit.clone())
            .await;
        let a = match admission {
            Ok(Admission::Assigned(a)) => {
                telemetry::record_admission(&admit, &a);
                a
            }
            Ok(Admission::Duplicate(d)) => match self.lost_start(&d, target, delivery).await {
                Some(a) => {
                    // A worker that had not started: the event is handed to it now.
                    telemetry::record_admission(&admit, &a);
                    a
                }
                None => {
                    admit.record("decision", "duplicate");
                    return Dispatch::Duplicate(d);
                }
            },
            Ok(Admission::Rejected(r)) => {
                admit.record("decision", "rejected");
                // With the room on, the registry parks what finds no room (no capacity, or the
                // target's worker draining): a refusal then means the room is full. A refusal for
                // the payload budget is never parked.
                let budget = matches!(r, Rejection::PayloadBudget { .. });
                if !budget && registry.config().max_waiting() > 0 {
                    return Dispatch::RoomFull(r);
                }
                return Dispatch::Rejected(r);
            }
            Ok(Admission::Waiting(w)) => {
                admit.record("decision", "waiting");
                return Dispatch::Waiting(w);
            }
            Err(e) => {
                admit.record("decision", "unavailable");
                tracing::warn!(%target, %delivery, "admission failed, answering 503: {e}");
                return Dispatch::Unavailable(e);
            }
        };
        self.deliver(target, delivery, a, payload).await
    }

    /// Hands a delivery the registry placed on `a` to its worker (starting the worker's container
    /// if `a` created it): the rest of an admission, and all of a promotion out of the waiting
    /// room (see [`crate::redispatch`]). The worker's [`Job`] carries `payload`.
    pub(crate) async fn deliver(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        a: Assignment,
        payload: Option<&Payload>,
    ) -> Dispatch {
        self.lifecycle.serves(target, a.worker);
        if a.new {
            match self
                .lifecycle
                .start_container(a.worker, target, delivery, a.token)
                .await
            {
                Start::Started | Start::HandOver => {}
                // A retry of this delivery won the start claim: it hands the event over.
                Start::Handled => return Dispatch::Assigned(a),
                // The worker died before it could be started: the registry has released its
                // events, this one included, for re-dispatch.
                Start::Dead => return self.settle(target, delivery, a, Handover::Stopped).await,
            }
        }
        // Shutdown began between the check and the admission, so the drain may have missed this
        // worker: drain it now (it is busy with this event, so it runs it and exits).
        if self.closing.is_set() {
            let deadline = self.registry.config().drain_deadline();
            let _ = self.registry.drain_within(a.worker, deadline).await;
        }
        let job = Job {
            target: target.clone(),
            event: delivery.clone(),
            token: a.token,
            // The dispatch span's: the worker's loop continues this trace.
            trace: TraceParent::current(),
            // Shared with the registry's copy: a reference count, not the bytes.
            payload: payload.cloned(),
        };
        let handover = self.hand_over(a.worker, job).await;
        self.settle(target, delivery, a, handover).await
    }

    /// A duplicate whose holder never started: the admission that placed it committed, but its
    /// reply was lost (or is still on its way), so nothing may have started the worker's container
    /// or handed it the event. This retry claims the worker's start (see [`crate::lifecycle`]):
    /// it starts the worker if it wins. Returns the assignment to hand the event over on, if this
    /// retry is to (it started the worker, or lost the claim to a path that placed another
    /// delivery); `None` for a plain duplicate: the duplicate does not ask for a start, the
    /// worker has started or died since, or the claim's winner placed this very delivery (and
    /// hands it: handing it here too would run it twice).
    ///
    /// No time is waited for: the start claim decides between this retry and the admission it
    /// retries. (This path once waited for the worker to be a heartbeat interval old, betting that
    /// a slower creating admission was a lost one; on a loaded machine it lost the bet, and the
    /// worker was started twice.)
    async fn lost_start(
        &self,
        dup: &AlreadyClaimed,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Option<Assignment> {
        let worker = dup.needs_start()?;
        let info = self.registry.worker(worker).await.ok()??;
        if !info.status.is_alive() || info.has_heartbeated || info.target.as_ref() != Some(target) {
            return None;
        }
        match self
            .lifecycle
            .start_container(worker, target, delivery, info.token)
            .await
        {
            Start::Started => tracing::info!(
                %target, %worker,
                "a redelivery named a worker that had not started (the reply to the admission \
                 that placed it was lost, or is still on its way): started it"
            ),
            Start::HandOver => {}
            Start::Handled | Start::Dead => return None,
        }
        Some(Assignment::new(worker, info.token, false))
    }

    /// What an admitted event's handover makes of it: assigned, overflowed (queued behind the
    /// worker's full mailbox), or (a full mailbox and overflow, an owner out of reach) its claim
    /// released again and a refusal.
    async fn settle(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        a: Assignment,
        handover: Handover,
    ) -> Dispatch {
        match handover {
            Handover::Queued => Dispatch::Assigned(a),
            Handover::Overflowed { position } => Dispatch::Overflowed {
                assignment: a,
                position,
            },
            Handover::Full => {
                // Undo the claim so a redelivery is admitted later; count it as refused, not
                // admitted, since that is what the router answers.
                match self.registry.release(target, delivery).await {
                    Ok(()) => self.metrics.returned.record(&a),
                    Err(e) => tracing::warn!(
                        %target, %delivery,
                        "could not release the claim of a delivery refused for a full queue ({e}); \
                         the registry releases it after max_in_flight"
                    ),
                }
                Dispatch::Backlog { worker: a.worker }
            }
            // The container is gone without a clean exit (crashed, fenced a moment ago, stopped at
            // shutdown, or died with its replica): the registry still counts the event as held by
            // that worker, so the sweep that declares it dead releases it and a sweeper callback
            // re-dispatches it.
            Handover::Stopped => Dispatch::Assigned(a),
            Handover::Unreachable(reason) => match self.registry.release(target, delivery).await {
                Ok(()) => {
                    tracing::warn!(%target, %delivery, worker = %a.worker, "answering 503: {reason}");
                    Dispatch::Unreachable {
                        worker: a.worker,
                        reason,
                    }
                }
                Err(e) => {
                    tracing::warn!(
                        %target, %delivery, worker = %a.worker,
                        "{reason}, and the claim could not be released ({e}): it stays with the worker, which releases it when it dies or exits"
                    );
                    Dispatch::Assigned(a)
                }
            },
        }
    }

    /// Hands `job` to worker `id`'s container: on this process's platform (parked for the container
    /// to come if it is not started yet and every replica is in this process), else on its owner
    /// replica (this one included: parked if the container is not started yet).
    async fn hand_over(&self, id: WorkerId, job: Job) -> Handover {
        let park = self.remote.is_none();
        match self.containers.hand(id, job, park) {
            Ok(handover) => handover,
            Err(job) => match &self.remote {
                Some(remote) => self.forward(remote, id, job).await,
                // Not reached: without replicas elsewhere the event was parked.
                None => Handover::Stopped,
            },
        }
    }

    /// Hands `job` to `worker`'s container on its owner replica (see [`crate::remote`]), looking
    /// the owner up until it has claimed the worker (for at most [`Remote::owner_wait`]); this
    /// process's own containers are checked again meanwhile, since the owner may be this process,
    /// between its admission and its claim. An owner record naming this replica, written before
    /// the container starts, parks the event for it.
    async fn forward(&self, remote: &Remote, worker: WorkerId, mut job: Job) -> Handover {
        let containers = &self.containers;
        let deadline = Instant::now() + remote.owner_wait();
        let mut delay = Duration::from_millis(1);
        loop {
            match remote.owner(worker).await {
                Err(reason) => return Handover::Unreachable(reason),
                // Ours: claimed by another task of this process a moment ago (parked for its
                // start), started, or gone.
                Ok(Owner::This) => {
                    // Parked when absent: `Err` is not reached.
                    return containers
                        .hand(worker, job, true)
                        .unwrap_or(Handover::Stopped);
                }
                Ok(Owner::Other(address)) => return remote.post(&address, worker, job).await,
                Ok(Owner::Unknown) => {}
            }
            job = match containers.hand(worker, job, false) {
                Ok(handover) => return handover,
                Err(job) => job,
            };
            if Instant::now() >= deadline {
                return Handover::Unreachable(format!(
                    "no replica has published worker {worker}'s container within {:?}",
                    remote.owner_wait()
                ));
            }
            sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(50));
        }
    }
}
