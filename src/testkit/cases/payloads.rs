//! Payloads (see `WorkerRegistry::admit_with`): what GitHub sent travels with its claim, byte for
//! byte, to whichever worker runs the delivery next (after a death, a deregistration, a drain
//! deadline, a stuck delivery, a promotion, the crash of the replica that held it), is found by
//! (target, delivery) while the delivery has work left, and is gone once it is done; the budget
//! and the per-payload limit refuse what does not fit and leave no claim.
//!
//! Counts of payloads held are read after a sweep: a shared backend's gauges come from its
//! latest snapshot.

use crate::WorkerRegistryExt;
use std::time::Duration;

use crate::testkit::payload_checks::sample;
use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{
    Admission, ClaimState, DeadReason, Maintenance, Payload, RegistryError, Rejection,
    ReleaseReason, ReleasedEvent, Status, SweepReport, WorkerRegistry,
};

/// The payloads `r` holds (count, bytes), as its snapshot after a sweep says, checked against
/// its stats.
async fn held<R: WorkerRegistry + Maintenance>(r: &R) -> (usize, u64) {
    sweep(r).await;
    let usage = r.status().payloads;
    let s = r.stats();
    assert_eq!(
        (s.payloads_held, s.payload_bytes_held),
        (usage.held, usage.bytes),
        "stats and snapshot agree on the payloads held"
    );
    assert_eq!(usage.budget, r.config().payload_budget());
    (usage.held, usage.bytes)
}

/// The one released event of `reports` for this delivery id.
#[track_caller]
fn released_of<'a>(reports: &'a [SweepReport], delivery: &str) -> &'a ReleasedEvent {
    let found: Vec<&ReleasedEvent> = reports
        .iter()
        .flat_map(|r| &r.released)
        .filter(|e| e.delivery.as_str() == delivery)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{delivery} is handed over once: {reports:?}"
    );
    found[0]
}

/// `e` carries exactly `p`, its body byte for byte.
#[track_caller]
fn carries(e: &ReleasedEvent, p: &Payload) {
    let got = e
        .payload
        .as_ref()
        .unwrap_or_else(|| panic!("{e} carries its payload"));
    assert_eq!(
        &got.body()[..],
        &p.body()[..],
        "{e}: the body, byte for byte"
    );
    assert_eq!(got, p, "{e}: event, action, content type and headers too");
}

/// Re-dispatches `e` as a router does: admitted again with its payload, onto a new worker, where
/// the lookup finds the same bytes.
async fn redispatch<R: WorkerRegistry>(r: &R, e: &ReleasedEvent, p: &Payload) {
    let a = assigned(
        r.admit_with(&e.target, &e.delivery, e.payload.as_ref())
            .await,
    );
    assert_eq!(
        r.payload(&e.target, &e.delivery).await,
        Ok(Some(p.clone())),
        "{e} re-admitted onto {}",
        a.worker
    );
}

/// The deliveries of a worker that died of silence, of one that deregistered and of one that ran
/// past its drain deadline are handed over with the payloads they were admitted with, byte for
/// byte (bodies with every byte value, metadata, headers); re-dispatched with them, the next
/// worker's lookup finds the same bytes; the registry holds each once.
pub async fn a_dead_workers_deliveries_are_handed_over_with_their_payloads<F: Fixture>(
    fixture: &F,
) {
    let r = registry(fixture, config()).await;
    let cases = [
        ("silent", sample("silent", 30_000)),
        ("leaver", sample("leaver", 1)),
        ("drained", sample("drained", 4_096)),
    ];
    let mut workers = Vec::new();
    for (n, (name, p)) in (1..).zip(&cases) {
        let a = assigned(r.admit_with(&t(n), &d(name), Some(p)).await);
        assert_eq!(r.payload(&t(n), &d(name)).await, Ok(Some(p.clone())));
        workers.push(a.worker);
    }
    let total: u64 = cases.iter().map(|(_, p)| p.size()).sum();
    assert_eq!(held(&r).await, (3, total));

    assert_eq!(r.deregister(workers[1]).await, Ok(DeadReason::Deregistered));
    let drain = Duration::from_secs(10);
    assert_eq!(
        r.drain_within(workers[2], drain).await,
        Ok(Status::Draining)
    );
    // The drain deadline passes first, then the silence of the first worker kills it.
    let reports = sweeps_over(fixture, &r, TIMEOUT + PAST).await;
    let died: Vec<(crate::WorkerId, DeadReason)> = deaths(&reports);
    assert!(
        died.contains(&(workers[0], DeadReason::MissedHeartbeats)),
        "{died:?}"
    );
    assert!(
        died.contains(&(workers[2], DeadReason::DrainTimedOut)),
        "{died:?}"
    );
    for report in &reports {
        r.acknowledge(&report.released).await.expect("acknowledge");
    }
    for (name, p) in &cases {
        carries(released_of(&reports, name), p);
    }
    for (name, p) in &cases {
        redispatch(&r, released_of(&reports, name), p).await;
    }
    assert_eq!(held(&r).await, (3, total), "each payload held once");
}

