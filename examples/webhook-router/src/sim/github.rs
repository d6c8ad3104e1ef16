//! The simulation's GitHub for the outage phase: an organisation hook's delivery log on a
//! loopback port, as GitHub's REST API serves it (`GET /orgs/{org}/hooks/{id}/deliveries`, newest
//! first with a `Link` cursor; `GET .../deliveries/{id}` with the request; `POST
//! .../deliveries/{id}/attempts`, which sends the delivery again), guarded by a token. It sends
//! each delivery to the router (the replicas in turn, as a load balancer would) signed and with
//! the hook headers, and logs which replica took it and its answer (0 when the router could not
//! be reached). The tests' fake (tests/fake_github) adds App JWTs, rate limits, and redeliveries
//! dropped or delayed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::github;

/// The simulated organisation and its hook.
pub(super) const ORG: &str = "sim-org";
pub(super) const HOOK_ID: u64 = 1;

#[derive(Clone)]
pub(super) struct Attempt {
    pub(super) id: u64,
    pub(super) guid: String,
    at: SystemTime,
    pub(super) redelivery: bool,
    pub(super) status: u16,
    /// Where it was sent.
    pub(super) router: String,
    /// The router's answer (its `outcome` and `reason`), or why there was none.
    pub(super) answer: String,
    event: String,
    headers: Vec<(String, String)>,
    payload: Value,
}

#[derive(Default)]
pub(super) struct Log {
    pub(super) attempts: Vec<Attempt>,
    /// `http://host:port/webhook`, or a closed port while the router is away.
    pub(super) router: String,
    /// When not empty, the replicas' `http://host:port/webhook`, sent to in turn instead.
    pub(super) routers: Vec<String>,
    /// Sends so far (the turn).
    sent: usize,
    /// Sends in progress.
    pub(super) sending: usize,
}

impl Log {
    /// Where the next send goes.
    fn next_router(&mut self) -> String {
        self.sent += 1;
        match self.routers.len() {
            0 => self.router.clone(),
            n => self.routers[self.sent % n].clone(),
        }
    }
}

struct Inner {
    log: Mutex<Log>,
    token: String,
    secret: Vec<u8>,
    http: reqwest::Client,
    base: String,
}

/// The simulated GitHub (cheap to clone).
#[derive(Clone)]
pub(super) struct FakeGitHub {
    inner: Arc<Inner>,
}

impl FakeGitHub {
    /// Serves on a free loopback port; deliveries go to `router`, signed with `secret`; the API
    /// wants `token`.
    pub(super) async fn start(router: String, secret: &[u8], token: &str) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let base = format!(
            "http://{}",
            listener.local_addr().map_err(|e| e.to_string())?
        );
        let inner = Arc::new(Inner {
            log: Mutex::new(Log {
                router,
                ..Log::default()
            }),
            token: token.to_owned(),
            secret: secret.to_vec(),
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .map_err(|e| e.to_string())?,
            base,
        });
        let path = format!("/orgs/{ORG}/hooks/{HOOK_ID}/deliveries");
        let app = Router::new()
            .route(&path, get(list))
            .route(&format!("{path}/{{id}}"), get(detail))
            .route(&format!("{path}/{{id}}/attempts"), post(redeliver))
            .with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { inner })
    }

    /// Its API's base URL.
    pub(super) fn base(&self) -> &str {
        &self.inner.base
    }

    /// The log, locked.
    pub(super) fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.inner.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends a new event `guid` to the router.
    pub(super) async fn deliver(&self, guid: String, event: &str, payload: Value) {
        send(&self.inner, guid, event.to_owned(), payload, false).await;
    }

    /// Whether no send is in progress.
    pub(super) fn idle(&self) -> bool {
        self.log().sending == 0
    }

    /// Sends `guid`'s request once more to `router` (`http://host:port/webhook`), as a redelivery
    /// by hand would, without logging it: the answer's status and body.
    pub(super) async fn resend(&self, guid: &str, router: &str) -> Option<(u16, Value)> {
        let (headers, payload) = {
            let log = self.log();
            let a = log.attempts.iter().find(|a| a.guid == guid)?;
            (a.headers.clone(), a.payload.clone())
        };
        let mut req = self.inner.http.post(router);
        for (k, v) in &headers {
            req = req.header(k, v);
        }
        let res = req
            .body(serde_json::to_vec(&payload).unwrap_or_default())
            .send()
            .await
            .ok()?;
        let status = res.status().as_u16();
        Some((status, res.json().await.unwrap_or(Value::Null)))
    }
}

