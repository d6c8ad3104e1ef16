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

/// [`audit`](WorkerRegistry::audit) counts what the registry holds unfinished, from its storage
/// and at once (no sweep needed): claims in flight (bound and bare), deliveries parked, a dead
/// worker's deliveries as released from its death on, and nothing once they are handed over and
/// acknowledged and the rest completed.
pub async fn the_audit_counts_in_flight_released_and_waiting_deliveries<F: Fixture>(fixture: &F) {
    use crate::{Admission, Audit};
    let r = registry(fixture, config().max_workers(1).max_waiting(4)).await;
    let audit = |r: &F::Registry| {
        let r = r.clone();
        async move { r.audit().await.expect("audit") }
    };
    assert_eq!(audit(&r).await, Audit::default(), "a new registry");

    let a = assigned(r.admit(&t(1), &d("one")).await);
    assigned(r.admit(&t(1), &d("two")).await);
    r.claim(&t(9), &d("bare")).await.unwrap();
    assert!(
        matches!(
            r.admit(&t(2), &d("parked")).await,
            Ok(Admission::Waiting(_))
        ),
        "max_workers 1: the second target waits"
    );
    r.complete_by(a.worker, &t(1), &d("two")).await.unwrap();
    let want = Audit {
        live_workers: 1,
        in_flight: 2,
        waiting: 1,
        ..Audit::default()
    };
    assert_eq!(audit(&r).await, want, "one, bare; parked");

    // The death releases "one" at once; the parked delivery may be promoted into the freed slot
    // by the death itself or by the next sweep: waiting or in flight, either way.
    r.deregister(a.worker).await.unwrap();
    let now = audit(&r).await;
    assert!(now.released >= 1, "the dead worker's delivery: {now:?}");
    assert_eq!(now.in_flight + now.waiting, 2, "bare, parked: {now:?}");

    let (mut handed, mut promoted) = (Vec::new(), None);
    for _ in 0..3 {
        let report = sweep(&r).await;
        r.acknowledge(&report.released).await.unwrap();
        handed.extend(released(&report));
        promoted = promoted.or(report
            .released
            .iter()
            .find_map(|e| e.assignment.as_ref().map(|a| a.worker)));
        if audit(&r).await.released == 0 {
            break;
        }
    }
    handed.sort();
    assert_eq!(handed, vec![(t(1), d("one")), (t(2), d("parked"))]);
    let want = Audit {
        live_workers: 1,
        in_flight: 2,
        ..Audit::default()
    };
    assert_eq!(
        audit(&r).await,
        want,
        "bare, and parked promoted; handed over"
    );

    let promoted = promoted.expect("the parked delivery was promoted onto a worker");
    r.complete_by(promoted, &t(2), &d("parked")).await.unwrap();
    r.complete(&t(9), &d("bare")).await.unwrap();
    let after = audit(&r).await;
    assert_eq!(
        (after.unfinished(), after.live_workers),
        (0, 1),
        "{after:?}"
    );
}
