//! Retention and expiry: completed claims remembered for `claim_retention` and at most
//! `max_retained_claims` of them, dead records kept for `dead_retention`.

use crate::WorkerRegistryExt;
use std::time::Duration;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{ClaimOutcome, ClaimState, RegistryError, WorkerRegistry};

/// A completed claim is remembered for its retention, so a late redelivery is still a duplicate,
/// then forgotten by a sweep (counted), after which the pair is new and unknown to `complete`.
pub async fn ac2_a_completed_claim_is_remembered_for_its_retention_then_forgotten<F: Fixture>(
    fixture: &F,
) {
    let retention = Duration::from_secs(3600);
    let r = registry(fixture, config().claim_retention(retention)).await;
    let (target, delivery) = (t(1), d("d"));
    let a = assigned(r.admit(&target, &delivery).await);
    r.complete(&target, &delivery).await.unwrap();
    r.deregister(a.worker).await.unwrap(); // the worker is gone; the claim stays

    fixture.advance(&r, retention - MARGIN).await;
    let report = sweep(&r).await;
    assert_eq!(report.expired_claims, 0);
    assert_eq!(r.status().claims.retained, 1);
    let dup = duplicate(r.admit(&target, &delivery).await);
    assert_eq!(dup.state, ClaimState::Completed);

    fixture.advance(&r, MARGIN + PAST).await;
    // Past its retention it is forgotten at once, before any sweep: `release` does not see it.
    assert_eq!(
        r.release(&target, &delivery).await,
        Err(RegistryError::UnknownClaim {
            target: target.clone(),
            delivery: delivery.clone()
        })
    );
    let report = sweep(&r).await;
    assert_eq!(report.expired_claims, 1);
    assert_eq!(r.status().claims.retained, 0);
    assert_eq!(
        r.complete(&target, &delivery).await,
        Err(RegistryError::UnknownClaim {
            target: target.clone(),
            delivery: delivery.clone()
        })
    );
    assert!(assigned(r.admit(&target, &delivery).await).new);
    let stats = r.stats();
    assert_eq!((stats.claims_expired, stats.retained_claims), (1, 0));
}

/// At most `max_retained_claims` completed claims are remembered: by the next sweep the oldest are
/// evicted (counted), the newest kept.
pub async fn ac2_retained_claims_are_bounded_oldest_evicted_first<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_retained_claims(3).max_workers(10)).await;
    let target = t(1);
    for i in 0..5 {
        let delivery = d(&format!("d{i}"));
        assigned(r.admit(&target, &delivery).await);
        r.complete(&target, &delivery).await.unwrap();
        fixture.advance(&r, Duration::from_secs(1)).await;
    }
    sweep(&r).await;
    let stats = r.stats();
    assert_eq!(stats.claims_evicted, 2);
    assert_eq!(stats.retained_claims, 3);
    assert_eq!(r.status().claims.retained, 3);
    for i in 0..2 {
        assert_eq!(
            r.claim(&target, &d(&format!("d{i}"))).await,
            Ok(ClaimOutcome::Claimed),
            "d{i} is among the oldest and was evicted"
        );
    }
    for i in 2..5 {
        assert!(
            matches!(
                r.claim(&target, &d(&format!("d{i}"))).await,
                Ok(ClaimOutcome::AlreadyClaimed(c)) if c.state == ClaimState::Completed
            ),
            "d{i} is among the newest and is kept"
        );
    }
}

/// A dead worker's record stays visible for `dead_retention`, then a sweep purges it (counted) and
/// its id is unknown.
pub async fn ac4_a_dead_record_is_purged_after_its_retention<F: Fixture>(fixture: &F) {
    let retention = Duration::from_secs(60);
    let r = registry(fixture, config().dead_retention(retention)).await;
    let w = r.register().await.unwrap();
    r.deregister(w).await.unwrap();
    let report = sweep(&r).await;
    assert_eq!(report.purged_workers, 0);
    assert_eq!(r.status().counts.dead, 1);
    fixture.advance(&r, retention - MARGIN).await;
    assert_eq!(sweep(&r).await.purged_workers, 0);
    assert!(r.worker(w).await.unwrap().is_some(), "still visible");

    fixture.advance(&r, MARGIN + PAST).await;
    assert_eq!(sweep(&r).await.purged_workers, 1);
    assert!(r.status().workers.is_empty());
    assert_eq!(r.worker(w).await, Ok(None));
    assert_eq!(
        r.heartbeat(w).await,
        Err(RegistryError::UnknownWorker { id: w })
    );
    assert_eq!(r.stats().workers_purged, 1);
}
