//! The payload budget: bytes of payloads held, reserved by one compare-and-swap when an admission
//! stores a payload and given back when the payload leaves (here: a completion).
//!
//! Race 1: a budget with room for one payload, two admissions with one each, for different
//! targets (nothing but the budget counter is shared).
//! * `payload-budget-one-admitted`: exactly one is assigned, the other refused with
//!   `PayloadBudget` (never both: the bytes held would pass the budget);
//! * `payload-refusal-leaves-no-claim`: the refused one leaves no claim and no payload;
//! * `payload-budget-accounted`: the bytes and count held equal those of the payload stored.
//!
//! Race 2: the budget has room for two; one payload is held and completed while another
//! admission reserves its bytes.
//! * `payload-reservation-fits`: the admission is assigned (its bytes fit whatever the order);
//! * `payload-budget-accounted`: at the end exactly the admitted payload is held, its bytes and
//!   count: the release and the reservation are each one read-modify-write, so neither is lost.
//!
//! Guard: the reservation is one `fetch_update` (check and add in one read-modify-write), the
//! release one `fetch_sub`. Twins: `twins/payload-budget-check-then-reserve.patch` (load and
//! compare, then add: `payload-budget-one-admitted` in race 1) and
//! `twins/payload-budget-release-load-store.patch` (the release as a load and a store, which
//! loses a racing reservation: `payload-budget-accounted` in race 2).
#![cfg(worker_registry_loom)]

use loom_tests::{check, event, invariant, registry_with, spawn, target, EXHAUSTIVE};
use worker_registry::{Admission, Payload, Rejection};

/// A payload of 64 body bytes; the budget and the per-payload limit are exactly its size.
fn payload(tag: u8) -> Payload {
    Payload::builder("push", vec![tag; 64]).build().unwrap()
}

/// A registry whose budget holds `room` payloads of [`payload`]'s size; that size.
fn budget_for(
    room: u64,
) -> (
    worker_registry::memory::Direct<worker_registry::ManualClock>,
    u64,
) {
    let size = payload(0).size();
    let (reg, _clock) = registry_with(4, |c| c.max_payload_bytes(size).payload_budget(room * size));
    (reg, size)
}

fn two_payloads_one_slot() {
    let (reg, size) = budget_for(1);
    let (ta, tb) = (target(1), target(2));
    let other = {
        let reg = reg.clone();
        let tb = tb.clone();
        spawn(move || reg.admit_with(&tb, &event(2), Some(&payload(2))).unwrap())
    };
    let mine = reg.admit_with(&ta, &event(1), Some(&payload(1))).unwrap();
    let theirs = other.join().unwrap();

    let assigned = [&mine, &theirs]
        .iter()
        .filter(|a| matches!(a, Admission::Assigned(_)))
        .count();
    let refused = [&mine, &theirs]
        .iter()
        .filter(|a| matches!(a, Admission::Rejected(Rejection::PayloadBudget { .. })))
        .count();
    invariant!(
        "payload-budget-one-admitted",
        (assigned, refused) == (1, 1),
        "one assigned, one refused for the budget: {mine:?} / {theirs:?}"
    );
    let (refused_target, refused_delivery) = if matches!(mine, Admission::Rejected(_)) {
        (ta, event(1))
    } else {
        (tb, event(2))
    };
    invariant!(
        "payload-refusal-leaves-no-claim",
        reg.claim_count() == 1 && reg.payload(&refused_target, &refused_delivery).is_none(),
        "the refused admission must leave nothing: {} claims",
        reg.claim_count()
    );
    let s = reg.stats();
    invariant!(
        "payload-budget-accounted",
        (
            s.payloads_held,
            s.payload_bytes_held,
            s.rejected_payload_budget
        ) == (1, size, 1),
        "one payload held, one refusal counted: {s:?}"
    );
}

fn a_completion_racing_an_admission() {
    let (reg, size) = budget_for(2);
    let (ta, tb) = (target(1), target(2));
    let Ok(Admission::Assigned(_)) = reg.admit_with(&ta, &event(1), Some(&payload(1))) else {
        panic!("the first payload fits the empty budget")
    };
    let done = {
        let reg = reg.clone();
        spawn(move || reg.complete(&ta, &event(1)))
    };
    let asked = reg.admit_with(&tb, &event(2), Some(&payload(2))).unwrap();
    done.join().unwrap().expect("the first delivery completes");

    invariant!(
        "payload-reservation-fits",
        matches!(asked, Admission::Assigned(_)),
        "two payloads fit the budget, whatever the order: {asked:?}"
    );
    let s = reg.stats();
    invariant!(
        "payload-budget-accounted",
        (s.payloads_held, s.payload_bytes_held) == (1, size)
            && reg.payload(&tb, &event(2)) == Some(payload(2)),
        "the admitted payload, only: {s:?}"
    );
}

#[test]
fn two_payloads_one_slot_concurrently() {
    check("two_payloads_one_slot_concurrently", EXHAUSTIVE, || {
        two_payloads_one_slot()
    });
}

#[test]
fn a_completion_racing_an_admission_concurrently() {
    check(
        "a_completion_racing_an_admission_concurrently",
        EXHAUSTIVE,
        || a_completion_racing_an_admission(),
    );
}
