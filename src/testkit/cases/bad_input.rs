//! Bad input through the seam: ids the registry never handed out (including ones no backend could
//! store), pairs it never saw, and valid but extreme targets and delivery ids, which a networked
//! backend must store and give back byte for byte.

use crate::WorkerRegistryExt;
use std::time::Duration;

use crate::limits::{MAX_DELIVERY_ID_LEN, MAX_OWNER_LEN, MAX_REPO_NAME_LEN};
use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{
    ClaimOutcome, ClaimState, DeadReason, DeliveryId, HeartbeatAck, RegistryError, Target,
    WorkerId, WorkerRegistry,
};

/// Every call that takes a worker id refuses an unknown one with `UnknownWorker` carrying that id,
/// whatever its value (up to `u64::MAX`, beyond any id a registry hands out), counts the refused
/// heartbeats, and changes nothing.
pub async fn unknown_worker_ids_are_refused_with_the_id<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let a = assigned(r.admit(&t(1), &d("e")).await);
    let pool = r.register().await.unwrap();
    let ids = [
        unknown_id(),
        WorkerId::new(WorkerId::MAX + 1),
        WorkerId::new(u64::MAX),
        WorkerId::new(i64::MAX as u64),
        WorkerId::new(1u64 << 63),
    ];
    for id in ids {
        assert!(
            id != a.worker && id != pool,
            "the suite assumes {id} is unknown"
        );
        let unknown = RegistryError::UnknownWorker { id };
        assert_eq!(r.heartbeat(id).await, Err(unknown.clone()));
        assert_eq!(r.loop_started(id).await, Err(unknown.clone()));
        assert_eq!(r.loop_finished(id).await, Err(unknown.clone()));
        assert_eq!(r.drain(id).await, Err(unknown.clone()));
        assert_eq!(
            r.drain_within(id, Duration::from_secs(1)).await,
            Err(unknown.clone())
        );
        assert_eq!(r.deregister(id).await, Err(unknown.clone()));
        assert_eq!(r.worker(id).await, Ok(None));
        assert!(unknown.to_string().contains(&id.to_string()));
        assert_eq!(unknown.observed_status(), None);
        assert!(!unknown.is_retryable());
        // A stranger never completes a claim, whatever its id.
        assert!(matches!(
            r.complete_by(id, &t(1), &d("e")).await,
            Err(RegistryError::NotHolder { holder: Some(h), worker, .. })
                if h == a.worker && worker == id
        ));
    }
    // Nothing the unknown ids did touched the real workers.
    assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));
    assert_eq!(r.heartbeat(pool).await, Ok(HeartbeatAck::Active));
    sweep(&r).await;
    assert_eq!(r.status().capacity.used, 2);
    let stats = r.stats();
    assert_eq!(stats.heartbeats_refused, ids.len() as u64);
    assert_eq!(stats.deaths_exited + stats.deaths_deregistered, 0);
}

/// Releasing or completing a pair that was never claimed is `UnknownClaim`, naming the pair
/// exactly, and leaves no claim.
pub async fn unknown_claims_are_refused_naming_the_pair<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let a = assigned(r.admit(&t(1), &d("known")).await);
    for (target, delivery) in [(t(1), d("never")), (t(2), d("known")), (t(99), d("x"))] {
        let unknown = RegistryError::UnknownClaim {
            target: target.clone(),
            delivery: delivery.clone(),
        };
        assert_eq!(r.release(&target, &delivery).await, Err(unknown.clone()));
        assert_eq!(r.complete(&target, &delivery).await, Err(unknown.clone()));
        assert!(matches!(
            r.complete_by(a.worker, &target, &delivery).await,
            Err(RegistryError::UnknownClaim { .. })
        ));
        let shown = unknown.to_string();
        assert!(shown.contains(delivery.as_str()) && shown.contains(&target.to_string()));
        assert_eq!(
            r.claim(&target, &delivery).await,
            Ok(ClaimOutcome::Claimed),
            "no claim was left"
        );
    }
}

