//! The contract traits for [`InMemoryRegistry`]: every method is the synchronous inherent method
//! of the same name, answered with an already-completed future (`std::future::Ready`), so awaiting
//! it costs nothing.

use std::future::{ready, Future};
use std::sync::Arc;
use std::time::Duration;

use super::InMemoryRegistry;
use crate::api::contract::{Maintenance, WorkerRegistry};
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{Admission, AssignOutcome, ClaimOutcome, DrainAll, HeartbeatAck};
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::snapshot::{StatusSnapshot, WorkerInfo};
use crate::api::stats::Stats;
use crate::api::status::{DeadReason, Status};
use crate::clock::Clock;
use crate::config::RegistryConfig;

impl<C: Clock> WorkerRegistry for InMemoryRegistry<C> {
    fn admit(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        ready(Ok(InMemoryRegistry::admit(self, target, delivery)))
    }
    fn claim(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send {
        ready(Ok(InMemoryRegistry::claim(self, target, delivery)))
    }
    fn release(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        ready(InMemoryRegistry::release(self, target, delivery))
    }
    fn complete(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        ready(InMemoryRegistry::complete(self, target, delivery))
    }
    fn complete_by(
        &self,
        worker: WorkerId,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        ready(InMemoryRegistry::complete_by(
            self, worker, target, delivery,
        ))
    }
    fn assign(
        &self,
        target: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send {
        ready(Ok(InMemoryRegistry::assign(self, target)))
    }
    fn heartbeat(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send {
        ready(InMemoryRegistry::heartbeat(self, worker))
    }
    fn loop_started(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        ready(InMemoryRegistry::loop_started(self, worker))
    }
    fn loop_finished(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        ready(InMemoryRegistry::loop_finished(self, worker))
    }
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send {
        ready(InMemoryRegistry::register(self).map(|h| h.id()))
    }
    fn deregister(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send {
        ready(InMemoryRegistry::deregister(self, worker))
    }
    fn drain_within(
        &self,
        worker: WorkerId,
        deadline: Duration,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        ready(InMemoryRegistry::drain_within(self, worker, deadline))
    }
    fn drain(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        ready(InMemoryRegistry::drain(self, worker))
    }
    fn drain_all_within(
        &self,
        deadline: Duration,
    ) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send {
        ready(Ok(InMemoryRegistry::drain_all_within(self, deadline)))
    }
    fn worker(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send {
        ready(Ok(InMemoryRegistry::worker(self, worker)))
    }
    fn status(&self) -> Arc<StatusSnapshot> {
        InMemoryRegistry::status(self)
    }
    fn stats(&self) -> Stats {
        InMemoryRegistry::stats(self)
    }
    fn config(&self) -> &RegistryConfig {
        InMemoryRegistry::config(self)
    }
    fn parks(&self) -> bool {
        true
    }
}

impl<C: Clock> Maintenance for InMemoryRegistry<C> {
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send {
        ready(Ok(InMemoryRegistry::sweep(self)))
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
        self.inner.wake.wait()
    }
}

#[cfg(feature = "tokio")]
impl<C: Clock> crate::api::contract::Subscribe for InMemoryRegistry<C> {
    fn subscribe(&self) -> crate::Subscription {
        InMemoryRegistry::subscribe(self)
    }
}
