//! [`ReferenceRegistry`]: the sequential reference model behind the contract traits, and
//! [`ReferenceFixture`], which runs the conformance suite against it.

use std::fmt;
use std::future::{ready, Future};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::fixture::Fixture;
use super::model::Model;
use crate::api::contract::{Maintenance, Subscribe};
use crate::api::error::RegistryError;
use crate::api::events::Subscription;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::methods::sync_contract;
use crate::api::outcome::{Admission, AssignOutcome, ClaimOutcome, DrainAll, HeartbeatAck};
use crate::api::payload::Payload;
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::snapshot::{StatusSnapshot, WorkerInfo};
use crate::api::stats::{Audit, Stats};
use crate::api::status::{DeadReason, Status};
use crate::config::RegistryConfig;

/// The contract's semantics as a plain sequential model behind one lock: the executable
/// specification that the conformance suite and the in-memory backend's property test
/// (`tests/model.rs`) hold every backend to.
///
/// It is deliberately simple rather than fast: ordered maps, every call under one mutex (so every
/// call is trivially one atomic step), time that moves only through
/// [`advance`](Self::advance) (its wall clock is a [`ManualClock`](crate::ManualClock)'s, so its
/// display times equal those of an in-memory registry on a manual clock). Clones share the model.
///
/// **Locking behaviour:** every call holds the model's one lock for its whole duration.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use worker_registry::testkit::ReferenceRegistry;
/// use worker_registry::{Admission, DeliveryId, Maintenance, RegistryConfig, Target, WorkerRegistry, WorkerRegistryExt};
///
/// let config = RegistryConfig::builder().startup_grace(Duration::ZERO).build().unwrap();
/// let r = ReferenceRegistry::new(config);
/// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
/// let Ok(Admission::Assigned(a)) = r.admit(&t, &d).await else { panic!() };
/// r.advance(r.config().heartbeat_timeout() + Duration::from_millis(1));
/// let report = r.sweep().await.unwrap();
/// assert_eq!(report.died.len(), 1);
/// assert_eq!(report.released[0].holder, Some(a.worker));
/// # }
/// ```
#[derive(Clone)]
pub struct ReferenceRegistry {
    shared: Arc<Shared>,
}

struct Shared {
    config: RegistryConfig,
    model: Mutex<Model>,
}

impl Shared {
    fn config(&self) -> &RegistryConfig {
        &self.config
    }
}

impl ReferenceRegistry {
    /// An empty registry with `config`, at time zero.
    pub fn new(config: RegistryConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                model: Mutex::new(Model::new(config.clone())),
                config,
            }),
        }
    }

    /// Moves the registry's time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.model().advance(by);
    }

    /// Claims in its claims map now: in flight, retained, and released or expired but not yet
    /// swept (what [`Direct::claim_count`](crate::memory::Direct::claim_count)
    /// counts, for the property test that compares the two).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::testkit::ReferenceRegistry;
    /// use worker_registry::{DeliveryId, RegistryConfig, Target, WorkerRegistry};
    ///
    /// let r = ReferenceRegistry::new(RegistryConfig::default());
    /// r.claim(&Target::new("o/r", 1).unwrap(), &DeliveryId::new("d").unwrap()).await.unwrap();
    /// assert_eq!(r.claim_count(), 1);
    /// # }
    /// ```
    pub fn claim_count(&self) -> usize {
        self.model().claim_count()
    }

    /// What outlives a call's lock: the configuration (`config()`'s answer borrows it).
    fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The model. A panic inside it is a bug in the model that the panicking test reports; the
    /// state it left is still the best there is to read, so poisoning is ignored.
    fn model(&self) -> MutexGuard<'_, Model> {
        self.shared
            .model
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for ReferenceRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReferenceRegistry")
            .field("max_workers", &self.shared.config.max_workers())
            .finish_non_exhaustive()
    }
}

sync_contract!([] ReferenceRegistry, core: model, borrowed: shared);

impl Maintenance for ReferenceRegistry {
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send {
        ready(Ok(self.model().sweep()))
    }
    /// Nothing to do: like the in-memory backend, the model hands each released event over once,
    /// in the report of the sweep that released it.
    fn acknowledge(
        &self,
        _released: &[ReleasedEvent],
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        ready(Ok(()))
    }
}

impl Subscribe for ReferenceRegistry {
    fn subscribe(&self) -> Subscription {
        self.model().events.subscribe()
    }
}

/// Runs the conformance suite against [`ReferenceRegistry`]: a replica is a clone (the model is
/// shared), and `advance` moves the model's time.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use worker_registry::testkit::{Fixture, ReferenceFixture};
/// use worker_registry::{RegistryConfig, WorkerRegistry};
///
/// let fixture = ReferenceFixture::new();
/// let r = fixture.registry(RegistryConfig::default()).await;
/// let w = r.register().await.unwrap();
/// fixture.advance(&r, Duration::from_secs(7)).await;
/// assert!(r.worker(w).await.unwrap().unwrap().uptime >= Duration::from_secs(7));
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceFixture;

impl ReferenceFixture {
    /// The fixture.
    pub fn new() -> Self {
        Self
    }
}

impl Fixture for ReferenceFixture {
    type Registry = ReferenceRegistry;

    async fn registry(&self, config: RegistryConfig) -> ReferenceRegistry {
        ReferenceRegistry::new(config)
    }

    async fn replica(&self, of: &ReferenceRegistry) -> ReferenceRegistry {
        of.clone()
    }

    async fn advance(&self, of: &ReferenceRegistry, by: Duration) {
        of.advance(by);
    }
}
