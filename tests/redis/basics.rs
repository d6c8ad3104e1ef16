//! Each script's answers, one behaviour at a time.

use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use worker_registry::{
    Admission, AssignOutcome, ClaimOutcome, ClaimState, DeadReason, DeliveryId, HeartbeatAck,
    Maintenance, RegistryConfig, RegistryError, Rejection, Status, Target, WorkerRegistry,
};

use crate::harness;

fn t(n: u64) -> Target {
    Target::new("octo/repo", n).unwrap()
}

fn d(s: &str) -> DeliveryId {
    DeliveryId::new(s).unwrap()
}

fn config() -> RegistryConfig {
    RegistryConfig::builder()
        .max_workers(2)
        .startup_grace(Duration::ZERO)
        .build()
        .unwrap()
}

#[tokio::test]
async fn admit_dedupes_sticks_and_refuses_beyond_capacity_without_a_claim() {
    let Some(url) = harness::shared("basics") else {
        return;
    };
    let r = harness::registry(&url, "admit", config()).await;
    let Admission::Assigned(a) = r.admit(&t(1), &d("a")).await.unwrap() else {
        panic!()
    };
    assert!(a.new);
    assert_eq!(a.token.seq(), 1);
    let Admission::Duplicate(dup) = r.admit(&t(1), &d("a")).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        (dup.holder, dup.state),
        (Some(a.worker), ClaimState::InFlight)
    );
    let Admission::Assigned(b) = r.admit(&t(1), &d("b")).await.unwrap() else {
        panic!()
    };
    assert_eq!((b.worker, b.new), (a.worker, false));
    assert!(b.token > a.token);
    assert!(matches!(
        r.admit(&t(2), &d("c")).await.unwrap(),
        Admission::Assigned(_)
    ));
    assert_eq!(
        r.admit(&t(3), &d("x")).await.unwrap(),
        Admission::Rejected(Rejection::CapacityFull { limit: 2 })
    );
    // No claim was left behind: once there is room, the same delivery is admitted.
    r.drain(a.worker).await.unwrap();
    assert_eq!(
        r.admit(&t(1), &d("z")).await.unwrap(),
        Admission::Rejected(Rejection::TargetDraining { worker: a.worker })
    );
    assert_eq!(
        r.loop_finished(a.worker).await.unwrap(),
        Status::Dead(DeadReason::Exited)
    );
    assert!(matches!(r.admit(&t(3), &d("x")).await.unwrap(), Admission::Assigned(x) if x.new));
    let s = r.stats();
    assert_eq!((s.admitted_new, s.admitted_sticky, s.duplicates), (3, 1, 1));
    assert_eq!(
        (s.rejected_capacity, s.rejected_draining, s.deaths_exited),
        (1, 1, 1)
    );
    assert_eq!(s.live_workers, 2);
}

#[tokio::test]
async fn completion_is_fenced_and_released_claims_refuse_completion() {
    let Some(url) = harness::shared("basics") else {
        return;
    };
    let r = harness::registry(&url, "complete", config()).await;
    let Admission::Assigned(a) = r.admit(&t(1), &d("a")).await.unwrap() else {
        panic!()
    };
    let stranger = worker_registry::WorkerId::new(a.worker.get() + 100);
    assert_eq!(
        r.complete_by(stranger, &t(1), &d("a")).await,
        Err(RegistryError::NotHolder {
            target: t(1),
            delivery: d("a"),
            holder: Some(a.worker),
            worker: stranger,
        })
    );
    r.complete_by(a.worker, &t(1), &d("a")).await.unwrap();
    r.complete_by(a.worker, &t(1), &d("a")).await.unwrap(); // idempotent
    let Admission::Duplicate(dup) = r.admit(&t(1), &d("a")).await.unwrap() else {
        panic!()
    };
    assert_eq!(dup.state, ClaimState::Completed);
    assert_eq!(
        r.release(&t(1), &d("a")).await,
        Err(RegistryError::ClaimCompleted {
            target: t(1),
            delivery: d("a")
        })
    );

    // The holder deregisters: its other claim is released at once.
    r.admit(&t(1), &d("b")).await.unwrap();
    assert_eq!(r.deregister(a.worker).await, Ok(DeadReason::Deregistered));
    assert_eq!(
        r.complete(&t(1), &d("b")).await,
        Err(RegistryError::ClaimReleased {
            target: t(1),
            delivery: d("b"),
            holder: Some(a.worker),
            reason: worker_registry::ReleaseReason::WorkerDied(DeadReason::Deregistered),
        })
    );
    assert_eq!(
        r.heartbeat(a.worker).await,
        Err(RegistryError::WorkerDead {
            id: a.worker,
            reason: DeadReason::Deregistered
        })
    );
    // The sweep hands the released delivery out once; acknowledged, it is not offered again.
    let report = r.sweep().await.unwrap();
    assert!(report.swept);
    assert_eq!(report.released.len(), 1);
    assert_eq!(report.released[0].delivery, d("b"));
    assert!(report.released[0].receipt().is_some());
    r.acknowledge(&report.released).await.unwrap();
    assert!(r.sweep().await.unwrap().released.is_empty());
    // And a redelivery of it is admitted again, on a new worker.
    let Admission::Assigned(again) = r.admit(&t(1), &d("b")).await.unwrap() else {
        panic!()
    };
    assert!(again.new && again.worker > a.worker);
}

