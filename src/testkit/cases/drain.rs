//! Drain and drain deadlines: `drain`, `drain_within`, `drain_all_within`, `loop_finished`, and
//! death by `DrainTimedOut`.

use crate::WorkerRegistryExt;
use std::time::Duration;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{
    Admission, DeadReason, HeartbeatAck, RegistryError, Rejection, ReleaseReason, Status,
    WorkerRegistry,
};

/// A drained busy worker takes nothing new, still heartbeats (answered `Draining`), may complete
/// its delivery, and is dead with `Exited` when its loop finishes, freeing its slot.
pub async fn ac5_drain_then_loop_finished_is_an_exit<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let target = t(1);
    let a = assigned(r.admit(&target, &d("1")).await);
    assert_eq!(r.drain(a.worker).await, Ok(Status::Draining));
    assert_eq!(r.drain(a.worker).await, Ok(Status::Draining), "idempotent");
    assert_eq!(
        r.heartbeat(a.worker).await,
        Ok(HeartbeatAck::Draining),
        "heartbeats are accepted and tell the worker to wind down"
    );
    assert_eq!(
        r.admit(&target, &d("2")).await,
        Ok(Admission::Rejected(Rejection::TargetDraining {
            worker: a.worker
        }))
    );
    assert!(info(&r, a.worker).await.drain_deadline.is_some());
    r.complete(&target, &d("1")).await.unwrap();
    assert_eq!(
        r.loop_finished(a.worker).await,
        Ok(Status::Dead(DeadReason::Exited))
    );
    assert_eq!(
        r.drain(a.worker).await,
        Err(RegistryError::WorkerDead {
            id: a.worker,
            reason: DeadReason::Exited
        })
    );
    let w = info(&r, a.worker).await;
    assert_eq!(w.drain_deadline, None, "only a draining worker has one");
    let report = sweep(&r).await;
    assert!(report.released.is_empty(), "its delivery was completed");
    assert!(report.died.is_empty(), "it exited; the sweep killed nobody");
    assert_eq!(r.status().capacity.used, 0);
    assert_eq!(r.stats().deaths_exited, 1);
}

/// An idle worker has no loop to finish: draining it is an exit, at once.
pub async fn ac5_an_idle_worker_exits_at_once_when_drained<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let pool = r.register().await.unwrap(); // pool workers start idle
    assert_eq!(r.drain(pool).await, Ok(Status::Dead(DeadReason::Exited)));
    let a = assigned(r.admit(&t(1), &d("1")).await);
    assert_eq!(r.loop_finished(a.worker).await, Ok(Status::Active)); // idle now
    assert_eq!(
        r.drain(a.worker).await,
        Ok(Status::Dead(DeadReason::Exited))
    );
    let b = assigned(r.admit(&t(2), &d("2")).await);
    assert_eq!(r.loop_finished(b.worker).await, Ok(Status::Active));
    assert_eq!(
        r.drain_within(b.worker, Duration::from_secs(60)).await,
        Ok(Status::Dead(DeadReason::Exited)),
        "whatever the deadline"
    );
}

/// A drained worker that exits with a delivery unfinished has it released, and the redelivery is
/// admitted again.
pub async fn ac5_a_drained_workers_unfinished_deliveries_are_released<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(1), d("unfinished"));
    let a = assigned(r.admit(&target, &delivery).await);
    assert_eq!(r.drain(a.worker).await, Ok(Status::Draining));
    assert_eq!(r.deregister(a.worker).await, Ok(DeadReason::Exited));
    let report = sweep(&r).await;
    assert_eq!(released(&report), vec![(target.clone(), delivery.clone())]);
    assert_eq!(
        report.released[0].reason,
        ReleaseReason::WorkerDied(DeadReason::Exited)
    );
    assert!(assigned(r.admit(&target, &delivery).await).new);
}

/// Draining every worker drains the busy ones and retires the idle ones; the busy ones get the
/// deadline given and die with `DrainTimedOut` if still draining after it.
pub async fn ac5_drain_all_drains_busy_workers_and_retires_idle_ones<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let busy = assigned(r.admit(&t(1), &d("1")).await);
    let idle = r.register().await.unwrap();
    let deadline = Duration::from_secs(20);
    let all = r.drain_all_within(deadline).await.unwrap();
    assert_eq!((all.draining, all.exited), (1, 1));
    assert_eq!(info(&r, busy.worker).await.status, Status::Draining);
    assert_eq!(
        info(&r, idle).await.status,
        Status::Dead(DeadReason::Exited)
    );

    fixture.advance(&r, deadline - MARGIN).await;
    assert_eq!(r.heartbeat(busy.worker).await, Ok(HeartbeatAck::Draining));
    assert!(sweep(&r).await.died.is_empty(), "within the deadline");
    assert_eq!(
        deaths(&sweeps_over(fixture, &r, MARGIN + PAST).await),
        vec![(busy.worker, DeadReason::DrainTimedOut)]
    );
}

