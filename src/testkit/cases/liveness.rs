//! Heartbeats, liveness and fencing: the worker record, death by silence, what a dead worker may
//! no longer do, and ids that are never reused.

use crate::WorkerRegistryExt;
use std::collections::HashSet;
use std::time::Duration;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{
    Activity, ClaimState, DeadReason, HeartbeatAck, PoolStatus, RegistryError, ReleaseReason,
    Status, WorkerKind, WorkerRegistry,
};

/// A worker's record holds its id, target, kind, status, activity, heartbeat and token, and its
/// ages are at least the time that passed (on the registry's time base).
pub async fn ac1_the_record_holds_target_kind_status_heartbeat_and_times<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    fixture.advance(&r, Duration::from_secs(10)).await;
    let a = assigned(r.admit(&t(5), &d("d1")).await);
    assert!(!info(&r, a.worker).await.has_heartbeated);
    fixture.advance(&r, Duration::from_secs(3)).await;
    assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));
    fixture.advance(&r, Duration::from_secs(2)).await;

    let w = info(&r, a.worker).await;
    assert_eq!(w.id, a.worker);
    assert_eq!(w.target, Some(t(5)));
    assert_eq!((w.kind, w.status), (WorkerKind::Spawned, Status::Active));
    assert_eq!(w.activity, Activity::Busy, "created for a delivery");
    assert_eq!(w.pool_status(), PoolStatus::Busy);
    assert!(w.has_heartbeated && !w.suspect);
    assert!(w.heartbeat_age >= Duration::from_secs(2), "{w:?}");
    assert!(w.uptime >= Duration::from_secs(5), "{w:?}");
    assert!(
        w.uptime.saturating_sub(w.heartbeat_age) >= Duration::from_secs(3),
        "the heartbeat came at least 3 s after the start: {w:?}"
    );
    let since_start = w.last_heartbeat.duration_since(w.started_at);
    assert!(
        since_start.is_ok_and(|s| s >= Duration::from_secs(3)),
        "display times follow the registry's time: {w:?}"
    );
    assert_eq!(w.token, a.token);
    assert_eq!((w.died_at, w.drain_deadline), (None, None));
}

/// Ids are never handed out twice, even after the dead records are purged.
pub async fn ac1_worker_ids_are_never_reused<F: Fixture>(fixture: &F) {
    let retention = Duration::from_secs(60);
    let r = registry(fixture, config().dead_retention(retention)).await;
    let mut seen = HashSet::new();
    for round in 0..5 {
        let a = assigned(r.admit(&t(1), &d(&format!("d{round}"))).await);
        assert!(seen.insert(a.worker), "id {} handed out twice", a.worker);
        let p = r.register().await.unwrap();
        assert!(seen.insert(p), "id {p} handed out twice");
        r.deregister(a.worker).await.unwrap();
        r.deregister(p).await.unwrap();
        fixture.advance(&r, retention + PAST).await;
        assert_eq!(sweep(&r).await.purged_workers, 2);
        assert_eq!(
            r.worker(a.worker).await,
            Ok(None),
            "purged: its id must still not come back"
        );
    }
}

/// Status only moves forward, and dead is terminal: every later call about the worker is refused
/// with how it died.
pub async fn ac1_status_is_forward_only_and_dead_is_terminal<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let a = assigned(r.admit(&t(1), &d("d")).await);
    assert_eq!(r.drain(a.worker).await, Ok(Status::Draining));
    assert_eq!(
        r.loop_started(a.worker).await,
        Ok(Status::Draining),
        "no way back"
    );
    assert_eq!(
        r.loop_finished(a.worker).await,
        Ok(Status::Dead(DeadReason::Exited))
    );
    let dead = RegistryError::WorkerDead {
        id: a.worker,
        reason: DeadReason::Exited,
    };
    assert_eq!(r.heartbeat(a.worker).await, Err(dead.clone()));
    assert_eq!(r.loop_started(a.worker).await, Err(dead.clone()));
    assert_eq!(r.loop_finished(a.worker).await, Err(dead.clone()));
    assert_eq!(r.drain(a.worker).await, Err(dead.clone()));
    assert_eq!(
        r.drain_within(a.worker, Duration::from_secs(1)).await,
        Err(dead.clone())
    );
    assert_eq!(r.deregister(a.worker).await, Err(dead.clone()));
    assert_eq!(
        dead.observed_status(),
        Some(Status::Dead(DeadReason::Exited))
    );
    let w = info(&r, a.worker).await;
    assert_eq!(w.status, Status::Dead(DeadReason::Exited));
    assert!(w.died_at.is_some());
}

