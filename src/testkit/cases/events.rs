//! Lifecycle events through `Subscribe`: what is published, in which order for each worker, to
//! which handles, and what a subscriber that falls behind is told.
//!
//! Events may travel through a server, so cases wait for them (failing after 30 s, a guard against
//! hanging, not a timing) and use a marker worker to know that everything published before it has
//! arrived.

use crate::WorkerRegistryExt;
use std::collections::{BTreeMap, BTreeSet};

use crate::events::EVENT_BUFFER;
use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{DeadReason, Event, RecvError, Status, Subscribe, WorkerId, WorkerRegistry};

/// Each worker's events, in the order received.
fn by_worker(events: &[Event]) -> BTreeMap<WorkerId, Vec<Event>> {
    let mut out: BTreeMap<WorkerId, Vec<Event>> = BTreeMap::new();
    for e in events {
        if let Some(w) = e.worker() {
            out.entry(w).or_default().push(e.clone());
        }
    }
    out
}

/// Created, draining, died and released arrive, each worker's in the order of its transitions,
/// and `TargetReleased` (listing the released deliveries) after the death it follows from.
pub async fn lifecycle_events_arrive_in_each_workers_order<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().brake_fraction(1.0)).await;
    let mut events = r.subscribe();

    // w1: created, drained while busy, exits when its loop finishes.
    let w1 = assigned(r.admit(&t(1), &d("d1")).await).worker;
    assert_eq!(r.drain(w1).await, Ok(Status::Draining));
    r.complete(&t(1), &d("d1")).await.unwrap();
    r.loop_finished(w1).await.unwrap();
    // w2: created, then silent past the timeout: the sweep kills it and releases d2 and d3.
    let w2 = assigned(r.admit(&t(2), &d("d2")).await).worker;
    assert_eq!(assigned(r.admit(&t(2), &d("d3")).await).worker, w2);
    fixture.advance(&r, TIMEOUT + PAST).await;
    let report = sweep(&r).await;
    assert_eq!(report.died, vec![(w2, DeadReason::MissedHeartbeats)]);

    let got = events_before_marker(&r, &mut events).await;
    let per = by_worker(&got);
    assert_eq!(per.len(), 2, "{got:?}");
    assert_eq!(
        per[&w1],
        vec![
            Event::WorkerCreated {
                worker: w1,
                target: Some(t(1))
            },
            Event::WorkerDraining {
                worker: w1,
                target: Some(t(1))
            },
            Event::WorkerDied {
                worker: w1,
                target: Some(t(1)),
                reason: DeadReason::Exited
            },
        ]
    );
    assert_eq!(
        per[&w2],
        vec![
            Event::WorkerCreated {
                worker: w2,
                target: Some(t(2))
            },
            Event::WorkerDied {
                worker: w2,
                target: Some(t(2)),
                reason: DeadReason::MissedHeartbeats
            },
        ]
    );
    let released: Vec<(usize, &Event)> = got
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, Event::TargetReleased { .. }))
        .collect();
    assert_eq!(released.len(), 1, "{got:?}");
    let (at, Event::TargetReleased { target, deliveries }) = released[0] else {
        unreachable!()
    };
    let mut deliveries = deliveries.clone();
    deliveries.sort();
    assert_eq!((target, deliveries), (&t(2), vec![d("d2"), d("d3")]));
    let died_at = got
        .iter()
        .position(|e| matches!(e, Event::WorkerDied { worker, .. } if *worker == w2))
        .unwrap();
    assert!(died_at < at, "released after the death: {got:?}");
    assert_eq!(got.len(), 6, "nothing else: {got:?}");
}

