//! The conformance suite (`worker_registry::testkit`), unchanged, against PostgreSQL: every
//! registry under a name of its own, every replica a handle with its own pool and listener, time
//! moved by the registry's test offset.
//!
//! The server is `WORKER_REGISTRY_POSTGRES_URL`, or a throwaway cluster started for the run (see
//! `support/pg_cluster.rs`); without either the suite is skipped with one line (and fails when
//! `CI` is set).

#[path = "support/pg_cluster.rs"]
mod pg_cluster;

use std::time::Duration;

use worker_registry::postgres::PostgresRegistry;
use worker_registry::testkit::Fixture;
use worker_registry::RegistryConfig;

struct PostgresFixture {
    url: String,
}

impl Fixture for PostgresFixture {
    type Registry = PostgresRegistry;

    async fn registry(&self, config: RegistryConfig) -> PostgresRegistry {
        PostgresRegistry::builder(&self.url)
            .name(pg_cluster::unique_name("conformance"))
            .config(config)
            .pool_size(8)
            .connect()
            .await
            .expect("connect to the test server")
    }

    async fn replica(&self, of: &PostgresRegistry) -> PostgresRegistry {
        of.connect_replica().await.expect("connect a replica")
    }

    async fn advance(&self, of: &PostgresRegistry, by: Duration) {
        of.advance_time_for_tests(by)
            .await
            .expect("advance the registry's time");
    }
}

fn fixture() -> Option<PostgresFixture> {
    pg_cluster::shared_url().map(|url| PostgresFixture { url })
}

worker_registry::conformance_suite!(fixture());
