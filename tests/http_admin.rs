//! The admin HTTP API over real HTTP on 127.0.0.1:0: list, get, drain, errors, bearer token,
//! metrics and the OpenAPI document. Registry time is a `ManualClock`; nothing sleeps.
#![cfg(feature = "http")]

mod metrics_format;

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use reqwest::{header, Client, Method, StatusCode};
use serde_json::{json, Value};
use worker_registry::http::{admin_router, AdminOptions};
use worker_registry::metrics::Metrics;
use worker_registry::{
    memory::Direct, Admission, DeliveryId, InMemoryRegistry, ManualClock, RegistryConfig, Target,
    WorkerId,
};

fn t(n: u64) -> Target {
    Target::new("octo/repo", n).unwrap()
}

fn e(s: &str) -> DeliveryId {
    DeliveryId::new(s).unwrap()
}

fn assigned(a: Admission) -> WorkerId {
    match a {
        Admission::Assigned(a) => a.worker,
        other => panic!("not assigned: {other:?}"),
    }
}

fn registry(clock: &ManualClock) -> Direct<ManualClock> {
    let config = RegistryConfig::builder()
        .max_workers(8)
        .startup_grace(Duration::ZERO)
        .brake_fraction(1.0)
        .build()
        .unwrap();
    Direct::with_clock(config, clock.clone())
}

/// Serves `router` on an ephemeral loopback port; returns its base URL.
async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

struct Api {
    base: String,
    client: Client,
}

impl Api {
    async fn new<C: worker_registry::Clock>(registry: &Direct<C>, options: AdminOptions) -> Self {
        Self {
            base: serve(admin_router(
                InMemoryRegistry::from(registry.clone()),
                options,
            ))
            .await,
            client: Client::new(),
        }
    }

    async fn send(&self, method: Method, path: &str, token: Option<&str>) -> reqwest::Response {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        req.send().await.unwrap()
    }

    /// Status and JSON body; asserts the body is JSON.
    async fn json(&self, method: Method, path: &str, token: Option<&str>) -> (StatusCode, Value) {
        let res = self.send(method, path, token).await;
        let status = res.status();
        let ct = res.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            ct.starts_with("application/json"),
            "{path}: content-type {ct}"
        );
        (status, res.json().await.unwrap())
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.json(Method::GET, path, None).await
    }

    async fn post(&self, path: &str, token: Option<&str>) -> (StatusCode, Value) {
        self.json(Method::POST, path, token).await
    }
}