#[tokio::test]
async fn bare_claims_release_and_unknown_claims() {
    let Some(url) = harness::shared("basics") else {
        return;
    };
    let r = harness::registry(&url, "claims", config()).await;
    assert_eq!(r.claim(&t(1), &d("a")).await, Ok(ClaimOutcome::Claimed));
    let Ok(ClaimOutcome::AlreadyClaimed(dup)) = r.claim(&t(1), &d("a")).await else {
        panic!()
    };
    assert_eq!(dup.holder, None);
    r.release(&t(1), &d("a")).await.unwrap();
    assert_eq!(r.claim(&t(1), &d("a")).await, Ok(ClaimOutcome::Claimed));
    assert_eq!(
        r.release(&t(1), &d("nope")).await,
        Err(RegistryError::UnknownClaim {
            target: t(1),
            delivery: d("nope")
        })
    );
    assert_eq!(
        r.complete(&t(2), &d("nope")).await,
        Err(RegistryError::UnknownClaim {
            target: t(2),
            delivery: d("nope")
        })
    );
}

#[tokio::test]
async fn workers_register_beat_drain_and_read_back() {
    let Some(url) = harness::shared("basics") else {
        return;
    };
    let r = harness::registry(&url, "workers", config()).await;
    let w = r.register().await.unwrap();
    let w2 = r.register().await.unwrap();
    assert_eq!(
        r.register().await,
        Err(RegistryError::Rejected(Rejection::CapacityFull {
            limit: 2
        }))
    );
    assert_eq!(r.heartbeat(w).await, Ok(HeartbeatAck::Active));
    assert_eq!(r.loop_started(w).await, Ok(Status::Active));
    assert_eq!(
        r.drain_within(w, Duration::from_secs(60)).await,
        Ok(Status::Draining)
    );
    assert_eq!(r.heartbeat(w).await, Ok(HeartbeatAck::Draining));
    let info = r.worker(w).await.unwrap().unwrap();
    assert_eq!(info.status, Status::Draining);
    assert!(info.has_heartbeated && info.drain_deadline.is_some());
    assert_eq!(
        r.worker(worker_registry::WorkerId::new(999_999)).await,
        Ok(None)
    );
    // Idle w2 exits at once; busy w keeps draining.
    let all = r.drain_all_within(Duration::from_secs(5)).await.unwrap();
    assert_eq!((all.draining, all.exited), (1, 1));
    assert_eq!(r.deregister(w).await, Ok(DeadReason::Exited));
    assert_eq!(
        r.loop_started(w2).await,
        Err(RegistryError::WorkerDead {
            id: w2,
            reason: DeadReason::Exited
        })
    );
    assert!(matches!(r.assign(&t(9)).await, Ok(AssignOutcome::Assigned(a)) if a.new));
}

#[tokio::test]
async fn a_replica_configured_otherwise_is_refused_naming_the_setting_and_both_values() {
    let Some(url) = harness::shared("basics") else {
        return;
    };
    let config = |ms| {
        RegistryConfig::builder()
            .max_in_flight(std::time::Duration::from_millis(ms))
            .build()
            .unwrap()
    };
    let first = harness::registry(&url, "agreement", config(60_000)).await;
    let err = worker_registry::redis::RedisRegistry::builder(&url)
        .name(first.name())
        .config(config(90_000))
        .connect()
        .await
        .unwrap_err();
    let worker_registry::ConnectError::Backend(e) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(
        e,
        &worker_registry::RegistryError::ConfigDisagrees {
            setting: "max_in_flight_ms",
            stored: "60000".into(),
            configured: "90000".into(),
        }
    );
    assert!(!err.is_retryable());
    // Another handle with the same configuration is welcome (connect_replica uses it).
    first.connect_replica().await.unwrap();
}

