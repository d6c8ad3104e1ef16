//! Issue 12: the router on real GitHub traffic. A replay of realistic payloads (every event kind
//! that concerns a pull request, and some that do not), signed, JSON and form-encoded, checked
//! against the routing table in `tests/replay/table.json`; and the findings about names, formats
//! and answers, each with a test.

mod common;

use common::*;

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;
use webhook_router::github;

const SECRET: &str = "It's a Secret to Everybody";

fn table() -> Vec<Value> {
    replay_table()
}

fn payload(name: &str) -> Vec<u8> {
    replay_payload(name)
}

/// Sends `body` as GitHub would, signed, with `content_type`.
async fn send_raw(h: &Harness, event: &str, id: &str, content_type: &str, body: Vec<u8>) -> Answer {
    let req = h
        .http
        .post(format!("{}/webhook", h.base))
        .header("content-type", content_type)
        .header("user-agent", "GitHub-Hookshot/044aadd")
        .header(github::EVENT_HEADER, event)
        .header(github::DELIVERY_HEADER, id)
        .header(
            github::SIGNATURE_HEADER,
            github::sign(SECRET.as_bytes(), &body),
        )
        .body(body);
    answer(req.send().await.unwrap()).await
}

async fn send(h: &Harness, event: &str, id: &str, json_payload: Vec<u8>, form: bool) -> Answer {
    if form {
        let text = String::from_utf8(json_payload).unwrap();
        let body = format!("payload={}", form_encode(&text)).into_bytes();
        send_raw(h, event, id, "application/x-www-form-urlencoded", body).await
    } else {
        send_raw(h, event, id, "application/json", json_payload).await
    }
}

async fn replay(form: bool) {
    let h = start(Setup {
        secret: Some(SECRET),
        capacity: 16,
        ..Setup::default()
    })
    .await;
    let rows = table();
    assert!(rows.len() >= 19);
    for (i, row) in rows.iter().enumerate() {
        let name = row["payload"].as_str().unwrap();
        let event = row["event"].as_str().unwrap();
        let id = format!("replay-{i}-{name}");
        let a = send(&h, event, &id, payload(name), form).await;
        let ctx = format!("{name} (form: {form}): {:#}", a.body);
        assert_eq!(
            a.status.as_u16(),
            row["status"].as_u64().unwrap() as u16,
            "{ctx}"
        );
        assert_eq!(a.body["outcome"], row["outcome"], "{ctx}");
        assert_eq!(a.body["event"], event, "{ctx}");
        match row["decision"].as_str() {
            Some(d) => assert_eq!(a.body["decision"], d, "{ctx}"),
            None => assert!(a.body.get("decision").is_none(), "{ctx}"),
        }
        let want = row["targets"].as_array().unwrap();
        let got = a.body["targets"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{ctx}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g["target"], w["target"], "{ctx}");
            assert_eq!(g["outcome"], w["outcome"], "{ctx}");
            if let Some(new) = w.get("new") {
                assert_eq!(&g["new"], new, "{ctx}");
            }
        }
        // A redelivery of anything placed is a duplicate, whichever content type.
        if a.body["outcome"] == "assigned" {
            let again = send(&h, event, &id, payload(name), !form).await;
            assert_eq!(
                again.status,
                StatusCode::OK,
                "{name} redelivered: {:#}",
                again.body
            );
            assert_eq!(again.body["outcome"], "duplicate");
        }
    }
    // `reach` and `drain` started nothing: no worker ever existed for #43, #47 or #48.
    let list = h.get("/workers").await;
    let targets: Vec<&str> = list.body["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["target"].as_str())
        .collect();
    for never in ["octo-org/api#43", "octo-org/api#47", "octo-org/api#48"] {
        assert!(
            !targets.contains(&never),
            "{never} got a worker: {targets:?}"
        );
    }
    // The merged PR's worker drained: it finishes its last event and exits.
    let w44 = eventually(|| async {
        let list = h.get("/workers").await;
        list.body["workers"]
            .as_array()?
            .iter()
            .find(|w| w["target"] == "octo-org/api#44")
            .filter(|w| w["status"] == "dead")
            .cloned()
    })
    .await;
    assert_eq!(w44["reason"], "exited");
}

#[tokio::test(start_paused = true)]
async fn replay_of_realistic_json_deliveries_follows_the_routing_table() {
    replay(false).await;
}

