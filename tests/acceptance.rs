//! Acceptance criteria AC1-AC6 and the DoD1 unit-test list: what is particular to the in-memory
//! backend, on a `ManualClock` (no sleeps). What every backend must do lives in the conformance
//! suite (`src/testkit/cases/`, run by `tests/conformance.rs`); what stays here needs the in-memory
//! registry itself: exact millisecond boundaries and display times of a manual clock,
//! `claim_count`, `WorkerHandle`, and races on OS threads against one shared registry whose
//! counters all racers share.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use worker_registry::{
    memory::Direct, Activity, Admission, AssignOutcome, ClaimOutcome, ClaimState, DeadReason,
    DeliveryId, HeartbeatAck, ManualClock, PoolStatus, RegistryConfig, RegistryError, Rejection,
    Status, Target, WorkerId, WorkerKind,
};

const HB: Duration = Duration::from_secs(30);
const MISSED: u32 = 4;
const TIMEOUT: Duration = Duration::from_secs(120);
const MS: Duration = Duration::from_millis(1);

fn config() -> RegistryConfig {
    RegistryConfig::builder()
        .heartbeat_interval(HB)
        .missed_heartbeats(MISSED)
        .startup_grace(Duration::ZERO)
        .max_workers(3)
        .build()
        .unwrap()
}

fn registry() -> (Direct<ManualClock>, ManualClock) {
    registry_with(config())
}

fn registry_with(config: RegistryConfig) -> (Direct<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (Direct::with_clock(config, clock.clone()), clock)
}

fn t(repo: &str, n: u64) -> Target {
    Target::new(repo, n).unwrap()
}

fn e(id: &str) -> DeliveryId {
    DeliveryId::new(id).unwrap()
}

/// Moves time forward by `by` as a running registry sees it: a sweep at least every
/// `sweep_interval` (a sweep that comes later than that is a stall of the registry itself, which
/// the stall rule does not count against the workers). Returns the last sweep's report.
fn advance_sweeping(
    r: &Direct<ManualClock>,
    clock: &ManualClock,
    by: Duration,
) -> worker_registry::SweepReport {
    let step = r.config().sweep_interval();
    let mut left = by;
    loop {
        let d = left.min(step);
        clock.advance(d);
        left -= d;
        let report = r.sweep();
        if left.is_zero() {
            return report;
        }
        assert!(report.died.is_empty(), "died before the end: {report:?}");
    }
}

fn assigned(a: Admission) -> worker_registry::Assignment {
    match a {
        Admission::Assigned(a) => a,
        other => panic!("expected Assigned, got {other:?}"),
    }
}

// ---- AC1: per-worker record ---------------------------------------------------------------------

#[test]
fn ac1_record_holds_id_target_start_heartbeat_and_status() {
    let (r, clock) = registry();
    clock.advance(Duration::from_secs(10));
    let a = assigned(r.admit(&t("o/r", 5), &e("d1")));
    clock.advance(Duration::from_secs(3));
    r.heartbeat(a.worker).unwrap();
    clock.advance(Duration::from_secs(2));

    let w = r.worker(a.worker).expect("record exists");
    assert_eq!(w.id, a.worker);
    assert_eq!(w.target, Some(t("o/r", 5)));
    assert_eq!(w.kind, WorkerKind::Spawned);
    assert_eq!(w.status, Status::Active);
    assert_eq!(w.activity, Activity::Busy, "created for an event");
    assert_eq!(w.pool_status(), PoolStatus::Busy);
    assert!(w.has_heartbeated);
    assert_eq!(w.heartbeat_age, Duration::from_secs(2));
    assert_eq!(w.uptime, Duration::from_secs(5));
    assert_eq!(
        w.last_heartbeat.duration_since(w.started_at).unwrap(),
        Duration::from_secs(3),
        "wall-clock display times derive from the monotonic clock"
    );
    assert_eq!(w.token, a.token);
    assert_eq!(w.died_at, None);
}

// ---- AC2: idempotency ---------------------------------------------------------------------------

#[test]
fn ac2_unbound_claim_is_released_after_the_heartbeat_timeout() {
    let (r, clock) = registry();
    let (target, event) = (t("o/r", 1), e("x"));
    r.claim(&target, &event);
    clock.advance(TIMEOUT);
    assert!(matches!(
        r.claim(&target, &event),
        ClaimOutcome::AlreadyClaimed(_)
    ));
    clock.advance(MS);
    let report = r.sweep();
    assert_eq!(
        report.released_pairs(),
        vec![(target.clone(), event.clone())]
    );
    assert_eq!(r.claim(&target, &event), ClaimOutcome::Claimed);
}

