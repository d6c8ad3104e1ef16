//! The stall rule: time during which the registry itself was not running (a sweep more than two
//! sweep intervals after the previous one measures it) is never counted against its workers.

use crate::WorkerRegistryExt;
use std::time::Duration;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{DeadReason, HeartbeatAck, Status, WorkerId, WorkerRegistry};

/// How long the registry is stopped in these cases.
const STALL: Duration = Duration::from_secs(180);

/// The sequence: twenty workers, the registry stopped far longer than the timeout, and by
/// the first sweep after it resumes nineteen have heartbeated (the twentieth's beat is not due
/// yet). One silent worker of twenty is far below the brake's trigger, yet nobody dies and nobody
/// is suspected: the sweep measures the stall and credits it. The twentieth beats a moment later.
pub async fn a_stall_of_the_registry_kills_nobody_even_below_the_brakes_trigger<F: Fixture>(
    fixture: &F,
) {
    let f = Fleet::new(fixture, 20, config().max_workers(32)).await;
    assert!(sweep(&f.r).await.died.is_empty());
    fixture.advance(&f.r, STALL).await;
    f.beat(0..19).await;
    let r = sweep(&f.r).await;
    assert!(
        r.died.is_empty() && r.suspected.is_empty() && !r.brake_engaged,
        "a stall of the registry was held against its workers: {r:?}"
    );
    let interval = f.r.config().sweep_interval();
    assert!(
        r.stall_credited >= STALL - interval && r.stall_credited <= STALL + MARGIN,
        "the stall measured: {:?}",
        r.stall_credited
    );
    let last = f.info(19).await;
    assert_eq!(last.status, Status::Active);
    assert!(!last.suspect);
    assert!(
        last.heartbeat_age > TIMEOUT,
        "silent for {:?}: without the stall rule it would be dead",
        last.heartbeat_age
    );
    assert_eq!(f.r.heartbeat(f.workers[19]).await, Ok(HeartbeatAck::Active));
    let all: Vec<WorkerId> = f.workers.clone();
    let reports = run_beating(fixture, &f.r, &all, HEARTBEAT).await;
    assert!(deaths(&reports).is_empty(), "{reports:?}");
    assert_eq!(f.r.stats().deaths_missed_heartbeats, 0);
}

/// The rule credits the stall, and nothing more: a worker that really crashed before the stall
/// dies once it has been silent for the timeout of registry running time.
pub async fn a_worker_silent_across_a_stall_dies_on_registry_running_time<F: Fixture>(fixture: &F) {
    let f = Fleet::new(fixture, 3, config()).await;
    let crashed = f.workers[0];
    let others = [f.workers[1], f.workers[2]];
    assert!(sweep(&f.r).await.died.is_empty());
    // Ten seconds of running time, then the registry stops.
    assert!(deaths(&run_beating(fixture, &f.r, &others, Duration::from_secs(10)).await).is_empty());
    fixture.advance(&f.r, STALL).await;
    f.beat(1..3).await;
    let r = sweep(&f.r).await;
    assert!(r.died.is_empty(), "silent 10 s of running time: {r:?}");
    // The rest of its timeout in running time.
    let on_the_way = run_beating(
        fixture,
        &f.r,
        &others,
        TIMEOUT - Duration::from_secs(10) - MARGIN,
    )
    .await;
    assert!(deaths(&on_the_way).is_empty(), "{on_the_way:?}");
    let past = run_beating(fixture, &f.r, &others, MARGIN + PAST).await;
    assert_eq!(deaths(&past), vec![(crashed, DeadReason::MissedHeartbeats)]);
}

/// A sweep up to two intervals after the previous one measures no stall; a later one measures
/// everything after the first interval. A registry's first sweep has no predecessor.
pub async fn only_a_sweep_more_than_two_intervals_late_measures_a_stall<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    fixture.advance(&r, Duration::from_secs(100)).await;
    assert_eq!(
        sweep(&r).await.stall_credited,
        Duration::ZERO,
        "the first sweep"
    );
    let interval = r.config().sweep_interval();
    fixture.advance(&r, interval).await;
    assert_eq!(
        sweep(&r).await.stall_credited,
        Duration::ZERO,
        "one interval"
    );
    let late = Duration::from_secs(10);
    fixture.advance(&r, late).await;
    let credited = sweep(&r).await.stall_credited;
    assert!(
        credited >= late - interval && credited <= late - interval + MARGIN,
        "{late:?} late: credited {credited:?}"
    );
}

/// A drain deadline that had not passed when the registry stopped moves out by the stall: the
/// worker could not report the end of its loop meanwhile. It keeps the drain time it had left.
pub async fn a_stall_moves_a_drain_deadline_out<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let a = assigned(r.admit(&t(1), &d("1")).await);
    assert_eq!(
        r.drain_within(a.worker, Duration::from_secs(20)).await,
        Ok(Status::Draining)
    );
    assert!(sweep(&r).await.died.is_empty());
    let me = [a.worker];
    assert!(deaths(&run_beating(fixture, &r, &me, Duration::from_secs(10)).await).is_empty());
    fixture.advance(&r, STALL).await;
    r.heartbeat(a.worker).await.unwrap();
    let report = sweep(&r).await;
    assert!(report.died.is_empty(), "the deadline moved out: {report:?}");
    assert_eq!(info(&r, a.worker).await.status, Status::Draining);
    // About ten seconds of drain time were left (less the sweep interval before the stall began).
    let on_the_way = run_beating(fixture, &r, &me, Duration::from_secs(9) - MARGIN).await;
    assert!(deaths(&on_the_way).is_empty(), "{on_the_way:?}");
    let past = run_beating(fixture, &r, &me, MARGIN + PAST + Duration::from_secs(1)).await;
    assert_eq!(deaths(&past), vec![(a.worker, DeadReason::DrainTimedOut)]);
}
