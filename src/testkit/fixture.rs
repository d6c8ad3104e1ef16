//! [`Fixture`]: what a conformance case needs from a backend beyond the contract (fresh registries,
//! more handles on one, and control of its time), and [`IntoFixture`], which lets a backend's test
//! file skip the suite when its server is not available.

use std::future::Future;
use std::time::Duration;

use crate::api::contract::{Maintenance, Subscribe, WorkerRegistry};
use crate::config::RegistryConfig;

/// What the conformance suite must control that the contract does not offer: a fresh registry with
/// a given configuration, another handle (replica) on the same registry, and the registry's time.
///
/// A case uses nothing but this and the three contract traits, so a backend passes the suite by
/// implementing the traits and a fixture. A networked backend's fixture makes every registry under
/// a unique name (so cases never see each other's data), opens a new connection for each replica,
/// and moves time with a test-only offset stored server-side, so that every handle on the registry
/// sees it (see the shared-backend design: the offset can only be set in `testkit` builds).
///
/// Time moves only through [`advance`](Self::advance): no case sleeps. A server's clock also moves
/// by itself while a case runs, so cases never assert an exact time, only relations (an age is at
/// least what was advanced) and decisions with a margin of seconds on the side where real time
/// could push a value over a boundary.
///
/// # Examples
///
/// The fixture for the in-memory backend, as [`MemoryFixture`](super::MemoryFixture) implements it:
///
/// ```
/// use std::time::Duration;
/// use worker_registry::testkit::Fixture;
/// use worker_registry::{Clock, InMemoryRegistry, ManualClock, RegistryConfig};
///
/// struct OnManualClocks;
///
/// impl Fixture for OnManualClocks {
///     type Registry = InMemoryRegistry<ManualClock>;
///
///     async fn registry(&self, config: RegistryConfig) -> Self::Registry {
///         InMemoryRegistry::with_clock(config, ManualClock::new())
///     }
///     async fn replica(&self, of: &Self::Registry) -> Self::Registry {
///         of.clone() // one process: a clone shares the state
///     }
///     async fn advance(&self, of: &Self::Registry, by: Duration) {
///         of.direct().clock().advance(by);
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let fixture = OnManualClocks;
/// let registry = fixture.registry(RegistryConfig::default()).await;
/// fixture.advance(&registry, Duration::from_secs(5)).await;
/// assert_eq!(registry.direct().clock().now(), Duration::from_secs(5));
/// # }
/// ```
pub trait Fixture: Send + Sync + 'static {
    /// The backend under test. `Clone` is a cheap copy of the same handle, as for every backend
    /// in this crate; a second *replica* comes from [`replica`](Self::replica).
    type Registry: WorkerRegistry + Maintenance + Subscribe + Clone + Send + Sync + 'static;

    /// A fresh, empty registry with `config`, isolated from every other registry this made.
    fn registry(&self, config: RegistryConfig) -> impl Future<Output = Self::Registry> + Send;

    /// Another handle on the same registry, on its own connection (another replica).
    fn replica(&self, of: &Self::Registry) -> impl Future<Output = Self::Registry> + Send;

    /// Moves the registry's time forward by `by`, for every handle on it.
    fn advance(&self, of: &Self::Registry, by: Duration) -> impl Future<Output = ()> + Send;
}

/// What [`conformance_suite!`](crate::conformance_suite) accepts: a [`Fixture`], or an
/// `Option` of one, where `None` skips every case (a backend whose server is not installed prints
/// one line saying so when it builds its fixture, and returns `None`; under `CI` it panics
/// instead).
///
/// # Examples
///
/// ```
/// use worker_registry::testkit::{IntoFixture, MemoryFixture};
///
/// assert!(MemoryFixture::new().into_fixture().is_some());
/// assert!(None::<MemoryFixture>.into_fixture().is_none());
/// ```
pub trait IntoFixture {
    /// The fixture the suite runs with.
    type Fixture: Fixture;

    /// The fixture, or `None` to skip.
    fn into_fixture(self) -> Option<Self::Fixture>;
}

impl<F: Fixture> IntoFixture for F {
    type Fixture = F;
    fn into_fixture(self) -> Option<F> {
        Some(self)
    }
}

impl<F: Fixture> IntoFixture for Option<F> {
    type Fixture = F;
    fn into_fixture(self) -> Option<F> {
        self
    }
}
