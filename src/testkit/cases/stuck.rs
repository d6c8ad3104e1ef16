//! Deliveries stuck in flight: one in flight longer than `max_in_flight` is released for
//! re-dispatch (`ReleaseReason::Stuck`), counted, published, and its worker drained, so that it is
//! replaced once its loop ends; the stuck worker's late completion is refused.

use crate::WorkerRegistryExt;
use std::time::Duration;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{
    Admission, DeadReason, Event, HeartbeatAck, RegistryError, Rejection, ReleaseReason, Status,
    Subscribe, WorkerRegistry,
};

const MAX_IN_FLIGHT: Duration = Duration::from_secs(60);

/// A worker that heartbeats faithfully but never finishes a delivery: past `max_in_flight` the
/// sweep releases it as stuck and drains the worker; its late completion is refused as released,
/// the redelivery waits for the worker to go (it is draining), and once its loop ends the delivery
/// runs on a new worker, the old one's completion then refused as not its own.
pub async fn a_delivery_stuck_in_flight_is_released_and_its_worker_drained<F: Fixture>(
    fixture: &F,
) {
    let r = registry(fixture, config().max_in_flight(MAX_IN_FLIGHT)).await;
    let (target, delivery) = (t(1), d("stuck"));
    let a = assigned(r.admit(&target, &delivery).await);
    let me = [a.worker];
    let on_the_way = run_beating(fixture, &r, &me, MAX_IN_FLIGHT - MARGIN).await;
    assert!(
        on_the_way.iter().all(|rep| rep.released.is_empty()),
        "{on_the_way:?}"
    );
    let reports = run_beating(fixture, &r, &me, MARGIN + PAST).await;
    let released: Vec<_> = reports
        .iter()
        .flat_map(|rep| rep.released.clone())
        .collect();
    assert_eq!(released.len(), 1, "{reports:?}");
    assert_eq!(
        (
            &released[0].target,
            &released[0].delivery,
            released[0].holder,
            released[0].reason
        ),
        (&target, &delivery, Some(a.worker), ReleaseReason::Stuck)
    );
    let drained: Vec<_> = reports
        .iter()
        .flat_map(|rep| rep.drained_stuck.clone())
        .collect();
    assert_eq!(drained, vec![a.worker]);
    assert!(
        deaths(&reports).is_empty(),
        "drained, not killed: {reports:?}"
    );
    assert_eq!(info(&r, a.worker).await.status, Status::Draining);
    assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Draining));
    let s = r.stats();
    assert_eq!((s.claims_stuck, s.claims_released), (1, 0));
    assert_eq!(r.status().claims.in_flight, 0, "released, not in flight");

    assert_eq!(
        r.complete_by(a.worker, &target, &delivery).await,
        Err(RegistryError::ClaimReleased {
            target: target.clone(),
            delivery: delivery.clone(),
            holder: Some(a.worker),
            reason: ReleaseReason::Stuck,
        })
    );
    assert_eq!(
        r.admit(&target, &delivery).await,
        Ok(Admission::Rejected(Rejection::TargetDraining {
            worker: a.worker
        }))
    );
    let later = run_beating(fixture, &r, &me, Duration::from_secs(3)).await;
    assert!(
        later.iter().all(|rep| rep.released.is_empty()),
        "reported once: {later:?}"
    );

    assert_eq!(
        r.loop_finished(a.worker).await,
        Ok(Status::Dead(DeadReason::Exited))
    );
    let b = assigned(r.admit(&target, &delivery).await);
    assert!(b.new && b.worker != a.worker);
    assert_eq!(
        r.complete_by(a.worker, &target, &delivery).await,
        Err(RegistryError::NotHolder {
            target: target.clone(),
            delivery: delivery.clone(),
            holder: Some(b.worker),
            worker: a.worker,
        })
    );
    r.complete_by(b.worker, &target, &delivery).await.unwrap();
}

/// A stuck worker that already reported its loop finished (idle) has no loop to wait for: the
/// drain exits it at once, in the same sweep, and its target is free for the re-dispatch.
pub async fn an_idle_worker_holding_a_stuck_delivery_exits_at_once<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_in_flight(MAX_IN_FLIGHT)).await;
    let (target, delivery) = (t(1), d("stuck"));
    let a = assigned(r.admit(&target, &delivery).await);
    assert_eq!(r.loop_finished(a.worker).await, Ok(Status::Active));
    let reports = run_beating(fixture, &r, &[a.worker], MAX_IN_FLIGHT + PAST).await;
    let r1 = reports
        .iter()
        .find(|rep| !rep.released.is_empty())
        .expect("released as stuck");
    assert_eq!(r1.released[0].reason, ReleaseReason::Stuck);
    assert_eq!(r1.died, vec![(a.worker, DeadReason::Exited)]);
    assert_eq!(r1.released_targets, vec![target.clone()]);
    assert!(r1.drained_stuck.is_empty());
    let b = assigned(r.admit(&target, &delivery).await);
    assert!(b.new && b.worker != a.worker);
}

/// Only what is still in flight can be stuck, and a stuck delivery is published as
/// `DeliveryStuck` (with the worker's drain) and handed over in `TargetReleased`.
pub async fn only_deliveries_in_flight_too_long_are_stuck_and_each_is_published<F: Fixture>(
    fixture: &F,
) {
    let r = registry(fixture, config().max_in_flight(MAX_IN_FLIGHT)).await;
    let mut events = r.subscribe();
    let target = t(1);
    let a = assigned(r.admit(&target, &d("old")).await);
    assigned(r.admit(&target, &d("done")).await);
    let me = [a.worker];
    run_beating(fixture, &r, &me, Duration::from_secs(30)).await;
    r.complete_by(a.worker, &target, &d("done")).await.unwrap();
    assigned(r.admit(&target, &d("young")).await);
    let reports = run_beating(fixture, &r, &me, Duration::from_secs(30) + PAST + MARGIN).await;
    let released: Vec<_> = reports
        .iter()
        .flat_map(|rep| rep.released_pairs())
        .collect();
    assert_eq!(released, vec![(target.clone(), d("old"))]);
    assert_eq!(r.status().claims.in_flight, 1, "young is still in flight");
    r.complete_by(a.worker, &target, &d("young")).await.unwrap();
    assert_eq!(
        r.loop_finished(a.worker).await,
        Ok(Status::Dead(DeadReason::Exited))
    );

    let seen = events_before_marker(&r, &mut events).await;
    let stuck = seen
        .iter()
        .position(|e| {
            *e == Event::DeliveryStuck {
                worker: a.worker,
                target: target.clone(),
                delivery: d("old"),
            }
        })
        .unwrap_or_else(|| panic!("DeliveryStuck published: {seen:?}"));
    assert!(
        seen[stuck..].contains(&Event::WorkerDraining {
            worker: a.worker,
            target: Some(target.clone()),
        }),
        "{seen:?}"
    );
    assert!(
        seen.contains(&Event::TargetReleased {
            target: target.clone(),
            deliveries: vec![d("old")],
        }),
        "{seen:?}"
    );
    assert_eq!(r.stats().claims_stuck, 1);
}
