//! Race 10: a sweep finds a delivery stuck in flight while its worker completes it.
//!
//! Invariant `stuck-xor-completed`: the delivery ends completed XOR released as stuck, matching
//! what `complete_by` returned: `Ok` means it is retained as completed (a redelivery is a
//! duplicate), it was not reported and the worker was not drained; an error means it was
//! released (`ClaimReleased { reason: Stuck }`), reported once by the sweep with its holder, the
//! worker drained, and the stuck counter is 1.
//! Guard: the sweep decides "stuck" and marks the claim released under the claim's shard lock,
//! which `complete_by` also takes to decide and write.
//! Twins: `twins/complete-check-then-write.patch` (the completion decides under one lock and
//! writes under another) and `twins/stuck-release-on-stale-read.patch` (the sweep picks stuck
//! claims in one pass and releases them in a second without looking again).
#![cfg(worker_registry_loom)]

use std::time::Duration;

use loom_tests::{check, event, invariant, registry_with, spawn, target, EXHAUSTIVE};
use worker_registry::{Admission, ClaimState, RegistryError, Rejection, ReleaseReason, Status};

fn stuck_release_against_completion() {
    let (reg, clock) = registry_with(4, |c| c.max_in_flight(Duration::from_secs(1)));
    let (t, e) = (target(1), event(1));
    let Admission::Assigned(a) = reg.admit(&t, &e) else {
        panic!("first delivery is assigned");
    };
    let w = a.worker;
    // In flight just past max_in_flight, well within the heartbeat timeout.
    clock.advance(Duration::from_millis(1001));

    let sweeper = {
        let reg = reg.clone();
        spawn(move || reg.sweep())
    };
    let completed = reg.complete_by(w, &t, &e);
    let report = sweeper.join().unwrap();

    let stuck: Vec<_> = report.released.iter().filter(|r| r.delivery == e).collect();
    let released = !stuck.is_empty();
    invariant!(
        "stuck-xor-completed",
        completed.is_ok() != released,
        "complete_by returned {completed:?}; the sweep released {:?}",
        report.released
    );
    let status = reg.worker(w).map(|i| i.status);
    let redelivery = reg.admit(&t, &e);
    if released {
        invariant!(
            "stuck-xor-completed",
            stuck.len() == 1
                && stuck[0].reason == ReleaseReason::Stuck
                && stuck[0].holder == Some(w)
                && report.drained_stuck == vec![w]
                && status == Some(Status::Draining)
                && reg.stats().claims_stuck == 1,
            "released: {:?}, drained {:?}, worker {status:?}, {:?}",
            report.released,
            report.drained_stuck,
            reg.stats()
        );
        invariant!(
            "stuck-xor-completed",
            matches!(
                completed,
                Err(RegistryError::ClaimReleased {
                    reason: ReleaseReason::Stuck,
                    ..
                })
            ) && redelivery == Admission::Rejected(Rejection::TargetDraining { worker: w }),
            "released as stuck, yet complete_by {completed:?}, redelivery {redelivery:?}"
        );
    } else {
        invariant!(
            "stuck-xor-completed",
            report.drained_stuck.is_empty()
                && status == Some(Status::Active)
                && reg.stats().claims_stuck == 0
                && matches!(&redelivery, Admission::Duplicate(d) if d.state == ClaimState::Completed),
            "completed, yet drained {:?}, worker {status:?}, redelivery {redelivery:?}",
            report.drained_stuck
        );
    }
}

#[test]
fn stuck_release_against_completion_concurrently() {
    check(
        "stuck_release_against_completion_concurrently",
        EXHAUSTIVE,
        || stuck_release_against_completion(),
    );
}
