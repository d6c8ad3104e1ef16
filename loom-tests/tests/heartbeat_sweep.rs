//! Race 4: a worker's heartbeat against a sweep, at the moment the worker becomes stale.
//!
//! Invariant `beat-xor-death`: exactly one wins. Either the heartbeat is accepted and the sweep
//! spares the worker, or the sweep declares it dead and the heartbeat is refused; never
//! "heartbeat accepted" and "marked dead" for the same beat.
//! Invariant `dead-stays-dead`: once refused, later heartbeats are refused too, and a dead worker
//! ends dead (reason `MissedHeartbeats`) with its target released and its slot freed.
//! Guard: every change of the state word is one CAS (`StateCell::transition`), and the sweep's
//! kill re-checks staleness on the word its CAS sees.
//! Twin: `Fault::TransitionLoadStore` (load, decide, store).
#![cfg(worker_registry_loom)]

use std::time::Duration;

use loom_tests::{
    check, check_fails, event, invariant, registry, spawn, target, INTERVAL, MISSED,
    PREEMPTION_BOUND,
};
use worker_registry::{Admission, DeadReason, Fault, RegistryError, Status};

fn heartbeat_at_the_threshold(faults: &'static [Fault]) {
    let (reg, clock) = registry(4, faults);
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

#[test]
fn heartbeat_against_sweep_at_threshold() {
    check(
        "heartbeat_against_sweep_at_threshold",
        PREEMPTION_BOUND,
        || heartbeat_at_the_threshold(&[]),
    );
}

#[test]
fn twin_transition_load_store_is_caught_by_heartbeat_model() {
    check_fails(
        "heartbeat_vs_sweep_load_store",
        PREEMPTION_BOUND,
        "beat-xor-death",
        || heartbeat_at_the_threshold(&[Fault::TransitionLoadStore]),
    );
}