#[tokio::test(start_paused = true)]
async fn replay_of_realistic_form_encoded_deliveries_follows_the_routing_table() {
    replay(true).await;
}

/// A closed PR's worker drains and none is started for it afterwards by a reach event.
#[tokio::test(start_paused = true)]
async fn a_closed_pull_request_drains_its_worker_and_starts_none() {
    let h = start(Setup::default()).await;
    let w = worker_of(&h.deliver("pull_request", "c-1", &pr("o/r", 5)).await);
    let mut closed = pr("o/r", 5);
    closed["action"] = json!("closed");
    closed["pull_request"]["merged"] = json!(true);
    let a = h.deliver("pull_request", "c-2", &closed).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:#}", a.body);
    assert_eq!(
        (a.body["outcome"].as_str(), a.body["decision"].as_str()),
        (Some("drained"), Some("drain"))
    );
    assert_eq!(worker_of(&a), w);
    h.until_status(w, "dead").await;
    // Closing again (a redelivery would be a duplicate; this is a new delivery): nothing to drain.
    let again = h.deliver("pull_request", "c-3", &closed).await;
    assert_eq!(again.body["outcome"], "ignored", "{:#}", again.body);
    assert!(again.body["reason"]
        .as_str()
        .unwrap()
        .contains("start none"));
    let mut labeled = pr("o/r", 5);
    labeled["action"] = json!("labeled");
    assert_eq!(
        h.deliver("pull_request", "c-4", &labeled).await.body["outcome"],
        "ignored"
    );
    assert_eq!(h.memory.direct().live_workers(), 0);
}

/// A redelivery of a `closed` event is a duplicate, also while the worker it drained is still
/// draining (the drain path once answered it "ignored: already draining" before asking the
/// dedupe), and so is a redelivery of a `closed` event that found the worker already draining.
#[tokio::test(start_paused = true)]
async fn a_redelivered_close_is_a_duplicate_while_its_worker_drains() {
    let h = start(Setup {
        // The worker is busy with its last event for the whole test: it stays draining.
        work: Duration::from_secs(3600),
        ..Setup::default()
    })
    .await;
    let w = worker_of(&h.deliver("pull_request", "d-1", &pr("o/r", 6)).await);
    let mut closed = pr("o/r", 6);
    closed["action"] = json!("closed");
    let a = h.deliver("pull_request", "d-2", &closed).await;
    assert_eq!(a.body["outcome"], "drained", "{:#}", a.body);
    h.until_status(w, "draining").await;
    let again = h.deliver("pull_request", "d-2", &closed).await;
    assert_eq!(again.status, StatusCode::OK, "{:#}", again.body);
    assert_eq!(again.body["outcome"], "duplicate", "{:#}", again.body);
    // A second close, new: nothing to drain; its redelivery is a duplicate too.
    let second = h.deliver("pull_request", "d-3", &closed).await;
    assert_eq!(second.status, StatusCode::ACCEPTED, "{:#}", second.body);
    assert!(second.body["reason"]
        .as_str()
        .unwrap()
        .contains("already draining"));
    let second_again = h.deliver("pull_request", "d-3", &closed).await;
    assert_eq!(
        second_again.body["outcome"], "duplicate",
        "{:#}",
        second_again.body
    );
}

/// A configured policy is followed: here, labels start workers and closing is ignored.
#[tokio::test(start_paused = true)]
async fn the_routing_policy_is_configurable() {
    let policy = webhook_router::policy::Policy::default()
        .with_rule("pull_request.labeled=start")
        .unwrap()
        .with_rule("pull_request.closed=ignore")
        .unwrap();
    let h = start(Setup {
        policy,
        ..Setup::default()
    })
    .await;
    let mut labeled = pr("o/r", 1);
    labeled["action"] = json!("labeled");
    let a = h.deliver("pull_request", "p-1", &labeled).await;
    assert_eq!(
        (a.body["outcome"].as_str(), a.body["decision"].as_str()),
        (Some("assigned"), Some("start"))
    );
    let mut closed = pr("o/r", 1);
    closed["action"] = json!("closed");
    let c = h.deliver("pull_request", "p-2", &closed).await;
    assert_eq!(
        (c.body["outcome"].as_str(), c.body["decision"].as_str()),
        (Some("ignored"), Some("ignore"))
    );
    h.until_status(worker_of(&a), "active").await;
}

