//! Failover: a primary, a replica of it and a `redis-sentinel` monitoring them, all throwaway
//! servers; the Sentinel fails over (`SENTINEL FAILOVER`: the replica is promoted, the old
//! primary demoted to a replica of it) under a live handle that found the primary through the
//! Sentinel. The handle's next calls meet `READONLY` (or a dropped connection), ask the Sentinel
//! again and go on with the new primary: no restart, nothing lost that had replicated.

use std::time::{Duration, Instant};

use test_servers::sentinel::Sentinel;
use worker_registry::redis::RedisRegistry;
use worker_registry::{Admission, DeliveryId, RegistryConfig, Target, WorkerRegistry};

use crate::harness::{self, Server};

const SERVICE: &str = "wr-primary";

/// Polls `f` until it is true. A condition: the cap (90 s) only bounds a hang, since Sentinel
/// learns of replicas from its 10 s `INFO` round, slower on a loaded machine.
async fn wait_for(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !f().await {
        assert!(Instant::now() < deadline, "not within 90 s: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The server's replication role, or `""` while it cannot say: during a failover the Sentinel
/// reconfigures the old primary and kills its clients, so a read may meet a closed connection.
async fn role(url: &str) -> String {
    let Ok(mut c) = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
    else {
        return String::new();
    };
    let Ok(info) = redis::cmd("INFO")
        .arg("replication")
        .query_async::<String>(&mut c)
        .await
    else {
        return String::new();
    };
    info.lines()
        .find_map(|l| l.strip_prefix("role:"))
        .unwrap_or("")
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_followed_without_a_restart() {
    let Some(primary) = Server::start(false, "Redis failover test") else {
        return;
    };
    let replica = Server::start_args(
        &[
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary.port.to_string(),
        ],
        "Redis failover test",
    )
    .expect("the replica starts where the primary did");
    let replica_url = replica.url();
    wait_for("the replica is in sync", async || {
        let mut c = harness::raw(&replica_url).await;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut c)
            .await
            .unwrap();
        info.contains("master_link_status:up")
    })
    .await;
    let Some(sentinel) = Sentinel::start(primary.port, SERVICE, "Redis failover test") else {
        return;
    };
    let sentinel_url = sentinel.url();
    // A replica the Sentinel can promote: connected, with its own INFO read (flags just "slave").
    wait_for("the Sentinel can promote the replica", async || {
        let mut c = harness::raw(&sentinel_url).await;
        let replicas: Vec<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(SERVICE)
            .query_async(&mut c)
            .await
            .unwrap_or_default();
        replicas.iter().any(|r| {
            r.get("flags").map(String::as_str) == Some("slave")
                && r.get("master-link-status").map(String::as_str) == Some("ok")
        })
    })
    .await;

    let registry = RedisRegistry::builder("redis://ignored-host/")
        .sentinel([sentinel.url()], SERVICE)
        .name(harness::unique_name("failover"))
        .config(RegistryConfig::default())
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .reconnect_retries(1)
        .connect()
        .await
        .expect("connect through the Sentinel");
    let t = |n| Target::new("octo/repo", n).unwrap();
    let d = |s: &str| DeliveryId::new(s).unwrap();
    let Admission::Assigned(first) = registry.admit(&t(1), &d("before")).await.unwrap() else {
        panic!("assigned on the first primary");
    };
    // The claim reached the replica before the failover (WAIT: one replica acknowledged).
    let mut c = harness::raw(&primary.url()).await;
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(acked, 1);

    let mut s = harness::raw(&sentinel.url()).await;
    let _: () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SERVICE)
        .query_async(&mut s)
        .await
        .expect("the Sentinel starts a failover");
    let (old, new) = (primary.url(), replica.url());
    wait_for("the replica is promoted", async || {
        role(&new).await == "master"
    })
    .await;
    wait_for("the old primary is demoted", async || {
        role(&old).await == "slave"
    })
    .await;

    // The same handle: calls fail (retryable) while it moves, then answer from the new primary.
    let deadline = Instant::now() + Duration::from_secs(90);
    let second = loop {
        match registry.admit(&t(2), &d("after")).await {
            Ok(a) => break a,
            Err(e) => {
                assert!(e.is_retryable(), "only retryable errors meanwhile: {e}");
                assert!(
                    Instant::now() < deadline,
                    "the handle did not follow the failover within 90 s: {e}\n{}",
                    sentinel.log()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(matches!(second, Admission::Assigned(_)), "{second:?}");
    // What replicated before the failover is there: the first delivery is a duplicate.
    assert!(
        matches!(
            registry.admit(&t(1), &d("before")).await.unwrap(),
            Admission::Duplicate(_)
        ),
        "the first claim survived the failover"
    );
    registry.heartbeat(first.worker).await.unwrap();
    assert!(
        !format!("{registry:?}").contains("reconnections: 0"),
        "a new connection, to the new primary: {registry:?}"
    );
}
