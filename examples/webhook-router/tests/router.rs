//! The reference webhook router, tested over real HTTP on 127.0.0.1:0 through its library, so
//! these tests exercise the real thing (the binary is a thin `main` over it).
//!
//! Time: every test runs on tokio's paused clock, and the registry on a `TokioClock` that follows it,
//! so heartbeats, loops and sweeps happen in virtual time. Nothing sleeps on the wall clock: where a
//! test waits for the sweep or a worker, it polls observable state (the admin API) a bounded number
//! of times, each poll letting a little virtual time pass.

mod common;
mod hold;

use common::*;
use hold::Hold;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use webhook_router::github;
use worker_registry::{DynRegistry, WorkerRegistry, WorkerRegistryExt};

#[tokio::test(start_paused = true)]
async fn assigned_then_duplicate_then_sticky() {
    let h = start(Setup::default()).await;
    let first = h.deliver("pull_request", "d-1", &pr("Octo/Repo", 1)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert_eq!(first.body["outcome"], "assigned");
    assert_eq!(first.body["new"], true);
    let w = worker_of(&first);

    let again = h.deliver("pull_request", "d-1", &pr("octo/repo", 1)).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["outcome"], "duplicate");
    assert_eq!(worker_of(&again), w);

    let second = h.deliver("pull_request", "d-2", &pr("octo/repo", 1)).await;
    assert_eq!(second.status, StatusCode::ACCEPTED);
    assert_eq!(
        (second.body["new"].as_bool(), worker_of(&second)),
        (Some(false), w)
    );
    assert!(second.body["token"].as_u64() > first.body["token"].as_u64());

    // The worker runs both loops and completes them; a late redelivery is still a duplicate.
    let done = eventually(|| async {
        let a = h.deliver("pull_request", "d-1", &pr("octo/repo", 1)).await;
        (a.body["state"] == "completed").then_some(a)
    })
    .await;
    assert_eq!(done.status, StatusCode::OK);
    let info = h.until_status(w, "active").await;
    assert_eq!(info["target"], "octo/repo#1");
}

#[tokio::test(start_paused = true)]
async fn capacity_full_is_503_and_leaves_no_claim() {
    let h = start(Setup {
        capacity: 1,
        ..Setup::default()
    })
    .await;
    assert_eq!(
        h.deliver("pull_request", "a", &pr("o/r", 1)).await.status,
        StatusCode::ACCEPTED
    );
    let full = h.deliver("pull_request", "b", &pr("o/r", 2)).await;
    assert_eq!(full.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(full.body["outcome"], "capacity");
    assert!(full.retry_after.is_some_and(|s| s >= 1));
    // No claim was left behind: the redelivery is refused for capacity again, not a duplicate.
    let again = h.deliver("pull_request", "b", &pr("o/r", 2)).await;
    assert_eq!(again.body["outcome"], "capacity");
}

#[tokio::test(start_paused = true)]
async fn drain_via_the_api_then_no_new_assignment() {
    let h = start(Setup {
        work: Duration::from_secs(2),
        ..Setup::default()
    })
    .await;
    let a = h.deliver("pull_request", "d-1", &pr("o/r", 1)).await;
    let w = worker_of(&a);

    let drained = h.post(&format!("/workers/{w}/drain")).await;
    assert_eq!(drained.status, StatusCode::OK);
    assert_eq!(drained.body["status"], "draining");

    let refused = h.deliver("pull_request", "d-2", &pr("o/r", 1)).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body["outcome"], "draining");
    assert_eq!(worker_of(&refused), w);
    assert!(refused.retry_after.is_some_and(|s| s >= 1));

    // The loop finishes, the worker exits, and the next delivery gets a new worker.
    h.until_status(w, "dead").await;
    let next = h.deliver("pull_request", "d-2", &pr("o/r", 1)).await;
    assert_eq!(next.status, StatusCode::ACCEPTED);
    assert_eq!(next.body["new"], true);
    assert_ne!(worker_of(&next), w);
    // d-1 was completed by the drained worker before it exited.
    let d1 = h.deliver("pull_request", "d-1", &pr("o/r", 1)).await;
    assert_eq!(d1.body["state"], "completed");
}

