//! [`MemoryFixture`]: the conformance fixture of [`InMemoryRegistry`], on a [`ManualClock`] per
//! registry.

use std::time::Duration;

use super::fixture::Fixture;
use crate::clock::ManualClock;
use crate::config::RegistryConfig;
use crate::memory::InMemoryRegistry;

/// Runs the conformance suite against [`InMemoryRegistry`]: each registry gets its own
/// [`ManualClock`], a replica is a clone (one process shares one state), and `advance` moves that
/// registry's clock.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use worker_registry::testkit::{Fixture, MemoryFixture};
/// use worker_registry::{Clock, RegistryConfig};
///
/// let fixture = MemoryFixture::new();
/// let registry = fixture.registry(RegistryConfig::default()).await;
/// fixture.advance(&registry, Duration::from_secs(1)).await;
/// assert_eq!(registry.direct().clock().now(), Duration::from_secs(1));
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryFixture;

impl MemoryFixture {
    /// The fixture (it holds nothing: every registry carries its own clock).
    pub fn new() -> Self {
        Self
    }
}

impl Fixture for MemoryFixture {
    type Registry = InMemoryRegistry<ManualClock>;

    async fn registry(&self, config: RegistryConfig) -> Self::Registry {
        InMemoryRegistry::with_clock(config, ManualClock::new())
    }

    async fn replica(&self, of: &Self::Registry) -> Self::Registry {
        of.clone()
    }

    async fn advance(&self, of: &Self::Registry, by: Duration) {
        of.direct().clock().advance(by);
    }
}
