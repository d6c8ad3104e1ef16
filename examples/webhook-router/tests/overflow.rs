//! A full mailbox is not a 503: a delivery for a busy worker whose mailbox is full stays claimed,
//! waits in order in the bounded overflow behind the mailbox (answered `202 waiting` with its
//! position), and reaches the worker in arrival order as the mailbox empties. Only a full overflow
//! is a 503 (with `Retry-After`, and no claim left behind). A worker that dies, or a router that
//! shuts down, with overflow queued loses none of it.
//!
//! Time: tokio's paused clock, as in `router.rs`; waits poll observable state.

mod common;

use common::*;

use std::collections::HashSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use worker_registry::{ClaimOutcome, ClaimState, DeliveryId, Target, WorkerRegistry};

/// Where delivery `id` of `payload` is, as its redelivery says: `completed`, `in_flight` or
/// `waiting` (a duplicate), else the outcome of the redelivery itself.
async fn state(h: &Harness, id: &str, payload: &Value) -> String {
    let a = h.deliver("pull_request", id, payload).await;
    if a.body["outcome"] == "duplicate" {
        a.body["state"].as_str().unwrap().to_owned()
    } else {
        format!("not claimed: {}", a.body)
    }
}

/// Sends `n` deliveries `{prefix}-0 ..` for PR `o/r#1`, back to back; their answers.
async fn burst(h: &Harness, prefix: &str, n: usize) -> Vec<Answer> {
    burst_from(h, prefix, 0, n).await
}

/// Sends deliveries `{prefix}-{from} .. {prefix}-{to - 1}` for PR `o/r#1`, back to back.
async fn burst_from(h: &Harness, prefix: &str, from: usize, to: usize) -> Vec<Answer> {
    let mut answers = Vec::new();
    for i in from..to {
        answers.push(
            h.deliver("pull_request", &format!("{prefix}-{i}"), &pr("o/r", 1))
                .await,
        );
    }
    answers
}

#[tokio::test(start_paused = true)]
async fn ten_events_on_a_mailbox_of_one_are_all_accepted_and_processed_in_arrival_order() {
    let h = start(Setup {
        mailbox: 1,
        overflow: 16,
        work: Duration::from_millis(400),
        ..Setup::default()
    })
    .await;
    let answers = burst(&h, "e", 10).await;
    let mut positions = Vec::new();
    let mut workers = HashSet::new();
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a.status, StatusCode::ACCEPTED, "{i}: {}", a.body);
        assert_eq!(a.retry_after, None, "{i}");
        workers.insert(worker_of(a));
        match a.body["outcome"].as_str() {
            Some("assigned") => assert!(positions.is_empty(), "{i}: assigned after an overflow"),
            Some("waiting") => {
                assert!(a.body["token"].is_u64(), "{i}: {}", a.body);
                assert!(a.body["reason"]
                    .as_str()
                    .unwrap()
                    .contains("mailbox is full"));
                positions.push(a.body["position"].as_u64().unwrap());
            }
            other => panic!("{i}: {other:?} {}", a.body),
        }
    }
    assert_eq!(workers.len(), 1, "one worker has them all");
    // One event in the loop and one in the mailbox at most; the rest overflowed, in order.
    assert!(positions.len() >= 8, "{positions:?}");
    let n = positions.len() as u64;
    assert_eq!(positions, (1..=n).collect::<Vec<_>>());
    let overflow = h.server.app().containers().overflow_metrics().clone();
    assert_eq!(overflow.overflowed(), n);
    assert!(overflow.queued() > 0);
    let metrics = h.get("/metrics").await.body;
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics.contains(&format!("webhook_router_overflowed_total {n}")),
        "{metrics}"
    );
    assert!(metrics.contains("webhook_router_overflow_queued "));

    // Processed in arrival order: at every poll the completed ones are a prefix of all sent (each
    // loop takes 400 ms, far longer than a poll). Two more arrive once the first is done, while
    // the overflow is being worked off: they queue behind it, not in the mailbox's free slot.
    let payload = pr("o/r", 1);
    let mut sent = 10;
    let mut done = 0;
    let started = std::time::Instant::now();
    while started.elapsed() < HANG {
        let mut states = Vec::new();
        for i in 0..sent {
            states.push(state(&h, &format!("e-{i}"), &payload).await);
        }
        let completed: Vec<bool> = states.iter().map(|s| s == "completed").collect();
        let k = completed.iter().take_while(|c| **c).count();
        assert!(
            completed[k..].iter().all(|c| !c),
            "completed out of arrival order: {states:?}"
        );
        assert!(
            states.iter().all(|s| s == "completed" || s == "in_flight"),
            "{states:?}"
        );
        done = k;
        if k >= 1 && sent == 10 {
            for a in burst_from(&h, "e", 10, 12).await {
                assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
                assert_eq!(
                    a.body["outcome"], "waiting",
                    "behind the overflow: {}",
                    a.body
                );
            }
            sent = 12;
        }
        if k == 12 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(done, 12, "all processed");
    assert_eq!(overflow.queued(), 0);
    let s = h.memory.direct().stats();
    assert_eq!(s.claims_completed, 12, "0 lost");
}

