//! Race 11: completions racing past the retained-claims bound, evicting as they go.
//!
//! Invariant `retained-bound`: with `max_retained_claims` = 2, one claim already retained (the
//! oldest) and two more completed at once on different shards: when both calls have returned,
//! exactly two claims are retained, exactly one was evicted and it is the oldest (its redelivery
//! is admitted again, both newer ones are still duplicates), and the gauge, the stats and the
//! snapshot agree.
//! Guard: every completion adds to one retained counter with a read-modify-write and evicts once
//! if the total it produced is over the bound; eviction pops the front of the shard whose oldest
//! claim is oldest, under that shard's lock.
//! Twin: `twins/retained-check-then-add.patch` (decide "over the bound?" on a load, then add).
#![cfg(worker_registry_loom)]

use std::time::Duration;

use loom_tests::{check, event, invariant, registry_with, spawn, target, EXHAUSTIVE};
use worker_registry::{Admission, ClaimState};

fn two_completions_past_the_bound() {
    let (reg, clock) = registry_with(4, |c| c.max_retained_claims(2));
    let (t, old, b, c) = (target(1), event(1), event(2), event(3));
    let Admission::Assigned(a) = reg.admit(&t, &old) else {
        panic!("first delivery is assigned");
    };
    reg.complete_by(a.worker, &t, &old).expect("in flight");
    clock.advance(Duration::from_millis(1));
    for e in [&b, &c] {
        assert!(matches!(reg.admit(&t, e), Admission::Assigned(_)));
    }
    let other = {
        let (reg, t, c) = (reg.clone(), t.clone(), c.clone());
        spawn(move || reg.complete(&t, &c))
    };
    let mine = reg.complete(&t, &b);
    let theirs = other.join().unwrap();
    assert!(mine.is_ok() && theirs.is_ok(), "{mine:?} / {theirs:?}");

    let s = reg.stats();
    invariant!(
        "retained-bound",
        (s.retained_claims, s.claims_evicted, s.claims_completed) == (2, 1, 3),
        "two retained, one evicted: {s:?}"
    );
    for e in [&b, &c] {
        let dup = reg.admit(&t, e);
        invariant!(
            "retained-bound",
            matches!(&dup, Admission::Duplicate(d) if d.state == ClaimState::Completed),
            "a newer completion was evicted: {e} is now {dup:?}"
        );
    }
    let again = reg.admit(&t, &old);
    invariant!(
        "retained-bound",
        matches!(again, Admission::Assigned(_)),
        "the oldest claim must be the one evicted: its redelivery got {again:?}"
    );
    reg.sweep();
    invariant!(
        "retained-bound",
        reg.status().claims.retained == 2,
        "the snapshot counts {:?}",
        reg.status().claims
    );
}

#[test]
fn two_completions_past_the_bound_concurrently() {
    check(
        "two_completions_past_the_bound_concurrently",
        EXHAUSTIVE,
        || two_completions_past_the_bound(),
    );
}