/// A sweep publishes one `TargetReleased` per target, listing every delivery it released there,
/// however its work was split: each target has a bare claim (released as unbound) and a
/// delivery on its silent worker (released at the death), and there are enough deaths that a
/// backend working in bounded steps kills some workers in an earlier step than the one that
/// releases the bare claims (the Redis sweep once published the two halves as two events).
pub async fn a_sweep_releases_each_target_in_one_event<F: Fixture>(fixture: &F) {
    const N: u64 = 24;
    let r = registry(
        fixture,
        config().max_workers(N as usize).brake_fraction(1.0),
    )
    .await;
    for i in 1..=N {
        let bare = d(&format!("bare-{i}"));
        assert_eq!(
            r.claim(&t(i), &bare).await,
            Ok(crate::ClaimOutcome::Claimed)
        );
        assigned(r.admit(&t(i), &d(&format!("held-{i}"))).await);
    }
    let mut events = r.subscribe();
    fixture.advance(&r, TIMEOUT + PAST).await;
    let report = sweep(&r).await;
    assert_eq!(report.died.len(), N as usize, "{report:?}");
    assert_eq!(report.released.len(), 2 * N as usize, "{report:?}");

    let mut released: BTreeMap<crate::Target, Vec<Vec<crate::DeliveryId>>> = BTreeMap::new();
    for e in events_before_marker(&r, &mut events).await {
        if let Event::TargetReleased {
            target,
            mut deliveries,
        } = e
        {
            deliveries.sort();
            released.entry(target).or_default().push(deliveries);
        }
    }
    let want: BTreeMap<_, _> = (1..=N)
        .map(|i| {
            (
                t(i),
                vec![vec![d(&format!("bare-{i}")), d(&format!("held-{i}"))]],
            )
        })
        .collect();
    assert_eq!(
        released, want,
        "one event per target, naming both deliveries"
    );
}

/// Duplicates, sticky assignments, heartbeats, loop reports that change no status, and a sweep
/// that finds nothing publish nothing.
pub async fn hot_paths_publish_nothing<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let w = assigned(r.admit(&t(1), &d("d1")).await).worker;
    let pool = r.register().await.unwrap();
    let mut events = r.subscribe();

    duplicate(r.admit(&t(1), &d("d1")).await);
    assert_eq!(assigned(r.admit(&t(1), &d("d2")).await).worker, w); // sticky
    r.claim(&t(1), &d("d2")).await.unwrap();
    r.heartbeat(w).await.unwrap();
    r.heartbeat(pool).await.unwrap();
    r.loop_started(w).await.unwrap();
    r.loop_finished(w).await.unwrap(); // active: becomes idle, no status change
    r.complete(&t(1), &d("d1")).await.unwrap();
    sweep(&r).await; // nothing stale, nothing released
    assert_eq!(r.drain(w).await, Ok(Status::Dead(DeadReason::Exited))); // idle: exits at once

    assert_eq!(
        events_before_marker(&r, &mut events).await,
        vec![Event::WorkerDied {
            worker: w,
            target: Some(t(1)),
            reason: DeadReason::Exited
        }]
    );
}

/// A subscriber sees what happens after it subscribed, not before.
pub async fn a_subscriber_sees_only_what_happens_after_it_subscribed<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let before = r.register().await.unwrap();
    let mut events = r.subscribe();
    let after = r.register().await.unwrap();
    r.deregister(before).await.unwrap();
    assert_eq!(
        events_before_marker(&r, &mut events).await,
        vec![
            Event::WorkerCreated {
                worker: after,
                target: None
            },
            Event::WorkerDied {
                worker: before,
                target: None,
                reason: DeadReason::Deregistered
            },
        ]
    );
}

/// When the brake holds deaths back, the suspects are published, not deaths.
pub async fn the_brake_publishes_suspects_not_deaths<F: Fixture>(fixture: &F) {
    let f = Fleet::new(fixture, 4, config()).await;
    let mut events = f.r.subscribe();
    fixture.advance(&f.r, TIMEOUT + PAST).await;
    assert!(sweep(&f.r).await.brake_engaged);
    let suspects: BTreeSet<WorkerId> = events_before_marker(&f.r, &mut events)
        .await
        .into_iter()
        .map(|e| match e {
            Event::WorkerSuspect {
                worker,
                target: Some(_),
            } => worker,
            other => panic!("expected only suspects, got {other:?}"),
        })
        .collect();
    assert_eq!(suspects, f.ids(0..4));
}

