//! Mass deaths at a size a networked backend works off in several bounded steps (the Redis
//! sweep's steps take a few hundred commands each: hundreds of workers need several): a sweep
//! still reads as one sweep at one instant, the brake is decided on every silent worker, and each
//! released delivery and target is handed over exactly once.

use crate::WorkerRegistryExt;
use std::collections::BTreeMap;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{DeliveryId, Event, Maintenance, Target, WorkerRegistry};

type Fl<F> = Fleet<<F as Fixture>::Registry>;

/// Workers in each case: more than one bounded step of any backend here judges or kills.
pub(crate) const MASS: usize = 600;

/// Two thirds of a large fleet fall silent at once: one sweep suspects exactly them (the brake is
/// decided on all of them, not a step's share); the survivors beat on; the first sweep after the
/// grace kills exactly the silent ones and releases each of their deliveries once; the registry
/// is then quiet, and its snapshot shows the survivors alive and the dead dead.
pub async fn a_mass_death_is_fully_worked_off<F: Fixture>(fixture: &F) {
    let silent = MASS * 2 / 3;
    let f = Fl::<F>::new(fixture, MASS, config().max_workers(MASS)).await;
    fixture.advance(&f.r, TIMEOUT + PAST).await;
    f.beat(silent..MASS).await;
    let r = sweep(&f.r).await;
    assert!(r.brake_engaged && r.died.is_empty(), "{:?}", r.died);
    assert_eq!(suspected(&r), f.ids(0..silent));
    assert!(r.released.is_empty());
    assert_eq!(f.r.status().counts.suspect, silent);

    let survivors: Vec<_> = f.workers[silent..].to_vec();
    let reports = run_beating(fixture, &f.r, &survivors, SUSPECT_GRACE + PAST).await;
    for r in &reports {
        f.r.acknowledge(&r.released).await.unwrap();
    }
    let r = the_deadly(reports.clone());
    assert_eq!(died(&r), f.ids(0..silent));
    let mut pairs: Vec<(Target, DeliveryId)> = reports.iter().flat_map(released).collect();
    pairs.sort();
    let want: Vec<(Target, DeliveryId)> = (0..silent)
        .map(|i| (Fl::<F>::target(i), Fl::<F>::delivery(i)))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(pairs, want, "every silent worker's delivery, once");

    let quiet = sweep(&f.r).await;
    assert!(
        quiet.died.is_empty() && quiet.released.is_empty() && quiet.suspected.is_empty(),
        "{quiet:?}"
    );
    assert!(!quiet.brake_engaged);
    let s = f.r.status();
    assert_eq!(
        (s.counts.active, s.counts.suspect, s.counts.dead),
        (MASS - silent, 0, silent)
    );
    assert_eq!(
        (s.capacity.used, s.claims.in_flight),
        (MASS - silent, MASS - silent)
    );
    assert_eq!(s.workers.len(), MASS);
}

/// A large fleet, each worker with two deliveries in flight, dies at once (the brake off), on a
/// registry shared by two replicas that both sweep: every delivery is handed over exactly once
/// across both replicas' sweeps, and every target is released exactly once, naming both of its
/// deliveries, whichever steps the death took.
pub async fn released_events_of_a_chunked_death_arrive_exactly_once<F: Fixture>(fixture: &F) {
    let n = MASS / 2;
    let f = Fl::<F>::new(fixture, n, config().max_workers(n).brake_fraction(1.0)).await;
    let other = fixture.replica(&f.r).await;
    let second = |i: usize| d(&format!("second-{i}"));
    for i in 0..n {
        let a = assigned(f.r.admit(&Fl::<F>::target(i), &second(i)).await);
        assert_eq!(a.worker, f.workers[i]);
    }
    let mut events = crate::Subscribe::subscribe(&f.r);
    fixture.advance(&f.r, TIMEOUT + PAST).await;

    let first = sweep(&f.r).await;
    assert_eq!(died(&first), f.ids(0..n));
    let mut handed: BTreeMap<(Target, DeliveryId), usize> = BTreeMap::new();
    let mut count = |r: &crate::SweepReport| {
        for p in released(r) {
            *handed.entry(p).or_default() += 1;
        }
    };
    count(&first);
    f.r.acknowledge(&first.released).await.unwrap();
    // Both replicas sweep until neither has anything left to hand over.
    loop {
        let a = other.sweep().await.expect("the other replica's sweep");
        other.acknowledge(&a.released).await.unwrap();
        let b = sweep(&f.r).await;
        f.r.acknowledge(&b.released).await.unwrap();
        count(&a);
        count(&b);
        if a.released.is_empty() && b.released.is_empty() {
            break;
        }
    }
    let want: BTreeMap<(Target, DeliveryId), usize> = (0..n)
        .flat_map(|i| {
            [
                ((Fl::<F>::target(i), Fl::<F>::delivery(i)), 1),
                ((Fl::<F>::target(i), second(i)), 1),
            ]
        })
        .collect();
    assert_eq!(handed, want, "each delivery handed over exactly once");

    let mut released_targets: BTreeMap<Target, Vec<Vec<DeliveryId>>> = BTreeMap::new();
    let mut deaths = 0;
    for e in events_before_marker(&f.r, &mut events).await {
        match e {
            Event::TargetReleased {
                target,
                mut deliveries,
            } => {
                deliveries.sort();
                released_targets.entry(target).or_default().push(deliveries);
            }
            Event::WorkerDied { .. } => deaths += 1,
            _ => {}
        }
    }
    assert_eq!(deaths, n, "one death event per worker");
    assert_eq!(released_targets.len(), n);
    for (i, (target, lists)) in released_targets.iter().enumerate() {
        let mut both = vec![Fl::<F>::delivery(i), second(i)];
        both.sort();
        assert_eq!(target, &Fl::<F>::target(i));
        assert_eq!(
            lists,
            &vec![both],
            "{target} released once, with both deliveries"
        );
    }
}