/// The longest valid names and ids, every visible ASCII character a key encoding might trip on,
/// and case-insensitive repository names go through admission, duplicates, completion, release
/// and the snapshot unchanged.
pub async fn extreme_valid_input_round_trips_exactly<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let long_repo = format!(
        "{}/{}",
        "O".repeat(MAX_OWNER_LEN),
        "n._-".repeat(MAX_REPO_NAME_LEN / 4)
    );
    let long_target = Target::new(&long_repo, u64::MAX).unwrap();
    let every_graphic: String = (b'!'..=b'~').map(char::from).collect();
    let nasty = [
        DeliveryId::new(&"x".repeat(MAX_DELIVERY_ID_LEN)).unwrap(),
        DeliveryId::new(&every_graphic).unwrap(),
        d(r#"'";--{a}:b*?[]\%$1"#),
        d("ABC"),
        d("abc"),
    ];
    let mut workers = Vec::new();
    for delivery in &nasty {
        let a = assigned(r.admit(&long_target, delivery).await);
        workers.push(a.worker);
        let dup = duplicate(r.admit(&long_target, delivery).await);
        assert_eq!(
            dup.holder,
            Some(a.worker),
            "{delivery:?} is a duplicate of itself"
        );
    }
    assert!(
        workers.iter().all(|w| *w == workers[0]),
        "one target, one worker"
    );
    let w = info(&r, workers[0]).await;
    assert_eq!(w.target.as_ref(), Some(&long_target));
    assert_eq!(w.target.as_ref().map(Target::number), Some(u64::MAX));

    // Repository names are case-insensitive: the same target.
    let upper = Target::new(&long_repo.to_ascii_uppercase(), u64::MAX).unwrap();
    assert_eq!(
        duplicate(r.admit(&upper, &nasty[1]).await).holder,
        Some(workers[0])
    );

    // Delivery ids are not: "ABC" and "abc" are two claims, completed one at a time.
    r.complete(&long_target, &nasty[3]).await.unwrap();
    assert_eq!(
        duplicate(r.admit(&long_target, &nasty[3]).await).state,
        ClaimState::Completed
    );
    assert_eq!(
        duplicate(r.admit(&long_target, &nasty[4]).await).state,
        ClaimState::InFlight
    );
    r.release(&long_target, &nasty[4]).await.unwrap();
    assert!(matches!(
        r.claim(&long_target, &nasty[4]).await,
        Ok(ClaimOutcome::Claimed)
    ));

    // What a sweep hands back is exactly what went in.
    assert_eq!(r.deregister(workers[0]).await, Ok(DeadReason::Deregistered));
    let report = sweep(&r).await;
    let mut got = released(&report);
    got.sort();
    let mut want: Vec<(Target, DeliveryId)> = [0, 1, 2]
        .iter()
        .map(|i| (long_target.clone(), nasty[*i].clone()))
        .collect();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(
        r.status().worker(workers[0]).and_then(|w| w.target.clone()),
        Some(long_target)
    );
}

/// Pairs whose parts would run together in a naive key (`a/b#1` + `2x` and `a/b#12` + `x`) are
/// distinct claims on distinct targets.
pub async fn pairs_that_concatenate_alike_stay_distinct<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (t1, t12) = (
        Target::new("a/b", 1).unwrap(),
        Target::new("a/b", 12).unwrap(),
    );
    let (t_ab, t_a) = (
        Target::new("a/bc", 1).unwrap(),
        Target::new("ab/c", 1).unwrap(),
    );
    let first = assigned(r.admit(&t1, &d("2x")).await);
    let second = assigned(r.admit(&t12, &d("x")).await);
    assert!(second.new && second.worker != first.worker);
    let third = assigned(r.admit(&t_ab, &d("x")).await);
    let fourth = assigned(r.admit(&t_a, &d("x")).await);
    assert!(third.new && fourth.new && third.worker != fourth.worker);

    r.complete(&t1, &d("2x")).await.unwrap();
    assert_eq!(
        duplicate(r.admit(&t1, &d("2x")).await).state,
        ClaimState::Completed
    );
    assert_eq!(
        duplicate(r.admit(&t12, &d("x")).await).state,
        ClaimState::InFlight
    );
    assert!(matches!(
        r.complete(&t12, &d("2x")).await,
        Err(RegistryError::UnknownClaim { .. })
    ));
    assert!(matches!(
        r.complete(&t1, &d("x")).await,
        Err(RegistryError::UnknownClaim { .. })
    ));
}
