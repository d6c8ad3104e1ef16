//! What GitHub sent travels with the delivery: the router admits it with its payload, the worker's
//! job carries it, and a delivery re-dispatched after its worker crashed or promoted out of the
//! waiting room reaches its next worker with the same bytes (checked by the SHA-256 of the body
//! each completed loop ran on, [`webhook_router::runs`]). A payload the registry's limit refuses
//! is a 413 and one past its budget a 503 with `Retry-After`, neither leaving a claim behind.
//!
//! Time: tokio's paused clock, as in `router.rs`; waits poll observable state.

mod common;

use common::*;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use webhook_router::runs::{digest, Ran};
use worker_registry::{DeliveryId, Target, WorkerId, WorkerRegistry};

/// A pull request event whose body is `pad` bytes larger than [`pr`]'s, pretty-printed (so that
/// re-serialising it would not give the same bytes: only the bytes as received compare equal).
fn body(repo: &str, number: u64, pad: usize) -> Vec<u8> {
    let mut p = pr(repo, number);
    p["padding"] = Value::String("x".repeat(pad));
    serde_json::to_vec_pretty(&p).unwrap()
}

fn ids(repo: &str, number: u64, delivery: &str) -> (Target, DeliveryId) {
    (
        Target::new(repo, number).unwrap(),
        DeliveryId::new(delivery).unwrap(),
    )
}

