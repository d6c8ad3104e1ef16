//! The contract traits for [`InMemoryRegistry`]: every method is the [`Direct`](super::Direct) method of the
//! same name, answered with an already-completed future (`std::future::Ready`), so awaiting it
//! costs nothing. [`WorkerRegistry`](crate::WorkerRegistry)'s impl is generated from the
//! contract's method list (`api/methods.rs`).

use std::future::{ready, Future};
use std::sync::Arc;
use std::time::Duration;

use super::handle::WorkerHandle;
use super::InMemoryRegistry;
use crate::api::contract::Maintenance;
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::methods::{sync_contract, IntoAnswer};
use crate::api::outcome::{Admission, AssignOutcome, ClaimOutcome, DrainAll, HeartbeatAck};
use crate::api::payload::Payload;
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::snapshot::{StatusSnapshot, WorkerInfo};
use crate::api::stats::{Audit, Stats};
use crate::api::status::{DeadReason, Status};
use crate::clock::Clock;
use crate::config::RegistryConfig;

sync_contract!([C: Clock] InMemoryRegistry<C>, core: direct, borrowed: direct);

/// The contract's `register` answers the worker's id; [`Direct::register`](super::Direct::register)
/// its handle.
impl<C: Clock> IntoAnswer<WorkerId> for Result<WorkerHandle<C>, RegistryError> {
    fn into_answer(self) -> Result<WorkerId, RegistryError> {
        self.map(|handle| handle.id())
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