/// A delivery stuck in flight past `max_in_flight` is handed over with its payload; its worker's
/// late completion is refused; re-dispatched once that worker is gone, the payload goes with it.
pub async fn a_stuck_delivery_is_handed_over_with_its_payload<F: Fixture>(fixture: &F) {
    let max = Duration::from_secs(60);
    let r = registry(fixture, config().max_in_flight(max)).await;
    let p = sample("stuck", 25_000);
    let w = assigned(r.admit_with(&t(1), &d("stuck"), Some(&p)).await).worker;
    let reports = run_beating(fixture, &r, &[w], max + PAST * 2).await;
    let e = released_of(&reports, "stuck");
    assert_eq!(e.reason, ReleaseReason::Stuck);
    carries(e, &p);
    for report in &reports {
        r.acknowledge(&report.released).await.expect("acknowledge");
    }
    assert!(matches!(
        r.complete_by(w, &t(1), &d("stuck")).await,
        Err(RegistryError::ClaimReleased { .. })
    ));
    assert_eq!(
        r.loop_finished(w).await,
        Ok(Status::Dead(DeadReason::Exited)),
        "the stuck worker was drained; its loop ends"
    );
    redispatch(&r, e, &p).await;
    assert_eq!(held(&r).await, (1, p.size()));
}

/// A delivery parked with its payload keeps it while it waits (the lookup finds it there, a
/// redelivery with another payload changes nothing), and the promotion hands it over with it:
/// the promoted event carries it byte for byte, the claim on the new worker keeps it (held once),
/// and its completion frees it.
pub async fn a_promoted_delivery_carries_its_payload<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_workers(1).max_waiting(8)).await;
    let w1 = assigned(r.admit(&t(1), &d("a")).await).worker;
    let p = sample("parked", 40_000);
    assert!(matches!(
        r.admit_with(&t(2), &d("b"), Some(&p)).await,
        Ok(Admission::Waiting(_))
    ));
    assert_eq!(r.payload(&t(2), &d("b")).await, Ok(Some(p.clone())));
    let other = sample("other", 10);
    let dup = duplicate(r.admit_with(&t(2), &d("b"), Some(&other)).await);
    assert_eq!(dup.state, ClaimState::Waiting);
    assert_eq!(
        r.payload(&t(2), &d("b")).await,
        Ok(Some(p.clone())),
        "a redelivery does not replace the payload"
    );
    assert_eq!(held(&r).await, (1, p.size()));

    assert_eq!(r.deregister(w1).await, Ok(DeadReason::Deregistered));
    let report = sweep(&r).await;
    let e = report
        .released
        .iter()
        .find(|e| e.reason == ReleaseReason::Promoted)
        .unwrap_or_else(|| panic!("promoted: {report:?}"));
    carries(e, &p);
    r.acknowledge(&report.released).await.expect("acknowledge");
    let a = e.assignment.expect("assignment");
    assert_eq!(r.payload(&t(2), &d("b")).await, Ok(Some(p.clone())));
    assert_eq!(held(&r).await, (1, p.size()), "held once, by the claim");
    r.complete_by(a.worker, &t(2), &d("b")).await.unwrap();
    assert_eq!(r.payload(&t(2), &d("b")).await, Ok(None));
    assert_eq!(held(&r).await, (0, 0));
}

