//! Dispatch to containers: one (target, delivery) pair admitted by the registry and handed to
//! its worker's container by id, on this process's [`Containers`](crate::containers::Containers)
//! or, with replicas in other processes, on its owner replica through [`Remote`].
//!
//! Only the admission that created the worker (`new: true`) starts its container (see
//! [`crate::lifecycle`]), so that no worker ever has two containers, whichever replicas its events
//! reach. Every event goes through the worker's bounded mailbox; a full one, or an owner that
//! cannot be reached, releases the claim again and answers 503.

use crate::app::App;
use crate::containers::Handed;
use crate::outcome::{Dispatch, Source};
use crate::remote::{Handover, Owner, Remote};
use crate::worker::Job;

use std::time::Duration;

use tokio::time::{sleep, Instant};
use worker_registry::{Admission, Assignment, DeliveryId, Target, WorkerId, WorkerRegistry};

impl App {
    /// Admits one (target, delivery) pair and hands it to the target's worker.
    ///
    /// Only the admission that created the worker (`new: true`) starts its container; every event
    /// goes through the worker's bounded mailbox, found by id on the platform (or on its owner
    /// replica).
    pub async fn dispatch(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        source: Source,
    ) -> Dispatch {
        let d = self.place(target, delivery).await;
        self.inner.metrics.admission(source, d.outcome());
        d
    }

    async fn place(&self, target: &Target, delivery: &DeliveryId) -> Dispatch {
        // A delivery that sees the flag clear may still race with the drain, which is fine: it is
        // caught below.
        if self.is_closing() {
            return Dispatch::Closing;
        }
        let a = match self.inner.registry.admit(target, delivery).await {
            Ok(Admission::Assigned(a)) => a,
            Ok(Admission::Duplicate(d)) => return Dispatch::Duplicate(d),
            Ok(Admission::Rejected(r)) => return Dispatch::Rejected(r),
            Ok(Admission::Waiting(w)) => return Dispatch::Waiting(w),
            Err(e) => {
                tracing::warn!(%target, %delivery, "admission failed, answering 503: {e}");
                return Dispatch::Unavailable(e);
            }
        };
        self.deliver(target, delivery, a).await
    }

    /// Hands a delivery the registry placed on `a` to its worker (starting the worker's container
    /// if `a` created it): the rest of an admission, and all of a promotion out of the waiting
    /// room (see [`crate::redispatch`]).
    pub(crate) async fn deliver(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        a: Assignment,
    ) -> Dispatch {
        self.inner.targets.insert(target.clone(), a.worker);
        if a.new {
            self.start_container(a.worker, target, delivery).await;
        }
        // Shutdown began between the check and the admission, so the drain may have missed this
        // worker: drain it now (it is busy with this event, so it runs it and exits).
        if self.is_closing() {
            let deadline = self.inner.registry.config().drain_deadline();
            let _ = self.inner.registry.drain_within(a.worker, deadline).await;
        }
        let job = Job {
            target: target.clone(),
            event: delivery.clone(),
            token: a.token,
        };
        let handover = self.hand_over(a.worker, job).await;
        self.settle(target, delivery, a, handover).await
    }

    /// What an admitted event's handover makes of it: assigned, or (a full queue, an owner out of
    /// reach) its claim released again and a refusal.
    async fn settle(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        a: Assignment,
        handover: Handover,
    ) -> Dispatch {
        match handover {
            Handover::Queued => Dispatch::Assigned(a),
            Handover::Full => {
                // Undo the claim so a redelivery is admitted later; count it as refused, not
                // admitted, since that is what the router answers.
                match self.inner.registry.release(target, delivery).await {
                    Ok(()) => self.inner.metrics.returned.record(&a),
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
            Handover::Held => Dispatch::Assigned(a),
            Handover::Unreachable(reason) => {
                match self.inner.registry.release(target, delivery).await {
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
                }
            }
        }
    }

    /// Hands `job` to worker `id`'s container: on this process's platform (parked for the container
    /// to come if it is not started yet and every replica is in this process), else on its owner
    /// replica.
    async fn hand_over(&self, id: WorkerId, job: Job) -> Handover {
        let park = self.inner.remote.is_none();
        match self.inner.containers.hand(id, job, park) {
            Handed::Queued => Handover::Queued,
            Handed::Full => Handover::Full,
            Handed::Stopped => Handover::Held,
            Handed::Absent(job) => match &self.inner.remote {
                Some(remote) => self.forward(remote, id, job).await,
                // Not reached: without replicas elsewhere the event was parked.
                None => Handover::Held,
            },
        }
    }

    /// Hands `job` to `worker`'s container on its owner replica (see [`crate::remote`]), looking
    /// the owner up until it has published its record (for at most [`Remote::owner_wait`]); this
    /// process's own containers are checked again meanwhile, since the owner may be this process,
    /// between its admission and its record.
    async fn forward(&self, remote: &Remote, worker: WorkerId, mut job: Job) -> Handover {
        let containers = &self.inner.containers;
        let deadline = Instant::now() + remote.owner_wait();
        let mut delay = Duration::from_millis(1);
        loop {
            match remote.owner(worker).await {
                Err(reason) => return Handover::Unreachable(reason),
                // Ours: started by another task of this process a moment ago, or gone.
                Ok(Owner::This) => {
                    return match containers.hand(worker, job, false) {
                        Handed::Absent(_) | Handed::Stopped => Handover::Held,
                        Handed::Queued => Handover::Queued,
                        Handed::Full => Handover::Full,
                    };
                }
                Ok(Owner::Other(address)) => return remote.post(&address, worker, job).await,
                Ok(Owner::Unknown) => {}
            }
            job = match containers.hand(worker, job, false) {
                Handed::Queued => return Handover::Queued,
                Handed::Full => return Handover::Full,
                Handed::Stopped => return Handover::Held,
                Handed::Absent(job) => job,
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
