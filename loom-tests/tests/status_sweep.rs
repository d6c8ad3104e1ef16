//! Race 8: `status()` readers against sweeps publishing snapshots while workers change.
//!
//! Invariant `snapshot-consistent`: every snapshot a reader gets agrees with itself (its counts are
//! the counts of its own worker list, `capacity.used` is its live workers).
//! Invariant `generation-monotone`: two reads in a row never go back to an older generation.
//! Guards: a snapshot's counts are computed from the one list it is published with, in one store;
//! sweeps (and so publications) are serialised by the sweep mutex.
//! Twins: `Fault::SnapshotCountsSecondPass` (counts from a second read of the workers) and
//! `Fault::PublishOutsideSweepLock` (a sweep publishes after releasing the mutex).
#![cfg(worker_registry_loom)]

use loom_tests::{check, check_fails, event, invariant, registry, spawn, target, EXHAUSTIVE};
use worker_registry::{Admission, Fault, StatusCounts, StatusSnapshot};

fn assert_consistent(s: &StatusSnapshot) {
    let c = StatusCounts::of(&s.workers);
    invariant!(
        "snapshot-consistent",
        s.counts == c
            && s.capacity.used == c.active + c.draining
            && c.active + c.draining + c.dead == s.workers.len(),
        "generation {}: counts {:?} / capacity {:?}, but its list counts {c:?}",
        s.version,
        s.counts,
        s.capacity
    );
}

/// A sweep publishes while a worker dies; the model thread reads twice.
fn status_against_sweep(faults: &'static [Fault]) {
    let (reg, _clock) = registry(4, faults);
    let Admission::Assigned(a) = reg.admit(&target(1), &event(1)) else {
        panic!("first delivery is assigned");
    };
    let _pool = reg.register().expect("capacity");

    let sweeper = {
        let reg = reg.clone();
        spawn(move || reg.sweep().version)
    };
    let leaver = {
        let reg = reg.clone();
        spawn(move || reg.deregister(a.worker))
    };
    let first = reg.status();
    let second = reg.status();
    assert_consistent(&first);
    assert_consistent(&second);
    invariant!(
        "generation-monotone",
        second.version >= first.version,
        "read generation {} after {}",
        second.version,
        first.version
    );
    let published = sweeper.join().unwrap();
    leaver.join().unwrap().expect("alive until now");
    let last = reg.status();
    assert_consistent(&last);
    invariant!(
        "generation-monotone",
        last.version == published && published == 1,
        "one sweep published generation {published}; a reader now sees {}",
        last.version
    );
}

/// Two sweeps publish concurrently; the model thread reads twice.
fn status_against_two_sweeps(faults: &'static [Fault]) {
    let (reg, _clock) = registry(4, faults);
    let _pool = reg.register().expect("capacity");
    let sweepers: Vec<_> = (0..2)
        .map(|_| {
            let reg = reg.clone();
            spawn(move || reg.sweep().version)
        })
        .collect();
    let first = reg.status();
    let second = reg.status();
    invariant!(
        "generation-monotone",
        second.version >= first.version,
        "read generation {} after {}",
        second.version,
        first.version
    );
    let mut gens: Vec<u64> = sweepers.into_iter().map(|h| h.join().unwrap()).collect();
    gens.sort_unstable();
    let last = reg.status();
    invariant!(
        "generation-monotone",
        gens == [1, 2] && last.version == 2,
        "sweeps published {gens:?}; a reader now sees {}",
        last.version
    );
    assert_consistent(&last);
}

#[test]
fn status_against_sweep_and_death() {
    check("status_against_sweep_and_death", EXHAUSTIVE, || {
        status_against_sweep(&[])
    });
}

#[test]
fn twin_snapshot_counts_second_pass_is_caught() {
    check_fails(
        "snapshot_counts_second_pass",
        EXHAUSTIVE,
        "snapshot-consistent",
        || status_against_sweep(&[Fault::SnapshotCountsSecondPass]),
    );
}

#[test]
fn status_against_two_sweeps_publishing() {
    check("status_against_two_sweeps_publishing", EXHAUSTIVE, || {
        status_against_two_sweeps(&[])
    });
}

#[test]
fn twin_publish_outside_sweep_lock_is_caught() {
    check_fails(
        "publish_outside_sweep_lock",
        EXHAUSTIVE,
        "generation-monotone",
        || status_against_two_sweeps(&[Fault::PublishOutsideSweepLock]),
    );
}