#[tokio::test]
async fn list_serves_the_snapshot_with_counts_capacity_and_rfc3339_times() {
    let clock = ManualClock::new();
    let registry = registry(&clock);
    let api = Api::new(&registry, AdminOptions::new()).await;

    let (status, body) = api.get("/workers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["version"], 0, "no sweep yet: the empty snapshot");
    assert_eq!(body["workers"], json!([]));

    clock.advance(Duration::from_millis(1500));
    let busy = assigned(registry.admit(&t(1), &e("d1")));
    let payload = worker_registry::Payload::builder("ping", &b"{}"[..])
        .build()
        .unwrap();
    let draining = assigned(
        registry
            .admit_with(&t(2), &e("d2"), Some(&payload))
            .unwrap(),
    );
    registry.drain(draining).unwrap();
    let pool = registry.register().unwrap();
    pool.heartbeat().unwrap();
    let gone = registry.register().unwrap();
    gone.deregister().unwrap();
    registry.sweep();

    let (status, body) = api.get("/workers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["version"], 1);
    assert_eq!(body["taken_at"], "2026-01-01T00:00:01.500Z");
    assert_eq!(
        body["counts"],
        json!({"active": 2, "draining": 1, "dead": 1, "idle": 1, "busy": 2, "suspect": 0})
    );
    assert_eq!(body["capacity"], json!({"used": 3, "limit": 8}));
    assert_eq!(body["claims"], json!({"in_flight": 2, "retained": 0}));
    assert_eq!(
        body["payloads"],
        json!({"held": 1, "bytes": payload.size(), "budget": worker_registry::config::DEFAULT_PAYLOAD_BUDGET})
    );
    assert_eq!(body["brake_engaged"], false);

    let workers = body["workers"].as_array().unwrap();
    let ids: Vec<u64> = workers.iter().map(|w| w["id"].as_u64().unwrap()).collect();
    assert_eq!(
        ids,
        [busy, draining, pool.id(), gone.id()].map(WorkerId::get),
        "sorted by id"
    );
    let w = &workers[0];
    assert_eq!(w["target"], "octo/repo#1");
    assert_eq!(w["kind"], "spawned");
    assert_eq!(w["status"], "active");
    assert_eq!(w["reason"], Value::Null);
    assert_eq!(w["activity"], "busy");
    assert_eq!(w["pool_status"], "busy");
    assert_eq!(w["started_at"], "2026-01-01T00:00:01.500Z");
    assert_eq!(w["last_heartbeat"], "2026-01-01T00:00:01.500Z");
    assert_eq!(w["has_heartbeated"], false);
    assert_eq!(w["died_at"], Value::Null);
    assert_eq!(w["token"], (busy.get() << 20) | 1);
    assert_eq!(workers[1]["status"], "draining");
    assert_eq!(workers[2]["target"], Value::Null);
    assert_eq!(workers[2]["kind"], "registered");
    assert_eq!(workers[2]["pool_status"], "idle");
    assert_eq!(workers[3]["status"], "dead");
    assert_eq!(workers[3]["reason"], "deregistered");
    assert_eq!(workers[3]["pool_status"], "offline");
    assert_eq!(workers[3]["died_at"], "2026-01-01T00:00:01.500Z");
}

#[tokio::test]
async fn get_reads_one_worker_live_and_refuses_unknown_and_bad_ids() {
    let clock = ManualClock::new();
    let registry = registry(&clock);
    let api = Api::new(&registry, AdminOptions::new()).await;
    let w = assigned(registry.admit(&t(7), &e("d")));
    clock.advance(Duration::from_secs(3));
    registry.heartbeat(w).unwrap();
    clock.advance(Duration::from_millis(250));

    // Live: no sweep has run, yet the worker is there.
    let (status, body) = api.get(&format!("/workers/{w}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["id"], w.get());
    assert_eq!(body["target"], "octo/repo#7");
    assert_eq!(body["status"], "active");
    assert_eq!(body["activity"], "busy");
    assert_eq!(body["started_at"], "2026-01-01T00:00:00.000Z");
    assert_eq!(body["last_heartbeat"], "2026-01-01T00:00:03.000Z");
    assert_eq!(body["heartbeat_age_ms"], 250);
    assert_eq!(body["uptime_ms"], 3250);
    assert_eq!(body["has_heartbeated"], true);
    assert_eq!(body["token"], (w.get() << 20) | 1);

    let (status, body) = api.get("/workers/999").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body, json!({"error": "unknown worker 999"}));

    for bad in [
        "abc",
        "-1",
        "+1",
        "01",
        "1.5",
        "99999999999999999999999",
        "%20",
    ] {
        let (status, body) = api.get(&format!("/workers/{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        let msg = body["error"].as_str().unwrap();
        assert!(
            msg.contains("is not a non-negative decimal integer"),
            "{bad}: {msg}"
        );
    }
    let (status, body) = api.get("/workers/17592186044416").await; // WorkerId::MAX + 1
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body,
        json!({"error": "worker id 17592186044416 is larger than 17592186044415"})
    );
}

#[tokio::test]
async fn drain_is_idempotent_refuses_the_dead_and_unknown() {
    let clock = ManualClock::new();
    let registry = registry(&clock);
    let api = Api::new(&registry, AdminOptions::new()).await;
    let busy = assigned(registry.admit(&t(1), &e("d1")));
    let idle = registry.register().unwrap();

    let (status, body) = api.post(&format!("/workers/{busy}/drain"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["id"].as_u64(), &body["status"]),
        (Some(busy.get()), &json!("draining"))
    );
    let (status, body) = api.post(&format!("/workers/{busy}/drain"), None).await;
    assert_eq!(status, StatusCode::OK, "draining again is fine");
    assert_eq!(body["status"], "draining");
    // No new assignment to a draining worker.
    assert!(matches!(
        registry.admit(&t(1), &e("d2")),
        Admission::Rejected(_)
    ));

    // Its loop finishes: dead; draining it now conflicts.
    registry.loop_finished(busy).unwrap();
    let (status, body) = api.post(&format!("/workers/{busy}/drain"), None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        body,
        json!({"error": format!("worker {busy} is dead (exited)")})
    );

    // An idle worker has no loop to finish: drained, it exits at once (the answer shows it).
    let (status, body) = api
        .post(&format!("/workers/{}/drain", idle.id()), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&body["status"], &body["reason"]),
        (&json!("dead"), &json!("exited"))
    );

    let (status, body) = api.post("/workers/4242/drain", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body, json!({"error": "unknown worker 4242"}));
    let (status, _) = api.post("/workers/x/drain", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_configured_bearer_token_guards_drain() {
    let registry = Direct::default();
    let api = Api::new(&registry, AdminOptions::new().bearer_token("s3cret")).await;
    let w = assigned(registry.admit(&t(1), &e("d1")));
    let path = format!("/workers/{w}/drain");

    for token in [None, Some("wrong"), Some("s3cre"), Some("s3cret-and-more")] {
        let res = api.send(Method::POST, &path, token).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{token:?}");
        assert!(res.headers()[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .starts_with("Bearer"));
        let body: Value = res.json().await.unwrap();
        assert_eq!(body, json!({"error": "missing or invalid bearer token"}));
    }
    // Unauthenticated requests learn nothing: an unknown id is 401 too, not 404.
    let (status, _) = api.post("/workers/999/drain", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(registry.worker(w).unwrap().status.is_alive());
    assert_eq!(
        registry.worker(w).unwrap().status.as_str(),
        "active",
        "refused drains did nothing"
    );

    let (status, body) = api.post(&path, Some("s3cret")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "draining");
    // Reads stay open unless protected.
    assert_eq!(api.get(&format!("/workers/{w}")).await.0, StatusCode::OK);
}

#[tokio::test]
async fn protect_reads_guards_everything_but_healthz() {
    let registry = Direct::default();
    let options = AdminOptions::new()
        .bearer_token("s3cret")
        .protect_reads(true);
    let api = Api::new(&registry, options).await;
    for path in ["/workers", "/workers/1", "/metrics", "/openapi.json"] {
        let res = api.send(Method::GET, path, None).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{path}");
        let res = api.send(Method::GET, path, Some("s3cret")).await;
        assert_ne!(res.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let (status, body) = api.get("/healthz").await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));
}

#[tokio::test]
async fn metrics_are_openmetrics_text_with_the_registry_and_application_metrics() {
    let clock = ManualClock::new();
    let registry = registry(&clock);
    let mut metrics = Metrics::new(&InMemoryRegistry::from(registry.clone()));
    let webhooks = Counter::<u64>::default();
    metrics
        .prometheus_mut()
        .register("router_webhooks", "Webhooks received", webhooks.clone());
    let api = Api::new(&registry, AdminOptions::new().metrics(metrics)).await;

    let w = assigned(registry.admit(&t(1), &e("d1")));
    assert!(matches!(
        registry.admit(&t(1), &e("d1")),
        Admission::Duplicate(_)
    ));
    registry.heartbeat(w).unwrap();
    registry.sweep();
    webhooks.inc_by(2);

    // Prometheus asks for OpenMetrics; without that Accept header the classic text format is served
    // (tested in the router's metrics tests through real parsers).
    let res = api
        .client
        .get(format!("{}/metrics", api.base))
        .header(
            header::ACCEPT,
            "application/openmetrics-text; version=1.0.0",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let ct = res.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        ct.starts_with("application/openmetrics-text; version=1.0.0"),
        "{ct}"
    );
    let text = res.text().await.unwrap();
    let m = metrics_format::parse(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    assert_eq!(m.get("router_webhooks_total"), 2.0);
    assert_eq!(m.get("worker_registry_admitted_total{worker=\"new\"}"), 1.0);
    assert_eq!(m.get("worker_registry_duplicates_total"), 1.0);
    assert_eq!(
        m.get("worker_registry_heartbeats_total{result=\"accepted\"}"),
        1.0
    );
    assert_eq!(m.get("worker_registry_workers{status=\"active\"}"), 1.0);
    assert_eq!(m.get("worker_registry_capacity_used"), 1.0);
    assert_eq!(m.get("worker_registry_capacity_limit"), 8.0);
    assert_eq!(
        metrics_format::check_histogram(&m, "worker_registry_sweep_duration_seconds"),
        Ok(1)
    );
}

#[tokio::test]
async fn openapi_describes_exactly_the_served_endpoints() {
    let registry = Direct::default();
    let w = assigned(registry.admit(&t(1), &e("d1")));
    let api = Api::new(&registry, AdminOptions::new().bearer_token("s3cret")).await;

    let (status, doc) = api.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );
    let served: serde_json::Value = serde_json::from_str(&worker_registry::http::openapi_json(
        &worker_registry::http::openapi(),
    ))
    .unwrap();
    assert_eq!(doc, served);

    let paths = doc["paths"].as_object().unwrap();
    let mut listed: Vec<(String, String)> = paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|k| ["get", "post", "put", "patch", "delete"].contains(&k.as_str()))
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    listed.sort();
    let mut expected: Vec<(String, String)> = [
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/workers"),
        ("GET", "/workers/{id}"),
        ("POST", "/workers/{id}/drain"),
    ]
    .map(|(m, p)| (m.to_owned(), p.to_owned()))
    .to_vec();
    expected.sort();
    assert_eq!(listed, expected);

    // Every documented operation is served, with one of its documented status codes.
    for (method, path) in &listed {
        let op = &paths[path][method.to_lowercase()];
        let real = path.replace("{id}", &w.to_string());
        let res = api
            .send(method.parse().unwrap(), &real, Some("s3cret"))
            .await;
        let code = res.status().as_str().to_owned();
        assert!(
            op["responses"].get(&code).is_some(),
            "{method} {path} answered {code}, not documented"
        );
        assert_eq!(res.status(), StatusCode::OK, "{method} {path}");
    }
    // The drain operation declares the bearer scheme, which the components define.
    assert_eq!(
        paths["/workers/{id}/drain"]["post"]["security"],
        json!([{"bearer": []}])
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"],
        json!({"type": "http", "scheme": "bearer"})
    );
    for schema in ["WorkerList", "Worker", "Error", "Status", "DeadReason"] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    // Every reference resolves.
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(refs.len() >= 10, "{refs:?}");
    for r in refs {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{r}"));
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "dangling {r}"
        );
    }
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r.clone()),
                    _ => collect_refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}
