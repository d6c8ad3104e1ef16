//! Several handles on one registry, each on its own connections (as router replicas would be):
//! the maintenance lease, the released-event stream, the snapshot, events, and races.

use std::collections::BTreeSet;
use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use worker_registry::redis::RedisRegistry;
use worker_registry::{
    Admission, DeliveryId, Event, Maintenance, RegistryConfig, Rejection, Subscribe, Target,
    WorkerRegistry,
};

use crate::harness;

fn config() -> RegistryConfig {
    let s = Duration::from_secs;
    RegistryConfig::builder()
        .heartbeat_interval(s(1))
        .missed_heartbeats(2)
        .sweep_interval(s(1))
        .startup_grace(Duration::ZERO)
        .release_ack_timeout(s(5))
        .brake_min_workers(100)
        .build()
        .unwrap()
}

fn t(n: u64) -> Target {
    Target::new("octo/repo", n).unwrap()
}

fn d(s: &str) -> DeliveryId {
    DeliveryId::new(s).unwrap()
}

async fn pair(test: &str) -> Option<(RedisRegistry, RedisRegistry)> {
    let url = harness::shared("replicas")?;
    let a = harness::registry(&url, test, config()).await;
    let b = a.connect_replica().await.unwrap();
    assert_ne!(a.replica_id(), b.replica_id());
    Some((a, b))
}

/// Past the heartbeat timeout (2 s), on the registry's time.
async fn past_timeout(r: &RedisRegistry) {
    r.advance_time_for_tests(Duration::from_millis(2_001))
        .await
        .unwrap();
}

#[tokio::test]
async fn one_replica_sweeps_at_a_time_and_another_takes_over_when_its_lease_lapses() {
    let Some((a, b)) = pair("lease").await else {
        return;
    };
    assert!(a.sweep().await.unwrap().swept);
    assert_eq!(
        a.lease_holder().await.unwrap().as_deref(),
        Some(a.replica_id())
    );
    let skipped = b.sweep().await.unwrap();
    assert!(!skipped.swept);
    // b still refreshed its snapshot from a's sweep.
    assert_eq!(skipped.version, 1);
    assert_eq!(b.status().version, 1);
    assert!(
        a.sweep().await.unwrap().swept,
        "the holder renews its lease"
    );

    // a goes silent for the lease's lifetime (3 x sweep interval): b takes over.
    a.advance_time_for_tests(Duration::from_millis(3_001))
        .await
        .unwrap();
    assert!(b.sweep().await.unwrap().swept);
    assert_eq!(
        b.lease_holder().await.unwrap().as_deref(),
        Some(b.replica_id())
    );
    assert!(!a.sweep().await.unwrap().swept);
    assert_eq!(b.stats().sweeps, 1);
    assert_eq!(a.stats().sweeps, 2);
}

#[tokio::test]
async fn a_released_event_whose_replica_dies_before_acknowledging_goes_to_another() {
    let Some((a, b)) = pair("handoff").await else {
        return;
    };
    let Admission::Assigned(w) = a.admit(&t(1), &d("x")).await.unwrap() else {
        panic!()
    };
    past_timeout(&a).await;
    let report = a.sweep().await.unwrap();
    assert_eq!(report.died.len(), 1);
    assert_eq!(report.released.len(), 1);
    assert_eq!(report.released[0].holder, Some(w.worker));
    // a dies before acknowledging (re-dispatch never happened).
    drop(a);

    // Within release_ack_timeout nobody else gets it ...
    assert!(b.sweep().await.unwrap().released.is_empty());
    // ... after it, b does (once), and once acknowledged it is gone for good.
    b.advance_time_for_tests(Duration::from_millis(5_001))
        .await
        .unwrap();
    let again = b.sweep().await.unwrap();
    assert_eq!(again.released.len(), 1);
    assert_eq!(
        (
            again.released[0].target.clone(),
            again.released[0].delivery.clone()
        ),
        (t(1), d("x"))
    );
    b.acknowledge(&again.released).await.unwrap();
    let c = b.connect_replica().await.unwrap();
    b.advance_time_for_tests(Duration::from_millis(5_001))
        .await
        .unwrap();
    assert!(b.sweep().await.unwrap().released.is_empty());
    assert!(c.sweep().await.unwrap().released.is_empty());
    // Acknowledging twice is not an error.
    b.acknowledge(&again.released).await.unwrap();
}

