//! Redis Cluster (feature `redis-cluster`): a three-primary cluster (`test-servers`), the
//! conformance suite unchanged through the cluster client, every registry in the slot of its
//! hash tag, and the keyless commands whose answer is the registry's primary's (`INFO`, `WAIT`)
//! sent to it.
//!
//! Without `redis-server`/`redis-cli` the file skips with one line (and fails when `CI` is set).

use std::time::Duration;
use worker_registry::WorkerRegistryExt;

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
        let home = cluster.owner(&format!("{tag}config"));
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

/// The registry's slot moved to another primary while a handle holds it (a reshard): the same
/// handle follows `MOVED` and goes on, ids and tokens going on from where they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_follows_its_slot_to_another_primary() {
    let Some(cluster) = Cluster::start(3, "Redis Cluster tests") else {
        return;
    };
    let reg = registry(&cluster, "moved", RegistryConfig::default()).await;
    let t = |n| Target::new("octo/repo", n).unwrap();
    let d = |s: &str| DeliveryId::new(s).unwrap();
    let Admission::Assigned(first) = reg.admit(&t(1), &d("a")).await.unwrap() else {
        panic!("assigned")
    };
    let key = format!("{{{}}}:config", reg.name());
    let home = cluster.owner(&key);
    cluster.move_slot_of(&key, (home + 1) % 3);
    assert_eq!(cluster.owner(&key), (home + 1) % 3);
    let Admission::Assigned(second) = reg.admit(&t(2), &d("b")).await.unwrap() else {
        panic!("assigned after the move")
    };
    assert!(second.worker > first.worker, "{first:?} then {second:?}");
    assert!(second.token > first.token, "{first:?} then {second:?}");
    reg.heartbeat(first.worker)
        .await
        .expect("a heartbeat after the move");
    assert!(matches!(
        reg.admit(&t(1), &d("a")).await.unwrap(),
        Admission::Duplicate(_)
    ));
    worker_registry::Maintenance::sweep(&reg)
        .await
        .expect("a sweep after the move");
}

/// The primary of the registry's slot stopped (no replica to take over): a call fails with a
/// typed, retryable backend error within the response timeout instead of hanging or panicking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_primary_is_a_typed_retryable_error() {
    let Some(mut cluster) = Cluster::start(3, "Redis Cluster tests") else {
        return;
    };
    let urls = cluster.urls();
    let reg = RedisRegistry::builder(urls[0].as_str())
        .cluster(urls[1..].iter().cloned())
        .name(harness::unique_name("lost"))
        .response_timeout(Duration::from_millis(500))
        .reconnect_retries(1)
        .connect()
        .await
        .expect("connect to the cluster");
    let key = format!("{{{}}}:config", reg.name());
    let home = cluster.owner(&key);
    cluster.nodes[home].stop();
    let t = Target::new("octo/repo", 1).unwrap();
    let got = tokio::time::timeout(
        Duration::from_secs(60),
        reg.admit(&t, &DeliveryId::new("a").unwrap()),
    )
    .await
    .expect("the call ends");
    match got {
        Err(e @ worker_registry::RegistryError::Backend { .. }) => {
            assert!(e.is_retryable(), "{e:?}");
        }
        other => panic!("a backend error, not {other:?}"),
    }
}

/// The primary of the registry's slot dies and the cluster promotes its replica by itself: the
/// same handle follows (the cluster client refreshes its slot map), with only retryable errors
/// meanwhile, and what had replicated is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_of_the_slots_primary_is_followed_by_the_same_handle() {
    let Some(mut cluster) = Cluster::start(3, "Redis Cluster tests") else {
        return;
    };
    let urls = cluster.urls();
    let reg = RedisRegistry::builder(urls[0].as_str())
        .cluster(urls[1..].iter().cloned())
        .name(harness::unique_name("cfailover"))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect to the cluster");
    let key = format!("{{{}}}:config", reg.name());
    let home = cluster.owner(&key);
    let replica = cluster.add_replica(home);
    let t = |n| Target::new("octo/repo", n).unwrap();
    let d = |s: &str| DeliveryId::new(s).unwrap();
    let Admission::Assigned(first) = reg.admit(&t(1), &d("before")).await.unwrap() else {
        panic!("assigned")
    };
    let acked = cluster.cli(home, &["WAIT", "1", "5000"]);
    assert_eq!(acked.trim(), "1", "the replica has the first worker");
    cluster.nodes[home].stop();
    // The cluster marks the primary failed after cluster-node-timeout and elects the replica.
    let cap = std::time::Instant::now() + Duration::from_secs(90);
    while !(cluster.cli(replica, &["ROLE"]).starts_with("master") && cluster.is_ok_without(home)) {
        assert!(std::time::Instant::now() < cap, "no failover within 90 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = loop {
        match reg.admit(&t(2), &d("after")).await {
            Ok(a) => break a,
            Err(e) => {
                assert!(e.is_retryable(), "only retryable errors meanwhile: {e}");
                assert!(
                    std::time::Instant::now() < cap,
                    "the handle did not follow the failover: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let Admission::Assigned(second) = second else {
        panic!("assigned after the failover: {second:?}")
    };
    assert!(second.worker > first.worker && second.token > first.token);
    match reg.admit(&t(1), &d("before")).await.unwrap() {
        Admission::Duplicate(c) => assert_eq!(c.holder, Some(first.worker)),
        other => panic!("the replicated claim survived: {other:?}"),
    }
    reg.heartbeat(first.worker)
        .await
        .expect("the first worker is alive on the promoted replica");
}

/// `cluster_connection`: the registry's commands over the application's cluster connection. On a
/// cluster of its own, so that connections can be counted: connecting adds only the listener's
/// pub/sub connection (the cluster client would open one per primary), the application's
/// connection sees the registry's writes, and it outlives the registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_on_the_applications_cluster_connection_decides_over_it() {
    let Some(cluster) = Cluster::start(3, "Redis Cluster given-connection test") else {
        return;
    };
    let urls = cluster.urls();
    let count = |c: &Cluster| -> usize {
        (0..urls.len())
            .map(|n| c.cli(n, &["CLIENT", "LIST"]).lines().count())
            .sum()
    };
    let mut app = redis::cluster::ClusterClient::new(urls.clone())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("app-key")
        .arg("v")
        .query_async(&mut app)
        .await
        .unwrap();
    // Each count is taken by a `redis-cli` of its own, which is in its own list.
    let before = count(&cluster);
    let name = harness::unique_name("given-cluster");
    let registry = RedisRegistry::builder(urls[0].as_str())
        .cluster_connection(app.clone())
        .name(&name)
        .connect()
        .await
        .expect("connect over the application's cluster connection");
    assert_eq!(
        count(&cluster),
        before + 1,
        "the registry opened its listener's pub/sub connection and nothing else"
    );
    let target = Target::new("octo/repo", 1).unwrap();
    harness::admit_fresh(&registry, &target).await;
    // The application's connection reads what the registry wrote (the sticky mapping's key).
    let holder: Option<String> = redis::cmd("GET")
        .arg(format!("{{{name}}}:t:{target}"))
        .query_async(&mut app)
        .await
        .unwrap();
    assert!(
        holder.is_some(),
        "the registry's key, read by the application"
    );
    drop(registry);
    let got: String = redis::cmd("GET")
        .arg("app-key")
        .query_async(&mut app)
        .await
        .expect("the application's connection outlives the registry");
    assert_eq!(got, "v");
}
