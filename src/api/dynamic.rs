//! [`DynRegistry`]: any backend behind one type, chosen at run time (from a URL in the
//! configuration, say), as object_store's `DynObjectStore`.
//!
//! [`WorkerRegistry`] and [`Maintenance`] return `impl Future`, which keeps a statically typed
//! backend free of allocation (the in-memory one answers with already-completed futures) but makes
//! them unusable as `dyn` traits. [`DynBackend`] is their object-safe mirror, with boxed futures,
//! implemented for every backend; [`DynRegistry`] wraps an `Arc<dyn DynBackend>` and implements the
//! contract traits again, so code generic over them (the admin API, the `Sweeper`, a router) takes
//! either a concrete backend or a `DynRegistry`. The price is an allocation per call and, for
//! calls that take a key, cloning it (two reference-count increments; a payload is one more), so
//! that the boxed future owns what it borrows.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::contract::{Maintenance, WorkerRegistry};
use super::error::RegistryError;
use super::ids::{DeliveryId, Target, WorkerId};
use super::outcome::{Admission, AssignOutcome, ClaimOutcome, DrainAll, HeartbeatAck};
use super::payload::Payload;
use super::report::{ReleasedEvent, SweepReport};
use super::snapshot::{StatusSnapshot, WorkerInfo};
use super::stats::{Audit, Stats};
use super::status::{DeadReason, Status};
use crate::config::RegistryConfig;

/// A boxed, sendable future (what [`DynBackend`]'s methods return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe form of [`WorkerRegistry`] + [`Maintenance`] (+ [`Subscribe`] with the `tokio`
/// feature), implemented for every type that implements them. Each method is the contract method
/// of the same name, boxed; see there for the semantics. Use it through [`DynRegistry`].
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use worker_registry::dynamic::DynBackend;
/// use worker_registry::InMemoryRegistry;
///
/// let backend: Arc<dyn DynBackend> = Arc::new(InMemoryRegistry::default());
/// assert_eq!(backend.status().version, 0);
/// ```
///
/// [`Subscribe`]: crate::Subscribe
pub trait DynBackend: Send + Sync + 'static {
    /// See [`WorkerRegistry::admit`].
    fn admit<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<Admission, RegistryError>>;
    /// See [`WorkerRegistry::admit_with`].
    fn admit_with<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
        payload: Option<&'a Payload>,
    ) -> BoxFuture<'a, Result<Admission, RegistryError>>;
    /// See [`WorkerRegistry::payload`].
    fn payload<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<Option<Payload>, RegistryError>>;
    /// See [`WorkerRegistry::claim`].
    fn claim<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<ClaimOutcome, RegistryError>>;
    /// See [`WorkerRegistry::release`].
    fn release<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<(), RegistryError>>;
    /// See [`WorkerRegistry::complete`].
    fn complete<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<(), RegistryError>>;
    /// See [`WorkerRegistry::complete_by`].
    fn complete_by<'a>(
        &'a self,
        worker: WorkerId,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<(), RegistryError>>;
    /// See [`WorkerRegistry::assign`].
    fn assign<'a>(
        &'a self,
        target: &'a Target,
    ) -> BoxFuture<'a, Result<AssignOutcome, RegistryError>>;
    /// See [`WorkerRegistry::heartbeat`].
    fn heartbeat<'a>(
        &'a self,
        worker: WorkerId,
    ) -> BoxFuture<'a, Result<HeartbeatAck, RegistryError>>;
    /// See [`WorkerRegistry::loop_started`].
    fn loop_started<'a>(&'a self, worker: WorkerId)
        -> BoxFuture<'a, Result<Status, RegistryError>>;
    /// See [`WorkerRegistry::loop_finished`].
    fn loop_finished<'a>(
        &'a self,
        worker: WorkerId,
    ) -> BoxFuture<'a, Result<Status, RegistryError>>;
    /// See [`WorkerRegistry::register`].
    fn register<'a>(&'a self) -> BoxFuture<'a, Result<WorkerId, RegistryError>>;
    /// See [`WorkerRegistry::deregister`].
    fn deregister<'a>(
        &'a self,
        worker: WorkerId,
    ) -> BoxFuture<'a, Result<DeadReason, RegistryError>>;
    /// See [`WorkerRegistry::drain_within`].
    fn drain_within<'a>(
        &'a self,
        worker: WorkerId,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<Status, RegistryError>>;
    /// See [`WorkerRegistry::drain_all_within`].
    fn drain_all_within<'a>(
        &'a self,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<DrainAll, RegistryError>>;
    /// See [`WorkerRegistry::worker`].
    fn worker<'a>(
        &'a self,
        worker: WorkerId,
    ) -> BoxFuture<'a, Result<Option<WorkerInfo>, RegistryError>>;
    /// See [`Maintenance::sweep`].
    fn sweep<'a>(&'a self) -> BoxFuture<'a, Result<SweepReport, RegistryError>>;
    /// See [`Maintenance::acknowledge`].
    fn acknowledge<'a>(
        &'a self,
        released: &'a [ReleasedEvent],
    ) -> BoxFuture<'a, Result<(), RegistryError>>;
    /// See [`Maintenance::wake`].
    fn wake<'a>(&'a self) -> BoxFuture<'a, ()>;
    /// See [`WorkerRegistry::status`].
    fn status(&self) -> Arc<StatusSnapshot>;
    /// See [`WorkerRegistry::stats`].
    fn stats(&self) -> Stats;
    /// See [`WorkerRegistry::audit`]; the default answers [`RegistryError::Unsupported`] as the
    /// trait's does.
    fn audit<'a>(&'a self) -> BoxFuture<'a, Result<Audit, RegistryError>> {
        Box::pin(std::future::ready(Err(RegistryError::Unsupported {
            backend: "unknown",
            feature: "audit",
        })))
    }
    /// See [`WorkerRegistry::config`].
    fn config(&self) -> &RegistryConfig;
    /// See [`WorkerRegistry::parks`].
    fn parks(&self) -> bool;
    /// See [`WorkerRegistry::keeps_payloads`].
    fn keeps_payloads(&self) -> bool;
    /// See [`Subscribe::subscribe`](crate::Subscribe::subscribe).
    #[cfg(feature = "tokio")]
    fn subscribe(&self) -> crate::Subscription;
}