#[tokio::test]
async fn every_released_event_reaches_exactly_one_of_the_replicas_sweeping_at_once() {
    let Some((a, b)) = pair("exactly-once").await else {
        return;
    };
    let c = a.connect_replica().await.unwrap();
    // 30 bare claims, released together once the heartbeat timeout passes.
    let mut want = BTreeSet::new();
    for i in 0..30 {
        let delivery = d(&format!("d-{i}"));
        a.claim(&t(1 + i % 3), &delivery).await.unwrap();
        want.insert(delivery);
    }
    past_timeout(&a).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        let (ra, rb, rc) = tokio::join!(a.sweep(), b.sweep(), c.sweep());
        for r in [ra, rb, rc] {
            let r = r.unwrap();
            got.extend(r.released.iter().map(|e| e.delivery.clone()));
            // Not acknowledged: still, nothing is offered twice within release_ack_timeout.
        }
    }
    let unique: BTreeSet<_> = got.iter().cloned().collect();
    assert_eq!(
        got.len(),
        unique.len(),
        "an event was handed to two replicas: {got:?}"
    );
    assert_eq!(unique, want);
}

#[tokio::test]
async fn events_caused_by_one_replica_reach_every_replicas_subscribers() {
    let Some((a, b)) = pair("events").await else {
        return;
    };
    let mut on_a = a.subscribe();
    let mut on_b = b.subscribe();
    let Admission::Assigned(w) = a.admit(&t(7), &d("e")).await.unwrap() else {
        panic!()
    };
    let created = Event::WorkerCreated {
        worker: w.worker,
        target: Some(t(7)),
    };
    past_timeout(&b).await;
    b.sweep().await.unwrap();
    let died = Event::WorkerDied {
        worker: w.worker,
        target: Some(t(7)),
        reason: worker_registry::DeadReason::MissedHeartbeats,
    };
    let released = Event::TargetReleased {
        target: t(7),
        deliveries: vec![d("e")],
    };
    for sub in [&mut on_a, &mut on_b] {
        for want in [&created, &died, &released] {
            let got = tokio::time::timeout(Duration::from_secs(5), sub.recv())
                .await
                .expect("event within 5 s")
                .unwrap();
            assert_eq!(&got, want);
        }
    }
    assert_eq!(a.stats().events_missed, 0);
}

#[tokio::test]
async fn a_sweeper_on_each_replica_redispatches_every_released_delivery_once() {
    let Some(url) = harness::shared("replicas") else {
        return;
    };
    let cfg = RegistryConfig::builder()
        .heartbeat_interval(Duration::from_millis(500))
        .missed_heartbeats(2)
        .sweep_interval(Duration::from_millis(50))
        .startup_grace(Duration::ZERO)
        // Short, so that the jump below passes it: an unacknowledged release would be offered
        // again by the first sweep after the jump.
        .release_ack_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let a = harness::registry(&url, "sweeper", cfg).await;
    let b = a.connect_replica().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Every report, once its callback is done: (the registry time it ran at, whether it swept).
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let sweepers: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|r| {
            let (router, tx, done_tx) = (r.clone(), tx.clone(), done_tx.clone());
            worker_registry::Sweeper::spawn_async(r, move |report| {
                let (router, tx, done_tx) = (router.clone(), tx.clone(), done_tx.clone());
                async move {
                    for e in &report.released {
                        // Re-dispatch: admitted again, as new (and done at once, so that
                        // nothing stays in flight on a worker that never beats).
                        let again = router.admit(&e.target, &e.delivery).await;
                        router.complete(&e.target, &e.delivery).await.unwrap();
                        let _ = tx.send((e.delivery.clone(), again));
                    }
                    let _ = done_tx.send((report.at, report.swept));
                }
            })
        })
        .collect();
    for i in 0..5 {
        a.claim(&t(1), &d(&format!("bare-{i}"))).await.unwrap();
    }
    a.advance_time_for_tests(Duration::from_millis(1_001))
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    while seen.len() < 5 {
        let (delivery, again) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("every released delivery re-dispatched within 10 s")
            .unwrap();
        assert!(matches!(again, Ok(Admission::Assigned(_))), "{again:?}");
        assert!(
            seen.insert(delivery.clone()),
            "{delivery} re-dispatched twice"
        );
    }
    // Acknowledged by the sweepers: not offered again, even past release_ack_timeout. A minute of
    // registry time, which no real time in this test reaches: a report at or past `before + JUMP`
    // is of a sweep that ran after the jump. Once such a sweep did the maintenance and its
    // callback is done, whatever it offered again would be in `rx` already.
    const JUMP: Duration = Duration::from_secs(60);
    assert!(JUMP > a.config().release_ack_timeout());
    let mut before = Duration::ZERO;
    while let Ok((at, _)) = done_rx.try_recv() {
        before = before.max(at);
    }
    a.advance_time_for_tests(JUMP).await.unwrap();
    loop {
        let (at, swept) = tokio::time::timeout(Duration::from_secs(10), done_rx.recv())
            .await
            .expect("a sweep reported within 10 s")
            .unwrap();
        if swept && at >= before + JUMP {
            break;
        }
    }
    let late = rx.try_recv();
    assert!(late.is_err(), "offered again: {late:?}");
    for s in sweepers {
        assert_eq!(s.errors(), 0);
        s.shutdown().await;
    }
}