/// A parked delivery dropped after `max_wait` loses its payload with it: reported (without the
/// bytes), nothing left to find, the bytes held back to zero.
pub async fn a_waiting_delivery_dropped_past_max_wait_frees_its_payload<F: Fixture>(fixture: &F) {
    let max_wait = Duration::from_secs(20);
    let r = registry(
        fixture,
        config().max_workers(1).max_waiting(8).max_wait(max_wait),
    )
    .await;
    let w = assigned(r.admit(&t(1), &d("a")).await).worker;
    let p = sample("expires", 9_000);
    assert!(matches!(
        r.admit_with(&t(2), &d("late"), Some(&p)).await,
        Ok(Admission::Waiting(_))
    ));
    assert_eq!(held(&r).await, (1, p.size()));
    let reports = run_beating(fixture, &r, &[w], max_wait + PAST).await;
    let expired: Vec<_> = reports.iter().flat_map(|r| &r.expired_waiting).collect();
    assert_eq!(expired.len(), 1, "{reports:?}");
    assert_eq!(expired[0].delivery, d("late"));
    assert_eq!(r.payload(&t(2), &d("late")).await, Ok(None));
    assert_eq!(held(&r).await, (0, 0));
}

/// The lookup by (target, delivery) finds a payload while its delivery is in flight, not before
/// and not after: a redelivery with another payload does not replace it; a completion deletes it
/// (the completed claim, still a duplicate, keeps none) and the bytes held go back to zero; an
/// admission without a payload behaves as it always did, with nothing to find; a released
/// delivery admitted again without one has none; `release` deletes it.
pub async fn a_payload_is_found_while_its_delivery_has_work_left_and_gone_after<F: Fixture>(
    fixture: &F,
) {
    let r = registry(fixture, config()).await;
    let (p, q) = (sample("first", 2_000), sample("second", 3_000));
    assert_eq!(r.payload(&t(1), &d("x")).await, Ok(None), "nothing yet");
    let w = assigned(r.admit_with(&t(1), &d("x"), Some(&p)).await).worker;
    let dup = duplicate(r.admit_with(&t(1), &d("x"), Some(&q)).await);
    assert_eq!((dup.holder, dup.state), (Some(w), ClaimState::InFlight));
    assert_eq!(r.payload(&t(1), &d("x")).await, Ok(Some(p.clone())));
    assert_eq!(held(&r).await, (1, p.size()));

    r.complete_by(w, &t(1), &d("x")).await.unwrap();
    assert_eq!(r.payload(&t(1), &d("x")).await, Ok(None));
    assert_eq!(
        duplicate(r.admit_with(&t(1), &d("x"), Some(&q)).await).state,
        ClaimState::Completed
    );
    assert_eq!(r.payload(&t(1), &d("x")).await, Ok(None));
    assert_eq!(held(&r).await, (0, 0), "a completion leaves no payload");

    // Without a payload: as before, nothing held, nothing to find, nothing handed over.
    assert_eq!(assigned(r.admit(&t(1), &d("bare")).await).worker, w);
    assert_eq!(r.payload(&t(1), &d("bare")).await, Ok(None));
    assert_eq!(held(&r).await, (0, 0));

    // `release` deletes it with the claim.
    assigned(r.admit_with(&t(1), &d("given-back"), Some(&q)).await);
    r.release(&t(1), &d("given-back")).await.unwrap();
    assert_eq!(r.payload(&t(1), &d("given-back")).await, Ok(None));
    assert_eq!(held(&r).await, (0, 0));

    // Released with its payload, admitted again without one: none.
    assigned(r.admit_with(&t(2), &d("y"), Some(&p)).await);
    let reports = sweeps_over(fixture, &r, TIMEOUT + PAST).await;
    carries(released_of(&reports, "y"), &p);
    let bare = released_of(&reports, "bare");
    assert_eq!(
        bare.payload, None,
        "admitted without one, released without one"
    );
    for report in &reports {
        r.acknowledge(&report.released).await.expect("acknowledge");
    }
    assigned(r.admit(&t(2), &d("y")).await);
    assert_eq!(r.payload(&t(2), &d("y")).await, Ok(None));
    assert_eq!(held(&r).await, (0, 0));
}

