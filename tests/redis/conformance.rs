//! The conformance suite (`worker_registry::testkit`), unchanged, against Redis: every registry
//! under a name (hash tag) of its own, every replica a handle on its own connection, time moved by
//! the registry's server-side test offset.

use std::time::Duration;

use worker_registry::redis::RedisRegistry;
use worker_registry::testkit::Fixture;
use worker_registry::RegistryConfig;

use crate::harness;

struct RedisFixture {
    url: String,
}

impl Fixture for RedisFixture {
    type Registry = RedisRegistry;

    async fn registry(&self, config: RegistryConfig) -> RedisRegistry {
        harness::registry(&self.url, "conformance", config).await
    }

    async fn replica(&self, of: &RedisRegistry) -> RedisRegistry {
        of.connect_replica().await.expect("connect a replica")
    }

    async fn advance(&self, of: &RedisRegistry, by: Duration) {
        of.advance_time_for_tests(by)
            .await
            .expect("advance the registry's time");
    }
}

fn fixture() -> Option<RedisFixture> {
    harness::shared("conformance").map(|url| RedisFixture { url })
}

worker_registry::conformance_suite!(fixture());
