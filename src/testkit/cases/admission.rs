//! Admission and duplicate detection: `admit`, `claim`, `release`, `complete`.

use crate::WorkerRegistryExt;
use std::time::Duration;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{
    ClaimOutcome, ClaimState, DeadReason, RegistryError, Rejection, ReleaseReason, Status,
    WorkerRegistry,
};

/// A redelivery of an in-flight delivery is a duplicate naming its holder and the first claim's
/// time, for `admit` and `claim` alike; no second worker is made; the same delivery id on another
/// target is another claim.
pub async fn ac2_a_redelivery_is_a_duplicate_naming_its_holder<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(9), d("delivery-1"));
    let a = assigned(r.admit(&target, &delivery).await);
    assert!(a.new, "the first delivery creates the worker");
    fixture.advance(&r, Duration::from_secs(1)).await;

    let first = duplicate(r.admit(&target, &delivery).await);
    assert_eq!(first.holder, Some(a.worker));
    assert_eq!(first.state, ClaimState::InFlight);
    let again = duplicate(r.admit(&target, &delivery).await);
    assert_eq!(
        again.since(),
        first.since(),
        "both name the first claim's time"
    );
    let Ok(ClaimOutcome::AlreadyClaimed(c)) = r.claim(&target, &delivery).await else {
        panic!("claim() sees the same duplicate")
    };
    assert_eq!(
        (c.holder, c.since(), c.state),
        (Some(a.worker), first.since(), first.state)
    );

    let other = assigned(r.admit(&t(10), &delivery).await);
    assert!(
        other.new && other.worker != a.worker,
        "another target: another claim"
    );

    sweep(&r).await;
    assert_eq!(
        r.status().capacity.used,
        2,
        "no worker for the redeliveries"
    );
    let s = r.stats();
    assert_eq!((s.admitted_new, s.admitted_sticky, s.duplicates), (2, 0, 3));
}

/// A bare claim is bound to no worker, is idempotent, can be released and claimed again; releasing
/// an unknown claim or a completed one is refused, naming the pair.
pub async fn ac2_a_bare_claim_is_idempotent_and_releasable<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(1), d("x"));
    assert_eq!(r.claim(&target, &delivery).await, Ok(ClaimOutcome::Claimed));
    let Ok(ClaimOutcome::AlreadyClaimed(dup)) = r.claim(&target, &delivery).await else {
        panic!("a second claim is a duplicate")
    };
    assert_eq!((dup.holder, dup.state), (None, ClaimState::InFlight));

    r.release(&target, &delivery).await.unwrap();
    assert_eq!(r.claim(&target, &delivery).await, Ok(ClaimOutcome::Claimed));
    assert_eq!(
        r.release(&t(2), &delivery).await,
        Err(RegistryError::UnknownClaim {
            target: t(2),
            delivery: delivery.clone()
        })
    );

    r.complete(&target, &delivery).await.unwrap();
    assert_eq!(
        r.release(&target, &delivery).await,
        Err(RegistryError::ClaimCompleted {
            target: target.clone(),
            delivery: delivery.clone()
        }),
        "a completed claim stays until its retention ends"
    );
    let Ok(ClaimOutcome::AlreadyClaimed(dup)) = r.claim(&target, &delivery).await else {
        panic!("still a duplicate")
    };
    assert_eq!((dup.holder, dup.state), (None, ClaimState::Completed));
}

/// A bare claim that nobody completes is released once the heartbeat timeout has passed, reported
/// with no holder and reason `Unbound`, and the pair is new again.
pub async fn ac2_an_unbound_claim_is_released_after_the_heartbeat_timeout<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(1), d("x"));
    assert_eq!(r.claim(&target, &delivery).await, Ok(ClaimOutcome::Claimed));

    fixture.advance(&r, TIMEOUT - MARGIN).await;
    assert!(sweep(&r).await.released.is_empty(), "not yet");
    assert!(matches!(
        r.claim(&target, &delivery).await,
        Ok(ClaimOutcome::AlreadyClaimed(_))
    ));

    fixture.advance(&r, MARGIN + PAST).await;
    let report = sweep(&r).await;
    assert_eq!(released(&report), vec![(target.clone(), delivery.clone())]);
    let e = &report.released[0];
    assert_eq!((e.holder, e.reason), (None, ReleaseReason::Unbound));
    assert!(report.died.is_empty(), "no worker was involved");
    assert_eq!(r.claim(&target, &delivery).await, Ok(ClaimOutcome::Claimed));
}