/// The payload budget: admissions whose payloads fit are admitted; the first that would take the
/// bytes held past the budget is refused with `PayloadBudget` (what was held, what it needed, the
/// budget), counted, leaving no claim (its redelivery without a payload is admitted), even with
/// capacity full and the waiting room open (never parked); once a completion frees room, a
/// payload that fits is admitted again.
pub async fn the_budget_refuses_past_its_bound_and_recovers_below_it<F: Fixture>(fixture: &F) {
    let size = sample("budget-1", 10_000).size();
    let budget = 3 * size;
    let r = registry(
        fixture,
        config()
            .max_workers(3)
            .max_waiting(8)
            .max_payload_bytes(size)
            .payload_budget(budget),
    )
    .await;
    let mut workers = Vec::new();
    for n in 1..=3 {
        let p = sample(&format!("budget-{n}"), 10_000);
        assert_eq!(p.size(), size);
        workers.push(assigned(r.admit_with(&t(n), &d("in"), Some(&p)).await).worker);
    }
    // Sticky onto a live worker, and a new target with capacity full: both refused for the
    // budget, neither placed nor parked.
    let fourth = sample("budget-4", 10_000);
    let refused = Rejection::PayloadBudget {
        held: budget,
        needed: size,
        limit: budget,
    };
    for target in [t(1), t(4)] {
        assert_eq!(
            r.admit_with(&target, &d("over"), Some(&fourth)).await,
            Ok(Admission::Rejected(refused))
        );
        assert_eq!(r.payload(&target, &d("over")).await, Ok(None));
    }
    assert_eq!(r.stats().rejected_payload_budget, 2);
    let report = sweep(&r).await;
    assert_eq!(
        (report.waiting, report.released.len()),
        (0, 0),
        "not parked"
    );
    assert_eq!(held(&r).await, (3, budget));
    // No claim was left: the redelivery without a payload is admitted.
    assert_eq!(
        assigned(r.admit(&t(1), &d("over")).await).worker,
        workers[0]
    );

    r.complete_by(workers[1], &t(2), &d("in")).await.unwrap();
    assert_eq!(held(&r).await, (2, 2 * size));
    assigned(r.admit_with(&t(2), &d("again"), Some(&fourth)).await);
    assert_eq!(r.payload(&t(2), &d("again")).await, Ok(Some(fourth)));
    assert_eq!(held(&r).await, (3, budget));
}

/// A payload larger than `max_payload_bytes` is bad input: refused with `PayloadTooLarge`
/// (its size and the limit) before anything is looked at, a redelivery of a pair in flight
/// included, counted, leaving no claim and the stored payload untouched; one of exactly the
/// limit is admitted.
pub async fn a_too_large_payload_is_refused_and_leaves_no_claim<F: Fixture>(fixture: &F) {
    let limit = sample("limit", 1_000).size();
    let r = registry(fixture, config().max_payload_bytes(limit)).await;
    let big = sample("limit", 1_001);
    let too_large = Err(RegistryError::PayloadTooLarge {
        size: limit + 1,
        limit,
    });
    assert_eq!(r.admit_with(&t(1), &d("big"), Some(&big)).await, too_large);
    assert_eq!(r.payload(&t(1), &d("big")).await, Ok(None));
    let w = assigned(r.admit(&t(1), &d("big")).await).worker;
    assert_eq!(r.payload(&t(1), &d("big")).await, Ok(None), "nothing kept");

    let fits = sample("limit", 1_000);
    assert_eq!(fits.size(), limit);
    assert_eq!(
        assigned(r.admit_with(&t(1), &d("fits"), Some(&fits)).await).worker,
        w
    );
    assert_eq!(
        r.admit_with(&t(1), &d("fits"), Some(&big)).await,
        too_large,
        "bad input is refused before the duplicate check"
    );
    assert_eq!(r.payload(&t(1), &d("fits")).await, Ok(Some(fits.clone())));
    assert_eq!(r.stats().payloads_too_large, 2);
    assert_eq!(held(&r).await, (1, limit));
}

