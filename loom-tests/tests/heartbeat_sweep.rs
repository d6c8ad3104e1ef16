//! Race 4: a worker's heartbeat against a sweep, at the moment the worker becomes stale.
//!
//! Invariant `beat-xor-death`: exactly one wins. Either the heartbeat is accepted and the sweep
//! spares the worker, or the sweep declares it dead and the heartbeat is refused; never
//! "heartbeat accepted" and "marked dead" for the same beat.
//! Invariant `dead-stays-dead`: once refused, later heartbeats are refused too, and a dead worker
//! ends dead (reason `MissedHeartbeats`) with its target released and its slot freed.
//! Guard: every change of the state word is one CAS (`StateCell::transition`), and the sweep's
//! kill re-checks staleness on the word its CAS sees.
//! Invariant `beat-clears-suspicion` (the mass-staleness brake engaged): a heartbeat racing the
//! sweep that marks every silent worker suspect is never lost: its worker ends alive, not suspect,
//! with the new beat recorded; no worker dies while the brake holds.
//! Twins: `twins/transition-load-store.patch` (load, decide, store), for both models;
//! `twins/handle-beat-after-death.patch` (a handle accepts its dead worker's beat) for
//! `dead-stays-dead`.
#![cfg(worker_registry_loom)]

use std::time::Duration;

use loom_tests::{
    braking_registry, check, event, invariant, registry, spawn, target, EXHAUSTIVE, INTERVAL,
    MISSED,
};
use worker_registry::{Admission, DeadReason, RegistryError, Status, WorkerId};

fn heartbeat_at_the_threshold() {
    let (reg, clock) = registry(4);
    let t = target(1);
    let Admission::Assigned(a) = reg.admit(&t, &event(1)) else {
        panic!("first delivery is assigned");
    };
    let w = a.worker;
    reg.heartbeat(w).expect("alive");
    // One millisecond past the timeout: stale for a sweep that reads the old beat.
    clock.advance(INTERVAL * MISSED + Duration::from_millis(1));

    let beats = {
        let reg = reg.clone();
        spawn(move || {
            let first = reg.heartbeat(w);
            let second = reg.handle(w).and_then(|h| h.heartbeat());
            (first, second)
        })
    };
    let report = reg.sweep();
    let (first, second) = beats.join().unwrap();

    let died = report.died.contains(&(w, DeadReason::MissedHeartbeats));
    invariant!(
        "beat-xor-death",
        first.is_ok() != died,
        "heartbeat {first:?}, sweep died={died} ({:?})",
        report.died
    );
    invariant!(
        "dead-stays-dead",
        !(first.is_err() && second.is_ok()),
        "a refused worker came back: {first:?} then {second:?}"
    );
    invariant!(
        "beat-xor-death",
        !(died && second.is_ok()),
        "a worker the sweep killed accepted a heartbeat: {second:?}"
    );
    let status = reg.worker(w).map(|i| i.status);
    let after = reg.heartbeat(w);
    let s = reg.stats();
    if died {
        invariant!(
            "dead-stays-dead",
            status == Some(Status::Dead(DeadReason::MissedHeartbeats))
                && matches!(after, Err(RegistryError::WorkerDead { .. }))
                && report.released_targets == vec![t.clone()]
                && (s.live_workers, s.deaths_missed_heartbeats) == (0, 1),
            "dead worker: status {status:?}, next beat {after:?}, released {:?}, {s:?}",
            report.released_targets
        );
    } else {
        invariant!(
            "beat-xor-death",
            status == Some(Status::Active)
                && after.is_ok()
                && report.released_targets.is_empty()
                && (s.live_workers, s.deaths_missed_heartbeats) == (1, 0),
            "spared worker: status {status:?}, next beat {after:?}, {s:?}"
        );
    }
}

/// Three workers all silent past the timeout: the brake (more than half of at least three) makes
/// the sweep mark them suspect instead of dead, while one of them heartbeats.
fn heartbeat_against_braking_sweep() {
    let (reg, clock) = braking_registry(4);
    let workers: Vec<WorkerId> = (1..=3)
        .map(|n| match reg.admit(&target(n), &event(n)) {
            Admission::Assigned(a) => a.worker,
            other => panic!("capacity for three: {other:?}"),
        })
        .collect();
    clock.advance(INTERVAL * MISSED + Duration::from_millis(1));
    let w = workers[0];

    let beat = {
        let reg = reg.clone();
        spawn(move || reg.heartbeat(w))
    };
    let report = reg.sweep();
    let beat = beat.join().unwrap();

    invariant!(
        "beat-clears-suspicion",
        beat.is_ok() && report.brake_engaged && report.died.is_empty(),
        "heartbeat {beat:?}; brake {} with deaths {:?}",
        report.brake_engaged,
        report.died
    );
    let info = reg.worker(w).expect("tracked");
    invariant!(
        "beat-clears-suspicion",
        info.status == Status::Active && !info.suspect && info.heartbeat_age == Duration::ZERO,
        "the accepted heartbeat was lost: {info:?} (suspected: {:?})",
        report.suspected
    );
    for other in &workers[1..] {
        let info = reg.worker(*other).expect("tracked");
        invariant!(
            "beat-clears-suspicion",
            info.status == Status::Active && info.suspect,
            "a silent worker under the brake is suspect, not dead: {info:?}"
        );
    }
}

#[test]
fn heartbeat_against_sweep_at_threshold() {
    check("heartbeat_against_sweep_at_threshold", EXHAUSTIVE, || {
        heartbeat_at_the_threshold()
    });
}

#[test]
fn heartbeat_against_braking_sweep_concurrently() {
    check(
        "heartbeat_against_braking_sweep_concurrently",
        EXHAUSTIVE,
        || heartbeat_against_braking_sweep(),
    );
}
