//! [`WorkerRegistryExt`]: the calls that are compositions of [`WorkerRegistry`]'s minimal set,
//! written once for every registry (as object_store's `ObjectStoreExt` over `ObjectStore`).

use std::future::Future;

use super::contract::WorkerRegistry;
use super::error::RegistryError;
use super::ids::{DeliveryId, Target, WorkerId};
use super::outcome::Admission;
use super::status::Status;

/// The conveniences of the contract: each is one call of [`WorkerRegistry`] with an argument
/// filled in, so its semantics are that call's. Implemented for every [`WorkerRegistry`]
/// ([`DynRegistry`](crate::DynRegistry) included) and never by hand: a backend implements the
/// minimal trait alone, and these behave the same on all of them.
///
/// Bring it into scope with the trait: `use worker_registry::{WorkerRegistry, WorkerRegistryExt};`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use worker_registry::{
///     Admission, DeliveryId, InMemoryRegistry, Status, Target, WorkerRegistry, WorkerRegistryExt,
/// };
///
/// let r = InMemoryRegistry::default();
/// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d-1").unwrap());
/// let Ok(Admission::Assigned(a)) = r.admit(&t, &d).await else { panic!() };
/// r.complete_by(a.worker, &t, &d).await.unwrap();
/// r.complete(&t, &d).await.unwrap(); // idempotent
/// assert_eq!(r.drain(a.worker).await, Ok(Status::Draining));
/// # }
/// ```
pub trait WorkerRegistryExt: WorkerRegistry {
    /// [`admit_with`](WorkerRegistry::admit_with) without a payload: claims the delivery and
    /// places its target in one atomic step. Call `admit_with` to keep what GitHub sent with the
    /// claim, so that whichever worker runs the delivery gets it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{Admission, DeliveryId, InMemoryRegistry, Target, WorkerRegistryExt};
    ///
    /// let r = InMemoryRegistry::default();
    /// let t = Target::new("o/r", 1).unwrap();
    /// let d = DeliveryId::new("d-1").unwrap();
    /// let Ok(Admission::Assigned(a)) = r.admit(&t, &d).await else { panic!() };
    /// assert!(a.new);
    /// assert!(matches!(r.admit(&t, &d).await, Ok(Admission::Duplicate(_))));
    /// # }
    /// ```
    fn admit(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        self.admit_with(target, delivery, None)
    }

    /// [`complete_as`](WorkerRegistry::complete_as) with no holder: marks a claim completed on
    /// behalf of whoever holds it (a bare claim, or a router that completes for its workers).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{ClaimOutcome, DeliveryId, InMemoryRegistry, Target, WorkerRegistry,
    ///     WorkerRegistryExt};
    ///
    /// let r = InMemoryRegistry::default();
    /// let (t, d) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// assert_eq!(r.claim(&t, &d).await, Ok(ClaimOutcome::Claimed));
    /// r.complete(&t, &d).await.unwrap();
    /// assert!(matches!(r.claim(&t, &d).await, Ok(ClaimOutcome::AlreadyClaimed(_))));
    /// # }
    /// ```
    fn complete(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        self.complete_as(None, target, delivery)
    }

    /// [`complete_as`](WorkerRegistry::complete_as) as `worker`, fenced: only the claim's
    /// holder completes it; a fenced-off worker gets [`RegistryError::NotHolder`] or
    /// [`RegistryError::ClaimReleased`] and completes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{Admission, DeliveryId, InMemoryRegistry, RegistryError, Target,
    ///     WorkerId, WorkerRegistryExt};
    ///
    /// let r = InMemoryRegistry::default();
    /// let (t, d) = (Target::new("o/r", 7).unwrap(), DeliveryId::new("d-1").unwrap());
    /// let Ok(Admission::Assigned(a)) = r.admit(&t, &d).await else { panic!() };
    /// let stranger = WorkerId::new(a.worker.get() + 1);
    /// let err = r.complete_by(stranger, &t, &d).await.unwrap_err();
    /// assert!(matches!(err, RegistryError::NotHolder { .. }));
    /// r.complete_by(a.worker, &t, &d).await.unwrap();
    /// # }
    /// ```
    fn complete_by(
        &self,
        worker: WorkerId,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        self.complete_as(Some(worker), target, delivery)
    }

    /// [`drain_within`](WorkerRegistry::drain_within) the configured
    /// [`drain_deadline`](crate::RegistryConfig::drain_deadline).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{AssignOutcome, DeadReason, InMemoryRegistry, Status, Target,
    ///     WorkerRegistry, WorkerRegistryExt};
    ///
    /// let r = InMemoryRegistry::default();
    /// let Ok(AssignOutcome::Assigned(a)) = r.assign(&Target::new("o/r", 1).unwrap()).await
    /// else { panic!() };
    /// assert_eq!(r.drain(a.worker).await, Ok(Status::Draining));
    /// assert_eq!(r.loop_finished(a.worker).await, Ok(Status::Dead(DeadReason::Exited)));
    /// # }
    /// ```
    fn drain(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.drain_within(worker, self.config().drain_deadline())
    }
}

impl<R: WorkerRegistry + ?Sized> WorkerRegistryExt for R {}
