//! The waiting room on Redis beyond the conformance cases (`cases/waiting.rs`): a death promoting
//! at the call that freed the slot wakes the handle's sweeper (`Maintenance::wake`), and a drain
//! batch whose idle workers all exit promotes the waiting target onto a new worker, once, after
//! the batch's own deaths.

use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use worker_registry::{
    Admission, DeliveryId, Maintenance, RegistryConfig, ReleaseReason, Target, WorkerRegistry,
};

use crate::harness;

fn config(max_workers: usize) -> RegistryConfig {
    RegistryConfig::builder()
        .max_workers(max_workers)
        .max_waiting(8)
        .build()
        .unwrap()
}

/// A guard against hanging, not a timing: the wake-up either comes or the test fails.
const GUARD: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_promotion_at_a_death_wakes_the_handles_sweeper() {
    let Some(url) = harness::shared("waiting wake") else {
        return;
    };
    let r = harness::registry(&url, "waiting-wake", config(1)).await;
    let holder = r.register().await.unwrap();
    let (t, d) = (
        Target::new("o/r", 1).unwrap(),
        DeliveryId::new("d").unwrap(),
    );
    assert!(matches!(
        r.admit(&t, &d).await.unwrap(),
        Admission::Waiting(_)
    ));
    r.deregister(holder).await.unwrap(); // the slot is the waiting delivery's at once
    tokio::time::timeout(GUARD, r.wake())
        .await
        .expect("woken by the promotion");
    let report = r.sweep().await.unwrap();
    assert_eq!(report.released.len(), 1, "{report:?}");
    let e = &report.released[0];
    assert_eq!(
        (e.reason, &e.target, &e.delivery),
        (ReleaseReason::Promoted, &t, &d)
    );
    assert!(e.assignment.expect("assignment").new);
    assert_eq!(r.stats().promoted, 1);
}

#[tokio::test]
async fn a_drain_batch_promotes_after_its_own_deaths() {
    let Some(url) = harness::shared("waiting drain batch") else {
        return;
    };
    let r = harness::registry(&url, "waiting-drain-batch", config(3)).await;
    let t = |n| Target::new("o/r", n).unwrap();
    let d = |s: &str| DeliveryId::new(s).unwrap();
    // Three idle workers (their loops finished), one a target waits for.
    let mut ids = Vec::new();
    for n in 1..=3 {
        let Admission::Assigned(a) = r.admit(&t(n), &d(&format!("d{n}"))).await.unwrap() else {
            panic!()
        };
        r.complete(&t(n), &d(&format!("d{n}"))).await.unwrap();
        r.loop_finished(a.worker).await.unwrap();
        ids.push(a.worker);
    }
    assert!(matches!(
        r.admit(&t(4), &d("w")).await.unwrap(),
        Admission::Waiting(_)
    ));
    // One drain call for all three (idle: each exits at once); the promotion runs after them.
    let out = r.drain_all_within(Duration::from_secs(60)).await.unwrap();
    assert_eq!(out.exited, 3);
    let report = r.sweep().await.unwrap();
    let promoted: Vec<_> = report
        .released
        .iter()
        .filter(|e| e.reason == ReleaseReason::Promoted)
        .collect();
    assert_eq!(promoted.len(), 1, "{report:?}");
    let a = promoted[0].assignment.expect("assignment");
    assert!(a.new && !ids.contains(&a.worker), "a new worker: {a:?}");
    r.heartbeat(a.worker)
        .await
        .expect("the promoted worker lives");
    assert_eq!(r.status().waiting, 0);
}
