//! Issue 12: the API description. `/openapi.json` covers `POST /webhook` and the debug endpoint
//! with their status codes and bodies, its worker-id schema agrees with the parser, the worker
//! list links to the per-worker operations, and a property test (the in-`cargo test` counterpart
//! of `scripts/schemathesis.sh`) sends generated deliveries built from the document and checks
//! every answer against it: a documented status, a body valid against the documented schema,
//! `Retry-After` on a 503, never a 500.

mod common;

use common::*;

use std::path::PathBuf;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reqwest::StatusCode;
use serde_json::{json, Value};
use webhook_router::github;
use worker_registry::WorkerId;

const SECRET: &str = "schema-secret";

async fn document(h: &Harness) -> Value {
    let a = h.get("/openapi.json").await;
    assert_eq!(a.status, StatusCode::OK);
    a.body
}

/// A validator for the schema the document gives `status` of `path`'s `method` (JSON bodies).
fn response_validator(
    doc: &Value,
    path: &str,
    method: &str,
    status: u16,
) -> Option<jsonschema::Validator> {
    let schema = doc["paths"][path][method]["responses"][status.to_string()]["content"]
        ["application/json"]["schema"]
        .clone();
    if schema.is_null() {
        return None;
    }
    // The schema's `$ref`s point into the document's components.
    let root = json!({ "$ref": schema["$ref"], "components": doc["components"] });
    Some(jsonschema::validator_for(&root).expect("the document's schemas compile"))
}

