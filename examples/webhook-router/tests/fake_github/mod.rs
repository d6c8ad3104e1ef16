//! A fake of GitHub's REST API for an App's webhook deliveries, written from GitHub's published
//! REST description (`github/rest-api-description`: `apps/list-webhook-deliveries`,
//! `apps/get-webhook-delivery`, `apps/redeliver-webhook-delivery`; the `hook-delivery-item` and
//! `hook-delivery` schemas), on a free loopback port. It keeps a delivery log, sends deliveries
//! to the router as GitHub does (signed, with the hook headers) and logs each attempt's answer,
//! checks the App's RS256 JWT against its public key, pages newest first with a `cursor` in the
//! `Link` header, answers a configurable number of calls with a 403 secondary rate limit and
//! `Retry-After`, and on a redelivery request sends the delivery again (same GUID): to the next
//! of several routers in turn if given (a load balancer before replicas), after a delay if set,
//! or never (a redelivery GitHub accepted and lost) for as many requests as it is told to drop;
//! redeliveries can also be held back until the test releases them.
#![allow(dead_code)] // each test uses part of it

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::time::Instant;
use webhook_router::github;

pub const APP_ID: &str = "4242";
pub const HOOK_ID: u64 = 1000;
pub const KEY_PEM: &[u8] = include_bytes!("app-key.pem");
pub const PUBLIC_PEM: &[u8] = include_bytes!("app-key.pub.pem");
pub const OTHER_KEY_PEM: &[u8] = include_bytes!("other-key.pem");

/// One attempt in the log.
#[derive(Debug, Clone)]
pub struct Logged {
    pub id: u64,
    pub guid: String,
    pub at: SystemTime,
    pub redelivery: bool,
    pub status_code: u16,
    pub event: String,
    pub action: Option<String>,
    pub headers: Vec<(String, String)>,
    pub payload: Value,
    /// Where it was sent.
    pub router: String,
    /// The router's answer (`outcome`, and `reason` if any), or why there was none.
    pub answer: String,
}

/// An API call the fake answered.
#[derive(Debug, Clone)]
pub struct Call {
    pub path: String,
    pub status: u16,
    pub at: Instant,
}

#[derive(Default)]
pub struct Log {
    pub attempts: Vec<Logged>,
    pub next_id: u64,
    /// Where deliveries go (`http://127.0.0.1:PORT/webhook`).
    pub router: String,
    /// When not empty, where deliveries go instead: each to the next of these in turn.
    pub routers: Vec<String>,
    /// Sends so far (the turn).
    pub sent: usize,
    /// The next this many redelivery requests are answered 202 and never sent.
    pub drop_redeliveries: u32,
    /// The attempts whose redelivery was dropped.
    pub dropped: Vec<u64>,
    /// Each redelivery is sent this long after its request is answered.
    pub redelivery_delay: Duration,
    /// The next this many API calls answer 403, a secondary rate limit.
    pub throttle: u32,
    pub retry_after: u64,
    /// The next answer says the primary rate limit is exhausted until this many seconds from now
    /// (`X-RateLimit-Remaining: 0`, `X-RateLimit-Reset`).
    pub exhaust_for: Option<u64>,
    /// Attempts are logged as failed (status 0, GitHub timed out) whatever the router answered.
    pub log_as_failed: bool,
    pub calls: Vec<Call>,
    pub redeliver_requests: Vec<u64>,
    /// Sends in progress.
    pub sending: usize,
}

struct Inner {
    log: Mutex<Log>,
    /// Open (`true`) unless redeliveries are held back.
    gate: tokio::sync::watch::Sender<bool>,
    key: DecodingKey,
    secret: Option<Vec<u8>>,
    http: reqwest::Client,
    base: String,
}

#[derive(Clone)]
pub struct FakeGitHub {
    inner: Arc<Inner>,
    pub base: String,
}

/// A loopback URL nothing listens on (a router that is down).
pub async fn nowhere() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}/webhook")
}

impl FakeGitHub {
    pub async fn start(router: String, secret: Option<&str>) -> Self {
        Self::start_with(router, secret, |_| {}).await
    }

    /// As [`start`](Self::start), with `setup` applied to the log before anything is served.
    pub async fn start_with(
        router: String,
        secret: Option<&str>,
        setup: impl FnOnce(&mut Log),
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let mut log = Log {
            router,
            next_id: 1,
            retry_after: 60,
            ..Log::default()
        };
        setup(&mut log);
        let inner = Arc::new(Inner {
            log: Mutex::new(log),
            gate: tokio::sync::watch::Sender::new(true),
            key: DecodingKey::from_rsa_pem(PUBLIC_PEM).unwrap(),
            secret: secret.map(|s| s.as_bytes().to_vec()),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            base: base.clone(),
        });
        let app = Router::new()
            .route("/app/hook/deliveries", get(list))
            .route("/app/hook/deliveries/{id}", get(detail))
            .route("/app/hook/deliveries/{id}/attempts", post(redeliver))
            .with_state(inner.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { inner, base }
    }

    pub fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.inner.log.lock().unwrap()
    }

