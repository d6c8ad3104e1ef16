//! Lifecycle events of the in-memory registry: its global publication order (the contract promises
//! only each worker's order), that its events are there the moment the call returns, that a
//! `WorkerHandle`'s heartbeat publishes nothing, and that dropping it closes subscriptions. What
//! every backend publishes (per-worker order, nothing on hot paths, only after subscribing,
//! suspects under the brake, lagging subscribers, every handle sees every event) is in the
//! conformance suite (`src/testkit/cases/events.rs`). Time is a `ManualClock`; nothing sleeps.
#![cfg(feature = "tokio")]

use std::time::Duration;

use worker_registry::{
    memory::Direct, Admission, DeadReason, DeliveryId, Event, ManualClock, RecvError,
    RegistryConfig, Subscription, Target, WorkerId,
};

fn t(n: u64) -> Target {
    Target::new("octo/repo", n).unwrap()
}

fn e(s: &str) -> DeliveryId {
    DeliveryId::new(s).unwrap()
}

fn registry(clock: &ManualClock) -> Direct<ManualClock> {
    let config = RegistryConfig::builder()
        .startup_grace(Duration::ZERO)
        .brake_fraction(1.0)
        .build()
        .unwrap();
    Direct::with_clock(config, clock.clone())
}

fn drain_now(events: &mut Subscription) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(ev) = events.try_recv().unwrap() {
        out.push(ev);
    }
    out
}

fn assigned(a: Admission) -> WorkerId {
    match a {
        Admission::Assigned(a) => a.worker,
        other => panic!("not assigned: {other:?}"),
    }
}

#[tokio::test]
async fn created_draining_dead_and_released_arrive_in_order() {
    let clock = ManualClock::new();
    let registry = registry(&clock);
    let mut events = registry.subscribe();

    // w1: created, drained while busy, exits when its loop finishes.
    let w1 = assigned(registry.admit(&t(1), &e("d1")));
    registry.drain(w1).unwrap();
    registry.complete(&t(1), &e("d1")).unwrap();
    registry.loop_finished(w1).unwrap();

    // w2: created, then silent past the timeout: the sweep kills it and releases d2 and d3.
    let w2 = assigned(registry.admit(&t(2), &e("d2")));
    assert_eq!(assigned(registry.admit(&t(2), &e("d3"))), w2);
    clock.advance(registry.config().heartbeat_timeout() + Duration::from_millis(1));
    let report = registry.sweep();
    assert_eq!(report.died, vec![(w2, DeadReason::MissedHeartbeats)]);

    let expected = vec![
        Event::WorkerCreated {
            worker: w1,
            target: Some(t(1)),
        },
        Event::WorkerDraining {
            worker: w1,
            target: Some(t(1)),
        },
        Event::WorkerDied {
            worker: w1,
            target: Some(t(1)),
            reason: DeadReason::Exited,
        },
        Event::WorkerCreated {
            worker: w2,
            target: Some(t(2)),
        },
        Event::WorkerDied {
            worker: w2,
            target: Some(t(2)),
            reason: DeadReason::MissedHeartbeats,
        },
    ];
    // `recv` (async) and `try_recv` see the same stream.
    for want in &expected {
        assert_eq!(&events.recv().await.unwrap(), want);
    }
    let Event::TargetReleased {
        target,
        deliveries: mut released,
    } = events.recv().await.unwrap()
    else {
        panic!("expected TargetReleased");
    };
    released.sort();
    assert_eq!((target, released), (t(2), vec![e("d2"), e("d3")]));
    assert_eq!(events.try_recv(), Ok(None));
}

#[tokio::test]
async fn hot_paths_publish_nothing() {
    let clock = ManualClock::new();
    let registry = registry(&clock);
    let w = assigned(registry.admit(&t(1), &e("d1")));
    let pool = registry.register().unwrap();
    let mut events = registry.subscribe();

    assert!(matches!(
        registry.admit(&t(1), &e("d1")),
        Admission::Duplicate(_)
    ));
    assert_eq!(assigned(registry.admit(&t(1), &e("d2"))), w); // sticky
    registry.heartbeat(w).unwrap();
    pool.heartbeat().unwrap();
    registry.loop_started(w).unwrap();
    registry.loop_finished(w).unwrap(); // active: becomes idle, no status change
    registry.sweep(); // nothing stale, nothing released
    registry.drain(w).unwrap(); // idle: exits at once (dead, not draining)

    assert_eq!(
        drain_now(&mut events),
        vec![Event::WorkerDied {
            worker: w,
            target: Some(t(1)),
            reason: DeadReason::Exited
        }]
    );
}

#[tokio::test]
async fn dropping_the_registry_closes_subscriptions_after_the_buffer() {
    let registry = Direct::default();
    let mut events = registry.subscribe();
    registry.register().unwrap().deregister().unwrap();
    drop(registry);
    assert!(matches!(
        events.recv().await,
        Ok(Event::WorkerCreated { .. })
    ));
    assert!(matches!(events.recv().await, Ok(Event::WorkerDied { .. })));
    assert_eq!(events.recv().await, Err(RecvError::Closed));
    assert_eq!(events.try_recv(), Err(RecvError::Closed));
}
