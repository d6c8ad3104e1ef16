//! Race 7: completing a delivery against its worker's death (deregister, or a sweep's kill).
//!
//! Invariant `claim-ends-once`: the claim ends in exactly one state, consistent with what
//! `complete()` returned: `Ok` means it is retained as completed (never reported released, a
//! redelivery is a duplicate); an error (`ClaimReleased`, or `UnknownClaim` once the sweep removed
//! it) means it was released for re-dispatch (reported by a sweep, a redelivery is admitted again).
//! Guard: `complete` decides and writes under the claim's shard lock, which the sweep's release
//! also takes.
//! Twin: `Fault::CompleteCheckThenWrite` (decide under one lock, write under a second).
#![cfg(worker_registry_loom)]

use std::time::Duration;

use loom_tests::{
    check, check_fails, event, invariant, registry, spawn, target, EXHAUSTIVE, INTERVAL, MISSED,
};
use worker_registry::{Admission, ClaimState, Fault, RegistryError};

#[derive(Clone, Copy)]
enum Death {
    /// The worker deregisters, then a sweep releases its claims.
    Deregister,
    /// The worker is silent; a sweep kills it and releases its claims in one pass.
    Sweep,
}

fn complete_against_death(faults: &'static [Fault], death: Death) {
    let (reg, clock) = registry(4, faults);
    let (t, e) = (target(1), event(1));
    let Admission::Assigned(a) = reg.admit(&t, &e) else {
        panic!("first delivery is assigned");
    };
    let w = a.worker;
    if let Death::Sweep = death {
        clock.advance(INTERVAL * MISSED + Duration::from_millis(1));
    }

    let completer = {
        let (reg, t, e) = (reg.clone(), t.clone(), e.clone());
        spawn(move || reg.complete(&t, &e))
    };
    if let Death::Deregister = death {
        reg.deregister(w).expect("alive until now");
    }
    let mut released = reg.sweep().released_pairs();
    let completed = completer.join().unwrap();
    released.extend(reg.sweep().released_pairs());

    let was_released = released.contains(&(t.clone(), e.clone()));
    invariant!(
        "claim-ends-once",
        completed.is_ok() != was_released,
        "complete() returned {completed:?}, released for re-dispatch: {was_released}"
    );
    invariant!(
        "claim-ends-once",
        matches!(
            completed,
            Ok(()) | Err(RegistryError::ClaimReleased { .. } | RegistryError::UnknownClaim { .. })
        ),
        "unexpected answer {completed:?}"
    );
    let redelivery = reg.admit(&t, &e);
    let consistent = match (&completed, &redelivery) {
        (Ok(()), Admission::Duplicate(d)) => d.state == ClaimState::Completed,
        (Err(_), Admission::Assigned(n)) => n.worker != w,
        _ => false,
    };
    invariant!(
        "claim-ends-once",
        consistent,
        "complete() returned {completed:?}, but a redelivery got {redelivery:?}"
    );
}

#[test]
fn complete_against_deregister() {
    check("complete_against_deregister", EXHAUSTIVE, || {
        complete_against_death(&[], Death::Deregister)
    });
}

#[test]
fn complete_against_sweep_kill() {
    check("complete_against_sweep_kill", EXHAUSTIVE, || {
        complete_against_death(&[], Death::Sweep)
    });
}

#[test]
fn twin_complete_check_then_write_is_caught_deregister() {
    check_fails(
        "complete_check_then_write_deregister",
        EXHAUSTIVE,
        "claim-ends-once",
        || complete_against_death(&[Fault::CompleteCheckThenWrite], Death::Deregister),
    );
}

#[test]
fn twin_complete_check_then_write_is_caught_sweep() {
    check_fails(
        "complete_check_then_write_sweep",
        EXHAUSTIVE,
        "claim-ends-once",
        || complete_against_death(&[Fault::CompleteCheckThenWrite], Death::Sweep),
    );
}
