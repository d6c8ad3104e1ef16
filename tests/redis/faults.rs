//! Faults: the server stopped and restarted under a live handle, a script that errors, and
//! persistence across a restart of the server and of every replica. Each test runs its own
//! `redis-server` (it stops and restarts it), so these need the binary even when
//! `WORKER_REGISTRY_REDIS_URL` names a server.

use std::time::{Duration, Instant};
use worker_registry::WorkerRegistryExt;

use redis::AsyncCommands;
use worker_registry::redis::RedisRegistry;
use worker_registry::{
    Admission, ClaimState, DeliveryId, Event, Maintenance, RegistryConfig, RegistryError,
    Subscribe, Target, WorkerRegistry,
};

use crate::harness::{self, Server};

fn t(n: u64) -> Target {
    Target::new("octo/repo", n).unwrap()
}

fn d(s: &str) -> DeliveryId {
    DeliveryId::new(s).unwrap()
}

async fn connect(server: &Server, name: &str) -> RedisRegistry {
    RedisRegistry::builder(server.url())
        .name(name)
        .config(RegistryConfig::default())
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .reconnect_retries(1)
        .connect()
        .await
        .expect("connect")
}

/// Retries `admit` until the registry answers (bounded: the test fails after 20 s).
async fn admit_until_answered(
    r: &RedisRegistry,
    target: &Target,
    delivery: &DeliveryId,
) -> Admission {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match r.admit(target, delivery).await {
            Ok(a) => return a,
            Err(e) => {
                assert!(
                    e.is_retryable(),
                    "only retryable errors while recovering: {e}"
                );
                assert!(Instant::now() < deadline, "no recovery within 20 s: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test]
async fn a_restarted_server_is_a_retryable_error_meanwhile_and_the_same_handle_recovers() {
    let Some(mut server) = Server::start(false, "faults") else {
        return;
    };
    let r = connect(&server, "restart").await;
    let mut events = r.subscribe();
    assert!(matches!(
        r.admit(&t(1), &d("a")).await,
        Ok(Admission::Assigned(_))
    ));
    let first = tokio::time::timeout(Duration::from_secs(5), events.recv()).await;
    assert!(
        matches!(first, Ok(Ok(Event::WorkerCreated { .. }))),
        "{first:?}"
    );

    server.stop();
    let err = r.admit(&t(1), &d("b")).await.unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::Backend {
                backend: "redis",
                retryable: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(r.sweep().await.unwrap_err().is_retryable());
    // Never blocks, never fails: the cached snapshot.
    assert_eq!(r.status().version, 0);

    // Back, empty (no persistence): the same handle answers again, its scripts reloaded
    // (NOSCRIPT), and the event listener resubscribed.
    server.restart();
    assert!(matches!(
        admit_until_answered(&r, &t(1), &d("b")).await,
        Admission::Assigned(a) if a.new
    ));
    // This handle's own events reach its subscribers with the reply, restart or not.
    let w = r.register().await.unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
            Ok(Ok(Event::WorkerCreated { worker, .. })) if worker == w => break,
            Ok(Ok(_)) => continue,
            other => panic!("own event not delivered: {other:?}"),
        }
    }
    // Another replica's events come through the listener, which resubscribes by itself: those
    // published while it was reconnecting are lost, and counted. Once it is back, every event of
    // the other replica was either received or counted missed.
    let other = connect(&server, "restart").await;
    let (mut published, mut received) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(10);
    'recovered: loop {
        assert!(
            Instant::now() < deadline,
            "no event from the listener within 10 s"
        );
        let w = other.register().await.unwrap();
        published += 1;
        while let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(200), events.recv()).await
        {
            received += 1;
            if e == (Event::WorkerCreated {
                worker: w,
                target: None,
            }) {
                break 'recovered;
            }
        }
        other.deregister(w).await.unwrap();
        published += 1;
    }
    assert_eq!(r.stats().events_missed, published - received);
    assert!(r.sweep().await.unwrap().swept);
}

#[tokio::test]
async fn a_script_that_errors_leaves_no_partial_state() {
    let Some(url) = harness::shared("faults") else {
        return;
    };
    let name = harness::unique_name("script-error");
    let r = RedisRegistry::builder(&url)
        .name(&name)
        .connect()
        .await
        .unwrap();
    let mut raw = harness::raw(&url).await;
    assert!(matches!(
        r.admit(&t(1), &d("a")).await,
        Ok(Admission::Assigned(_))
    ));
    let key = |k: &str| format!("{{{name}}}:{k}");

    // Corrupt the live-worker index: the next new placement fails while reading it.
    let _: () = raw.set(key("live"), "not a sorted set").await.unwrap();
    let before: Vec<String> = redis::cmd("KEYS")
        .arg(r.key_pattern())
        .query_async(&mut raw)
        .await
        .unwrap();
    let next_id: String = raw.get(key("next_worker_id")).await.unwrap();
    let err = r.admit(&t(2), &d("b")).await.unwrap_err();
    let RegistryError::Backend {
        backend,
        retryable,
        source,
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!((*backend, *retryable), ("redis", false));
    assert!(source.to_string().contains("WRONGTYPE"), "{source}");
    // Nothing was written: no claim, no worker, no id consumed, no mapping.
    let after: Vec<String> = redis::cmd("KEYS")
        .arg(r.key_pattern())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(sorted(before), sorted(after.clone()));
    assert!(!after.contains(&r.claim_key(&t(2), &d("b"))));
    assert_eq!(
        raw.get::<_, String>(key("next_worker_id")).await.unwrap(),
        next_id
    );
    assert!(raw
        .exists::<_, bool>(key(&format!("t:{}", t(1))))
        .await
        .unwrap());
    assert!(!raw
        .exists::<_, bool>(key(&format!("t:{}", t(2))))
        .await
        .unwrap());
    // A sweep on the corrupted registry fails too, and changes nothing either.
    let version: Option<u64> = raw.get(key("snapshot_version")).await.unwrap();
    assert!(!r.sweep().await.unwrap_err().is_retryable());
    assert_eq!(
        raw.get::<_, Option<u64>>(key("snapshot_version"))
            .await
            .unwrap(),
        version
    );

    // Repaired, the same delivery is admitted normally (no claim was left behind).
    let _: () = raw.del(key("live")).await.unwrap();
    assert!(matches!(
        r.admit(&t(2), &d("b")).await,
        Ok(Admission::Assigned(_))
    ));
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn with_aof_claims_and_workers_survive_a_restart_of_the_server_and_every_replica() {
    let Some(mut server) = Server::start(true, "faults") else {
        return;
    };
    let a = connect(&server, "aof").await;
    let b = a.connect_replica().await.unwrap();
    let Admission::Assigned(w) = a.admit(&t(1), &d("done")).await.unwrap() else {
        panic!()
    };
    a.complete_by(w.worker, &t(1), &d("done")).await.unwrap();
    b.admit(&t(1), &d("running")).await.unwrap();
    let reg = b.register().await.unwrap();
    drop((a, b));

    server.restart();
    let c = connect(&server, "aof").await;
    let Admission::Duplicate(done) = c.admit(&t(1), &d("done")).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        (done.holder, done.state),
        (Some(w.worker), ClaimState::Completed)
    );
    let Admission::Duplicate(running) = c.admit(&t(1), &d("running")).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        (running.holder, running.state),
        (Some(w.worker), ClaimState::InFlight)
    );
    // Sticky assignment and worker ids carry on where they were.
    let Admission::Assigned(again) = c.admit(&t(1), &d("third")).await.unwrap() else {
        panic!()
    };
    assert_eq!((again.worker, again.new), (w.worker, false));
    assert!(c.register().await.unwrap() > reg);
}

/// Sweeps until the server answers (bounded like `admit_until_answered`).
async fn sweep_until_answered(r: &RedisRegistry) -> worker_registry::SweepReport {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match r.sweep().await {
            Ok(s) => return s,
            Err(e) => {
                assert!(e.is_retryable(), "only retryable errors: {e}");
                assert!(Instant::now() < deadline, "no recovery within 20 s: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The data loss the next `DataLost` event on `events` reports (bounded wait), skipping others.
async fn next_loss(events: &mut worker_registry::Subscription) -> Vec<worker_registry::WorkerId> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_mid_traffic_repeats_no_id_or_token_and_is_reported() {
    let Some(mut server) = Server::start(false, "data-loss") else {
        return;
    };
    let r = connect(&server, "data-loss").await;
    let other = r.connect_replica().await.unwrap();
    let (mut events, mut other_events) = (r.subscribe(), other.subscribe());
    let mut before = Vec::new();
    for i in 0..6 {
        let replica = if i % 2 == 0 { &r } else { &other };
        let Admission::Assigned(a) = admit_until_answered(replica, &t(i + 1), &d("before")).await
        else {
            panic!("admitted")
        };
        before.push(a);
    }
    sweep_until_answered(&r).await;
    sweep_until_answered(&other).await;
    assert_eq!(r.status().capacity.used, 6);

    // The server restarts with nothing (no AOF, no RDB): the registry's data is gone. Traffic
    // goes on through the same handles.
    server.restart();
    let mut after = Vec::new();
    for i in 0..6 {
        let replica = if i % 2 == 0 { &other } else { &r };
        let Admission::Assigned(a) = admit_until_answered(replica, &t(i + 1), &d("after")).await
        else {
            panic!("admitted")
        };
        assert!(
            a.new,
            "the old workers are gone: a new one for {}",
            t(i + 1)
        );
        after.push(a);
    }
    let newest_before = before.iter().map(|a| a.token).max().unwrap();
    for a in &after {
        assert!(
            before.iter().all(|b| b.worker != a.worker),
            "worker id {} handed out again",
            a.worker
        );
        assert!(
            a.token > newest_before,
            "token {} not above {newest_before}",
            a.token
        );
    }

    // Each replica finds the loss in its next sweep: logged, counted, and the workers its
    // snapshot listed alive that the server no longer knows are reported.
    let mut old: Vec<_> = before.iter().map(|a| a.worker).collect();
    old.sort();
    sweep_until_answered(&r).await;
    assert_eq!(next_loss(&mut events).await, old);
    assert_eq!(r.stats().data_losses, 1);
    sweep_until_answered(&other).await;
    assert_eq!(next_loss(&mut other_events).await, old);
    assert_eq!(other.stats().data_losses, 1);
    // Reported once; the snapshot starts over and lists the new workers only.
    sweep_until_answered(&r).await;
    sweep_until_answered(&r).await;
    assert_eq!(r.stats().data_losses, 1);
    let listed: Vec<_> = r.status().workers.iter().map(|w| w.id).collect();
    assert_eq!(listed.len(), 6, "{listed:?}");
    assert!(listed.iter().all(|w| after.iter().any(|a| a.worker == *w)));
    // A zombie container of a lost worker is refused: its id names nothing, and never will.
    assert!(matches!(
        r.heartbeat(before[0].worker).await,
        Err(RegistryError::UnknownWorker { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_on_create_answers_once_a_replica_has_the_new_worker() {
    let Some(primary) = Server::start(false, "wait-primary") else {
        return;
    };
    let Some(replica) = Server::start(false, "wait-replica") else {
        return;
    };
    let port = primary
        .url()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let mut raw_replica = harness::raw(&replica.url()).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(&port)
        .query_async(&mut raw_replica)
        .await
        .unwrap();
    // Until the replica is in sync (bounded).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut raw_replica)
            .await
            .unwrap();
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never synced: {info}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = RedisRegistry::builder(primary.url())
        .name("wait")
        .wait_on_create(1, Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    // The replica may still be syncing: the first creation waits for it (bounded by the WAIT).
    let Ok(Admission::Assigned(a)) = r.admit(&t(1), &d("a")).await else {
        panic!("admitted")
    };
    assert!(a.new);
    // Acknowledged by the replica before the answer: the worker is there.
    let key = format!("{{wait}}:w:{}", a.worker);
    assert!(raw_replica.exists::<_, bool>(&key).await.unwrap(), "{key}");

    // Two replicas wanted, one there: the answer stands after the timeout.
    let short = RedisRegistry::builder(primary.url())
        .name("wait")
        .wait_on_create(2, Duration::from_millis(20))
        .connect()
        .await
        .unwrap();
    let Ok(Admission::Assigned(b)) = short.admit(&t(2), &d("b")).await else {
        panic!("admitted")
    };
    assert!(b.new);
    let id: worker_registry::WorkerId = short.register().await.unwrap();
    assert!(id > b.worker);
}

/// Payloads survive a restart of a server with AOF (`testkit::payload_checks`): one in flight
/// and one parked are found after it, byte for byte, and handed over with their deliveries.
#[tokio::test]
async fn with_aof_payloads_survive_a_restart_of_the_server() {
    let Some(mut server) = Server::start(true, "faults") else {
        return;
    };
    let r = RedisRegistry::builder(server.url())
        .name("aof-payloads")
        .config(
            worker_registry::testkit::payload_checks::restart_config()
                .build()
                .expect("config"),
        )
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .reconnect_retries(1)
        .connect()
        .await
        .expect("connect");
    worker_registry::testkit::payload_checks::payloads_survive_a_restart(&r, || async {
        server.restart();
    })
    .await;
}
