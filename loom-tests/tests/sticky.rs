//! Race 2: two different deliveries for the same, not yet assigned, target at once.
//!
//! Invariant `one-worker-per-target`: exactly one worker is created, both deliveries are assigned
//! to it (one `new`, one sticky), and the target stays mapped to it.
//! Guard: the targets map's entry API (look up and create-and-insert under one shard lock).
//! Twin: `twins/target-check-then-insert.patch` (look up, then create and insert outside that
//! lock).
#![cfg(worker_registry_loom)]

use loom_tests::{check, event, invariant, registry, spawn, target, EXHAUSTIVE};
use worker_registry::{Admission, AssignOutcome};

fn two_events_for_a_new_target() {
    let (reg, _clock) = registry(4);
    let t = target(1);
    let e1 = event(1);
    // A different delivery, so a different claims key (under loom every key has a shard of its
    // own): both admits race on the targets map, not on one claims lock.
    let e2 = event(2);
    let other = {
        let (reg, t) = (reg.clone(), t.clone());
        spawn(move || reg.admit(&t, &e2))
    };
    let mine = reg.admit(&t, &e1);
    let theirs = other.join().unwrap();

    let (Admission::Assigned(a), Admission::Assigned(b)) = (&mine, &theirs) else {
        panic!("both deliveries must be assigned: {mine:?} / {theirs:?}");
    };
    invariant!(
        "one-worker-per-target",
        a.worker == b.worker && a.new != b.new,
        "one new worker, shared: {a:?} / {b:?}"
    );
    let s = reg.stats();
    invariant!(
        "one-worker-per-target",
        (s.admitted_new, s.admitted_sticky, s.live_workers) == (1, 1, 1),
        "one worker created, one sticky assignment: {s:?}"
    );
    let AssignOutcome::Assigned(again) = reg.assign(&t) else {
        panic!("the target's worker is active");
    };
    invariant!(
        "one-worker-per-target",
        again.worker == a.worker && !again.new,
        "the target must stay mapped to its worker: {again:?} after {a:?}"
    );
}

#[test]
fn two_events_for_a_new_target_concurrently() {
    check(
        "two_events_for_a_new_target_concurrently",
        EXHAUSTIVE,
        || two_events_for_a_new_target(),
    );
}
