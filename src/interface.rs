//! [`WorkerRegistry`]: the injectable interface a router depends on (DoD3).

use std::future::{ready, Future};
use std::sync::Arc as StdArc;

use crate::clock::Clock;
use crate::error::RegistryError;
use crate::ids::{EventId, Target, WorkerId};
use crate::outcome::{Admission, AssignOutcome, ClaimOutcome, HeartbeatAck};
use crate::registry::{DrainAll, Registry};
use crate::snapshot::StatusSnapshot;
use crate::state::{DeadReason, Status};
use crate::sweep::SweepReport;
use crate::worker::WorkerInfo;

/// The registry as a router sees it: what it depends on instead of a concrete type or a global.
///
/// Every method is fallible and returns a future, so a networked backend shared by several router
/// replicas (a database or a registry service) can implement it; [`Registry`] implements it with
/// futures that are already complete (`std::future::Ready`), so awaiting them costs nothing. Tests
/// substitute a fake.
///
/// # Examples
///
/// ```
/// use worker_registry::{Admission, EventId, Registry, Target, WorkerRegistry};
///
/// // A router written against the trait, not the type:
/// async fn on_webhook<R: WorkerRegistry>(r: &R, t: &Target, e: &EventId) -> &'static str {
///     match r.admit(t, e).await {
///         Ok(Admission::Assigned(_)) => "assigned",
///         Ok(Admission::Duplicate(_)) => "duplicate",
///         Ok(Admission::Rejected(_)) => "rejected",
///         Err(_) => "error",
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let registry = Registry::default();
/// let (t, e) = (Target::new("o/r", 1).unwrap(), EventId::new("d").unwrap());
/// assert_eq!(on_webhook(&registry, &t, &e).await, "assigned");
/// assert_eq!(on_webhook(&registry, &t, &e).await, "duplicate");
/// # }
/// ```
pub trait WorkerRegistry: Send + Sync {
    /// See [`Registry::admit`].
    fn admit(
        &self,
        target: &Target,
        event: &EventId,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send;
    /// See [`Registry::claim`].
    fn claim(
        &self,
        target: &Target,
        event: &EventId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send;
    /// See [`Registry::release`].
    fn release(
        &self,
        target: &Target,
        event: &EventId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send;
    /// See [`Registry::complete`].
    fn complete(
        &self,
        target: &Target,
        event: &EventId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send;
    /// See [`Registry::complete_by`].
    fn complete_by(
        &self,
        worker: WorkerId,
        target: &Target,
        event: &EventId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send;
    /// See [`Registry::assign`].
    fn assign(
        &self,
        target: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send;
    /// See [`Registry::heartbeat`].
    fn heartbeat(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send;
    /// See [`Registry::loop_started`].
    fn loop_started(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send;
    /// See [`Registry::loop_finished`].
    fn loop_finished(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send;
    /// See [`Registry::register`]; returns the new worker's id.
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send;
    /// See [`Registry::deregister`].
    fn deregister(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send;
    /// See [`Registry::drain`].
    fn drain(&self, worker: WorkerId)
        -> impl Future<Output = Result<Status, RegistryError>> + Send;
    /// See [`Registry::drain_all`].
    fn drain_all(&self) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send;
    /// See [`Registry::sweep`].
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send;
    /// See [`Registry::status`].
    fn status(&self) -> impl Future<Output = Result<StdArc<StatusSnapshot>, RegistryError>> + Send;
    /// See [`Registry::worker`]; `Ok(None)` for an unknown id.
    fn worker(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send;
}

impl<C: Clock> WorkerRegistry for Registry<C> {
    fn admit(
        &self,
        target: &Target,
        event: &EventId,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        ready(Ok(Registry::admit(self, target, event)))
    }
    fn claim(
        &self,
        target: &Target,
        event: &EventId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send {
        ready(Ok(Registry::claim(self, target, event)))
    }
    fn release(
        &self,
        target: &Target,
        event: &EventId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        ready(Registry::release(self, target, event))
    }
    fn complete(
        &self,
        target: &Target,
        event: &EventId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        ready(Registry::complete(self, target, event))
    }
    fn complete_by(
        &self,
        worker: WorkerId,
        target: &Target,
        event: &EventId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        ready(Registry::complete_by(self, worker, target, event))
    }
    fn assign(
        &self,
        target: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send {
        ready(Ok(Registry::assign(self, target)))
    }
    fn heartbeat(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send {
        ready(Registry::heartbeat(self, worker))
    }
    fn loop_started(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        ready(Registry::loop_started(self, worker))
    }
    fn loop_finished(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        ready(Registry::loop_finished(self, worker))
    }
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send {
        ready(Registry::register(self).map(|h| h.id()))
    }
    fn deregister(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send {
        ready(Registry::deregister(self, worker))
    }
    fn drain(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        ready(Registry::drain(self, worker))
    }
    fn drain_all(&self) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send {
        ready(Ok(Registry::drain_all(self)))
    }
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send {
        ready(Ok(Registry::sweep(self)))
    }
    fn status(&self) -> impl Future<Output = Result<StdArc<StatusSnapshot>, RegistryError>> + Send {
        ready(Ok(to_std_arc(Registry::status(self))))
    }
    fn worker(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send {
        ready(Ok(Registry::worker(self, worker)))
    }
}

#[cfg(not(worker_registry_loom))]
fn to_std_arc(a: StdArc<StatusSnapshot>) -> StdArc<StatusSnapshot> {
    a
}

#[cfg(worker_registry_loom)]
fn to_std_arc(a: crate::sync::Arc<StatusSnapshot>) -> StdArc<StatusSnapshot> {
    StdArc::new((*a).clone())
}