#[tokio::test]
async fn a_subscription_sees_what_happens_after_it_and_nothing_from_before() {
    let Some((a, _b)) = pair("subscribe-after").await else {
        return;
    };
    let before = a.register().await.unwrap();
    let mut sub = a.subscribe();
    let after = a.register().await.unwrap();
    a.deregister(before).await.unwrap();
    assert_eq!(
        sub.try_recv(),
        Ok(Some(Event::WorkerCreated {
            worker: after,
            target: None
        })),
        "the handle's own events are delivered with the reply, in order"
    );
    assert!(
        matches!(sub.try_recv(), Ok(Some(Event::WorkerDied { worker, .. })) if worker == before)
    );
    assert_eq!(sub.try_recv(), Ok(None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_racing_on_one_delivery_and_on_the_last_slot_get_the_in_memory_answers() {
    let Some(url) = harness::shared("replicas") else {
        return;
    };
    let cfg = RegistryConfig::builder().max_workers(1).build().unwrap();
    let a = harness::registry(&url, "race", cfg).await;
    let b = a.connect_replica().await.unwrap();
    for round in 0..20u64 {
        // One delivery, admitted by both replicas at once: one Assigned, one Duplicate.
        let (x, y) = tokio::join!(
            tokio::spawn({
                let a = a.clone();
                async move { a.admit(&t(round + 1), &d("same")).await }
            }),
            tokio::spawn({
                let b = b.clone();
                async move { b.admit(&t(round + 1), &d("same")).await }
            })
        );
        let answers = [x.unwrap().unwrap(), y.unwrap().unwrap()];
        let assigned = answers
            .iter()
            .filter(|a| matches!(a, Admission::Assigned(_)))
            .count();
        let dup = answers
            .iter()
            .filter(|a| matches!(a, Admission::Duplicate(_)))
            .count();
        assert_eq!((assigned, dup), (1, 1), "round {round}: {answers:?}");
        // Free the only slot, then two new targets race for it: exactly one wins.
        let holder = answers
            .iter()
            .find_map(|a| match a {
                Admission::Assigned(a) => Some(a.worker),
                _ => None,
            })
            .unwrap();
        a.deregister(holder).await.unwrap();
        let (x, y) = tokio::join!(
            tokio::spawn({
                let a = a.clone();
                async move { a.assign(&t(1000 + 2 * round)).await }
            }),
            tokio::spawn({
                let b = b.clone();
                async move { b.assign(&t(1001 + 2 * round)).await }
            })
        );
        let answers = [x.unwrap().unwrap(), y.unwrap().unwrap()];
        let won: Vec<_> = answers
            .iter()
            .filter_map(|a| match a {
                worker_registry::AssignOutcome::Assigned(a) => Some(a.worker),
                _ => None,
            })
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {answers:?}");
        assert!(answers.contains(&worker_registry::AssignOutcome::Rejected(
            Rejection::CapacityFull { limit: 1 }
        )));
        a.deregister(won[0]).await.unwrap();
    }
    assert_eq!(a.stats().admitted_new + b.stats().admitted_new, 40);
}

/// The consumers of the released stream's group, by name.
async fn consumers(r: &RedisRegistry) -> BTreeSet<String> {
    let url = harness::shared("replicas").unwrap();
    let mut raw = harness::raw(&url).await;
    let stream = format!("{}released", r.key_pattern().trim_end_matches('*'));
    let info: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(&stream)
        .arg("dispatch")
        .query_async(&mut raw)
        .await
        .unwrap();
    info.into_iter()
        .filter_map(|c| match c.get("name") {
            Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_consumer_of_a_replica_that_is_gone_is_forgotten_once_it_holds_nothing() {
    let Some((a, b)) = pair("consumers").await else {
        return;
    };
    a.admit(&t(1), &d("x")).await.unwrap();
    past_timeout(&a).await;
    // a takes the released event and dies before acknowledging it.
    assert_eq!(a.sweep().await.unwrap().released.len(), 1);
    b.sweep().await.unwrap();
    let (gone, stays) = (a.replica_id().to_owned(), b.replica_id().to_owned());
    assert!(consumers(&b).await.contains(&gone));
    drop(a);

    // Silent longer than 10 sweep intervals plus the acknowledgement timeout (15 s): but it holds
    // an entry, so it stays until b has claimed that (b's sweep after the ack timeout) ...
    b.advance_time_for_tests(Duration::from_millis(15_001))
        .await
        .unwrap();
    let again = b.sweep().await.unwrap();
    assert_eq!(again.released.len(), 1, "b claims a's unacknowledged event");
    assert!(consumers(&b).await.contains(&gone));
    b.acknowledge(&again.released).await.unwrap();
    // ... and is forgotten by the next sweep; a live replica never is.
    b.sweep().await.unwrap();
    let left = consumers(&b).await;
    assert!(!left.contains(&gone), "{left:?}");
    assert!(left.contains(&stays), "{left:?}");
}

#[tokio::test]
async fn a_released_event_never_acknowledged_expires_after_claim_retention_counted_once() {
    let Some(url) = harness::shared("replicas") else {
        return;
    };
    let config = RegistryConfig::builder()
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(2)
        .sweep_interval(Duration::from_secs(1))
        .startup_grace(Duration::ZERO)
        .release_ack_timeout(Duration::from_secs(5))
        .claim_retention(Duration::from_secs(60))
        .brake_min_workers(100)
        .build()
        .unwrap();
    let a = harness::registry(&url, "release-expiry", config).await;
    let Admission::Assigned(_) = a.admit(&t(1), &d("never-acked")).await.unwrap() else {
        panic!()
    };
    past_timeout(&a).await;
    assert_eq!(a.sweep().await.unwrap().released.len(), 1);
    // Not acknowledged: offered again after release_ack_timeout, not yet expired.
    a.advance_time_for_tests(Duration::from_millis(5_001))
        .await
        .unwrap();
    assert_eq!(a.sweep().await.unwrap().released.len(), 1);
    assert_eq!(a.stats().released_expired, 0);
    // claim_retention after its release (seen by the lease holder's next sweep, up to one
    // sweep interval late): deleted, counted once, not offered again.
    a.advance_time_for_tests(Duration::from_secs(61))
        .await
        .unwrap();
    let r = a.sweep().await.unwrap();
    assert!(r.released.is_empty(), "expired, not offered: {r:?}");
    assert_eq!(a.stats().released_expired, 1);
    for _ in 0..2 {
        a.advance_time_for_tests(Duration::from_millis(5_001))
            .await
            .unwrap();
        assert!(a.sweep().await.unwrap().released.is_empty());
    }
    assert_eq!(a.stats().released_expired, 1, "counted once");
}
