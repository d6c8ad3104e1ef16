//! The tokio maintenance task, on paused time (no real waiting).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use worker_registry::{
    memory::Direct, DeadReason, InMemoryRegistry, RegistryConfig, RegistryError, Sweeper,
    TokioClock,
};

fn config() -> RegistryConfig {
    RegistryConfig::builder()
        .heartbeat_interval(Duration::from_secs(30))
        .missed_heartbeats(4)
        .sweep_interval(Duration::from_secs(5))
        .startup_grace(Duration::ZERO)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn sweeper_declares_a_silent_worker_dead_on_schedule() {
    let registry = Direct::with_clock(config(), TokioClock::new());
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = reports.clone();
    let sweeper = Sweeper::spawn(InMemoryRegistry::from(registry.clone()), move |r| {
        sink.lock().unwrap().push(r.clone())
    });

    let silent = registry.register().unwrap();
    let chatty = registry.register().unwrap();
    let hb = tokio::spawn({
        let chatty = chatty.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(30)).await;
                if chatty.heartbeat().is_err() {
                    break;
                }
            }
        }
    });

    // 120 s of silence is allowed; the first sweep after that (at 125 s) kills.
    tokio::time::sleep(Duration::from_secs(121)).await;
    assert!(registry.worker(silent.id()).unwrap().status.is_alive());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        silent.heartbeat(),
        Err(RegistryError::WorkerDead {
            id: silent.id(),
            reason: DeadReason::MissedHeartbeats
        })
    );
    assert!(chatty.heartbeat().is_ok(), "the heartbeating worker lives");

    let reports = reports.lock().unwrap().clone();
    assert_eq!(reports.len(), 25, "one sweep every 5 s for 125 s");
    let deaths: Vec<_> = reports.iter().flat_map(|r| r.died.clone()).collect();
    assert_eq!(deaths, vec![(silent.id(), DeadReason::MissedHeartbeats)]);
    assert_eq!(registry.status().version, 25);
    assert_eq!(registry.status().counts.dead, 1);

    sweeper.shutdown().await;
    hb.abort();
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_sweeping() {
    let registry = Direct::with_clock(config(), TokioClock::new());
    let sweeper = Sweeper::spawn(InMemoryRegistry::from(registry.clone()), |_| {});
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(registry.status().version, 2);
    sweeper.shutdown().await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(registry.status().version, 2, "no sweep after shutdown");
}

#[tokio::test(start_paused = true)]
async fn dropping_the_sweeper_stops_it_too() {
    let registry = Direct::with_clock(config(), TokioClock::new());
    drop(Sweeper::spawn(
        InMemoryRegistry::from(registry.clone()),
        |_| {},
    ));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(registry.status().version, 0);
}

/// `abort` stops the task in the middle of a callback (a killed replica): the callback does not
/// run to its end, no later sweep happens, and `abort` does not wait for the callback.
#[tokio::test(start_paused = true)]
async fn abort_abandons_a_callback_in_progress() {
    let registry = Direct::with_clock(config(), TokioClock::new());
    let stages = Arc::new(Mutex::new(Vec::new()));
    let log = stages.clone();
    let sweeper = Sweeper::spawn_async(InMemoryRegistry::from(registry.clone()), move |_| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push("started");
            tokio::time::sleep(Duration::from_secs(3600)).await;
            log.lock().unwrap().push("finished");
        }
    });
    let monitor = sweeper.monitor();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(*stages.lock().unwrap(), ["started"]);
    sweeper.abort().await;
    assert!(!monitor.is_running());
    tokio::time::sleep(Duration::from_secs(7200)).await;
    assert_eq!(
        *stages.lock().unwrap(),
        ["started"],
        "abandoned, never resumed"
    );
    assert_eq!(registry.status().version, 1, "no sweep after the abort");
}

/// An exit that promotes a waiting delivery wakes the sweeper, which hands the promoted delivery
/// over (with its payload) at once, not at its next interval: on paused time, the report arrives
/// before any time passes.
#[tokio::test(start_paused = true)]
async fn a_promotion_at_an_exit_is_handed_over_at_once() {
    use worker_registry::{Admission, DeliveryId, Payload, ReleaseReason, Target};

    let config = RegistryConfig::builder()
        .heartbeat_interval(Duration::from_secs(30))
        .sweep_interval(Duration::from_secs(5))
        .max_workers(1)
        .max_waiting(8)
        .build()
        .unwrap();
    let registry = Direct::with_clock(config, TokioClock::new());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sweeper = Sweeper::spawn(InMemoryRegistry::from(registry.clone()), move |r| {
        let promoted: Vec<_> = r
            .released
            .iter()
            .filter(|e| e.reason == ReleaseReason::Promoted)
            .cloned()
            .collect();
        if !promoted.is_empty() {
            let _ = tx.send(promoted);
        }
    });
    let holder = registry.register().unwrap();
    let (t, d) = (
        Target::new("o/r", 1).unwrap(),
        DeliveryId::new("waits").unwrap(),
    );
    let p = Payload::builder("pull_request", &b"{}"[..])
        .build()
        .unwrap();
    assert!(matches!(
        registry.admit_with(&t, &d, Some(&p)),
        Ok(Admission::Waiting(_))
    ));
    // Between two sweeps: the next one is 4 s away.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let before = tokio::time::Instant::now();
    holder.deregister().unwrap();
    let promoted = tokio::time::timeout(Duration::from_secs(1), rx.recv())
        .await
        .expect("the sweeper was woken: the promoted delivery is handed over at once")
        .expect("a report");
    assert_eq!(before.elapsed(), Duration::ZERO, "no time passed");
    assert_eq!(promoted.len(), 1);
    assert_eq!(
        (&promoted[0].delivery, &promoted[0].payload),
        (&d, &Some(p))
    );
    sweeper.shutdown().await;
}
