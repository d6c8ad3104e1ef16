//! Faults: the server stopped and restarted under a live handle, a script that errors, and
//! persistence across a restart of the server and of every replica. Each test runs its own
//! `redis-server` (it stops and restarts it), so these need the binary even when
//! `WORKER_REGISTRY_REDIS_URL` names a server.

use std::time::{Duration, Instant};

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
    assert!(!raw
        .hexists::<_, _, bool>(key("targets"), t(2).to_string())
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
