//! Race 1: two deliveries of the same (target, event) at once.
//!
//! Invariant `one-winner-per-delivery`: exactly one of them is `Assigned` (or `Claimed` for a bare
//! claim), the other is a duplicate naming the winner's worker; one worker exists.
//! Guard: the claims map's entry API (look and insert under one shard lock).
//! Twins: `twins/admit-check-then-insert.patch` and `twins/claim-check-then-insert.patch` (look
//! up, then insert under a second lock).
#![cfg(worker_registry_loom)]

use loom_tests::{check, event, invariant, registry, spawn, target, EXHAUSTIVE};
use worker_registry::{Admission, ClaimOutcome};

fn admit_same_delivery_twice() {
    let (reg, _clock) = registry(4);
    let (t, e) = (target(1), event(1));
    let other = {
        let (reg, t, e) = (reg.clone(), t.clone(), e.clone());
        spawn(move || reg.admit(&t, &e))
    };
    let mine = reg.admit(&t, &e);
    let theirs = other.join().unwrap();

    let outcomes = [&mine, &theirs];
    let winners: Vec<_> = outcomes
        .iter()
        .filter_map(|a| match a {
            Admission::Assigned(a) => Some(a.worker),
            _ => None,
        })
        .collect();
    invariant!(
        "one-winner-per-delivery",
        winners.len() == 1,
        "{} deliveries assigned: {mine:?} / {theirs:?}",
        winners.len()
    );
    let holder = outcomes.iter().find_map(|a| match a {
        Admission::Duplicate(d) => Some(d.holder),
        _ => None,
    });
    invariant!(
        "one-winner-per-delivery",
        holder == Some(Some(winners[0])),
        "the duplicate must name the winner: {mine:?} / {theirs:?}"
    );
    let s = reg.stats();
    invariant!(
        "one-winner-per-delivery",
        (s.admitted_new, s.duplicates, s.live_workers) == (1, 1, 1),
        "stats disagree with the outcomes: {s:?}"
    );
}

fn claim_same_delivery_twice() {
    let (reg, _clock) = registry(4);
    let (t, e) = (target(1), event(1));
    let other = {
        let (reg, t, e) = (reg.clone(), t.clone(), e.clone());
        spawn(move || reg.claim(&t, &e))
    };
    let mine = reg.claim(&t, &e);
    let theirs = other.join().unwrap();
    let claimed = [&mine, &theirs]
        .iter()
        .filter(|c| matches!(c, ClaimOutcome::Claimed))
        .count();
    invariant!(
        "one-winner-per-delivery",
        claimed == 1,
        "{claimed} claims won: {mine:?} / {theirs:?}"
    );
    invariant!(
        "one-winner-per-delivery",
        reg.claim_count() == 1 && reg.stats().duplicates == 1,
        "one claim and one duplicate expected: {} claims, {:?}",
        reg.claim_count(),
        reg.stats()
    );
}

#[test]
fn admit_same_delivery_concurrently() {
    check("admit_same_delivery_concurrently", EXHAUSTIVE, || {
        admit_same_delivery_twice()
    });
}

#[test]
fn claim_same_delivery_concurrently() {
    check("claim_same_delivery_concurrently", EXHAUSTIVE, || {
        claim_same_delivery_twice()
    });
}