#[tokio::test(start_paused = true)]
async fn the_document_describes_the_webhook_and_the_debug_endpoint() {
    let h = start(Setup::default()).await;
    let doc = document(&h).await;
    let webhook = &doc["paths"]["/webhook"]["post"];
    for status in ["200", "202", "400", "401", "408", "413", "415", "503"] {
        let r = &webhook["responses"][status];
        assert!(r.is_object(), "/webhook {status} undocumented");
        assert!(
            r["content"]["application/json"]["schema"]["$ref"].is_string(),
            "/webhook {status} has no body schema"
        );
    }
    assert!(webhook["responses"]["503"]["headers"]["Retry-After"].is_object());
    let content = webhook["requestBody"]["content"].as_object().unwrap();
    assert!(content.contains_key("application/json"));
    assert!(content.contains_key("application/x-www-form-urlencoded"));
    let headers: Vec<&str> = webhook["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["in"] == "header")
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for h in ["X-GitHub-Event", "X-GitHub-Delivery", "X-Hub-Signature-256"] {
        assert!(headers.contains(&h), "{h} undocumented: {headers:?}");
    }
    let crash = &doc["paths"]["/debug/workers/{id}/crash"]["post"];
    for status in ["202", "400", "401", "404", "409", "503"] {
        assert!(crash["responses"][status].is_object(), "crash {status}");
    }
    // The admin API is still all there.
    for path in [
        "/workers",
        "/workers/{id}",
        "/workers/{id}/drain",
        "/metrics",
        "/healthz",
        "/openapi.json",
    ] {
        assert!(doc["paths"][path].is_object(), "{path}");
    }
    // Every response schema compiles.
    for status in [200u16, 202, 400, 503] {
        assert!(response_validator(&doc, "/webhook", "post", status).is_some());
    }
}

/// `GET /deliveries/failed` is in the document, and its answer (with a record in it) and its 400
/// are valid against the schemas the document gives them.
#[tokio::test(start_paused = true)]
async fn the_failed_deliveries_answer_matches_the_document() {
    use webhook_router::failed::FailedDelivery;
    use worker_registry::{DeliveryId, FencingToken, Target};

    let h = start(Setup::default()).await;
    let doc = document(&h).await;
    let failed = FailedDelivery::now(
        DeliveryId::new("d-1").unwrap(),
        Target::new("o/r", 1).unwrap(),
        WorkerId::new(7),
        FencingToken::from_raw(1),
        3,
        Some("exit status 7"),
    );
    h.server.app().failed().record(failed);
    for (query, status) in [("", 200), ("?limit=1", 200), ("?limit=-1", 400)] {
        let a = h.get(&format!("/deliveries/failed{query}")).await;
        assert_eq!(a.status.as_u16(), status, "{query}: {}", a.body);
        let v = response_validator(&doc, "/deliveries/failed", "get", status).unwrap();
        assert!(v.is_valid(&a.body), "{query}: {}", a.body);
    }
}

/// Worker ids: the schema says what the parser takes (decimal, 0 to 2^44 - 1), at both ends.
#[tokio::test(start_paused = true)]
async fn worker_id_schema_and_parser_agree() {
    let h = start(Setup::default()).await;
    let doc = document(&h).await;
    for (path, method) in [
        ("/workers/{id}", "get"),
        ("/workers/{id}/drain", "post"),
        ("/debug/workers/{id}/crash", "post"),
    ] {
        let p = &doc["paths"][path][method]["parameters"][0];
        assert_eq!(p["name"], "id");
        let s = &p["schema"];
        assert_eq!(s["type"], "integer", "{path}");
        assert_eq!(s["minimum"], 0, "{path}");
        assert_eq!(s["maximum"].as_u64(), Some(WorkerId::MAX), "{path}");
    }
    assert_eq!(
        doc["components"]["schemas"]["Worker"]["properties"]["id"]["maximum"].as_u64(),
        Some(WorkerId::MAX)
    );
    // In range: a well-formed id (unknown here: 404); out of range or not canonical: 400.
    assert_eq!(
        h.get(&format!("/workers/{}", WorkerId::MAX)).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(h.get("/workers/0").await.status, StatusCode::NOT_FOUND);
    for bad in [
        (WorkerId::MAX + 1).to_string(),
        u64::MAX.to_string(),
        "-1".into(),
        "+1".into(),
        "01".into(),
        "1.0".into(),
    ] {
        assert_eq!(
            h.get(&format!("/workers/{bad}")).await.status,
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
        assert_eq!(
            h.post(&format!("/debug/workers/{bad}/crash")).await.status,
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
    }
    proptest!(|(n in any::<u64>())| {
        prop_assert_eq!(n.to_string().parse::<WorkerId>().is_ok(), n <= WorkerId::MAX);
    });
}

/// The list links to the per-worker operations, and following the link works.
#[tokio::test(start_paused = true)]
async fn the_worker_list_links_to_the_per_worker_operations() {
    let h = start(Setup::default()).await;
    let doc = document(&h).await;
    let links = &doc["paths"]["/workers"]["get"]["responses"]["200"]["links"];
    let operations: Vec<String> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|p| p.as_object().unwrap().values())
        .filter_map(|o| o["operationId"].as_str().map(str::to_owned))
        .collect();
    for name in ["GetWorker", "DrainWorker"] {
        let link = &links[name];
        let op = link["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {link}"));
        assert!(
            operations.iter().any(|o| o == op),
            "{name} -> {op} not in {operations:?}"
        );
        assert_eq!(link["parameters"]["id"], "$response.body#/workers/0/id");
    }
    h.deliver("pull_request", "l-1", &pr("o/r", 1)).await;
    let list = eventually(|| async {
        let l = h.get("/workers").await;
        (!l.body["workers"].as_array()?.is_empty()).then_some(l.body)
    })
    .await;
    let id = &list["workers"][0]["id"];
    assert_eq!(
        h.get(&format!("/workers/{id}")).await.status,
        StatusCode::OK
    );
}

// ---- the property test over the document ---------------------------------------------------------

#[derive(Debug, Clone)]
enum Signature {
    Valid,
    Wrong,
    Malformed,
    Missing,
}

#[derive(Debug, Clone)]
struct Delivery {
    event: Option<String>,
    id: Option<String>,
    content_type: Option<String>,
    signature: Signature,
    body: Vec<u8>,
}

/// The replay payloads with their event (the file name up to its first dot).
fn replay_payloads() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/replay/payloads");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            let event = name.split('.').next().unwrap().to_owned();
            (
                event,
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.to_string().cmp(&b.1.to_string())));
    out
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A realistic payload and its event, sometimes with its repository or numbers mangled.
fn payload(samples: Vec<(String, Value)>) -> impl Strategy<Value = (String, Value)> {
    (
        prop::sample::select(samples),
        prop::option::weighted(0.3, "[A-Za-z0-9_.-]{0,12}/?[A-Za-z0-9_.-]{0,12}"),
        prop::option::weighted(0.3, prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()]),
    )
        .prop_map(|((event, mut v), repo, number)| {
            if let Some(r) = repo {
                v["repository"]["full_name"] = Value::from(r);
            }
            if let Some(n) = number {
                for key in ["number"] {
                    if v.get(key).is_some() {
                        v[key] = Value::from(n);
                    }
                }
                if v.get("pull_request").is_some() {
                    v["pull_request"]["number"] = Value::from(n);
                }
            }
            (event, v)
        })
}