impl<T: Backend> DynBackend for T {
    fn admit<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<Admission, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::admit(self, target, delivery))
    }
    fn admit_with<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
        payload: Option<&'a Payload>,
    ) -> BoxFuture<'a, Result<Admission, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::admit_with(
            self, target, delivery, payload,
        ))
    }
    fn payload<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<Option<Payload>, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::payload(self, target, delivery))
    }
    fn claim<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<ClaimOutcome, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::claim(self, target, delivery))
    }
    fn release<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(<T as WorkerRegistry>::release(self, target, delivery))
    }
    fn complete<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(<T as WorkerRegistry>::complete(self, target, delivery))
    }
    fn complete_by<'a>(
        &'a self,
        worker: WorkerId,
        target: &'a Target,
        delivery: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(<T as WorkerRegistry>::complete_by(
            self, worker, target, delivery,
        ))
    }
    fn assign<'a>(
        &'a self,
        target: &'a Target,
    ) -> BoxFuture<'a, Result<AssignOutcome, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::assign(self, target))
    }
    fn heartbeat<'a>(
        &'a self,
        worker: WorkerId,
    ) -> BoxFuture<'a, Result<HeartbeatAck, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::heartbeat(self, worker))
    }
    fn loop_started<'a>(
        &'a self,
        worker: WorkerId,
    ) -> BoxFuture<'a, Result<Status, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::loop_started(self, worker))
    }
    fn loop_finished<'a>(
        &'a self,
        worker: WorkerId,
    ) -> BoxFuture<'a, Result<Status, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::loop_finished(self, worker))
    }
    fn register<'a>(&'a self) -> BoxFuture<'a, Result<WorkerId, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::register(self))
    }
    fn deregister<'a>(
        &'a self,
        worker: WorkerId,
    ) -> BoxFuture<'a, Result<DeadReason, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::deregister(self, worker))
    }
    fn drain_within<'a>(
        &'a self,
        worker: WorkerId,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<Status, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::drain_within(self, worker, deadline))
    }
    fn drain_all_within<'a>(
        &'a self,
        deadline: Duration,
    ) -> BoxFuture<'a, Result<DrainAll, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::drain_all_within(self, deadline))
    }
    fn worker<'a>(
        &'a self,
        worker: WorkerId,
    ) -> BoxFuture<'a, Result<Option<WorkerInfo>, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::worker(self, worker))
    }
    fn sweep<'a>(&'a self) -> BoxFuture<'a, Result<SweepReport, RegistryError>> {
        Box::pin(<T as Maintenance>::sweep(self))
    }
    fn acknowledge<'a>(
        &'a self,
        released: &'a [ReleasedEvent],
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        Box::pin(<T as Maintenance>::acknowledge(self, released))
    }
    fn wake<'a>(&'a self) -> BoxFuture<'a, ()> {
        Box::pin(<T as Maintenance>::wake(self))
    }
    fn status(&self) -> Arc<StatusSnapshot> {
        WorkerRegistry::status(self)
    }
    fn stats(&self) -> Stats {
        WorkerRegistry::stats(self)
    }
    fn audit<'a>(&'a self) -> BoxFuture<'a, Result<Audit, RegistryError>> {
        Box::pin(<T as WorkerRegistry>::audit(self))
    }
    fn config(&self) -> &RegistryConfig {
        WorkerRegistry::config(self)
    }
    fn parks(&self) -> bool {
        WorkerRegistry::parks(self)
    }
    fn keeps_payloads(&self) -> bool {
        WorkerRegistry::keeps_payloads(self)
    }
    #[cfg(feature = "tokio")]
    fn subscribe(&self) -> crate::Subscription {
        crate::Subscribe::subscribe(self)
    }
}