/// Re-dispatching released deliveries never needs more budget than they held: with the budget
/// full of one worker's payloads and that worker gone, a redelivery of one of them (before any
/// sweep) and the re-dispatch of the other (after the sweep hands it over) are both admitted
/// with their payloads, while a new payload is still refused.
pub async fn re_dispatching_released_deliveries_needs_no_more_budget_than_they_held<F: Fixture>(
    fixture: &F,
) {
    let (p1, p2) = (sample("held-1", 8_000), sample("held-2", 8_000));
    let budget = p1.size() + p2.size();
    let r = registry(
        fixture,
        config().max_payload_bytes(p1.size()).payload_budget(budget),
    )
    .await;
    let w = assigned(r.admit_with(&t(1), &d("one"), Some(&p1)).await).worker;
    assigned(r.admit_with(&t(1), &d("two"), Some(&p2)).await);
    let fresh = sample("held-3", 8_000);
    assert!(matches!(
        r.admit_with(&t(2), &d("fresh"), Some(&fresh)).await,
        Ok(Admission::Rejected(Rejection::PayloadBudget { .. }))
    ));

    assert_eq!(r.deregister(w).await, Ok(DeadReason::Deregistered));
    // Its redelivery, before a sweep has handed anything over: the released copy makes room.
    let again = assigned(r.admit_with(&t(1), &d("one"), Some(&p1)).await);
    assert!(again.new && again.worker != w);
    let report = sweep(&r).await;
    let e = released_of(std::slice::from_ref(&report), "two");
    carries(e, &p2);
    assert!(
        report.released.iter().all(|e| e.delivery != d("one")),
        "admitted again before the sweep: nothing to hand over for it: {report:?}"
    );
    redispatch(&r, e, &p2).await;
    r.acknowledge(&report.released).await.expect("acknowledge");
    assert!(matches!(
        r.admit_with(&t(2), &d("fresh"), Some(&fresh)).await,
        Ok(Admission::Rejected(Rejection::PayloadBudget { .. }))
    ));
    assert_eq!(held(&r).await, (2, budget));
}

/// A released delivery handed to a replica that then crashes (drops its handle without
/// acknowledging) is offered to another replica after `release_ack_timeout` with the same
/// payload, byte for byte. Runs on a backend whose released events carry a receipt (a shared
/// outbox); one that hands them over in-process has no replica to lose.
pub async fn a_released_payload_survives_the_crash_of_the_replica_that_held_it<F: Fixture>(
    fixture: &F,
) {
    let ack = Duration::from_secs(10);
    let r = registry(fixture, config().release_ack_timeout(ack)).await;
    let other = fixture.replica(&r).await;
    let crashed = fixture.replica(&r).await;
    let p = sample("crash", 20_000);
    let w = assigned(r.admit_with(&t(1), &d("orphan"), Some(&p)).await).worker;
    assert_eq!(r.deregister(w).await, Ok(DeadReason::Deregistered));
    let first = crashed.sweep().await.expect("sweep");
    let handed = released_of(std::slice::from_ref(&first), "orphan").clone();
    carries(&handed, &p);
    if handed.receipt().is_none() {
        return;
    }
    drop(crashed); // never acknowledged
    fixture.advance(&r, ack + PAST).await;
    let again = other.sweep().await.expect("sweep");
    let e = released_of(std::slice::from_ref(&again), "orphan");
    carries(e, &p);
    redispatch(&other, e, &p).await;
    other
        .acknowledge(&again.released)
        .await
        .expect("acknowledge");
    assert_eq!(held(&other).await, (1, p.size()));
}

/// Many replicas racing admissions with payloads for the last bytes of the budget: exactly as
/// many as fit are admitted, the rest refused with `PayloadBudget` (never more bytes held than
/// the budget), and completing them all brings the bytes held back to zero.
pub async fn racing_payloads_never_exceed_the_budget<F: Fixture>(fixture: &F) {
    let size = sample("race", 5_000).size();
    let fit: u64 = 5;
    let r = registry(
        fixture,
        config()
            .max_workers(RACERS * ROUNDS)
            .max_payload_bytes(size)
            .payload_budget(fit * size),
    )
    .await;
    let handles = replicas(fixture, &r, RACERS).await;
    let mut tasks = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for round in 0..ROUNDS {
                let n = (i * ROUNDS + round) as u64 + 1;
                let p = sample("race", 5_000);
                let a = h.admit_with(&t(n), &d("race"), Some(&p)).await;
                out.push((n, a));
            }
            out
        }));
    }
    let mut admitted = Vec::new();
    for task in tasks {
        for (n, a) in task.await.expect("racer") {
            match a {
                Ok(Admission::Assigned(a)) => admitted.push((n, a.worker)),
                Ok(Admission::Rejected(Rejection::PayloadBudget { needed, limit, .. })) => {
                    assert_eq!((needed, limit), (size, fit * size));
                }
                other => panic!("expected Assigned or PayloadBudget, got {other:?}"),
            }
        }
    }
    assert_eq!(admitted.len() as u64, fit, "{admitted:?}");
    assert_eq!(held(&r).await, (fit as usize, fit * size));
    for (n, w) in admitted {
        r.complete_by(w, &t(n), &d("race")).await.unwrap();
    }
    assert_eq!(held(&r).await, (0, 0));
}