/// Deliveries built from the document: its header parameters, its request content types, and
/// bodies for them (plus what a careless or hostile client sends instead).
fn deliveries(doc: &Value) -> impl Strategy<Value = Delivery> {
    let op = &doc["paths"]["/webhook"]["post"];
    let content_types: Vec<String> = op["requestBody"]["content"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let mut events: Vec<String> = github::PR_EVENTS.iter().map(|e| e.to_string()).collect();
    events.extend(["push", "ping", "release"].map(String::from));
    let ct = prop_oneof![
        8 => prop::sample::select(content_types).prop_map(Some),
        1 => Just(Some("Application/JSON; charset=utf-8".to_owned())),
        1 => Just(Some("text/plain".to_owned())),
        1 => Just(None),
    ];
    // A payload with its own event, mostly; sometimes another event, arbitrary JSON or bytes.
    let event_and_body = prop_oneof![
        8 => payload(replay_payloads()).prop_map(|(e, v)| (Some(e), v.to_string().into_bytes())),
        1 => (prop::sample::select(events.clone()), payload(replay_payloads()))
            .prop_map(|(e, (_, v))| (Some(e), v.to_string().into_bytes())),
        1 => (prop::sample::select(events), arbitrary_json())
            .prop_map(|(e, v)| (Some(e), v.to_string().into_bytes())),
        1 => ("[ -~]{0,12}", prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(e, b)| (Some(e), b)),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| (None, b)),
    ];
    (
        event_and_body,
        prop_oneof![
            5 => "[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}".prop_map(Some),
            // Redeliveries.
            2 => "redelivery-[0-3]".prop_map(Some),
            1 => "[ -~]{0,300}".prop_map(Some),
            1 => Just(None),
        ],
        ct,
        prop_oneof![
            6 => Just(Signature::Valid),
            1 => Just(Signature::Wrong),
            1 => Just(Signature::Malformed),
            1 => Just(Signature::Missing),
        ],
    )
        .prop_map(|((event, body), id, content_type, signature)| {
            let form = content_type.as_deref().is_some_and(|c| {
                c.to_ascii_lowercase()
                    .starts_with("application/x-www-form-urlencoded")
            });
            let body = if form {
                format!("payload={}", form_encode(&String::from_utf8_lossy(&body))).into_bytes()
            } else {
                body
            };
            Delivery {
                event,
                id,
                content_type,
                signature,
                body,
            }
        })
}