/// A worker silent for longer than the timeout dies at the next sweep: its target is unassigned,
/// its in-flight deliveries released with its id and reason, its heartbeats refused (it is
/// fenced), and the redelivery runs on a new worker.
pub async fn ac4_a_silent_worker_dies_and_releases_its_target_and_claims<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(1), d("in-flight"));
    let a = assigned(r.admit(&target, &delivery).await);
    assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));

    fixture.advance(&r, TIMEOUT - MARGIN).await;
    assert!(sweep(&r).await.died.is_empty(), "within the timeout");
    assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));

    let report = the_deadly(sweeps_over(fixture, &r, TIMEOUT + PAST).await);
    assert_eq!(report.died, vec![(a.worker, DeadReason::MissedHeartbeats)]);
    assert_eq!(report.released_targets, vec![target.clone()]);
    assert_eq!(released(&report), vec![(target.clone(), delivery.clone())]);
    let e = &report.released[0];
    assert_eq!(e.holder, Some(a.worker));
    assert_eq!(
        e.reason,
        ReleaseReason::WorkerDied(DeadReason::MissedHeartbeats)
    );
    assert_eq!(
        r.heartbeat(a.worker).await,
        Err(RegistryError::WorkerDead {
            id: a.worker,
            reason: DeadReason::MissedHeartbeats
        }),
        "a dead worker's heartbeat is refused: it is fenced"
    );
    let s = r.status();
    assert_eq!(s.capacity.used, 0);
    assert_eq!(
        s.worker(a.worker).map(|w| w.status),
        Some(Status::Dead(DeadReason::MissedHeartbeats))
    );
    assert_eq!(
        r.complete(&target, &delivery).await,
        Err(RegistryError::UnknownClaim {
            target: target.clone(),
            delivery: delivery.clone()
        }),
        "the sweep released it and handed it over: it is no longer a claim"
    );

    let b = assigned(r.admit(&target, &delivery).await);
    assert!(
        b.new && b.worker != a.worker,
        "re-dispatched on a new worker"
    );
    assert!(b.token > a.token);
    let stats = r.stats();
    assert_eq!(stats.deaths_missed_heartbeats, 1);
    assert_eq!(stats.claims_released, 1);
    assert_eq!(stats.heartbeats_refused, 1);
}

/// A worker that heartbeats every interval lives through any number of sweeps.
pub async fn ac4_heartbeats_keep_a_worker_alive_indefinitely<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let w = r.register().await.unwrap();
    for _ in 0..30 {
        fixture.advance(&r, HEARTBEAT).await;
        assert_eq!(r.heartbeat(w).await, Ok(HeartbeatAck::Active));
        assert!(sweep(&r).await.died.is_empty());
    }
    assert_eq!(info(&r, w).await.status, Status::Active);
    assert!(info(&r, w).await.uptime >= HEARTBEAT * 30);
    assert_eq!(r.stats().heartbeats, 30);
}

/// A dead worker's late completion is refused and completes nothing: `ClaimReleased` while its
/// claim is released but not yet swept, `UnknownClaim` once the sweep handed it over, and
/// `NotHolder` (naming the new holder) once the delivery was admitted again onto another worker.
pub async fn a_dead_workers_late_completion_is_refused<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(1), d("d"));

    // Released, not yet swept.
    let a = assigned(r.admit(&target, &delivery).await);
    assert_eq!(r.deregister(a.worker).await, Ok(DeadReason::Deregistered));
    let released_err = RegistryError::ClaimReleased {
        target: target.clone(),
        delivery: delivery.clone(),
        holder: Some(a.worker),
        reason: ReleaseReason::WorkerDied(DeadReason::Deregistered),
    };
    assert_eq!(
        r.complete_by(a.worker, &target, &delivery).await,
        Err(released_err.clone())
    );
    assert_eq!(r.complete(&target, &delivery).await, Err(released_err));

    // Swept: handed over for re-dispatch, so no longer a claim.
    assert_eq!(
        released(&sweep(&r).await),
        vec![(target.clone(), delivery.clone())]
    );
    let unknown = Err(RegistryError::UnknownClaim {
        target: target.clone(),
        delivery: delivery.clone(),
    });
    assert_eq!(r.complete_by(a.worker, &target, &delivery).await, unknown);
    assert_eq!(r.complete(&target, &delivery).await, unknown);

    // Re-admitted onto a new worker: the old one is not its holder.
    let b = assigned(r.admit(&target, &delivery).await);
    assert_ne!(b.worker, a.worker);
    assert_eq!(
        r.complete_by(a.worker, &target, &delivery).await,
        Err(RegistryError::NotHolder {
            target: target.clone(),
            delivery: delivery.clone(),
            holder: Some(b.worker),
            worker: a.worker,
        })
    );
    let dup = duplicate(r.admit(&target, &delivery).await);
    assert_eq!(
        (dup.holder, dup.state),
        (Some(b.worker), ClaimState::InFlight)
    );
    r.complete_by(b.worker, &target, &delivery).await.unwrap();
    let dup = duplicate(r.admit(&target, &delivery).await);
    assert_eq!(
        (dup.holder, dup.state),
        (Some(b.worker), ClaimState::Completed)
    );
}

/// Only a claim's holder completes it through `complete_by`: another live worker, or any worker
/// for a bare claim, gets `NotHolder` naming the real holder, and nothing is completed.
pub async fn complete_by_refuses_a_worker_that_does_not_hold_the_claim<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(1), d("mine"));
    let a = assigned(r.admit(&target, &delivery).await);
    let other = assigned(r.admit(&t(2), &d("theirs")).await);
    assert_eq!(
        r.complete_by(other.worker, &target, &delivery).await,
        Err(RegistryError::NotHolder {
            target: target.clone(),
            delivery: delivery.clone(),
            holder: Some(a.worker),
            worker: other.worker,
        })
    );
    assert_eq!(
        duplicate(r.admit(&target, &delivery).await).state,
        ClaimState::InFlight
    );

    let bare = (t(3), d("bare"));
    r.claim(&bare.0, &bare.1).await.unwrap();
    assert_eq!(
        r.complete_by(a.worker, &bare.0, &bare.1).await,
        Err(RegistryError::NotHolder {
            target: bare.0.clone(),
            delivery: bare.1.clone(),
            holder: None,
            worker: a.worker,
        })
    );
    r.complete(&bare.0, &bare.1).await.unwrap();
    r.complete_by(a.worker, &target, &delivery).await.unwrap();
    assert_eq!(r.stats().claims_completed, 2);
}
