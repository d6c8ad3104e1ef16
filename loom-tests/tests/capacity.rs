//! Race 3: capacity 1, deliveries for two different new targets at once.
//!
//! One invariant per check, so that a twin names the one that fired:
//! * `capacity-one-admitted`: exactly one is assigned (a new worker), the other is rejected with
//!   `CapacityFull { limit: 1 }`;
//! * `capacity-refusal-leaves-no-claim`: the rejected delivery leaves no claim;
//! * `capacity-stats-agree`: `live_workers()` and the stats count what the outcomes say;
//! * `capacity-snapshot-agrees`: the next snapshot counts the same live workers.
//!
//! Guard: the capacity reservation is one `fetch_update` (check and increment in one RMW).
//! A second model frees the only slot (a deregister) while two new targets compete for it:
//! `capacity-freed-slot-taken-once` (at most one gets it, and never before it is free), then the
//! stats and snapshot checks as above.
//! Twins, one per check: `twins/capacity-check-then-increment.patch` (load and compare, then
//! increment: `capacity-one-admitted`, `capacity-freed-slot-taken-once`),
//! `twins/capacity-refusal-keeps-a-claim.patch`, `twins/capacity-rejections-miscounted.patch` (both
//! models) and `twins/snapshot-counts-dead-as-used.patch` (the freed-slot model: only it has a dead
//! worker).
#![cfg(worker_registry_loom)]

use loom_tests::{check, event, invariant, registry, spawn, target, EXHAUSTIVE};
use worker_registry::{Admission, Rejection, Status};

fn two_targets_one_slot() {
    let (reg, _clock) = registry(1);
    // Different targets and deliveries: under loom every key has a shard of its own, so nothing
    // but the capacity counter is shared.
    let (ta, tb) = (target(1), target(2));
    let other = {
        let reg = reg.clone();
        spawn(move || reg.admit(&tb, &event(2)))
    };
    let mine = reg.admit(&ta, &event(1));
    let theirs = other.join().unwrap();

    let (assigned, full) = tally([&mine, &theirs]);
    invariant!(
        "capacity-one-admitted",
        (assigned, full) == (1, 1),
        "one assigned, one CapacityFull: {mine:?} / {theirs:?}"
    );
    let s = reg.stats();
    invariant!(
        "capacity-stats-agree",
        (s.live_workers, s.admitted_new, s.rejected_capacity) == (1, 1, 1),
        "live_workers() and stats must agree with the outcomes: {s:?}"
    );
    invariant!(
        "capacity-refusal-leaves-no-claim",
        reg.claim_count() == 1,
        "the rejected delivery must leave no claim: {} claims",
        reg.claim_count()
    );
    reg.sweep();
    let snap = reg.status();
    invariant!(
        "capacity-snapshot-agrees",
        snap.capacity.used == 1 && snap.counts.active == 1 && snap.workers.len() == 1,
        "the snapshot must count one live worker: {:?} {:?}",
        snap.capacity,
        snap.counts
    );
}

fn two_targets_one_slot_being_freed() {
    let (reg, _clock) = registry(1);
    let (ta, tb) = (target(1), target(2));
    let holder = reg.register().expect("the one slot");
    let leaver = {
        let holder = holder.clone();
        spawn(move || holder.deregister())
    };
    let other = {
        let reg = reg.clone();
        spawn(move || reg.admit(&tb, &event(2)))
    };
    let mine = reg.admit(&ta, &event(1));
    let theirs = other.join().unwrap();
    leaver.join().unwrap().expect("alive until now");

    let (assigned, full) = tally([&mine, &theirs]);
    invariant!(
        "capacity-freed-slot-taken-once",
        assigned <= 1 && assigned + full == 2,
        "at most one may take the freed slot: {mine:?} / {theirs:?}"
    );
    let s = reg.stats();
    invariant!(
        "capacity-stats-agree",
        (s.live_workers, s.admitted_new, s.rejected_capacity)
            == (assigned, assigned as u64, full as u64),
        "live_workers() and stats must agree with the outcomes ({assigned} assigned): {s:?}"
    );
    reg.sweep();
    let snap = reg.status();
    let live = snap.workers.iter().filter(|w| w.status.is_alive()).count();
    invariant!(
        "capacity-snapshot-agrees",
        live == assigned
            && snap.capacity.used == assigned
            && snap.worker(holder.id()).map(|w| w.status.is_alive()) == Some(false)
            && !matches!(holder.info().status, Status::Active | Status::Draining),
        "the snapshot must show the holder dead and {assigned} live: {:?}",
        snap.workers
    );
}

#[test]
fn two_targets_one_slot_concurrently() {
    check("two_targets_one_slot_concurrently", EXHAUSTIVE, || {
        two_targets_one_slot()
    });
}

#[test]
fn two_targets_one_slot_being_freed_concurrently() {
    check(
        "two_targets_one_slot_being_freed_concurrently",
        EXHAUSTIVE,
        || two_targets_one_slot_being_freed(),
    );
}

/// How many of the outcomes created a worker, and how many were refused for capacity (limit 1).
fn tally(outcomes: [&Admission; 2]) -> (usize, usize) {
    let assigned = outcomes
        .iter()
        .filter(|a| matches!(a, Admission::Assigned(x) if x.new))
        .count();
    let full = outcomes
        .iter()
        .filter(|a| matches!(a, Admission::Rejected(Rejection::CapacityFull { limit: 1 })))
        .count();
    (assigned, full)
}
