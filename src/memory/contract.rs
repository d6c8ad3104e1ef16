//! The contract traits for [`InMemoryRegistry`]: every method is the [`Direct`](super::Direct) method of the
//! same name, answered with an already-completed future (`std::future::Ready`), so awaiting it
//! costs nothing.

use std::future::{ready, Future};
use std::sync::Arc;
use std::time::Duration;

use super::InMemoryRegistry;
use crate::api::contract::{Maintenance, WorkerRegistry};
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{Admission, AssignOutcome, ClaimOutcome, DrainAll, HeartbeatAck};
use crate::api::payload::Payload;
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::snapshot::{StatusSnapshot, WorkerInfo};
use crate::api::stats::Stats;
use crate::api::status::{DeadReason, Status};
use crate::clock::Clock;
use crate::config::RegistryConfig;

impl<C: Clock> WorkerRegistry for InMemoryRegistry<C> {
    fn admit_with(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        ready(self.direct().admit_with(target, delivery, payload))
    }
    fn payload(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Payload>, RegistryError>> + Send {
        ready(Ok(self.direct().payload(target, delivery)))
    }
    fn claim(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send {
        ready(Ok(self.direct().claim(target, delivery)))
    }
    fn release(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        ready(self.direct().release(target, delivery))
    }
    fn complete_as(
        &self,
        holder: Option<WorkerId>,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        ready(self.direct().complete_inner(target, delivery, holder))
    }
    fn assign(
        &self,
        target: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send {
        ready(Ok(self.direct().assign(target)))
    }
    fn heartbeat(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send {
        ready(self.direct().heartbeat(worker))
    }
    fn loop_started(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        ready(self.direct().loop_started(worker))
    }
    fn loop_finished(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        ready(self.direct().loop_finished(worker))
    }
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send {
        ready(self.direct().register().map(|h| h.id()))
    }
    fn deregister(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send {
        ready(self.direct().deregister(worker))
    }
    fn drain_within(
        &self,
        worker: WorkerId,
        deadline: Duration,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        ready(self.direct().drain_within(worker, deadline))
    }
    fn drain_all_within(
        &self,
        deadline: Duration,
    ) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send {
        ready(Ok(self.direct().drain_all_within(deadline)))
    }
    fn worker(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send {
        ready(Ok(self.direct().worker(worker)))
    }
    fn status(&self) -> Arc<StatusSnapshot> {
        self.direct().status()
    }
    fn stats(&self) -> Stats {
        self.direct().stats()
    }
    fn audit(&self) -> impl Future<Output = Result<crate::Audit, RegistryError>> + Send {
        ready(Ok(self.direct().audit()))
    }
    fn config(&self) -> &RegistryConfig {
        self.direct().config()
    }
}

impl<C: Clock> Maintenance for InMemoryRegistry<C> {
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send {
        ready(Ok(self.direct().sweep()))
    }
    /// Nothing to do: the in-memory registry hands each released event over once, in the report
    /// of the sweep that released it.
    fn acknowledge(
        &self,
        _released: &[ReleasedEvent],
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        ready(Ok(()))
    }
    /// Resolves once a death or an exit promoted waiting deliveries since the last wake-up.
    #[cfg(feature = "tokio")]
    fn wake(&self) -> impl Future<Output = ()> + Send {
        self.direct().inner.wake.wait()
    }
}

#[cfg(feature = "tokio")]
impl<C: Clock> crate::api::contract::Subscribe for InMemoryRegistry<C> {
    fn subscribe(&self) -> crate::Subscription {
        self.direct().subscribe()
    }
}