    /// A new event sent to the router (a fresh GUID); returns the GUID.
    pub async fn deliver(&self, event: &str, payload: Value) -> String {
        let guid = format!("{:032x}", rand::random::<u128>());
        let guid = format!(
            "{}-{}-{}-{}-{}",
            &guid[0..8],
            &guid[8..12],
            &guid[12..16],
            &guid[16..20],
            &guid[20..32]
        );
        send(&self.inner, guid.clone(), event.to_owned(), payload, false).await;
        guid
    }

    /// Waits until no send is in progress (a redelivery is sent after its request is answered).
    /// Polls a condition, not a duration. The cap is on the wall clock (60 s), because the tests
    /// run on tokio's paused clock, which jumps past any sleep while real sockets are busy.
    pub async fn settled(&self) {
        let cap = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < cap {
            if self.log().sending == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        panic!("sends still in progress");
    }

    /// Holds every redelivery back (answered 202, sent once released) until
    /// [`release_redeliveries`](Self::release_redeliveries). [`settled`](Self::settled) waits
    /// for held ones too: release them first.
    pub fn hold_redeliveries(&self) {
        self.inner.gate.send_replace(false);
    }

    /// Sends the redeliveries held back.
    pub fn release_redeliveries(&self) {
        self.inner.gate.send_replace(true);
    }

    /// Sends `guid`'s logged request once more to `router` (`http://host:port/webhook`), as a
    /// redelivery by hand would, without logging it: the answer's status and JSON body, `None`
    /// if there was no answer.
    pub async fn resend(&self, guid: &str, router: &str) -> Option<(u16, Value)> {
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
            .body(serde_json::to_vec(&payload).unwrap())
            .send()
            .await
            .ok()?;
        let status = res.status().as_u16();
        Some((status, res.json().await.unwrap_or(Value::Null)))
    }

    /// The attempts of `guid`, oldest first.
    pub fn attempts_of(&self, guid: &str) -> Vec<Logged> {
        self.log()
            .attempts
            .iter()
            .filter(|a| a.guid == guid)
            .cloned()
            .collect()
    }
}

async fn send(inner: &Arc<Inner>, guid: String, event: String, payload: Value, redelivery: bool) {
    let body = serde_json::to_vec(&payload).unwrap();
    let mut headers = vec![
        ("Accept".to_owned(), "*/*".to_owned()),
        ("User-Agent".to_owned(), "GitHub-Hookshot/fake".to_owned()),
        ("X-GitHub-Event".to_owned(), event.clone()),
        ("X-GitHub-Delivery".to_owned(), guid.clone()),
        ("X-GitHub-Hook-ID".to_owned(), HOOK_ID.to_string()),
        (
            "X-GitHub-Hook-Installation-Target-Type".to_owned(),
            "integration".to_owned(),
        ),
        (
            "X-GitHub-Hook-Installation-Target-ID".to_owned(),
            APP_ID.to_owned(),
        ),
        ("Content-Type".to_owned(), "application/json".to_owned()),
    ];
    if let Some(secret) = &inner.secret {
        headers.push((
            "X-Hub-Signature-256".to_owned(),
            github::sign(secret, &body),
        ));
    }
    let router = {
        let mut log = inner.log.lock().unwrap();
        log.sending += 1;
        log.sent += 1;
        match log.routers.len() {
            0 => log.router.clone(),
            n => log.routers[log.sent % n].clone(),
        }
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
    let mut log = inner.log.lock().unwrap();
    let id = log.next_id;
    log.next_id += 1;
    let status_code = if log.log_as_failed { 0 } else { status };
    log.attempts.push(Logged {
        id,
        guid,
        at: SystemTime::now(),
        redelivery,
        status_code,
        action: payload["action"].as_str().map(str::to_owned),
        event,
        headers,
        payload,
        router,
        answer,
    });
    log.sending -= 1;
}

fn item(a: &Logged) -> Value {
    json!({
        "id": a.id,
        "guid": a.guid,
        "delivered_at": humantime::format_rfc3339_seconds(a.at).to_string(),
        "redelivery": a.redelivery,
        "duration": 0.01,
        "status": match a.status_code { 0 => "failed to connect".to_owned(), 200..=299 => "OK".to_owned(), s => format!("Invalid HTTP Response: {s}") },
        "status_code": a.status_code,
        "event": a.event,
        "action": a.action,
        "installation_id": 1,
        "repository_id": 2,
        "throttled_at": null,
    })
}

fn message(status: StatusCode, text: &str) -> Response {
    (
        status,
        Json(json!({ "message": text, "documentation_url": "https://docs.github.com/rest" })),
    )
        .into_response()
}

/// The JWT check and the rate limit every call goes through; `Err` is the answer.
fn gate(inner: &Inner, headers: &HeaderMap, path: String) -> Result<(), Box<Response>> {
    let mut log = inner.log.lock().unwrap();
    let answer = |log: &mut Log, status: StatusCode| {
        log.calls.push(Call {
            path: path.clone(),
            status: status.as_u16(),
            at: Instant::now(),
        });
    };
    let jwt = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_issuer(&[APP_ID]);
    validation.set_required_spec_claims(&["exp", "iat", "iss"]);
    let valid = jwt.is_some_and(|t| {
        jsonwebtoken::decode::<HashMap<String, Value>>(t, &inner.key, &validation).is_ok()
    });
    if !valid {
        answer(&mut log, StatusCode::UNAUTHORIZED);
        return Err(Box::new(message(
            StatusCode::UNAUTHORIZED,
            "A JSON web token could not be decoded",
        )));
    }
    if log.throttle > 0 {
        log.throttle -= 1;
        let retry = log.retry_after;
        answer(&mut log, StatusCode::FORBIDDEN);
        let mut r = message(
            StatusCode::FORBIDDEN,
            "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
        );
        r.headers_mut()
            .insert("retry-after", retry.to_string().parse().unwrap());
        r.headers_mut()
            .insert("x-ratelimit-remaining", "4999".parse().unwrap());
        return Err(Box::new(r));
    }
    answer(&mut log, StatusCode::OK);
    Ok(())
}

async fn list(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&inner, &headers, "list".into()) {
        return *r;
    }
    let per_page = q
        .get("per_page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    let before = match q.get("cursor") {
        None => u64::MAX,
        Some(c) => match c.strip_prefix("v1_").and_then(|n| n.parse().ok()) {
            Some(n) => n,
            None => return message(StatusCode::BAD_REQUEST, "invalid cursor"),
        },
    };
    let mut log = inner.log.lock().unwrap();
    let exhaust = log.exhaust_for.take();
    let newest_first: Vec<&Logged> = log
        .attempts
        .iter()
        .rev()
        .filter(|a| a.id < before)
        .collect();
    let page: Vec<Value> = newest_first
        .iter()
        .take(per_page)
        .map(|a| item(a))
        .collect();
    let mut r = Json(page).into_response();
    r.headers_mut()
        .insert("x-ratelimit-remaining", "4999".parse().unwrap());
    if let Some(secs) = exhaust {
        let reset = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + secs;
        r.headers_mut()
            .insert("x-ratelimit-remaining", "0".parse().unwrap());
        r.headers_mut()
            .insert("x-ratelimit-reset", reset.to_string().parse().unwrap());
    }
    if newest_first.len() > per_page {
        let last = newest_first[per_page - 1].id;
        let link = format!(
            "<{}/app/hook/deliveries?per_page={per_page}&cursor=v1_{last}>; rel=\"next\"",
            inner.base
        );
        r.headers_mut().insert("link", link.parse().unwrap());
    }
    r
}

async fn detail(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> Response {
    if let Err(r) = gate(&inner, &headers, format!("detail {id}")) {
        return *r;
    }
    let log = inner.log.lock().unwrap();
    let Some(a) = log.attempts.iter().find(|a| a.id == id) else {
        return message(StatusCode::NOT_FOUND, "Not Found");
    };
    let mut v = item(a);
    let hs: serde_json::Map<String, Value> = a
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    v["url"] = json!(log.router);
    v["request"] = json!({ "headers": hs, "payload": a.payload });
    v["response"] = json!({ "headers": {}, "payload": null });
    Json(v).into_response()
}

async fn redeliver(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> Response {
    if let Err(r) = gate(&inner, &headers, format!("redeliver {id}")) {
        return *r;
    }
    let (original, delay) = {
        let mut log = inner.log.lock().unwrap();
        log.redeliver_requests.push(id);
        let found = log.attempts.iter().find(|a| a.id == id).cloned();
        if found.is_some() && log.drop_redeliveries > 0 {
            // Accepted, and lost: nothing is sent, nothing logged.
            log.drop_redeliveries -= 1;
            log.dropped.push(id);
            return (StatusCode::ACCEPTED, Json(json!({}))).into_response();
        }
        (found, log.redelivery_delay)
    };
    let Some(a) = original else {
        return message(StatusCode::NOT_FOUND, "Not Found");
    };
    // Counted as sending before the answer, so `settled` waits for it.
    inner.log.lock().unwrap().sending += 1;
    let inner2 = inner.clone();
    let mut gate = inner.gate.subscribe();
    tokio::spawn(async move {
        let _ = gate.wait_for(|open| *open).await;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        send(&inner2, a.guid, a.event, a.payload, true).await;
        inner2.log.lock().unwrap().sending -= 1;
    });
    (StatusCode::ACCEPTED, Json(json!({}))).into_response()
}