#[tokio::test]
async fn drain_all_walks_more_workers_than_one_scan_step_and_counts_each_once() {
    let Some(url) = harness::shared("basics") else {
        return;
    };
    let cfg = RegistryConfig::builder()
        .max_workers(400)
        .startup_grace(Duration::ZERO)
        .build()
        .unwrap();
    let r = harness::registry(&url, "drain-all-walk", cfg).await;
    // 300 live workers (the walk takes about 128 a step), every third one busy.
    let mut busy = Vec::new();
    for i in 0..300 {
        let w = r.register().await.unwrap();
        if i % 3 == 0 {
            assert_eq!(r.loop_started(w).await, Ok(Status::Active));
            busy.push(w);
        }
    }
    let all = r.drain_all_within(Duration::from_secs(60)).await.unwrap();
    assert_eq!((all.draining, all.exited), (100, 200));
    // The idle ones are gone; the busy ones keep draining and are counted again, once each.
    let again = r.drain_all_within(Duration::from_secs(60)).await.unwrap();
    assert_eq!((again.draining, again.exited), (100, 0));
    for w in busy {
        assert_eq!(r.heartbeat(w).await, Ok(HeartbeatAck::Draining));
    }
}

#[tokio::test]
async fn a_handle_without_the_test_offset_decides_the_same_and_never_reads_it() {
    let Some(url) = harness::shared("basics") else {
        return;
    };
    let mut raw = harness::raw(&url).await;
    let name = harness::unique_name("no-offset");
    let prod = worker_registry::redis::RedisRegistry::builder(&url)
        .name(name.clone())
        .config(config())
        .without_test_offset()
        .connect()
        .await
        .unwrap();
    let replica = prod.connect_replica().await.unwrap();
    // A default handle of the same (testkit) build, on the same registry.
    let tested = worker_registry::redis::RedisRegistry::builder(&url)
        .name(name.clone())
        .config(config())
        .connect()
        .await
        .unwrap();
    let Admission::Assigned(a) = prod.admit(&t(1), &d("a")).await.unwrap() else {
        panic!("admit")
    };
    assert!(a.new);

    // The offset key made a hash: a call that reads it (a `GET`) fails with WRONGTYPE.
    let offset = format!("{{{name}}}:test_offset_ms");
    let _: () = redis::cmd("HSET")
        .arg(&offset)
        .arg("not")
        .arg("a number")
        .query_async(&mut raw)
        .await
        .unwrap();
    for i in 0..10 {
        assert_eq!(
            prod.heartbeat(a.worker).await.unwrap(),
            HeartbeatAck::Active
        );
        let b = prod.admit(&t(1), &d(&format!("b{i}"))).await.unwrap();
        assert!(matches!(b, Admission::Assigned(ref x) if x.worker == a.worker && !x.new));
        assert!(matches!(
            prod.admit(&t(1), &d("a")).await.unwrap(),
            Admission::Duplicate(_)
        ));
        prod.complete(&t(1), &d(&format!("b{i}"))).await.unwrap();
    }
    // The replica handle is built the same way.
    assert_eq!(
        replica.heartbeat(a.worker).await.unwrap(),
        HeartbeatAck::Active
    );
    // The default handle reads it.
    assert!(
        tested.heartbeat(a.worker).await.is_err(),
        "a testkit handle reads the offset"
    );
    let _: () = redis::cmd("DEL")
        .arg(&offset)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        tested.heartbeat(a.worker).await.unwrap(),
        HeartbeatAck::Active
    );
}