impl WorkerRegistry for DynRegistry {
    fn admit(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        let backend = self.0.clone();
        let target = target.to_owned();
        let delivery = delivery.to_owned();
        async move { backend.admit(&target, &delivery).await }
    }
    fn admit_with(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        let backend = self.0.clone();
        let target = target.to_owned();
        let delivery = delivery.to_owned();
        let payload = payload.cloned();
        async move {
            backend
                .admit_with(&target, &delivery, payload.as_ref())
                .await
        }
    }
    fn payload(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Payload>, RegistryError>> + Send {
        let backend = self.0.clone();
        let target = target.to_owned();
        let delivery = delivery.to_owned();
        async move { backend.payload(&target, &delivery).await }
    }
    fn claim(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send {
        let backend = self.0.clone();
        let target = target.to_owned();
        let delivery = delivery.to_owned();
        async move { backend.claim(&target, &delivery).await }
    }
    fn release(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        let backend = self.0.clone();
        let target = target.to_owned();
        let delivery = delivery.to_owned();
        async move { backend.release(&target, &delivery).await }
    }
    fn complete(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        let backend = self.0.clone();
        let target = target.to_owned();
        let delivery = delivery.to_owned();
        async move { backend.complete(&target, &delivery).await }
    }
    fn complete_by(
        &self,
        worker: WorkerId,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        let backend = self.0.clone();
        let target = target.to_owned();
        let delivery = delivery.to_owned();
        async move { backend.complete_by(worker, &target, &delivery).await }
    }
    fn assign(
        &self,
        target: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send {
        let backend = self.0.clone();
        let target = target.to_owned();
        async move { backend.assign(&target).await }
    }
    fn heartbeat(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.heartbeat(worker).await }
    }
    fn loop_started(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.loop_started(worker).await }
    }
    fn loop_finished(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.loop_finished(worker).await }
    }
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.register().await }
    }
    fn deregister(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.deregister(worker).await }
    }
    fn drain_within(
        &self,
        worker: WorkerId,
        deadline: Duration,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.drain_within(worker, deadline).await }
    }
    fn drain_all_within(
        &self,
        deadline: Duration,
    ) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.drain_all_within(deadline).await }
    }
    fn worker(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.worker(worker).await }
    }
    fn status(&self) -> Arc<StatusSnapshot> {
        self.0.status()
    }
    fn stats(&self) -> Stats {
        self.0.stats()
    }
    fn audit(&self) -> impl Future<Output = Result<Audit, RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.audit().await }
    }
    fn config(&self) -> &RegistryConfig {
        self.0.config()
    }
    fn parks(&self) -> bool {
        self.0.parks()
    }
    fn keeps_payloads(&self) -> bool {
        self.0.keeps_payloads()
    }
}

