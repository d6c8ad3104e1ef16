//! The conformance suite (`worker_registry::testkit`), unchanged, through a real `pgbouncer` in
//! transaction mode (the usual deployment in front of PostgreSQL): every call an unnamed
//! statement (`transaction_pooler(true)`), events on a direct `listen_url`; and again without a
//! `listen_url` (module `polling`), events polled from the registry's event log. Plus the errors
//! a handle not told about the pooler meets.
//!
//! The server is the tests' shared one (see `support/pg_cluster.rs`), the pooler a throwaway one
//! in front of it; without `pgbouncer` the file skips with one line (and fails when `CI` is set).

#[path = "support/pg_cluster.rs"]
mod pg_cluster;

use std::sync::OnceLock;
use std::time::Duration;

use test_servers::pgbouncer::PgBouncer;
use worker_registry::postgres::PostgresRegistry;
use worker_registry::testkit::Fixture;
use worker_registry::{ConnectError, RegistryConfig};

struct PgBouncerFixture {
    /// Through the pooler.
    url: String,
    /// The server itself (for LISTEN); none: the handles poll the event log.
    direct: Option<String>,
}

impl Fixture for PgBouncerFixture {
    type Registry = PostgresRegistry;

    async fn registry(&self, config: RegistryConfig) -> PostgresRegistry {
        let b = PostgresRegistry::builder(&self.url)
            .name(pg_cluster::unique_name("pgbouncer"))
            .config(config)
            .pool_size(4)
            .transaction_pooler(true);
        let b = match &self.direct {
            Some(direct) => b.listen_url(direct),
            None => b.poll_interval(Duration::from_millis(50)),
        };
        b.connect().await.expect("connect through pgbouncer")
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

fn port(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .and_then(|p| p.parse().ok())
        .expect("a port in the server's URL")
}

/// The pooler every test of this binary shares, in front of the shared server.
fn pooler() -> Option<(String, String)> {
    static POOLER: OnceLock<Option<(PgBouncer, String)>> = OnceLock::new();
    POOLER
        .get_or_init(|| {
            let direct = pg_cluster::shared_url()?;
            let b = PgBouncer::start(port(&direct), 20, "the tests through pgbouncer")?;
            Some((b, direct))
        })
        .as_ref()
        .map(|(b, direct)| (b.url(), direct.clone()))
}

fn fixture() -> Option<PgBouncerFixture> {
    pooler().map(|(url, direct)| PgBouncerFixture {
        url,
        direct: Some(direct),
    })
}

worker_registry::conformance_suite!(fixture());

/// The suite again with no `listen_url`: events come from the polled event log.
mod polling {
    fn fixture() -> Option<super::PgBouncerFixture> {
        super::pooler().map(|(url, _)| super::PgBouncerFixture { url, direct: None })
    }

    worker_registry::conformance_suite!(fixture());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_not_told_about_the_pooler_gets_a_clear_error() {
    let Some((url, _)) = pooler() else {
        return;
    };
    let err = PostgresRegistry::builder(&url)
        .name(pg_cluster::unique_name("pgbouncer-untold"))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ConnectError::Unsupported {
                backend: "postgres",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("transaction_pooler(true)"),
        "{err}"
    );
}

/// Told about the pooler but given no `listen_url`: the handle connects and polls, and another
/// replica's events reach it (the polling suite shows the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_listen_url_events_are_polled_from_the_log() {
    let Some((url, _)) = pooler() else {
        return;
    };
    let r = PostgresRegistry::builder(&url)
        .name(pg_cluster::unique_name("pgbouncer-poll"))
        .transaction_pooler(true)
        .poll_interval(Duration::from_millis(20))
        .connect()
        .await
        .expect("a handle without listen_url polls");
    let other = r.connect_replica().await.unwrap();
    let mut events = worker_registry::Subscribe::subscribe(&r);
    let w = worker_registry::WorkerRegistry::register(&other)
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), events.recv())
        .await
        .expect("the other replica's event arrives by polling")
        .unwrap();
    assert_eq!(
        got,
        worker_registry::Event::WorkerCreated {
            worker: w,
            target: None
        }
    );
}
