//! Registration: self-registered pool workers (`register`, `deregister`) and the capacity they
//! share with spawned workers.

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::WorkerRegistryExt;
use crate::{
    Activity, DeadReason, HeartbeatAck, RegistryError, Rejection, ReleaseReason, Status,
    WorkerKind, WorkerRegistry,
};

/// A registered worker has no target, starts active and idle, shares heartbeats, loops and drain
/// with spawned workers, and deregistering it is a clean death (`Deregistered`), after which it
/// is fenced.
pub async fn a_registered_worker_lives_like_a_spawned_one<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let w = r.register().await.unwrap();
    let i = info(&r, w).await;
    assert_eq!(
        (i.id, i.target.clone(), i.kind),
        (w, None, WorkerKind::Registered)
    );
    assert_eq!((i.status, i.activity), (Status::Active, Activity::Idle));
    assert_eq!(i.token.worker(), w);
    assert_eq!(r.heartbeat(w).await, Ok(HeartbeatAck::Active));
    assert_eq!(r.loop_started(w).await, Ok(Status::Active));
    assert_eq!(info(&r, w).await.activity, Activity::Busy);
    assert_eq!(r.loop_finished(w).await, Ok(Status::Active));
    assert_eq!(info(&r, w).await.activity, Activity::Idle);

    assert_eq!(r.deregister(w).await, Ok(DeadReason::Deregistered));
    assert_eq!(
        r.deregister(w).await,
        Err(RegistryError::WorkerDead {
            id: w,
            reason: DeadReason::Deregistered
        })
    );
    assert_eq!(
        info(&r, w).await.status,
        Status::Dead(DeadReason::Deregistered)
    );
    sweep(&r).await;
    assert_eq!(r.stats().deaths_deregistered, 1);
    assert_eq!(r.status().capacity.used, 0);
}

/// Registered and spawned workers share `max_workers`: a full registry refuses a registration with
/// `Rejected(CapacityFull)` and a new target alike, and a deregistration frees a slot.
pub async fn registration_counts_against_capacity<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_workers(2)).await;
    let spawned = assigned(r.admit(&t(1), &d("1")).await);
    let pool = r.register().await.unwrap();
    let full = Rejection::CapacityFull { limit: 2 };
    assert_eq!(r.register().await, Err(RegistryError::Rejected(full)));
    assert_eq!(
        r.admit(&t(2), &d("2")).await,
        Ok(crate::Admission::Rejected(full))
    );
    r.deregister(pool).await.unwrap();
    let again = r.register().await.unwrap();
    assert!(again != pool && again != spawned.worker, "a new id");
    assert_eq!(r.register().await, Err(RegistryError::Rejected(full)));
    sweep(&r).await;
    assert_eq!(r.status().capacity.used, 2);
}

/// Deregistering a draining worker is an exit (`Exited`), not a deregistration.
pub async fn deregistering_a_draining_worker_is_an_exit<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let w = r.register().await.unwrap();
    assert_eq!(r.loop_started(w).await, Ok(Status::Active));
    assert_eq!(r.drain(w).await, Ok(Status::Draining));
    assert_eq!(r.heartbeat(w).await, Ok(HeartbeatAck::Draining));
    assert_eq!(r.deregister(w).await, Ok(DeadReason::Exited));
    assert_eq!(info(&r, w).await.status, Status::Dead(DeadReason::Exited));
}

/// Deregistering releases the worker's in-flight deliveries (reason: it deregistered) and its
/// target, which the next delivery places on a new worker.
pub async fn deregistering_releases_in_flight_deliveries<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(1), d("d"));
    let a = assigned(r.admit(&target, &delivery).await);
    assert_eq!(r.deregister(a.worker).await, Ok(DeadReason::Deregistered));
    let report = sweep(&r).await;
    assert!(
        report.died.is_empty(),
        "it died by itself, not in the sweep"
    );
    assert_eq!(released(&report), vec![(target.clone(), delivery.clone())]);
    let e = &report.released[0];
    assert_eq!(e.holder, Some(a.worker));
    assert_eq!(
        e.reason,
        ReleaseReason::WorkerDied(DeadReason::Deregistered)
    );
    let b = assigned(r.admit(&target, &d("next")).await);
    assert!(b.new && b.worker != a.worker);
}
