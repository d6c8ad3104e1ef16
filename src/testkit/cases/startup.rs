//! The start-up grace: a new worker's first heartbeat may come as late as timeout plus
//! `startup_grace` after its creation; after that first beat, the plain timeout applies.

use crate::WorkerRegistryExt;
use std::time::Duration;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{DeadReason, HeartbeatAck, WorkerId, WorkerRegistry};

const GRACE: Duration = Duration::from_secs(20);

/// A new worker's late first heartbeat (past the plain timeout, within the grace) is accepted;
/// from then on it gets only the plain timeout.
pub async fn a_new_workers_first_heartbeat_may_come_late<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().startup_grace(GRACE)).await;
    let a = assigned(r.admit(&t(1), &d("d")).await);
    fixture.advance(&r, TIMEOUT + GRACE - MARGIN).await;
    assert!(sweep(&r).await.died.is_empty(), "within timeout + grace");
    assert!(!info(&r, a.worker).await.has_heartbeated);
    assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));
    assert!(info(&r, a.worker).await.has_heartbeated);

    assert!(died_in(&run_for(fixture, &r, TIMEOUT - MARGIN).await).is_empty());
    assert!(sweep(&r).await.died.is_empty());
    assert_eq!(
        deaths(&sweeps_over(fixture, &r, MARGIN + PAST).await),
        vec![(a.worker, DeadReason::MissedHeartbeats)],
        "past the plain timeout, well within timeout + grace: the grace is spent"
    );
}

/// A new worker that never heartbeats dies once timeout plus grace have passed since its creation
/// (time before its creation does not count), and its delivery is released.
pub async fn a_new_worker_that_never_heartbeats_dies_after_the_grace<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().startup_grace(GRACE)).await;
    fixture.advance(&r, Duration::from_secs(1000)).await;
    let (target, delivery) = (t(1), d("d"));
    let a = assigned(r.admit(&target, &delivery).await);
    fixture.advance(&r, TIMEOUT + GRACE - MARGIN).await;
    assert!(sweep(&r).await.died.is_empty());
    let report = the_deadly(sweeps_over(fixture, &r, MARGIN + PAST).await);
    assert_eq!(report.died, vec![(a.worker, DeadReason::MissedHeartbeats)]);
    assert_eq!(released(&report), vec![(target, delivery)]);
}

/// Self-registered pool workers get the same start-up grace.
pub async fn registered_workers_get_the_startup_grace_too<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().startup_grace(GRACE)).await;
    let w = r.register().await.unwrap();
    fixture.advance(&r, TIMEOUT + GRACE - MARGIN).await;
    assert!(sweep(&r).await.died.is_empty());
    assert_eq!(r.heartbeat(w).await, Ok(HeartbeatAck::Active));
    assert_eq!(
        deaths(&sweeps_over(fixture, &r, TIMEOUT + PAST).await),
        vec![(w, DeadReason::MissedHeartbeats)]
    );
    assert!(r.heartbeat(w).await.is_err());
}

/// With no start-up grace a new worker gets exactly the plain timeout.
pub async fn zero_startup_grace_means_the_plain_timeout<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().startup_grace(Duration::ZERO)).await;
    let a = assigned(r.admit(&t(1), &d("d")).await);
    fixture.advance(&r, TIMEOUT - MARGIN).await;
    assert!(sweep(&r).await.died.is_empty());
    assert_eq!(
        deaths(&sweeps_over(fixture, &r, MARGIN + PAST).await),
        vec![(a.worker, DeadReason::MissedHeartbeats)]
    );
}

/// Workers still in their start-up grace are not silent: a burst of new workers that have not
/// beaten yet neither dies nor engages the brake; past the grace, all ten silent are suspected.
pub async fn workers_in_their_startup_grace_do_not_engage_the_brake<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().startup_grace(GRACE)).await;
    for i in 0..10 {
        assigned(r.admit(&t(i + 1), &d("d")).await);
    }
    fixture.advance(&r, TIMEOUT + GRACE - MARGIN).await;
    let report = sweep(&r).await;
    assert!(
        report.died.is_empty() && report.suspected.is_empty() && !report.brake_engaged,
        "{report:?}"
    );
    let reports = sweeps_over(fixture, &r, MARGIN + PAST).await;
    assert!(
        reports.iter().any(|r| r.brake_engaged),
        "all ten silent past the grace: suspected, not killed"
    );
    let suspected: usize = reports.iter().map(|r| r.suspected.len()).sum();
    assert_eq!(suspected, 10);
    assert!(deaths(&reports).is_empty());
}

/// A failed rollout: ten new workers of which three ever beat. They are suspected together after
/// the grace; the seven silent ones die after the suspect grace, the three live.
pub async fn a_failed_rollout_is_suspected_then_killed<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().startup_grace(GRACE)).await;
    let mut ids: Vec<WorkerId> = Vec::new();
    for i in 0..10 {
        ids.push(assigned(r.admit(&t(i + 1), &d("d")).await).worker);
    }
    fixture.advance(&r, TIMEOUT + GRACE + PAST).await;
    let report = sweep(&r).await;
    assert!(report.brake_engaged);
    assert_eq!(report.suspected.len(), 10);
    for id in &ids[..3] {
        r.heartbeat(*id).await.unwrap();
    }
    // While the seven stay silent the registry runs on; the three that beat go quiet too until
    // just before the grace ends (so the brake holds them, suspect, not dead).
    let mut reports = run_for(fixture, &r, SUSPECT_GRACE - MARGIN).await;
    for id in &ids[..3] {
        r.heartbeat(*id).await.unwrap();
    }
    // The stretch ends with a sweep, as run_for leaves it to its caller: otherwise the next
    // sweep would come two intervals later, which a server's clock (moving by itself) makes a
    // stall of a few milliseconds, credited to the seven.
    reports.push(sweep(&r).await);
    reports.extend(sweeps_over(fixture, &r, MARGIN).await);
    assert_eq!(died_in(&reports), ids[3..].iter().copied().collect());
    assert_eq!(r.status().capacity.used, 3);
}