/// Completing is idempotent; a completed claim stays a duplicate (naming its holder) after its
/// worker is gone, and is never released.
pub async fn ac2_a_completed_claim_stays_a_duplicate_after_its_worker_is_gone<F: Fixture>(
    fixture: &F,
) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(1), d("done"));
    let a = assigned(r.admit(&target, &delivery).await);
    r.complete(&target, &delivery).await.unwrap();
    r.complete(&target, &delivery).await.unwrap();
    r.complete_by(a.worker, &target, &delivery).await.unwrap();
    assert_eq!(r.deregister(a.worker).await, Ok(DeadReason::Deregistered));

    let report = sweep(&r).await;
    assert!(
        report.released.is_empty(),
        "a completed claim is not re-dispatched"
    );
    let dup = duplicate(r.admit(&target, &delivery).await);
    assert_eq!(
        (dup.holder, dup.state),
        (Some(a.worker), ClaimState::Completed)
    );
    assert_eq!(r.stats().claims_completed, 1, "completed once");
}

/// An admission refused for capacity or for a draining target leaves no claim behind: the pair is
/// unknown to `complete` and `release`, and once the target can be placed it is admitted, not a
/// duplicate.
pub async fn ac2_a_rejected_admission_leaves_no_claim_behind<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_workers(1)).await;
    let first = assigned(r.admit(&t(1), &d("a")).await);
    let (target, delivery) = (t(2), d("b"));
    assert_eq!(
        r.admit(&target, &delivery).await,
        Ok(crate::Admission::Rejected(Rejection::CapacityFull {
            limit: 1
        }))
    );
    let unknown = Err(RegistryError::UnknownClaim {
        target: target.clone(),
        delivery: delivery.clone(),
    });
    assert_eq!(r.complete(&target, &delivery).await, unknown);
    assert_eq!(r.release(&target, &delivery).await, unknown);

    assert_eq!(r.drain(first.worker).await, Ok(Status::Draining));
    let drained = d("c");
    assert_eq!(
        r.admit(&t(1), &drained).await,
        Ok(crate::Admission::Rejected(Rejection::TargetDraining {
            worker: first.worker
        }))
    );
    assert!(matches!(
        r.complete(&t(1), &drained).await,
        Err(RegistryError::UnknownClaim { .. })
    ));

    // Capacity frees up: the redelivery is admitted, not treated as a duplicate.
    assert_eq!(
        r.loop_finished(first.worker).await,
        Ok(Status::Dead(DeadReason::Exited))
    );
    assert!(assigned(r.admit(&target, &delivery).await).new);
}

/// A lost reply leaves no phantom: the retry of an admission that created a worker (its reply
/// never reached the router) is a duplicate that says its holder never started
/// ([`unstarted`](crate::AlreadyClaimed::unstarted), [`needs_start`](crate::AlreadyClaimed::needs_start)
/// names it), for `admit` and `claim` alike; once the worker has heartbeated, a redelivery is a
/// plain duplicate. A completed claim and a bare one are never unstarted.
pub async fn a_duplicate_of_a_never_started_worker_says_so<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(3), d("lost-reply"));
    let a = assigned(r.admit(&target, &delivery).await);
    assert!(a.new);

    // The router never saw `a`: its retry.
    let retry = duplicate(r.admit(&target, &delivery).await);
    assert_eq!(
        (retry.holder, retry.state),
        (Some(a.worker), ClaimState::InFlight)
    );
    assert!(retry.unstarted, "the holder never heartbeated: {retry:?}");
    assert_eq!(retry.needs_start(), Some(a.worker));
    let Ok(ClaimOutcome::AlreadyClaimed(c)) = r.claim(&target, &delivery).await else {
        panic!("claim() sees the same duplicate")
    };
    assert!(c.unstarted);

    // Started (its first heartbeat): a plain duplicate from then on.
    r.heartbeat(a.worker).await.unwrap();
    let after = duplicate(r.admit(&target, &delivery).await);
    assert!(!after.unstarted, "{after:?}");
    assert_eq!(after.needs_start(), None);

    // A completed claim, and a bare one, never ask for a start.
    let (other, second) = (t(4), d("second"));
    let b = assigned(r.admit(&other, &second).await);
    r.complete_by(b.worker, &other, &second).await.unwrap();
    let done = duplicate(r.admit(&other, &second).await);
    assert_eq!(done.state, ClaimState::Completed);
    assert!(!done.unstarted);
    assert_eq!(r.claim(&t(5), &d("bare")).await, Ok(ClaimOutcome::Claimed));
    let Ok(ClaimOutcome::AlreadyClaimed(bare)) = r.claim(&t(5), &d("bare")).await else {
        panic!("a second bare claim is a duplicate")
    };
    assert!(bare.holder.is_none() && !bare.unstarted);
}