/// The calls of `command` the server ran since the last `CONFIG RESETSTAT` (`INFO commandstats`,
/// which counts a function's own commands too).
async fn calls_of(raw: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn a_duplicate_of_a_claim_made_on_a_started_worker_reads_only_the_claim() {
    // Its own server, so that no other test's calls move the command counts.
    let Some(server) = harness::Server::start(false, "dup-reads") else {
        return;
    };
    let url = server.url();
    let mut raw = harness::raw(&url).await;
    let r = worker_registry::redis::RedisRegistry::builder(&url)
        .name(harness::unique_name("dup-reads"))
        .config(config())
        .connect()
        .await
        .unwrap();
    let Admission::Assigned(first) = r.admit(&t(1), &d("before")).await.unwrap() else {
        panic!("admit")
    };
    // Made before the worker's first beat: its duplicate must read the worker, and is unstarted.
    let reset = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    };
    reset(&mut raw).await;
    let Admission::Duplicate(dup) = r.admit(&t(1), &d("before")).await.unwrap() else {
        panic!("duplicate")
    };
    assert!(
        dup.unstarted,
        "a claim on a worker that never beat is unstarted"
    );
    assert_eq!(
        calls_of(&mut raw, "hmget").await,
        2,
        "the claim, then the worker"
    );

    assert_eq!(r.heartbeat(first.worker).await, Ok(HeartbeatAck::Active));
    let Admission::Assigned(after) = r.admit(&t(1), &d("after")).await.unwrap() else {
        panic!("sticky admit")
    };
    assert_eq!(after.worker, first.worker);
    reset(&mut raw).await;
    let Admission::Duplicate(dup) = r.admit(&t(1), &d("after")).await.unwrap() else {
        panic!("duplicate")
    };
    assert!(!dup.unstarted);
    assert_eq!(dup.holder, Some(first.worker));
    assert_eq!(calls_of(&mut raw, "hmget").await, 1, "the claim alone");
    // The claim made before the beat still reads the worker, which has started now.
    let Admission::Duplicate(dup) = r.admit(&t(1), &d("before")).await.unwrap() else {
        panic!("duplicate")
    };
    assert!(!dup.unstarted, "its worker has beaten since");
    assert_eq!(calls_of(&mut raw, "hmget").await, 3);
}

#[tokio::test]
async fn a_started_workers_beat_is_one_write_and_every_reader_still_sees_it() {
    // Its own server, so that no other test's calls move the command counts.
    let Some(server) = harness::Server::start(false, "beat-index") else {
        return;
    };
    let url = server.url();
    let mut raw = harness::raw(&url).await;
    let r = worker_registry::redis::RedisRegistry::builder(&url)
        .name(harness::unique_name("beat-index"))
        .config(config())
        .connect()
        .await
        .unwrap();
    let reset = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    };
    let Admission::Assigned(a) = r.admit(&t(1), &d("a")).await.unwrap() else {
        panic!("admit")
    };
    let Admission::Assigned(b) = r.admit(&t(2), &d("b")).await.unwrap() else {
        panic!("admit")
    };
    // The first beat reads the worker (it starts it) and indexes it.
    reset(&mut raw).await;
    assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));
    assert_eq!(calls_of(&mut raw, "hmget").await, 1, "the first beat reads");
    assert_eq!(r.heartbeat(b.worker).await, Ok(HeartbeatAck::Active));
    let first = r.worker(a.worker).await.unwrap().unwrap().last_heartbeat;

    // Later beats are one ZADD to the index: no read, no hash write, no dirty mark.
    r.advance_time_for_tests(Duration::from_secs(2))
        .await
        .unwrap();
    reset(&mut raw).await;
    assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));
    assert_eq!(r.heartbeat(b.worker).await, Ok(HeartbeatAck::Active));
    assert_eq!(
        (
            calls_of(&mut raw, "hmget").await,
            calls_of(&mut raw, "hset").await,
            calls_of(&mut raw, "zadd").await,
        ),
        (0, 0, 2),
        "one ZADD a beat"
    );
    let later = r.worker(a.worker).await.unwrap().unwrap().last_heartbeat;
    assert!(
        later >= first + Duration::from_secs(2),
        "a worker read folds the indexed beat in: {later:?} vs {first:?}"
    );

    // The published snapshot has it (the publisher reads the index past its cursor).
    r.sweep().await.unwrap();
    let snap = r.status();
    assert_eq!(snap.worker(a.worker).unwrap().last_heartbeat, later);

    // A drain takes the worker out of the index and keeps its beat; its next beat is answered
    // as a draining worker's (not by the fast path).
    assert_eq!(r.drain(a.worker).await, Ok(Status::Draining));
    assert_eq!(
        r.worker(a.worker).await.unwrap().unwrap().last_heartbeat,
        later
    );
    assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Draining));

    // A death does too: the dead worker's last beat is the indexed one, and its beat is refused.
    let b_beat = r.worker(b.worker).await.unwrap().unwrap().last_heartbeat;
    assert!(b_beat >= first + Duration::from_secs(2));
    r.deregister(b.worker).await.unwrap();
    let dead = r.worker(b.worker).await.unwrap().unwrap();
    assert_eq!(dead.status, Status::Dead(DeadReason::Deregistered));
    assert_eq!(dead.last_heartbeat, b_beat);
    assert_eq!(
        r.heartbeat(b.worker).await,
        Err(RegistryError::WorkerDead {
            id: b.worker,
            reason: DeadReason::Deregistered
        })
    );
}