impl Maintenance for DynRegistry {
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.sweep().await }
    }
    fn acknowledge(
        &self,
        released: &[ReleasedEvent],
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        let backend = self.0.clone();
        async move { backend.acknowledge(released).await }
    }
    fn wake(&self) -> impl Future<Output = ()> + Send {
        let backend = self.0.clone();
        async move { backend.wake().await }
    }
}

/// What [`DynBackend`] is implemented for: every type that implements the contract traits.
#[cfg(feature = "tokio")]
pub trait Backend: WorkerRegistry + Maintenance + crate::Subscribe + 'static {}
#[cfg(feature = "tokio")]
impl<T: WorkerRegistry + Maintenance + crate::Subscribe + 'static> Backend for T {}

/// What [`DynBackend`] is implemented for: every type that implements the contract traits.
#[cfg(not(feature = "tokio"))]
pub trait Backend: WorkerRegistry + Maintenance + 'static {}
#[cfg(not(feature = "tokio"))]
impl<T: WorkerRegistry + Maintenance + 'static> Backend for T {}

/// A registry whose backend was chosen at run time: an `Arc<dyn DynBackend>` that implements the
/// contract traits itself. Cloning shares the backend.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use worker_registry::{Admission, DeliveryId, DynRegistry, InMemoryRegistry, Target, WorkerRegistry};
///
/// let registry = DynRegistry::new(InMemoryRegistry::default()); // or a networked backend
/// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
/// assert!(matches!(registry.admit(&t, &d).await, Ok(Admission::Assigned(_))));
/// # }
/// ```
#[derive(Clone)]
pub struct DynRegistry(Arc<dyn DynBackend>);

impl DynRegistry {
    /// Wraps a backend.
    ///
    /// # Examples
    ///
    /// See [`DynRegistry`].
    pub fn new(backend: impl Backend) -> Self {
        Self(Arc::new(backend))
    }

    /// Wraps a backend that is already shared.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use worker_registry::dynamic::DynBackend;
    /// use worker_registry::{DynRegistry, InMemoryRegistry};
    ///
    /// let shared: Arc<dyn DynBackend> = Arc::new(InMemoryRegistry::default());
    /// let registry = DynRegistry::from_arc(shared);
    /// ```
    pub fn from_arc(backend: Arc<dyn DynBackend>) -> Self {
        Self(backend)
    }

    /// The backend.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DynRegistry, InMemoryRegistry};
    ///
    /// let registry = DynRegistry::new(InMemoryRegistry::default());
    /// assert_eq!(registry.backend().status().version, 0);
    /// ```
    pub fn backend(&self) -> &Arc<dyn DynBackend> {
        &self.0
    }
}

impl fmt::Debug for DynRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynRegistry")
            .field("max_workers", &self.0.config().max_workers())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tokio")]
impl crate::Subscribe for DynRegistry {
    fn subscribe(&self) -> crate::Subscription {
        self.0.subscribe()
    }
}