#[tokio::test(start_paused = true)]
async fn a_full_overflow_is_503_with_retry_after_and_leaves_no_claim() {
    let h = start(Setup {
        mailbox: 1,
        overflow: 2,
        work: Duration::from_secs(60),
        ..Setup::default()
    })
    .await;
    let mut refused = None;
    for i in 0..6 {
        let id = format!("q-{i}");
        let a = h.deliver("pull_request", &id, &pr("o/r", 1)).await;
        if a.status == StatusCode::SERVICE_UNAVAILABLE {
            refused = Some((id, a));
            break;
        }
        assert_eq!(a.status, StatusCode::ACCEPTED, "{id}: {}", a.body);
    }
    let (id, a) = refused.expect("1 running + 1 in the mailbox + 2 overflowed, then a 503");
    assert_eq!(a.body["outcome"], "overflow_full");
    assert!(a.body["reason"].as_str().unwrap().contains("overflow"));
    assert!(a.retry_after.is_some_and(|s| s >= 1), "Retry-After");
    assert_eq!(h.server.app().containers().overflow_metrics().queued(), 2);
    // No claim was left behind: a bare claim of the pair succeeds.
    let target = Target::new("o/r", 1).unwrap();
    let d = DeliveryId::new(&id).unwrap();
    assert!(matches!(
        WorkerRegistry::claim(&h.memory, &target, &d).await.unwrap(),
        ClaimOutcome::Claimed
    ));
}

#[tokio::test(start_paused = true)]
async fn a_worker_dying_with_overflow_queued_loses_nothing() {
    let h = start(Setup {
        mailbox: 1,
        overflow: 16,
        work: Duration::from_millis(300),
        ..Setup::default()
    })
    .await;
    let answers = burst(&h, "c", 10).await;
    assert!(answers.iter().all(|a| a.status == StatusCode::ACCEPTED));
    let w1 = worker_of(&answers[0]);
    let overflow = h.server.app().containers().overflow_metrics().clone();
    assert!(overflow.queued() >= 5, "queued {}", overflow.queued());
    let crashed = h.post(&format!("/debug/workers/{w1}/crash")).await;
    assert_eq!(crashed.status, StatusCode::ACCEPTED);
    // Its overflow goes with its container (the events stay claimed by the dead worker) ...
    eventually(|| async { (overflow.queued() == 0).then_some(()) }).await;
    // ... until the sweep declares it dead, the registry releases them and they are
    // re-dispatched: all ten are completed, by its successor.
    h.until_status(w1, "dead").await;
    let payload = pr("o/r", 1);
    for i in 0..10 {
        let id = format!("c-{i}");
        eventually(|| async { (state(&h, &id, &payload).await == "completed").then_some(()) })
            .await;
    }
    assert_eq!(h.memory.direct().stats().claims_completed, 10, "0 lost");
    assert!(h.server.app().redispatcher().redispatched() >= 5);
}

#[tokio::test(start_paused = true)]
async fn overflow_unfinished_at_shutdown_is_released_and_reported_by_id() {
    let h = start(Setup {
        mailbox: 1,
        overflow: 64,
        work: Duration::from_millis(300),
        ..Setup::default()
    })
    .await;
    let answers = burst(&h, "s", 40).await;
    assert!(answers.iter().all(|a| a.status == StatusCode::ACCEPTED));
    let target = Target::new("o/r", 1).unwrap();
    let Harness { server, memory, .. } = h;
    let report = server.shutdown(Duration::from_secs(3)).await;
    let unfinished: HashSet<String> = report
        .unfinished
        .iter()
        .map(|u| u.delivery.to_string())
        .collect();
    assert_eq!(unfinished.len(), report.unfinished.len(), "each once");
    let mut completed = 0;
    for i in 0..40 {
        let id = format!("s-{i}");
        let d = DeliveryId::new(&id).unwrap();
        match WorkerRegistry::claim(&memory, &target, &d).await.unwrap() {
            ClaimOutcome::AlreadyClaimed(c) if c.state == ClaimState::Completed => {
                assert!(!unfinished.contains(&id), "{id} completed and reported");
                completed += 1;
            }
            ClaimOutcome::AlreadyClaimed(c) => panic!("{id} still {:?} after shutdown", c.state),
            // Released through the registry: it must have been reported.
            _ => assert!(unfinished.contains(&id), "{id} was dropped unreported"),
        }
    }
    assert_eq!(completed + unfinished.len(), 40, "every accepted delivery");
    // 40 x 300 ms does not fit in 3 s: the overflow's events were among those handed back.
    assert!(unfinished.len() >= 20, "{}", unfinished.len());
    assert!(completed >= 5, "{completed}");
}

#[tokio::test(start_paused = true)]
async fn a_drained_worker_finishes_its_overflow_before_it_exits() {
    let h = start(Setup {
        mailbox: 1,
        overflow: 16,
        work: Duration::from_millis(200),
        ..Setup::default()
    })
    .await;
    let answers = burst(&h, "d", 8).await;
    assert!(answers.iter().all(|a| a.status == StatusCode::ACCEPTED));
    let w = worker_of(&answers[0]);
    assert!(h.server.app().containers().overflow_metrics().queued() >= 4);
    assert_eq!(
        h.post(&format!("/workers/{w}/drain")).await.status,
        StatusCode::OK
    );
    // It runs everything it was handed, its overflow included, then exits: nothing is released
    // for another worker to pick up.
    h.until_status(w, "dead").await;
    let payload = pr("o/r", 1);
    for i in 0..8 {
        assert_eq!(
            state(&h, &format!("d-{i}"), &payload).await,
            "completed",
            "d-{i}"
        );
    }
    assert_eq!(h.server.app().redispatcher().redispatched(), 0);
    assert_eq!(h.memory.direct().stats().claims_completed, 8);
}