#[test]
fn ac2_duplicate_claim_from_many_threads_has_exactly_one_winner() {
    for round in 0..50 {
        let (r, _clock) = registry();
        let target = t("o/r", 1);
        let event = e(&format!("race-{round}"));
        let threads = 4;
        let barrier = Arc::new(Barrier::new(threads));
        let outcomes: Vec<Admission> = (0..threads)
            .map(|_| {
                let (r, target, event, barrier) =
                    (r.clone(), target.clone(), event.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    r.admit(&target, &event)
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let winners: Vec<_> = outcomes
            .iter()
            .filter_map(|o| match o {
                Admission::Assigned(a) => Some(a.worker),
                _ => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        for o in &outcomes {
            if let Admission::Duplicate(d) = o {
                assert_eq!(d.holder, Some(winners[0]));
            }
        }
        assert_eq!(r.live_workers(), 1);
        assert_eq!(r.stats().duplicates, threads as u64 - 1);
    }
}

#[test]
fn ac2_completed_claim_is_retained_for_late_redeliveries_then_forgotten() {
    let config = RegistryConfig::builder()
        .claim_retention(Duration::from_secs(3600))
        .build()
        .unwrap();
    let (r, clock) = registry_with(config);
    let (target, event) = (t("o/r", 1), e("d"));
    let a = assigned(r.admit(&target, &event));
    r.complete(&target, &event).unwrap();
    r.complete(&target, &event).unwrap(); // idempotent
    r.deregister(a.worker).unwrap(); // the worker is gone; the claim stays
    clock.advance(Duration::from_secs(3600));
    r.sweep();
    let Admission::Duplicate(d) = r.admit(&target, &event) else {
        panic!("still within retention")
    };
    assert_eq!(d.state, ClaimState::Completed);
    clock.advance(MS);
    let report = r.sweep();
    assert_eq!(report.expired_claims, 1);
    assert!(matches!(r.admit(&target, &event), Admission::Assigned(_)));
}

#[test]
fn ac2_admit_rejected_leaves_no_claim_behind() {
    let config = RegistryConfig::builder().max_workers(1).build().unwrap();
    let (r, _clock) = registry_with(config);
    let first = assigned(r.admit(&t("o/a", 1), &e("a")));
    let (target, event) = (t("o/b", 1), e("b"));
    assert_eq!(
        r.admit(&target, &event),
        Admission::Rejected(Rejection::CapacityFull { limit: 1 })
    );
    assert_eq!(r.claim_count(), 1, "only the first delivery's claim");
    assert!(matches!(
        r.complete(&target, &event),
        Err(RegistryError::UnknownClaim { .. })
    ));
    // Capacity frees up: the redelivery is admitted, not treated as a duplicate.
    r.deregister(first.worker).unwrap();
    assert!(matches!(r.admit(&target, &event), Admission::Assigned(_)));
}

// ---- AC3: assignment ----------------------------------------------------------------------------

#[test]
fn ac3_capacity_is_never_exceeded_by_racing_threads() {
    for round in 0..20 {
        let config = RegistryConfig::builder().max_workers(5).build().unwrap();
        let (r, _clock) = registry_with(config);
        let barrier = Arc::new(Barrier::new(4));
        let created: usize = (0..4)
            .map(|th| {
                let (r, barrier) = (r.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    (0..10)
                        .filter(|i| {
                            let target = Target::new("o/r", 1 + th * 100 + i).unwrap();
                            matches!(r.assign(&target), AssignOutcome::Assigned(a) if a.new)
                        })
                        .count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(created, 5, "round {round}");
        assert_eq!(r.live_workers(), 5);
        r.sweep();
        assert_eq!(r.status().capacity.used, 5);
    }
}

#[test]
fn ac3_draining_target_gets_no_second_worker_until_the_first_is_dead() {
    let (r, _clock) = registry();
    let target = t("o/r", 1);
    let a = assigned(r.admit(&target, &e("1")));
    r.drain(a.worker).unwrap();
    assert_eq!(
        r.admit(&target, &e("2")),
        Admission::Rejected(Rejection::TargetDraining { worker: a.worker })
    );
    assert_eq!(r.claim_count(), 1, "the rejected delivery left no claim");
    r.loop_finished(a.worker).unwrap();
    let b = assigned(r.admit(&target, &e("2")));
    assert!(b.new);
    assert_ne!(b.worker, a.worker);
    assert!(b.token > a.token, "the new owner's tokens are higher");
}

// ---- AC4: stale detection -----------------------------------------------------------------------

#[test]
fn ac4_missing_n_intervals_is_dead_and_releases_target_and_claims() {
    let (r, clock) = registry();
    let target = t("o/r", 1);
    let event = e("in-flight");
    let a = assigned(r.admit(&target, &event));
    r.heartbeat(a.worker).unwrap();

    // exactly N intervals: not yet
    assert!(advance_sweeping(&r, &clock, TIMEOUT).died.is_empty());
    assert_eq!(r.heartbeat(a.worker), Ok(HeartbeatAck::Active));

    let report = advance_sweeping(&r, &clock, TIMEOUT + MS);
    assert_eq!(report.died, vec![(a.worker, DeadReason::MissedHeartbeats)]);
    assert_eq!(report.released_targets, vec![target.clone()]);
    assert_eq!(
        report.released_pairs(),
        vec![(target.clone(), event.clone())]
    );
    assert_eq!(r.live_workers(), 0);
    assert_eq!(
        r.heartbeat(a.worker),
        Err(RegistryError::WorkerDead {
            id: a.worker,
            reason: DeadReason::MissedHeartbeats
        }),
        "a dead worker's heartbeat is refused: it is fenced"
    );
    // Target unassigned: the redelivery of the released event runs on a new worker.
    let b = assigned(r.admit(&target, &event));
    assert!(b.new);
    assert_ne!(b.worker, a.worker);
    assert_eq!(r.stats().deaths_missed_heartbeats, 1);
    assert_eq!(r.stats().claims_released, 1);
}

#[test]
fn ac4_heartbeats_keep_a_worker_alive_indefinitely() {
    let (r, clock) = registry();
    let w = r.register().unwrap();
    for _ in 0..100 {
        clock.advance(HB);
        assert_eq!(w.heartbeat(), Ok(HeartbeatAck::Active));
        assert!(r.sweep().died.is_empty());
    }
}

#[test]
fn ac4_new_worker_is_measured_from_its_assignment_with_startup_grace() {
    let config = RegistryConfig::builder()
        .startup_grace(Duration::from_secs(30))
        .build()
        .unwrap();
    let (r, clock) = registry_with(config);
    clock.advance(Duration::from_secs(1000)); // time before creation does not count
    let a = assigned(r.admit(&t("o/r", 1), &e("d")));
    clock.advance(TIMEOUT + Duration::from_secs(30));
    assert!(r.sweep().died.is_empty(), "within timeout + start-up grace");
    clock.advance(MS);
    assert_eq!(r.sweep().died.len(), 1);
    assert!(r.heartbeat(a.worker).is_err());
}

// ---- AC5, AC6 ----------------------------------------------------------------------------------
//
// Drain and the status snapshot: entirely in the conformance suite (`cases::drain`,
// `cases::snapshot`).

// ---- errors -------------------------------------------------------------------------------------

#[test]
fn unknown_worker_is_a_typed_error_for_every_worker_call() {
    let (r, _clock) = registry();
    let id = WorkerId::new(12345);
    let unknown = RegistryError::UnknownWorker { id };
    assert_eq!(r.heartbeat(id), Err(unknown.clone()));
    assert_eq!(r.drain(id), Err(unknown.clone()));
    assert_eq!(r.loop_started(id), Err(unknown.clone()));
    assert_eq!(r.loop_finished(id), Err(unknown.clone()));
    assert_eq!(r.deregister(id), Err(unknown.clone()));
    assert_eq!(r.handle(id).map(|_| ()), Err(unknown));
    assert!(r.worker(id).is_none());
    assert_eq!(r.stats().heartbeats_refused, 1);
}

#[test]
fn a_fenced_worker_cannot_complete_the_claim_of_its_successor() {
    let (r, clock) = registry();
    let (target, event) = (t("o/r", 1), e("d"));
    let old = assigned(r.admit(&target, &event));
    let old_handle = r.handle(old.worker).unwrap();
    clock.advance(TIMEOUT + MS);
    let report = r.sweep(); // old dies; its event is released and re-admitted
    assert_eq!(
        report.released_pairs(),
        vec![(target.clone(), event.clone())]
    );
    let new = assigned(r.admit(&target, &event));
    assert_ne!(new.worker, old.worker);

    // The dead worker's late completion must not complete the new worker's claim.
    assert_eq!(
        old_handle.complete(&target, &event),
        Err(RegistryError::NotHolder {
            target: target.clone(),
            delivery: event.clone(),
            holder: Some(new.worker),
            worker: old.worker,
        })
    );
    let Admission::Duplicate(d) = r.admit(&target, &event) else {
        panic!()
    };
    assert_eq!(d.holder, Some(new.worker));
    assert_eq!(
        d.state,
        ClaimState::InFlight,
        "still the new worker's, in flight"
    );
    r.handle(new.worker)
        .unwrap()
        .complete(&target, &event)
        .unwrap();
    let Admission::Duplicate(d) = r.admit(&target, &event) else {
        panic!()
    };
    assert_eq!(d.state, ClaimState::Completed);
}