/// `Content-Type` is a case-insensitive media type with optional parameters.
#[tokio::test(start_paused = true)]
async fn content_types_are_matched_case_insensitively_with_parameters() {
    let h = start(Setup {
        secret: Some(SECRET),
        ..Setup::default()
    })
    .await;
    let body = pr("o/r", 1).to_string();
    let form = format!("payload={}", form_encode(&body)).into_bytes();
    for (i, (ct, b)) in [
        ("Application/X-WWW-Form-Urlencoded", form.clone()),
        ("application/x-www-form-urlencoded; charset=utf-8", form),
        ("Application/JSON; charset=UTF-8", body.clone().into_bytes()),
    ]
    .into_iter()
    .enumerate()
    {
        let a = send_raw(&h, "pull_request", &format!("ct-{i}"), ct, b).await;
        assert!(a.status.is_success(), "{ct}: {:?}", a.body);
    }
    let a = send_raw(&h, "pull_request", "ct-x", "text/plain", body.into_bytes()).await;
    assert_eq!(a.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(a.body["error"].as_str().unwrap().contains("text/plain"));
}

/// Unknown paths and wrong methods answer JSON errors too.
#[tokio::test(start_paused = true)]
async fn unknown_paths_and_methods_answer_json() {
    let h = start(Setup::default()).await;
    for path in ["/", "/nope", "/workers/1/nope", "/webhook/extra"] {
        let a = h.get(path).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{path}");
        assert!(
            a.body["error"].as_str().unwrap().contains(path),
            "{path}: {:?}",
            a.body
        );
    }
    let a = h.get("/webhook").await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(a.body["error"].is_string(), "{:?}", a.body);
}

/// A webhook signature failure is not an HTTP authentication challenge: no `WWW-Authenticate`.
/// The admin API's 401 keeps its `Bearer` challenge.
#[tokio::test(start_paused = true)]
async fn a_bad_webhook_signature_carries_no_bearer_challenge() {
    let h = start(Setup {
        secret: Some(SECRET),
        token: Some("t0ken"),
        ..Setup::default()
    })
    .await;
    let res = h
        .http
        .post(format!("{}/webhook", h.base))
        .header("content-type", "application/json")
        .header(github::EVENT_HEADER, "pull_request")
        .header(github::DELIVERY_HEADER, "sig-1")
        .header(github::SIGNATURE_HEADER, github::sign(b"wrong", b"{}"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(res.headers().get("www-authenticate").is_none());
    let admin = h
        .http
        .get(format!("{}/workers", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(admin.status(), StatusCode::UNAUTHORIZED);
    assert!(admin.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Bearer"));
}

/// An Enterprise Managed User's repository is a target like any other.
#[tokio::test(start_paused = true)]
async fn enterprise_managed_user_owners_are_routed() {
    let h = start(Setup::default()).await;
    let a = h
        .deliver("pull_request", "emu-1", &pr("Mona_OctoCorp/app", 3))
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    assert_eq!(a.body["targets"][0]["target"], "mona_octocorp/app#3");
    let bad = h
        .deliver("pull_request", "emu-2", &pr("-mona/app", 3))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body["error"]
        .as_str()
        .unwrap()
        .contains("starts with '-'"));
}

/// Found by schemathesis: a malformed signature header is refused even by a router without a
/// secret, and a payload that is not a JSON object is refused whatever the event.
#[tokio::test(start_paused = true)]
async fn malformed_signatures_and_non_object_payloads_are_refused() {
    let h = start(Setup::default()).await;
    let res = h
        .http
        .post(format!("{}/webhook", h.base))
        .header("content-type", "application/json")
        .header(github::EVENT_HEADER, "push")
        .header(github::DELIVERY_HEADER, "s-1")
        .header(github::SIGNATURE_HEADER, "{}")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    for (i, body) in ["8115548734529121.0", "[]", "\"x\""]
        .into_iter()
        .enumerate()
    {
        let res = h
            .http
            .post(format!("{}/webhook", h.base))
            .header("content-type", "application/json")
            .header(github::EVENT_HEADER, "G")
            .header(github::DELIVERY_HEADER, format!("n-{i}"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body}");
    }
}