/// The completed loops of `delivery` to `target`, once there is one.
async fn ran(h: &Harness, target: &Target, delivery: &DeliveryId) -> Vec<Ran> {
    let runs = h.server.app().containers().runs().clone();
    eventually(|| {
        let runs = runs.clone();
        async move {
            let r = runs.of(target, delivery);
            (!r.is_empty()).then_some(r)
        }
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn the_successor_of_a_crashed_worker_runs_on_the_body_github_sent() {
    let h = start(Setup {
        work: Duration::from_secs(5),
        ..Setup::default()
    })
    .await;
    h.server.app().containers().runs().keep();
    let sent = body("o/r", 3, 3000);
    let a = h.deliver_bytes("pull_request", "c-1", sent.clone()).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    let w1 = worker_of(&a);
    let (t, d) = ids("o/r", 3, "c-1");
    let held = h
        .memory
        .payload(&t, &d)
        .await
        .unwrap()
        .expect("kept with the claim");
    assert_eq!(&held.body()[..], &sent[..]);
    assert_eq!(
        (
            held.event(),
            held.action(),
            held.header("x-github-delivery")
        ),
        ("pull_request", Some("synchronize"), Some("c-1"))
    );
    h.until_status(w1, "active").await;

    // Killed mid-event: the sweep declares it dead, the registry releases the delivery with its
    // payload, and the sweeper callback hands it to a new worker.
    assert_eq!(
        h.post(&format!("/debug/workers/{w1}/crash")).await.status,
        StatusCode::ACCEPTED
    );
    h.until_status(w1, "dead").await;
    let runs = ran(&h, &t, &d).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_ne!(runs[0].worker, WorkerId::new(w1), "its successor ran it");
    assert_eq!(
        runs[0].body,
        Some(digest(&sent)),
        "the successor ran on the bytes GitHub sent"
    );
    assert_eq!(h.server.app().redispatcher().redispatched(), 1);
    // Completed: the registry keeps no payload any more.
    eventually(|| async { (h.memory.stats().payload_bytes_held == 0).then_some(()) }).await;
    assert_eq!(h.memory.payload(&t, &d).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_delivery_promoted_out_of_the_waiting_room_runs_on_the_body_github_sent() {
    let h = start(Setup {
        capacity: 1,
        waiting: 8,
        work: Duration::from_secs(1),
        idle: Duration::from_millis(150),
        ..Setup::default()
    })
    .await;
    h.server.app().containers().runs().keep();
    let first = body("o/r", 1, 100);
    let parked = body("o/r", 2, 2000);
    let a = h.deliver_bytes("pull_request", "p-1", first.clone()).await;
    assert_eq!(a.body["outcome"], "assigned", "{}", a.body);
    let b = h.deliver_bytes("pull_request", "p-2", parked.clone()).await;
    assert_eq!(
        (b.status, b.body["outcome"].as_str()),
        (StatusCode::ACCEPTED, Some("waiting")),
        "{}",
        b.body
    );
    let (t2, d2) = ids("o/r", 2, "p-2");
    let held = h
        .memory
        .payload(&t2, &d2)
        .await
        .unwrap()
        .expect("kept while waiting");
    assert_eq!(&held.body()[..], &parked[..]);

    // The first worker completes and leaves; the waiting delivery is promoted onto a new worker.
    let (t1, d1) = ids("o/r", 1, "p-1");
    assert_eq!(ran(&h, &t1, &d1).await[0].body, Some(digest(&first)));
    let runs = ran(&h, &t2, &d2).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        runs[0].body,
        Some(digest(&parked)),
        "promoted with its body"
    );
    assert_eq!(h.memory.stats().promoted, 1);
}

#[tokio::test(start_paused = true)]
async fn a_payload_over_the_registry_limit_is_413_before_any_registry_call() {
    let h = start(Setup {
        max_payload: 2000,
        payload_budget: 4000,
        ..Setup::default()
    })
    .await;
    let big = body("o/r", 1, 3000);
    let a = h.deliver_bytes("pull_request", "big-1", big).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", a.body);
    let error = a.body["error"].as_str().unwrap();
    assert!(error.contains("2000"), "names the limit: {error}");
    let s = h.memory.stats();
    assert_eq!(
        (s.admitted_new, s.payloads_held, s.payloads_too_large),
        (0, 0, 0),
        "no registry call, nothing claimed"
    );
    // No claim left: a smaller delivery for the same id is admitted as new.
    let ok = h
        .deliver_bytes("pull_request", "big-1", body("o/r", 1, 10))
        .await;
    assert_eq!(ok.body["outcome"], "assigned", "{}", ok.body);
    assert_eq!(ok.body["new"], true);
}

#[tokio::test(start_paused = true)]
async fn past_the_payload_budget_a_delivery_is_503_with_retry_after_and_leaves_no_claim() {
    let h = start(Setup {
        work: Duration::from_secs(2),
        max_payload: 2000,
        payload_budget: 2500,
        // With the waiting room on too: a budget refusal is never parked, nor reported as a
        // full room.
        waiting: 8,
        ..Setup::default()
    })
    .await;
    let a = h
        .deliver_bytes("pull_request", "b-1", body("o/r", 1, 1200))
        .await;
    assert_eq!(a.body["outcome"], "assigned", "{}", a.body);
    let second = body("o/r", 2, 1200);
    let refused = h.deliver_bytes("pull_request", "b-2", second.clone()).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.body
    );
    assert_eq!(refused.body["outcome"], "payload_budget");
    assert!(refused.retry_after.is_some_and(|s| s >= 1));
    assert!(
        refused.body["reason"].as_str().unwrap().contains("2500"),
        "{}",
        refused.body
    );
    let s = h.memory.stats();
    assert_eq!((s.rejected_payload_budget, s.payloads_held), (1, 1));
    let metrics = h.get("/metrics").await.body;
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics.contains(r#"webhook_router_deliveries_total{outcome="payload_budget"} 1"#),
        "{metrics}"
    );

    // Once the first completes, GitHub's resend is admitted as new: nothing was left behind.
    let (t1, d1) = ids("o/r", 1, "b-1");
    eventually(|| async { (h.memory.payload(&t1, &d1).await.unwrap().is_none()).then_some(()) })
        .await;
    let again = h.deliver_bytes("pull_request", "b-2", second).await;
    assert_eq!(
        (again.body["outcome"].as_str(), again.body["new"].as_bool()),
        (Some("assigned"), Some(true)),
        "{}",
        again.body
    );
}