async fn check(h: &Harness, doc: &Value, d: Delivery) -> Result<(), TestCaseError> {
    let mut req = h.http.post(format!("{}/webhook", h.base));
    if let Some(e) = &d.event {
        req = req.header(github::EVENT_HEADER, e);
    }
    if let Some(i) = &d.id {
        req = req.header(github::DELIVERY_HEADER, i);
    }
    if let Some(c) = &d.content_type {
        req = req.header("content-type", c);
    }
    let sig = match d.signature {
        Signature::Valid => Some(github::sign(SECRET.as_bytes(), &d.body)),
        Signature::Wrong => Some(github::sign(b"not the secret", &d.body)),
        Signature::Malformed => Some("sha256=zz".to_owned()),
        Signature::Missing => None,
    };
    if let Some(s) = sig {
        req = req.header(github::SIGNATURE_HEADER, s);
    }
    let res = req.body(d.body.clone()).send().await.unwrap();
    let status = res.status().as_u16();
    let retry_after = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let ct = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = res.text().await.unwrap();
    prop_assert!(
        doc["paths"]["/webhook"]["post"]["responses"][status.to_string()].is_object(),
        "undocumented status {status}: {text}"
    );
    prop_assert_ne!(status, 500);
    prop_assert_eq!(ct.as_deref(), Some("application/json"), "{}", text);
    let body: Value =
        serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
    let validator = response_validator(doc, "/webhook", "post", status).unwrap();
    if let Err(e) = validator.validate(&body) {
        return Err(TestCaseError::fail(format!(
            "{status} body does not match its schema: {e}\n{body:#}"
        )));
    }
    if status == 503 {
        let secs: u64 = retry_after.as_deref().unwrap_or("").parse().map_err(|_| {
            TestCaseError::fail(format!(
                "503 without a numeric Retry-After: {retry_after:?}"
            ))
        })?;
        prop_assert!(secs >= 1);
    }
    Ok(())
}

#[test]
fn post_webhook_answers_as_its_openapi_description_says() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (h, doc) = rt.block_on(async {
        let h = start(Setup {
            secret: Some(SECRET),
            capacity: 4,
            ..Setup::default()
        })
        .await;
        let doc = document(&h).await;
        (h, doc)
    });
    // A fixed seed: the same 300 cases every run (change the seed to explore), so the coverage
    // check below is stable.
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 300,
            failure_persistence: None,
            ..Config::default()
        },
        proptest::test_runner::TestRng::from_seed(
            proptest::test_runner::RngAlgorithm::ChaCha,
            &[7; 32],
        ),
    );
    runner
        .run(&deliveries(&doc), |d| rt.block_on(check(&h, &doc, d)))
        .unwrap();
    // A few fixed deliveries too, then: the run reached every kind of answer that matters (the
    // router counts its answers by outcome).
    let exercised = rt.block_on(async {
        for (i, (event, body)) in [
            ("pull_request", pr("o/r", 1)),
            ("pull_request", pr("o/r", 1)),
            ("push", json!({})),
            ("pull_request", json!({"repository": {"full_name": "o/r"}})),
        ]
        .into_iter()
        .enumerate()
        {
            let body = body.to_string().into_bytes();
            let d = Delivery {
                event: Some(event.into()),
                // The first two are the same delivery: the second is a duplicate.
                id: Some(format!("fixed-{}", i.max(1))),
                content_type: Some("application/json".into()),
                signature: Signature::Valid,
                body,
            };
            check(&h, &doc, d).await.unwrap();
        }
        let text = h.get("/metrics").await.body.as_str().unwrap().to_owned();
        text.lines()
            .filter_map(|l| l.strip_prefix("webhook_router_deliveries_total{outcome=\""))
            .filter_map(|l| l.split_once("\"} "))
            .filter(|(_, n)| n.parse::<f64>().is_ok_and(|n| n > 0.0))
            .map(|(o, _)| o.to_owned())
            .collect::<std::collections::BTreeSet<String>>()
    });
    for outcome in [
        "assigned",
        "duplicate",
        "ignored",
        "invalid",
        "unauthorized",
        "capacity",
    ] {
        assert!(
            exercised.contains(outcome),
            "{outcome} never answered: {exercised:?}"
        );
    }
}