/// A subscriber that falls more than `EVENT_BUFFER` events behind loses the oldest and is told how
/// many, once; it then continues with the oldest still buffered; publishing never waits for it,
/// and a subscriber that keeps up misses nothing. The loss is counted in `stats`.
pub async fn a_lagging_subscriber_is_told_how_many_it_missed<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_workers(4)).await;
    let mut slow = r.subscribe();
    let mut fast = r.subscribe();

    // Each register + deregister publishes two events; the slow subscriber reads none.
    let extra = 10;
    let total = EVENT_BUFFER + extra;
    for _ in 0..total / 2 {
        let w = r.register().await.unwrap();
        r.deregister(w).await.unwrap();
        assert!(
            matches!(next_event(&mut fast).await, Event::WorkerCreated { worker, .. } if worker == w)
        );
        assert!(
            matches!(next_event(&mut fast).await, Event::WorkerDied { worker, .. } if worker == w)
        );
    }

    assert_eq!(
        slow.recv().await,
        Err(RecvError::Lagged {
            missed: extra as u64
        })
    );
    assert_eq!(r.stats().events_missed, extra as u64);
    let mut rest = Vec::new();
    while let Some(e) = slow.try_recv().unwrap() {
        rest.push(e);
    }
    assert_eq!(rest.len(), EVENT_BUFFER, "the buffer, oldest first");
    assert!(
        matches!(rest[0], Event::WorkerCreated { .. }),
        "{:?}",
        rest[0]
    );
    assert!(matches!(rest.last(), Some(Event::WorkerDied { .. })));
}

/// Every handle's subscribers see every event, whichever replica caused it.
pub async fn every_handle_sees_every_event<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let other = fixture.replica(&r).await;
    let mut here = r.subscribe();
    let mut there = other.subscribe();
    let w = other.register().await.unwrap();
    r.deregister(w).await.unwrap();
    let want = vec![
        Event::WorkerCreated {
            worker: w,
            target: None,
        },
        Event::WorkerDied {
            worker: w,
            target: None,
            reason: DeadReason::Deregistered,
        },
    ];
    for events in [&mut here, &mut there] {
        let got = vec![next_event(events).await, next_event(events).await];
        assert_eq!(got, want);
    }
}

/// A worker created on one replica and deregistered on another, by several replicas at once:
/// every handle's subscribers get each worker's `WorkerCreated` before its `WorkerDied`, and every
/// event exactly once (a handle must not hand out its own calls' events ahead of earlier ones it
/// has yet to receive from the others).
pub async fn a_workers_events_keep_their_order_whichever_replicas_caused_them<F: Fixture>(
    fixture: &F,
) {
    const EACH: usize = 25;
    let r = registry(fixture, config().max_workers(RACERS)).await;
    let handles = std::sync::Arc::new(replicas(fixture, &r, RACERS).await);
    let mut subs: Vec<_> = handles.iter().map(|h| h.subscribe()).collect();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut tasks = Vec::new();
    for i in 0..RACERS {
        let (handles, barrier) = (handles.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            for _ in 0..EACH {
                let w = handles[i].register().await.expect("register");
                handles[(i + 1) % RACERS]
                    .deregister(w)
                    .await
                    .expect("deregister");
            }
        }));
    }
    for task in tasks {
        task.await.expect("a racer panicked");
    }
    for (i, sub) in subs.iter_mut().enumerate() {
        let mut got = Vec::with_capacity(2 * RACERS * EACH);
        while got.len() < 2 * RACERS * EACH {
            got.push(next_event(sub).await);
        }
        let per = by_worker(&got);
        assert_eq!(per.len(), RACERS * EACH, "handle {i}: {got:?}");
        for (w, events) in per {
            assert_eq!(
                events,
                vec![
                    Event::WorkerCreated {
                        worker: w,
                        target: None
                    },
                    Event::WorkerDied {
                        worker: w,
                        target: None,
                        reason: DeadReason::Deregistered
                    }
                ],
                "handle {i}"
            );
        }
        assert_eq!(sub.try_recv(), Ok(None), "handle {i}: nothing twice");
    }
}