/// A worker still draining at its deadline (heartbeating all along) is declared dead with
/// `DrainTimedOut` by the next sweep: its target unassigned, its deliveries released, its
/// heartbeats refused.
pub async fn a_worker_still_draining_at_its_deadline_dies<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(1), d("long"));
    let a = assigned(r.admit(&target, &delivery).await);
    let deadline = Duration::from_secs(25);
    assert_eq!(
        r.drain_within(a.worker, deadline).await,
        Ok(Status::Draining)
    );
    let w = info(&r, a.worker).await;
    let until = w
        .drain_deadline
        .expect("a draining worker has a drain deadline")
        .duration_since(w.last_heartbeat)
        .expect("the deadline is ahead");
    assert!(until >= deadline, "{until:?} from its last heartbeat");

    fixture.advance(&r, deadline - MARGIN).await;
    assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Draining));
    assert!(sweep(&r).await.died.is_empty(), "within the deadline");

    let report = the_deadly(sweeps_over(fixture, &r, MARGIN + PAST).await);
    assert_eq!(report.died, vec![(a.worker, DeadReason::DrainTimedOut)]);
    assert_eq!(report.released_targets, vec![target.clone()]);
    assert_eq!(released(&report), vec![(target.clone(), delivery.clone())]);
    assert_eq!(
        report.released[0].reason,
        ReleaseReason::WorkerDied(DeadReason::DrainTimedOut)
    );
    assert_eq!(
        r.heartbeat(a.worker).await,
        Err(RegistryError::WorkerDead {
            id: a.worker,
            reason: DeadReason::DrainTimedOut
        })
    );
    assert_eq!(
        r.status().worker(a.worker).map(|w| w.status),
        Some(Status::Dead(DeadReason::DrainTimedOut))
    );
    assert!(assigned(r.admit(&target, &d("next")).await).new);
    assert_eq!(r.stats().deaths_drain_timed_out, 1);
}

/// Draining a draining worker again keeps the earlier of the two deadlines.
pub async fn draining_again_keeps_the_earlier_deadline<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let a = assigned(r.admit(&t(1), &d("1")).await);
    let deadline_of = |w: crate::WorkerInfo| w.drain_deadline.expect("draining");
    assert_eq!(
        r.drain_within(a.worker, Duration::from_secs(100)).await,
        Ok(Status::Draining)
    );
    let late = deadline_of(info(&r, a.worker).await);
    assert_eq!(
        r.drain_within(a.worker, Duration::from_secs(20)).await,
        Ok(Status::Draining)
    );
    let early = deadline_of(info(&r, a.worker).await);
    assert!(
        early < late,
        "the shorter deadline wins: {early:?} vs {late:?}"
    );
    assert_eq!(
        r.drain_within(a.worker, Duration::from_secs(200)).await,
        Ok(Status::Draining)
    );
    assert_eq!(
        deadline_of(info(&r, a.worker).await),
        early,
        "a later one changes nothing"
    );

    fixture.advance(&r, Duration::from_secs(20) + PAST).await;
    r.heartbeat(a.worker).await.unwrap();
    assert_eq!(
        sweep(&r).await.died,
        vec![(a.worker, DeadReason::DrainTimedOut)]
    );
}

/// `drain` gives the configured `drain_deadline`.
pub async fn drain_uses_the_configured_deadline<F: Fixture>(fixture: &F) {
    let deadline = Duration::from_secs(40);
    let r = registry(fixture, config().drain_deadline(deadline)).await;
    let a = assigned(r.admit(&t(1), &d("1")).await);
    assert_eq!(r.drain(a.worker).await, Ok(Status::Draining));
    fixture.advance(&r, deadline - MARGIN).await;
    r.heartbeat(a.worker).await.unwrap();
    assert!(sweep(&r).await.died.is_empty());
    assert_eq!(
        deaths(&sweeps_over(fixture, &r, MARGIN + PAST).await),
        vec![(a.worker, DeadReason::DrainTimedOut)]
    );
}

/// A drain deadline is the worker's own: it is kept even while the mass-staleness brake holds back
/// the deaths of silent workers.
pub async fn a_drain_deadline_is_not_held_back_by_the_brake<F: Fixture>(fixture: &F) {
    let f = Fleet::new(fixture, 4, config()).await;
    let deadline = Duration::from_secs(10);
    assert_eq!(
        f.r.drain_within(f.workers[0], deadline).await,
        Ok(Status::Draining)
    );
    fixture.advance(&f.r, TIMEOUT + PAST).await;
    assert_eq!(
        f.r.heartbeat(f.workers[0]).await,
        Ok(HeartbeatAck::Draining)
    );
    let report = sweep(&f.r).await;
    assert!(report.brake_engaged, "three of four silent: {report:?}");
    assert_eq!(suspected(&report), f.ids(1..4));
    assert_eq!(report.died, vec![(f.workers[0], DeadReason::DrainTimedOut)]);
}
