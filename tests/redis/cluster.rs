//! Redis Cluster (feature `redis-cluster`): a three-primary cluster (`test-servers`), the
//! conformance suite unchanged through the cluster client, every registry in the slot of its
//! hash tag, and the keyless commands whose answer is the registry's primary's (`INFO`, `WAIT`)
//! sent to it.
//!
//! Without `redis-server`/`redis-cli` the file skips with one line (and fails when `CI` is set).

use std::time::Duration;

use test_servers::cluster::{self, Cluster};
use worker_registry::redis::RedisRegistry;
use worker_registry::testkit::Fixture;
use worker_registry::{Admission, DeliveryId, RegistryConfig, Target, WorkerRegistry};

use crate::harness;

/// A registry on `cluster` under a fresh name, reached through every node as a seed.
async fn registry(cluster: &Cluster, test: &str, config: RegistryConfig) -> RedisRegistry {
    let urls = cluster.urls();
    RedisRegistry::builder(urls[0].as_str())
        .cluster(urls[1..].iter().cloned())
        .name(harness::unique_name(test))
        .config(config)
        .connect()
        .await
        .expect("connect to the cluster")
}

struct ClusterFixture {
    cluster: &'static Cluster,
}

impl Fixture for ClusterFixture {
    type Registry = RedisRegistry;

    async fn registry(&self, config: RegistryConfig) -> RedisRegistry {
        registry(self.cluster, "cluster", config).await
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

fn fixture() -> Option<ClusterFixture> {
    cluster::shared("Redis Cluster tests").map(|cluster| ClusterFixture { cluster })
}

worker_registry::conformance_suite!(fixture());

/// Which node (index) serves the slot of `key`: the one that does not answer `GET key` with
/// `MOVED`.
fn owner(cluster: &Cluster, key: &str) -> usize {
    (0..cluster.nodes.len())
        .find(|&i| {
            !cluster
                .cli(i, &["GET", key])
                .to_ascii_uppercase()
                .contains("MOVED")
        })
        .unwrap_or_else(|| panic!("no node serves {key}"))
}

/// Registries with different names land in different slots, each with every key on the primary
/// of its own slot: one registry lives in one slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_keeps_all_its_keys_on_the_primary_of_its_slot() {
    let Some(cluster) = cluster::shared("Redis Cluster tests") else {
        return;
    };
    let mut owners = std::collections::BTreeSet::new();
    for n in 0..6 {
        let reg = registry(cluster, &format!("slot{n}"), RegistryConfig::default()).await;
        let admitted = reg
            .admit(
                &Target::new("org/repo", 1).unwrap(),
                &DeliveryId::new(&format!("d{n}")).unwrap(),
            )
            .await
            .expect("admit through the cluster");
        assert!(matches!(admitted, Admission::Assigned(_)), "{admitted:?}");
        let tag = format!("{{{}}}:", reg.name());
        let home = owner(cluster, &format!("{tag}config"));
        owners.insert(home);
        for (i, _) in cluster.nodes.iter().enumerate() {
            let keys = cluster.cli(i, &["KEYS", &format!("{tag}*")]);
            if i == home {
                assert!(
                    keys.lines().count() > 5,
                    "the home node holds the registry's keys: {keys}"
                );
            } else {
                assert!(
                    keys.trim().is_empty(),
                    "node {i} holds none of {tag}'s keys: {keys}"
                );
            }
        }
    }
    assert!(
        owners.len() > 1,
        "six names spread over more than one primary: {owners:?}"
    );
}