async fn send(inner: &Arc<Inner>, guid: String, event: String, payload: Value, redelivery: bool) {
    let body = serde_json::to_vec(&payload).unwrap_or_default();
    let headers = vec![
        ("X-GitHub-Event".to_owned(), event.clone()),
        ("X-GitHub-Delivery".to_owned(), guid.clone()),
        ("X-GitHub-Hook-ID".to_owned(), HOOK_ID.to_string()),
        (
            "X-GitHub-Hook-Installation-Target-Type".to_owned(),
            "organization".to_owned(),
        ),
        (
            "X-GitHub-Hook-Installation-Target-ID".to_owned(),
            "7".to_owned(),
        ),
        ("Content-Type".to_owned(), "application/json".to_owned()),
        (
            "X-Hub-Signature-256".to_owned(),
            github::sign(&inner.secret, &body),
        ),
    ];
    let router = {
        let mut log = inner.log.lock().unwrap_or_else(|p| p.into_inner());
        log.sending += 1;
        log.next_router()
    };
    let mut req = inner.http.post(&router);
    for (k, v) in &headers {
        req = req.header(k, v);
    }
    let (status, answer) = match req.body(body).send().await {
        Ok(res) => {
            let status = res.status().as_u16();
            let body: Value = res.json().await.unwrap_or(Value::Null);
            (status, format!("{} {}", body["outcome"], body["reason"]))
        }
        Err(e) => (0, e.to_string()),
    };
    let mut log = inner.log.lock().unwrap_or_else(|p| p.into_inner());
    let id = log.attempts.len() as u64 + 1;
    log.attempts.push(Attempt {
        id,
        guid,
        at: SystemTime::now(),
        redelivery,
        status,
        router,
        answer,
        event,
        headers,
        payload,
    });
    log.sending -= 1;
}

fn item(a: &Attempt) -> Value {
    json!({
        "id": a.id,
        "guid": a.guid,
        "delivered_at": humantime::format_rfc3339_seconds(a.at).to_string(),
        "redelivery": a.redelivery,
        "duration": 0.01,
        "status": if a.status == 0 { "failed to connect".to_owned() } else { format!("{}", a.status) },
        "status_code": a.status,
        "event": a.event,
        "action": a.payload["action"],
        "installation_id": null,
        "repository_id": null,
    })
}

fn authorized(inner: &Inner, headers: &HeaderMap) -> bool {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.strip_prefix("Bearer ") == Some(inner.token.as_str()))
}

fn refused() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({ "message": "Bad credentials" })),
    )
        .into_response()
}

async fn list(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if !authorized(&inner, &headers) {
        return refused();
    }
    let per_page = q
        .get("per_page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    let before = q
        .get("cursor")
        .and_then(|c| c.strip_prefix("v1_")?.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    let log = inner.log.lock().unwrap_or_else(|p| p.into_inner());
    let newer: Vec<&Attempt> = log
        .attempts
        .iter()
        .rev()
        .filter(|a| a.id < before)
        .collect();
    let page: Vec<Value> = newer.iter().take(per_page).map(|a| item(a)).collect();
    let mut r = Json(page).into_response();
    if newer.len() > per_page {
        let link = format!(
            "<{}/orgs/{ORG}/hooks/{HOOK_ID}/deliveries?per_page={per_page}&cursor=v1_{}>; rel=\"next\"",
            inner.base,
            newer[per_page - 1].id
        );
        if let Ok(v) = link.parse() {
            r.headers_mut().insert("link", v);
        }
    }
    r
}

async fn detail(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> Response {
    if !authorized(&inner, &headers) {
        return refused();
    }
    let log = inner.log.lock().unwrap_or_else(|p| p.into_inner());
    let Some(a) = log.attempts.iter().find(|a| a.id == id) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({ "message": "Not Found" })),
        )
            .into_response();
    };
    let mut v = item(a);
    let hs: serde_json::Map<String, Value> = a
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    v["request"] = json!({ "headers": hs, "payload": a.payload });
    v["response"] = json!({ "headers": {}, "payload": null });
    Json(v).into_response()
}

async fn redeliver(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> Response {
    if !authorized(&inner, &headers) {
        return refused();
    }
    let original = {
        let mut log = inner.log.lock().unwrap_or_else(|p| p.into_inner());
        let found = log.attempts.iter().find(|a| a.id == id).cloned();
        if found.is_some() {
            // Counted before the answer, so `idle` waits for the send.
            log.sending += 1;
        }
        found
    };
    let Some(a) = original else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({ "message": "Not Found" })),
        )
            .into_response();
    };
    let inner2 = inner.clone();
    tokio::spawn(async move {
        send(&inner2, a.guid, a.event, a.payload, true).await;
        inner2.log.lock().unwrap_or_else(|p| p.into_inner()).sending -= 1;
    });
    (StatusCode::ACCEPTED, Json(json!({}))).into_response()
}
