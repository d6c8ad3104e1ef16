//! Failover: a primary, a replica of it and a `redis-sentinel` monitoring them, all throwaway
//! servers; the Sentinel fails over (`SENTINEL FAILOVER`: the replica is promoted, the old
//! primary demoted to a replica of it) under a live handle that found the primary through the
//! Sentinel. The handle's next calls meet `READONLY` (or a dropped connection), ask the Sentinel
//! again and go on with the new primary: no restart, nothing lost that had replicated.
//!
//! And a real promotion of a replica that lagged: replication cut before the last writes, the
//! primary stopped, `REPLICAOF NO ONE` on the replica, the address the handles use moved to it
//! (`test_servers::forward`, as a virtual IP moves): no id or token repeats, every handle reports
//! the loss, and each worker created after it is created once.

use std::time::{Duration, Instant};
use worker_registry::WorkerRegistryExt;

use test_servers::forward::Forward;
use test_servers::sentinel::Sentinel;
use worker_registry::redis::RedisRegistry;
use worker_registry::{
    Admission, DeliveryId, Event, Maintenance, RegistryConfig, RegistryError, Subscribe, Target,
    WorkerId, WorkerRegistry,
};

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

/// Retries `f` until it answers; only retryable errors meanwhile (capped at 30 s: a hang).
async fn until_answered<T>(what: &str, mut f: impl AsyncFnMut() -> Result<T, RegistryError>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(e.is_retryable(), "{what}: only retryable errors: {e}");
                assert!(
                    Instant::now() < deadline,
                    "{what}: no answer within 30 s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The workers the next `DataLost` event reports (bounded wait), skipping other events.
async fn next_loss(events: &mut worker_registry::Subscription) -> Vec<WorkerId> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Ok(Event::DataLost { mut lost })) => {
                lost.sort();
                return lost;
            }
            Ok(Ok(_)) | Ok(Err(worker_registry::RecvError::Lagged { .. })) => {}
            other => panic!("no DataLost event: {other:?}"),
        }
    }
}

async fn info_replication(url: &str) -> String {
    let mut c = harness::raw(url).await;
    redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut c)
        .await
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_promoted_repeats_no_id_or_token_and_reports_the_loss() {
    let what = "Redis promotion test";
    let Some(mut primary) = Server::start(false, what) else {
        return;
    };
    let replica = Server::start_args(
        &[
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary.port.to_string(),
        ],
        what,
    )
    .expect("the replica starts where the primary did");
    let replica_url = replica.url();
    wait_for("the replica is in sync", async || {
        info_replication(&replica_url)
            .await
            .contains("master_link_status:up")
    })
    .await;
    // The handles reach the primary through an address that a failover moves.
    let vip = Forward::start(primary.port);
    let r = RedisRegistry::builder(vip.redis_url())
        .name(harness::unique_name("promote"))
        .config(RegistryConfig::default())
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .reconnect_retries(1)
        .connect()
        .await
        .expect("connect");
    let other = r.connect_replica().await.expect("a second replica");
    let (mut events, mut other_events) = (r.subscribe(), other.subscribe());
    let handles = [&r, &other];
    let t = |n| Target::new("octo/repo", n).unwrap();
    let d = |s: &str| DeliveryId::new(s).unwrap();
    let mut earlier = Vec::new();
    let admit_all = async |range: std::ops::RangeInclusive<u64>, delivery: &str| {
        let mut got = Vec::new();
        for i in range {
            let h = handles[(i % 2) as usize];
            let Admission::Assigned(a) = h.admit(&t(i), &d(delivery)).await.unwrap() else {
                panic!("assigned")
            };
            got.push(a);
        }
        for h in handles {
            h.sweep().await.expect("a sweep");
        }
        got
    };
    // Replicated: the replica acknowledged everything so far.
    let kept = admit_all(1..=3, "before").await;
    let mut raw_primary = harness::raw(&primary.url()).await;
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut raw_primary)
        .await
        .unwrap();
    assert_eq!(acked, 1, "the replica has the first workers");
    // Replication is cut: the replica follows a primary that is not there (keeping its data).
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut raw_replica = harness::raw(&replica_url).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(nowhere)
        .query_async(&mut raw_replica)
        .await
        .unwrap();
    // Acknowledged by the primary, never replicated.
    let lost = admit_all(4..=6, "lost").await;
    earlier.extend(kept.iter().chain(&lost).cloned());
    assert_eq!(r.status().capacity.used, 6);

    // The primary dies; the lagging replica is promoted and the address moves to it.
    primary.stop();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut raw_replica)
        .await
        .unwrap();
    wait_for("the replica is promoted", async || {
        role(&replica_url).await == "master"
    })
    .await;
    vip.point_at(replica.port);

    // Every handle finds the loss at its next sweep and names the lost workers.
    let mut lost_ids: Vec<_> = lost.iter().map(|a| a.worker).collect();
    lost_ids.sort();
    until_answered("sweep", async || r.sweep().await).await;
    assert_eq!(next_loss(&mut events).await, lost_ids);
    assert_eq!(r.stats().data_losses, 1);
    until_answered("sweep", async || other.sweep().await).await;
    assert_eq!(next_loss(&mut other_events).await, lost_ids);
    assert_eq!(other.stats().data_losses, 1);
    // What had replicated is there.
    for (i, a) in kept.iter().enumerate() {
        match r.admit(&t(i as u64 + 1), &d("before")).await.unwrap() {
            Admission::Duplicate(c) => assert_eq!(c.holder, Some(a.worker)),
            other => panic!("the replicated claim survived: {other:?}"),
        }
    }

    // After it: both handles race for each target (the lost ones and new ones); each gets one
    // worker, created once, with an id and a token never handed out before.
    let newest = earlier.iter().map(|a| a.token).max().unwrap();
    for i in 4..=9 {
        let (a, b) = tokio::join!(
            until_answered("admit", async || r.admit(&t(i), &d("after")).await),
            until_answered("admit", async || other.admit(&t(i), &d("after")).await),
        );
        let (created, duplicate) = match (a, b) {
            (Admission::Assigned(x), Admission::Duplicate(y))
            | (Admission::Duplicate(y), Admission::Assigned(x)) => (x, y),
            other => panic!("one assignment and one duplicate for {}: {other:?}", t(i)),
        };
        assert!(created.new, "a new worker for {}", t(i));
        assert_eq!(duplicate.holder, Some(created.worker));
        assert!(
            earlier.iter().all(|e| e.worker != created.worker),
            "worker id {} handed out again",
            created.worker
        );
        assert!(
            created.token > newest,
            "token {} not above {newest}",
            created.token
        );
    }
    // A container of a lost worker is refused: its id names nothing, and never will.
    assert!(matches!(
        r.heartbeat(lost[0].worker).await,
        Err(RegistryError::UnknownWorker { .. })
    ));
}
