//! Race 12: a worker created while a sweep runs, and the sweep's own list of workers.
//!
//! Invariant `roster-complete`: a worker whose creation returned before a sweep started (seen
//! through a flag the creating thread sets afterwards) is in that sweep's snapshot; whatever the
//! order, the next sweep's snapshot lists every worker exactly once, with counts and capacity
//! that agree with the live count.
//! Guard: a new worker is announced on the roster's channel before its creation returns, and a
//! sweep takes in every announced worker before it reads any.
//! Twins: `twins/roster-late-intake.patch` (the sweep takes in new workers after its pass: caught
//! in every sequential order too); `twins/roster-intake-drops-unindexed.patch` (creation announces
//! before it indexes, and intake drops what the map does not list: caught only when the sweep's
//! intake runs inside a creation, two preemptions; the runner checks that the model passes with at
//! most one).
#![cfg(worker_registry_loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom_tests::{check, event, invariant, registry, spawn, target, EXHAUSTIVE};
use worker_registry::{Admission, StatusCounts};

fn creation_against_sweep() {
    let (reg, _clock) = registry(4);
    let Admission::Assigned(first) = reg.admit(&target(1), &event(1)) else {
        panic!("first delivery is assigned");
    };
    let created = Arc::new(AtomicBool::new(false));
    let creator = {
        let (reg, created) = (reg.clone(), created.clone());
        spawn(move || {
            let w = reg.register().expect("capacity");
            // Release: whoever sees the flag sees the creation.
            created.store(true, Ordering::Release);
            w.id()
        })
    };
    // Acquire: pairs with the Release above.
    let seen = created.load(Ordering::Acquire);
    let report = reg.sweep();
    let snap = reg.status();
    let w = creator.join().unwrap();
    if seen {
        invariant!(
            "roster-complete",
            snap.worker(w).is_some(),
            "worker {w} was created before sweep {} started but is not in it",
            report.version
        );
    }
    reg.sweep();
    let snap = reg.status();
    let mut ids: Vec<_> = snap.workers.iter().map(|i| i.id).collect();
    ids.sort();
    let mut expected = vec![first.worker, w];
    expected.sort();
    invariant!(
        "roster-complete",
        ids == expected,
        "the snapshot lists {ids:?}, the registry has {expected:?}"
    );
    invariant!(
        "roster-complete",
        snap.counts == StatusCounts::of(&snap.workers)
            && snap.capacity.used == 2
            && reg.live_workers() == 2,
        "counts {:?}, capacity {:?}, live {}",
        snap.counts,
        snap.capacity,
        reg.live_workers()
    );
}

#[test]
fn creation_against_sweep_concurrently() {
    check("creation_against_sweep_concurrently", EXHAUSTIVE, || {
        creation_against_sweep()
    });
}
