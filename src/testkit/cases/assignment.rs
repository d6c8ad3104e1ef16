//! Assignment, stickiness and capacity: `assign`, `admit` placing targets, fencing tokens.

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::WorkerRegistryExt;
use crate::{
    Activity, Admission, AssignOutcome, DeadReason, RegistryError, Rejection, Status, WorkerKind,
    WorkerRegistry,
};

/// Every delivery for a target goes to its worker while that one is active, each assignment with
/// a larger fencing token, which names the worker.
pub async fn ac3_a_target_sticks_to_its_worker_with_increasing_tokens<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let target = t(1);
    let first = assigned(r.admit(&target, &d("1")).await);
    assert!(first.new);
    assert_eq!(first.token.worker(), first.worker);
    let mut last = first.token;
    for i in 2..10 {
        let a = assigned(r.admit(&target, &d(&i.to_string())).await);
        assert_eq!((a.worker, a.new), (first.worker, false), "delivery {i}");
        assert!(a.token > last, "the fencing token increases");
        assert_eq!(a.token.worker(), a.worker);
        last = a.token;
    }
    let Ok(AssignOutcome::Assigned(a)) = r.assign(&target).await else {
        panic!("assign places the target too")
    };
    assert_eq!((a.worker, a.new), (first.worker, false));
    assert!(a.token > last);
    assert_eq!(
        info(&r, first.worker).await.token,
        a.token,
        "the latest token"
    );

    sweep(&r).await;
    assert_eq!(r.status().capacity.used, 1);
    let s = r.stats();
    assert_eq!((s.admitted_new, s.admitted_sticky), (1, 9));
}

/// With `max_workers` alive, a new target is refused (`CapacityFull` with the limit), as is a
/// registration, while the existing targets are still placed.
pub async fn ac3_capacity_refuses_new_targets_but_not_existing_ones<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_workers(3)).await;
    for n in 1..=3 {
        assert!(assigned(r.admit(&t(n), &d(&format!("e{n}"))).await).new);
    }
    let full = Rejection::CapacityFull { limit: 3 };
    assert_eq!(r.assign(&t(4)).await, Ok(AssignOutcome::Rejected(full)));
    assert_eq!(
        r.admit(&t(4), &d("e4")).await,
        Ok(Admission::Rejected(full))
    );
    assert!(matches!(
        r.assign(&t(2)).await,
        Ok(AssignOutcome::Assigned(a)) if !a.new
    ));
    assert_eq!(r.register().await, Err(RegistryError::Rejected(full)));
    sweep(&r).await;
    assert_eq!(r.status().capacity.used, 3);
    assert_eq!(r.status().capacity.limit, 3);
    assert_eq!(r.stats().rejected_capacity, 2, "the two refused placements");
}

/// A target whose worker drains gets no second worker (`TargetDraining`, naming it) until the first
/// is dead; then a new worker with larger tokens.
pub async fn ac3_a_draining_target_gets_no_second_worker_until_the_first_is_dead<F: Fixture>(
    fixture: &F,
) {
    let r = registry(fixture, config()).await;
    let target = t(1);
    let a = assigned(r.admit(&target, &d("1")).await);
    assert_eq!(r.drain(a.worker).await, Ok(Status::Draining));
    let draining = Rejection::TargetDraining { worker: a.worker };
    assert_eq!(
        r.admit(&target, &d("2")).await,
        Ok(Admission::Rejected(draining))
    );
    assert_eq!(
        r.assign(&target).await,
        Ok(AssignOutcome::Rejected(draining))
    );
    assert!(
        matches!(
            r.complete(&target, &d("2")).await,
            Err(RegistryError::UnknownClaim { .. })
        ),
        "the refused delivery left no claim"
    );
    assert_eq!(
        r.loop_finished(a.worker).await,
        Ok(Status::Dead(DeadReason::Exited))
    );
    let b = assigned(r.admit(&target, &d("2")).await);
    assert!(b.new);
    assert_ne!(b.worker, a.worker);
    assert!(b.token > a.token, "the new owner's tokens are larger");
    assert_eq!(r.stats().rejected_draining, 2);
}

/// `assign` places a target without claiming a delivery: the worker is spawned for the target and
/// busy; after its loop it is idle, and the next assignment makes it busy again.
pub async fn assign_places_a_target_without_claiming<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let target = t(5);
    let Ok(AssignOutcome::Assigned(a)) = r.assign(&target).await else {
        panic!("a new target is placed")
    };
    assert!(a.new);
    let w = info(&r, a.worker).await;
    assert_eq!(w.target, Some(target.clone()));
    assert_eq!((w.kind, w.status), (WorkerKind::Spawned, Status::Active));
    assert_eq!(w.activity, Activity::Busy, "an assignment makes it busy");
    assert!(
        matches!(
            r.complete(&target, &d("any")).await,
            Err(RegistryError::UnknownClaim { .. })
        ),
        "no claim was made"
    );

    assert_eq!(r.loop_finished(a.worker).await, Ok(Status::Active));
    assert_eq!(info(&r, a.worker).await.activity, Activity::Idle);
    let Ok(AssignOutcome::Assigned(again)) = r.assign(&target).await else {
        panic!("sticky")
    };
    assert_eq!((again.worker, again.new), (a.worker, false));
    assert_eq!(info(&r, a.worker).await.activity, Activity::Busy);
}