#[tokio::test(start_paused = true)]
async fn events_without_a_pull_request_are_ignored() {
    let h = start(Setup::default()).await;
    let push = h
        .deliver(
            "push",
            "p-1",
            &json!({ "ref": "refs/heads/main", "repository": { "full_name": "o/r" } }),
        )
        .await;
    assert_eq!(push.status, StatusCode::ACCEPTED);
    assert_eq!(push.body["outcome"], "ignored");
    assert!(push.body["reason"].as_str().unwrap().contains("push"));

    let ping = h
        .deliver("ping", "p-2", &json!({ "zen": "Design for failure." }))
        .await;
    assert_eq!(ping.body["outcome"], "ignored");

    let on_issue = json!({ "action": "created", "issue": { "number": 4 }, "repository": { "full_name": "o/r" } });
    let ignored = h.deliver("issue_comment", "p-3", &on_issue).await;
    assert_eq!(ignored.body["outcome"], "ignored");
    assert!(ignored.body["reason"].as_str().unwrap().contains("issue"));
    assert_eq!(h.server.app().registry().stats().live_workers, 0);
}

#[tokio::test(start_paused = true)]
async fn every_pull_request_event_routes_to_the_pr_worker() {
    let h = start(Setup::default()).await;
    let first = h.deliver("pull_request", "e-1", &pr("o/r", 7)).await;
    let w = worker_of(&first);
    let comment = json!({ "action": "created", "issue": { "number": 7, "pull_request": { "url": "u" } },
        "repository": { "full_name": "o/r" } });
    let review = json!({ "action": "submitted", "pull_request": { "number": 7 }, "repository": { "full_name": "o/r" } });
    for (event, id, payload) in [
        ("issue_comment", "e-2", &comment),
        ("pull_request_review", "e-3", &review),
        ("pull_request_review_comment", "e-4", &review),
    ] {
        let a = h.deliver(event, id, payload).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{event}");
        assert_eq!(
            (a.body["new"].as_bool(), worker_of(&a)),
            (Some(false), w),
            "{event}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn signatures_are_checked_when_a_secret_is_set() {
    let h = start(Setup {
        secret: Some("It's a Secret to Everybody"),
        ..Setup::default()
    })
    .await;
    // Correctly signed.
    let ok = h.deliver("pull_request", "s-1", &pr("o/r", 1)).await;
    assert_eq!(ok.status, StatusCode::ACCEPTED);

    let body = serde_json::to_vec(&pr("o/r", 2)).unwrap();
    let send = |signature: Option<String>| {
        let mut req = h
            .http
            .post(format!("{}/webhook", h.base))
            .header("content-type", "application/json")
            .header(github::EVENT_HEADER, "pull_request")
            .header(github::DELIVERY_HEADER, "s-2")
            .body(body.clone());
        if let Some(s) = signature {
            req = req.header(github::SIGNATURE_HEADER, s);
        }
        async move { answer(req.send().await.unwrap()).await }
    };
    // Missing.
    let missing = send(None).await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert!(missing.body["error"].as_str().unwrap().contains("missing"));
    // Signed with another secret.
    let wrong = send(Some(github::sign(b"not the secret", &body))).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.body["error"]
        .as_str()
        .unwrap()
        .contains("does not match"));
    // Not even a signature.
    let garbage = send(Some("sha256=xyz".into())).await;
    assert_eq!(garbage.status, StatusCode::UNAUTHORIZED);
    // Refused deliveries left no claim: the correctly signed one is admitted.
    let good = send(Some(github::sign(b"It's a Secret to Everybody", &body))).await;
    assert_eq!(good.status, StatusCode::ACCEPTED);
}

#[tokio::test(start_paused = true)]
async fn malformed_deliveries_are_400_with_the_reason() {
    let h = start(Setup::default()).await;
    let raw = |event: Option<&str>, id: Option<&str>, body: &'static str| {
        let mut req = h
            .http
            .post(format!("{}/webhook", h.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(e) = event {
            req = req.header(github::EVENT_HEADER, e);
        }
        if let Some(d) = id {
            req = req.header(github::DELIVERY_HEADER, d);
        }
        async move { answer(req.send().await.unwrap()).await }
    };
    let cases = [
        (
            raw(Some("pull_request"), Some("m-1"), "{not json").await,
            "pull_request payload",
        ),
        (raw(Some("push"), Some("m-2"), "[1,").await, "push payload"),
        (raw(None, Some("m-3"), "{}").await, "X-GitHub-Event"),
        (
            raw(Some("pull_request"), None, "{}").await,
            "X-GitHub-Delivery",
        ),
        (
            raw(Some("pull_request"), Some("has space"), "{}").await,
            "delivery id",
        ),
        (
            raw(
                Some("pull_request"),
                Some("m-4"),
                r#"{"repository":{"full_name":"o/r"}}"#,
            )
            .await,
            "missing field `pull_request`",
        ),
        (
            raw(
                Some("pull_request"),
                Some("m-5"),
                r#"{"repository":{"full_name":"no-slash"},"pull_request":{"number":1}}"#,
            )
            .await,
            "owner/name",
        ),
        (
            raw(
                Some("pull_request"),
                Some("m-6"),
                r#"{"repository":{"full_name":"o/r"},"pull_request":{"number":0}}"#,
            )
            .await,
            "at least 1",
        ),
    ];
    for (a, expected) in cases {
        assert_eq!(
            a.status,
            StatusCode::BAD_REQUEST,
            "{expected}: {:?}",
            a.body
        );
        let error = a.body["error"].as_str().unwrap();
        assert!(
            error.contains(expected),
            "{error:?} should mention {expected:?}"
        );
    }
    assert_eq!(h.memory.direct().claim_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn payloads_above_githubs_cap_are_413() {
    let h = start(Setup::default()).await;
    let body = vec![b' '; github::MAX_PAYLOAD_BYTES + 1];
    let res = h
        .http
        .post(format!("{}/webhook", h.base))
        .header("content-type", "application/json")
        .header(github::EVENT_HEADER, "push")
        .header(github::DELIVERY_HEADER, "big")
        .body(body)
        .send()
        .await
        .unwrap();
    let a = answer(res).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(a.body["error"].is_string());
    // Exactly at the cap is accepted (a JSON document padded with spaces).
    let mut body = b"{}".to_vec();
    body.resize(github::MAX_PAYLOAD_BYTES, b' ');
    let res = h
        .http
        .post(format!("{}/webhook", h.base))
        .header("content-type", "application/json")
        .header(github::EVENT_HEADER, "push")
        .header(github::DELIVERY_HEADER, "at-cap")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
}

#[tokio::test(start_paused = true)]
async fn unknown_worker_is_404_and_bad_id_is_400() {
    let h = start(Setup::default()).await;
    for path in ["/workers/999"] {
        let a = h.get(path).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{path}");
        assert!(a.body["error"].is_string());
    }
    let a = h.post("/workers/999/drain").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let a = h.post("/debug/workers/999/crash").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(a.body["error"].as_str().unwrap().contains("999"));

    let a = h.get("/workers/abc").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.body["error"].is_string());
    let a = h.post("/debug/workers/-1/crash").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.body["error"].as_str().unwrap().contains("-1"));
}

#[tokio::test(start_paused = true)]
async fn crash_then_dead_then_target_reassigned_and_event_redispatched() {
    let h = start(Setup {
        work: Duration::from_secs(5),
        ..Setup::default()
    })
    .await;
    let a = h.deliver("pull_request", "c-1", &pr("o/r", 3)).await;
    let w1 = worker_of(&a);
    h.until_status(w1, "active").await;

    let crashed = h.post(&format!("/debug/workers/{w1}/crash")).await;
    assert_eq!(crashed.status, StatusCode::ACCEPTED);
    // Crashing it again is refused: its container has stopped.
    assert_eq!(
        h.post(&format!("/debug/workers/{w1}/crash")).await.status,
        StatusCode::CONFLICT
    );

    // The sweep declares it dead after the heartbeat timeout ...
    h.until_status(w1, "dead").await;
    // ... and the sweeper callback re-dispatches the released delivery: a new worker for the same
    // target appears without anything being sent.
    let w2 = eventually(|| async {
        let list = h.get("/workers").await;
        list.body["workers"]
            .as_array()?
            .iter()
            .find(|w| w["target"] == "o/r#3" && w["status"] == "active")
            .and_then(|w| w["id"].as_u64())
    })
    .await;
    assert_ne!(w2, w1);
    // The delivery is held by the new worker: GitHub redelivering it now is a duplicate.
    let dup = h.deliver("pull_request", "c-1", &pr("o/r", 3)).await;
    assert_eq!(
        (dup.body["outcome"].as_str(), worker_of(&dup)),
        (Some("duplicate"), w2)
    );
    let info = h.until_status(w2, "active").await;
    assert_eq!(info["target"], "o/r#3");
    assert_eq!(h.server.app().redispatcher().redispatched(), 1);
    // New deliveries for the target go to the new worker.
    let next = h.deliver("pull_request", "c-2", &pr("o/r", 3)).await;
    assert_eq!(
        (next.body["new"].as_bool(), worker_of(&next)),
        (Some(false), w2)
    );
}

#[tokio::test(start_paused = true)]
async fn full_mailbox_and_overflow_is_503_and_releases_the_claim() {
    let h = start(Setup {
        work: Duration::from_secs(60),
        mailbox: 1,
        overflow: 1,
        ..Setup::default()
    })
    .await;
    let mut refused = None;
    for i in 0..5 {
        let a = h
            .deliver("pull_request", &format!("q-{i}"), &pr("o/r", 1))
            .await;
        if a.status == StatusCode::SERVICE_UNAVAILABLE {
            refused = Some((i, a));
            break;
        }
        assert_eq!(a.status, StatusCode::ACCEPTED);
    }
    let (i, a) = refused.expect("a mailbox of 1 and an overflow of 1 are full within 5 deliveries");
    assert_eq!(a.body["outcome"], "overflow_full");
    assert!(a.body["reason"].as_str().unwrap().contains("queue"));
    // The claim was released: the redelivery is not a duplicate.
    let again = h
        .deliver("pull_request", &format!("q-{i}"), &pr("o/r", 1))
        .await;
    assert_ne!(again.body["outcome"], "duplicate");
}

/// A minimal check of the Prometheus/OpenMetrics text format: every line is a `# HELP`, `# TYPE` or
/// `# UNIT` line, or a sample `name{label="value",...} number`, of a family declared by a `# TYPE`
/// line, and the exposition ends with `# EOF`. Returns the samples as (name with labels, value).
fn parse_prometheus(text: &str) -> Result<Vec<(String, f64)>, String> {
    fn is_name(s: &str) -> bool {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    let mut families: Vec<String> = Vec::new();
    let mut samples = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" {
            return match lines.next() {
                None => Ok(samples),
                Some(extra) => Err(format!("content after # EOF: {extra:?}")),
            };
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            if !matches!(kind, "HELP" | "TYPE" | "UNIT") || !is_name(name) {
                return Err(format!("bad comment line {line:?}"));
            }
            if kind == "TYPE" {
                let t = parts.next().unwrap_or("");
                if !matches!(
                    t,
                    "counter"
                        | "gauge"
                        | "histogram"
                        | "summary"
                        | "info"
                        | "stateset"
                        | "unknown"
                        | "gaugehistogram"
                ) {
                    return Err(format!("bad type in {line:?}"));
                }
                families.push(name.to_owned());
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or(format!("no value in {line:?}"))?;
        let name = &line[..name_end];
        if !is_name(name) {
            return Err(format!("bad metric name in {line:?}"));
        }
        let mut rest = &line[name_end..];
        if let Some(labels) = rest.strip_prefix('{') {
            // label="value" pairs; values may contain escaped quotes.
            let mut chars = labels.char_indices();
            let mut in_value = false;
            let mut escaped = false;
            let mut end = None;
            for (i, c) in chars.by_ref() {
                match (in_value, escaped, c) {
                    (true, true, _) => escaped = false,
                    (true, false, '\\') => escaped = true,
                    (_, false, '"') => in_value = !in_value,
                    (false, _, '}') => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let end = end.ok_or(format!("unclosed labels in {line:?}"))?;
            for pair in labels[..end].split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or(format!("bad label in {line:?}"))?;
                if !(is_name(k) && v.starts_with('"') && v.ends_with('"') && v.len() >= 2) {
                    return Err(format!("bad label {pair:?} in {line:?}"));
                }
            }
            rest = &labels[end + 1..];
        }
        let mut fields = rest.trim_start_matches(' ').split(' ');
        let value = fields.next().unwrap_or("");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| format!("bad value in {line:?}"))?,
        };
        let family_known = families.iter().any(|f| {
            name == f
                || name.strip_prefix(f.as_str()).is_some_and(|s| {
                    matches!(
                        s,
                        "_total" | "_bucket" | "_count" | "_sum" | "_created" | "_info"
                    )
                })
        });
        if !family_known {
            return Err(format!("sample {name} has no # TYPE line before it"));
        }
        samples.push((line[..line.len() - rest.len()].to_owned(), value));
    }
    Err("no # EOF line".into())
}

#[test]
fn the_prometheus_checker_rejects_what_it_should() {
    assert!(parse_prometheus("# TYPE a counter\na_total 1\n# EOF\n").is_ok());
    assert!(parse_prometheus("# TYPE a counter\na_total 1\n").is_err());
    assert!(parse_prometheus("a_total 1\n# EOF\n").is_err());
    assert!(parse_prometheus("# TYPE a gauge\na{x=\"1\"} one\n# EOF\n").is_err());
    assert!(parse_prometheus("# TYPE a gauge\na{x=1} 1\n# EOF\n").is_err());
    assert!(parse_prometheus("# TYPE a gauge\na{x=\"a \\\" }\"} 1\n# EOF\n").is_ok());
}

#[tokio::test(start_paused = true)]
async fn metrics_parse_as_prometheus_text() {
    let h = start(Setup::default()).await;
    let first = h.deliver("pull_request", "x-1", &pr("o/r", 1)).await;
    h.deliver("pull_request", "x-1", &pr("o/r", 1)).await;
    h.deliver("push", "x-2", &json!({})).await;
    // Let a sweep publish the snapshot the gauges read.
    h.until_status(worker_of(&first), "active").await;
    eventually(|| async { (h.memory.status().version > 0).then_some(()) }).await;

    let res = h
        .http
        .get(format!("{}/metrics", h.base))
        .header("accept", "application/openmetrics-text")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let content_type = res.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.contains("text"), "{content_type}");
    let text = res.text().await.unwrap();
    let samples = parse_prometheus(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let value = |name: &str| {
        samples
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
    };
    assert_eq!(
        value(r#"webhook_router_deliveries_total{outcome="assigned"}"#),
        1.0
    );
    assert_eq!(
        value(r#"webhook_router_deliveries_total{outcome="duplicate"}"#),
        1.0
    );
    assert_eq!(
        value(r#"webhook_router_deliveries_total{outcome="ignored"}"#),
        1.0
    );
    assert_eq!(value("worker_registry_capacity_limit"), 8.0);
    assert_eq!(value("worker_registry_duplicates_total"), 1.0);
}

#[tokio::test(start_paused = true)]
async fn openapi_document_is_served_and_valid_json() {
    let h = start(Setup::default()).await;
    let a = h.get("/openapi.json").await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/workers",
        "/workers/{id}",
        "/workers/{id}/drain",
        "/metrics",
        "/healthz",
    ] {
        assert!(a.body["paths"][path].is_object(), "{path} missing");
    }
    assert_eq!(h.get("/healthz").await.status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn admin_token_guards_drain_and_crash() {
    let mut h = start(Setup {
        token: Some("t0ken"),
        ..Setup::default()
    })
    .await;
    let w = worker_of(&h.deliver("pull_request", "t-1", &pr("o/r", 1)).await);
    h.token = None;
    for path in [
        format!("/workers/{w}/drain"),
        format!("/debug/workers/{w}/crash"),
    ] {
        let a = h.post(&path).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{path}");
    }
    h.token = Some("wrong");
    assert_eq!(
        h.post(&format!("/debug/workers/{w}/crash")).await.status,
        StatusCode::UNAUTHORIZED
    );
    h.token = Some("t0ken");
    assert_eq!(
        h.post(&format!("/debug/workers/{w}/crash")).await.status,
        StatusCode::ACCEPTED
    );
    // Reads need the token too (issue 13: the list names repositories and pull requests).
    assert_eq!(
        h.get(&format!("/workers/{w}")).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_refuses_deliveries_and_drains_every_worker() {
    let h = start(Setup {
        work: Duration::from_secs(1),
        ..Setup::default()
    })
    .await;
    // Three workers finish their first loop; then two get another event: two busy, one idle.
    let mut workers = Vec::new();
    for (id, repo) in [("z-1", "o/a"), ("z-2", "o/b"), ("z-3", "o/c")] {
        workers.push(worker_of(
            &h.deliver("pull_request", id, &pr(repo, 1)).await,
        ));
    }
    let registry = h.memory.direct().clone();
    eventually(|| async {
        workers
            .iter()
            .all(|w| {
                registry
                    .worker(worker_registry::WorkerId::new(*w))
                    .is_some_and(|i| i.activity == worker_registry::Activity::Idle)
            })
            .then_some(())
    })
    .await;
    h.deliver("pull_request", "z-4", &pr("o/a", 1)).await;
    h.deliver("pull_request", "z-5", &pr("o/b", 1)).await;

    let drained = h
        .server
        .app()
        .shutdown()
        .begin(Duration::from_secs(10))
        .await;
    assert_eq!((drained.draining, drained.exited), (2, 1));
    let refused = h.deliver("pull_request", "z-6", &pr("o/d", 1)).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body["outcome"], "closing");

    let report = h.server.shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.stopped_at_deadline, 0);
    assert!(report.unfinished.is_empty(), "{:?}", report.unfinished);
    let stats = registry.stats();
    assert_eq!((stats.live_workers, stats.deaths_exited), (0, 3));
    assert_eq!(stats.claims_completed, 5);
}

#[tokio::test(start_paused = true)]
async fn form_encoded_deliveries_are_accepted() {
    let secret = "It's a Secret to Everybody";
    let h = start(Setup {
        secret: Some(secret),
        ..Setup::default()
    })
    .await;
    let send = |id: &'static str, body: String| {
        let signature = github::sign(secret.as_bytes(), body.as_bytes());
        let req = h
            .http
            .post(format!("{}/webhook", h.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .header(github::EVENT_HEADER, "pull_request")
            .header(github::DELIVERY_HEADER, id)
            .header(github::SIGNATURE_HEADER, signature)
            .body(body);
        async move { answer(req.send().await.unwrap()).await }
    };
    let payload = pr("o/r", 5).to_string();
    let a = send("f-1", format!("payload={}", form_encode(&payload))).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    assert_eq!(a.body["outcome"], "assigned");
    let info = h.get(&format!("/workers/{}", worker_of(&a))).await;
    assert_eq!(info.body["target"], "o/r#5");

    let missing = send("f-2", "other=1".to_owned()).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert!(missing.body["error"]
        .as_str()
        .unwrap()
        .contains("form-encoded"));
}

#[tokio::test(start_paused = true)]
async fn a_redelivery_starts_the_worker_whose_creating_admission_lost_its_reply() {
    let h = start(Setup::default()).await;
    // The admission committed, and its reply never reached a router: nothing started the worker.
    let target = worker_registry::Target::new("octo/repo", 9).unwrap();
    let delivery = worker_registry::DeliveryId::new("lost").unwrap();
    let Ok(worker_registry::Admission::Assigned(a)) =
        WorkerRegistryExt::admit(&h.memory, &target, &delivery).await
    else {
        panic!("admitted")
    };
    assert!(a.new);
    // The redelivery, at once (no time is waited for), wins the worker's start claim: it starts
    // the worker and hands it the event.
    let retry = h.deliver("pull_request", "lost", &pr("octo/repo", 9)).await;
    assert_eq!(retry.status, StatusCode::ACCEPTED, "{:?}", retry.body);
    assert_eq!(retry.body["outcome"], "assigned");
    assert_eq!(worker_of(&retry), a.worker.get());
    // It runs: it heartbeats, completes the event, and a later redelivery is a plain duplicate.
    let done = eventually(|| async {
        let d = h.deliver("pull_request", "lost", &pr("octo/repo", 9)).await;
        (d.body["state"] == "completed").then_some(d)
    })
    .await;
    assert_eq!(worker_of(&done), a.worker.get());
    let info = WorkerRegistry::worker(&h.memory, a.worker)
        .await
        .unwrap()
        .unwrap();
    assert!(info.has_heartbeated);
    let audit = h.server.app().containers().ledger().audit();
    assert_eq!((audit.started, audit.refused, audit.lost_claims), (1, 0, 0));
}

/// The race the start claim settles, made deterministic: the reply to the admission that created a
/// worker is held back (as on a loaded machine), and a redelivery of that delivery, answered a
/// duplicate whose worker never started, takes the lost-start path meanwhile. It wins the
/// worker's start claim, starts the worker and hands it the event; the creating admission, let
/// go, loses the claim to that very delivery and leaves the handover to the winner. One
/// container, the event run once and completed, and the ledger shows one lost claim and no
/// refusal.
#[tokio::test(start_paused = true)]
async fn a_held_back_creating_admission_and_a_redelivery_start_one_container() {
    let mut hold = None;
    let h = start_with(Setup::default(), |memory| {
        let (held, registry) = Hold::wrap(DynRegistry::new(memory));
        hold = Some(held);
        registry
    })
    .await;
    let hold = hold.unwrap();
    let held = hold.hold("race");
    let payload = pr("octo/repo", 9);
    let (first, retry) = tokio::join!(h.deliver("pull_request", "race", &payload), async {
        held.reached().await;
        let retry = h.deliver("pull_request", "race", &payload).await;
        held.release();
        retry
    });
    assert_eq!(retry.status, StatusCode::ACCEPTED, "{:?}", retry.body);
    assert_eq!(retry.body["outcome"], "assigned");
    assert_eq!(first.status, StatusCode::ACCEPTED, "{:?}", first.body);
    assert_eq!(first.body["outcome"], "assigned");
    assert_eq!(first.body["new"], true);
    let w = worker_of(&first);
    assert_eq!(worker_of(&retry), w);
    let done = eventually(|| async {
        let d = h.deliver("pull_request", "race", &payload).await;
        (d.body["state"] == "completed").then_some(d)
    })
    .await;
    assert_eq!(worker_of(&done), w);
    let id = worker_registry::WorkerId::new(w);
    // Idle again: whatever was queued for it has run.
    eventually(|| async {
        WorkerRegistry::worker(&h.memory, id)
            .await
            .unwrap()
            .filter(|i| i.activity == worker_registry::Activity::Idle)
    })
    .await;
    assert_eq!(hold.loops(id), 1, "the event ran once");
    let containers = h.server.app().containers();
    assert!(containers.is_running(id));
    let audit = containers.ledger().audit();
    assert_eq!(
        (audit.started, audit.workers, audit.max_per_worker),
        (1, 1, 1),
        "one container: {audit:?}"
    );
    assert_eq!(
        (audit.refused, audit.lost_claims, audit.abandoned_claims),
        (0, 1, 0),
        "the creating admission lost the claim, nothing was refused: {audit:?}"
    );
}

/// The other order: a redelivery, answered a duplicate whose worker never started while the
/// creating admission's reply is held back, is itself held up (its read of the worker); the
/// creating admission then wins the start claim, starts the worker and hands it the event. The
/// redelivery, let go, loses the claim to the admission of that very delivery and is a plain
/// duplicate: the event is not handed over a second time.
#[tokio::test(start_paused = true)]
async fn a_redelivery_that_loses_the_start_claim_to_its_own_delivery_is_a_duplicate() {
    let mut hold = None;
    let h = start_with(Setup::default(), |memory| {
        let (held, registry) = Hold::wrap(DynRegistry::new(memory));
        hold = Some(held);
        registry
    })
    .await;
    let hold = hold.unwrap();
    let creating = hold.hold("order");
    let payload = pr("octo/repo", 9);
    let answered = tokio::sync::Notify::new();
    let (first, retry) = tokio::join!(
        async {
            let first = h.deliver("pull_request", "order", &payload).await;
            answered.notify_one();
            first
        },
        async {
            creating.reached().await;
            let read = hold.hold_read();
            let (retry, ()) = tokio::join!(h.deliver("pull_request", "order", &payload), async {
                // The redelivery has read the worker (alive, never heartbeated) and waits.
                read.reached().await;
                creating.release();
                answered.notified().await;
                read.release();
            });
            retry
        },
    );
    assert_eq!(first.status, StatusCode::ACCEPTED, "{:?}", first.body);
    assert_eq!(first.body["outcome"], "assigned");
    assert_eq!(first.body["new"], true);
    assert_eq!(retry.status, StatusCode::OK, "{:?}", retry.body);
    assert_eq!(retry.body["outcome"], "duplicate");
    let id = worker_registry::WorkerId::new(worker_of(&first));
    assert_eq!(worker_of(&retry), id.get());
    eventually(|| async {
        let d = h.deliver("pull_request", "order", &payload).await;
        (d.body["state"] == "completed").then_some(())
    })
    .await;
    eventually(|| async {
        WorkerRegistry::worker(&h.memory, id)
            .await
            .unwrap()
            .filter(|i| i.activity == worker_registry::Activity::Idle)
    })
    .await;
    assert_eq!(hold.loops(id), 1, "the event ran once");
    let audit = h.server.app().containers().ledger().audit();
    assert_eq!(
        (audit.started, audit.refused, audit.lost_claims),
        (1, 0, 1),
        "the redelivery lost the claim, nothing was refused: {audit:?}"
    );
}
