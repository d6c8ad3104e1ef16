//! Released events: what a sweep hands over for re-dispatch (`SweepReport::released`), to whom,
//! how often, and `acknowledge`.

use crate::WorkerRegistryExt;
use std::collections::BTreeMap;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{DeadReason, DeliveryId, Maintenance, ReleaseReason, Target, WorkerId, WorkerRegistry};

/// The sweep that kills a worker hands over each of its in-flight deliveries (and a bare claim
/// nobody completed) once, with holder and reason; acknowledging them, twice or not at all, is
/// fine; they are never offered again; re-dispatching one is an admission, a second one a
/// harmless duplicate.
pub async fn released_events_are_handed_over_once_and_acknowledged<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let target = t(1);
    let a = assigned(r.admit(&target, &d("one")).await);
    assert_eq!(assigned(r.admit(&target, &d("two")).await).worker, a.worker);
    let bare = (t(2), d("bare"));
    r.claim(&bare.0, &bare.1).await.unwrap();
    let done = d("done");
    assigned(r.admit(&target, &done).await);
    r.complete_by(a.worker, &target, &done).await.unwrap();

    fixture.advance(&r, TIMEOUT + PAST).await;
    let report = sweep(&r).await;
    assert_eq!(report.died, vec![(a.worker, DeadReason::MissedHeartbeats)]);
    let got: BTreeMap<(Target, DeliveryId), (Option<WorkerId>, ReleaseReason)> = report
        .released
        .iter()
        .map(|e| ((e.target.clone(), e.delivery.clone()), (e.holder, e.reason)))
        .collect();
    assert_eq!(
        got.len(),
        report.released.len(),
        "each handed over once: {report:?}"
    );
    let died = ReleaseReason::WorkerDied(DeadReason::MissedHeartbeats);
    let want = BTreeMap::from([
        ((target.clone(), d("one")), (Some(a.worker), died)),
        ((target.clone(), d("two")), (Some(a.worker), died)),
        (bare.clone(), (None, ReleaseReason::Unbound)),
    ]);
    assert_eq!(got, want, "the completed delivery is not among them");
    assert_eq!(r.stats().claims_released, 3);

    r.acknowledge(&report.released).await.unwrap();
    r.acknowledge(&report.released).await.unwrap(); // twice: not an error
    r.acknowledge(&[]).await.unwrap();
    for _ in 0..3 {
        fixture
            .advance(&r, r.config().release_ack_timeout() + PAST)
            .await;
        assert!(sweep(&r).await.released.is_empty(), "never offered again");
    }

    // Re-dispatch: the first admission runs it, a second one is a duplicate.
    let b = assigned(r.admit(&target, &d("one")).await);
    assert!(b.new && b.worker != a.worker);
    assert_eq!(
        duplicate(r.admit(&target, &d("one")).await).holder,
        Some(b.worker)
    );
}

/// With several replicas sweeping, each released event reaches exactly one of them.
pub async fn released_events_reach_exactly_one_replica<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().brake_fraction(1.0)).await; // three die at once
    let others = replicas(fixture, &r, 2).await;
    let mut want = Vec::new();
    for n in 1..=3 {
        let (target, delivery) = (t(n), d(&format!("d{n}")));
        assigned(r.admit(&target, &delivery).await);
        want.push((target, delivery));
    }
    fixture.advance(&r, TIMEOUT + PAST).await;

    let mut got = Vec::new();
    let first = sweep(&r).await; // the registry's first sweeper holds the maintenance lease
    assert_eq!(first.died.len(), 3);
    got.extend(first.released_pairs());
    r.acknowledge(&first.released).await.unwrap();
    for _ in 0..2 {
        for h in &others {
            let report = h.sweep().await.unwrap();
            got.extend(report.released_pairs());
            h.acknowledge(&report.released).await.unwrap();
        }
        let report = sweep(&r).await;
        got.extend(report.released_pairs());
        r.acknowledge(&report.released).await.unwrap();
    }
    got.sort();
    assert_eq!(
        got, want,
        "every released delivery exactly once, across replicas"
    );
}

/// A pair released because its worker died is admitted again from that instant; re-admitted before
/// any sweep it runs on a new worker, and the sweep has nothing of it to hand over.
pub async fn a_pair_readmitted_before_the_sweep_is_not_handed_over<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let (target, delivery) = (t(1), d("d"));
    let a = assigned(r.admit(&target, &delivery).await);
    assert_eq!(r.deregister(a.worker).await, Ok(DeadReason::Deregistered));
    let b = assigned(r.admit(&target, &delivery).await);
    assert!(b.new && b.worker != a.worker);
    assert!(b.token > a.token);
    let report = sweep(&r).await;
    assert!(
        report.released.is_empty(),
        "it is in flight again: {report:?}"
    );
    assert_eq!(
        duplicate(r.admit(&target, &delivery).await).holder,
        Some(b.worker)
    );
}
