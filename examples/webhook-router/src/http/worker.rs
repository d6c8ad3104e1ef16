//! The worker protocol, `/worker/v1/...`, on its own listener (`--worker-bind`): what a worker in
//! another process calls to heartbeat, fetch its next event, report its loop and its completions,
//! and leave. Every call is authenticated by the worker's credential ([`crate::credential`]) and
//! mapped onto the registry's contract; a worker the registry counts dead (or does not know) is
//! answered `410 {"error": "fenced", ...}` on every call. The design, and why the lease each
//! heartbeat grants stops the worker before its pull request can pass on, are in
//! [`crate::docs::worker_protocol`]; the router's side of it in [`crate::protocol`].

use super::answer::ErrorAnswer;
use super::reply::error_response;
use crate::app::App;
use crate::credential::Verified;
use crate::failed::FailedDelivery;
use crate::protocol::hub::Served;
use crate::protocol::DEFAULT_LONG_POLL;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use utoipa::{IntoParams, ToSchema};
use worker_registry::{
    DeadReason, HeartbeatAck, RegistryError, Status, WorkerId, WorkerRegistry, WorkerRegistryExt,
};

/// The protocol's routes (JSON 404 and 405 like the other apps).
pub fn router(app: &App) -> Router {
    Router::new()
        .route("/worker/v1/heartbeat", post(heartbeat))
        .route("/worker/v1/next", get(next))
        .route("/worker/v1/loop/started", post(loop_started))
        .route("/worker/v1/complete", post(complete))
        .route("/worker/v1/loop/finished", post(loop_finished))
        .route("/worker/v1/exit", post(exit))
        .with_state(app.clone())
}

/// A heartbeat's answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatAnswer {
    /// `active`, or `draining` (finish the current event, take no new one, then exit).
    pub status: String,
    /// How long the worker may keep acting without another successful heartbeat, in
    /// milliseconds, counted on its own monotonic clock from the instant it sent this heartbeat.
    pub lease_ms: u64,
}

/// The answer to a call the registry refused because the worker is dead (or unknown): stop now.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FencedAnswer {
    /// Always `fenced`.
    pub error: String,
    /// The worker.
    pub worker: u64,
    /// Why it is dead: `missed_heartbeats`, `drain_timed_out`, `exited`, `deregistered`, or
    /// `unknown` (the registry does not know it, or this router does not serve it).
    pub reason: String,
}

/// A loop's start.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoopStarted {
    /// The delivery (`X-GitHub-Delivery` of the event `next` answered).
    pub delivery: String,
}

/// How an event's command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CompleteOutcome {
    /// Exit status 0.
    Succeeded,
    /// Failed every attempt: completed anyway, and reported (log line, metric and
    /// `GET /deliveries/failed`).
    Failed,
}

/// A completion.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Complete {
    /// The delivery.
    pub delivery: String,
    /// How the command ended.
    pub outcome: CompleteOutcome,
    /// How many times the command ran.
    #[serde(default)]
    pub attempts: u32,
    /// Why it failed, when it did (kept up to 1,024 bytes).
    #[serde(default)]
    pub reason: Option<String>,
}

/// The answer to `loop/finished`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoopFinishedAnswer {
    /// `active` (carry on), `draining`, or `dead` (a draining worker's last loop: exit now).
    pub status: String,
}

/// `GET /worker/v1/next`'s query.
#[derive(Debug, Clone, Deserialize, IntoParams)]
pub struct NextQuery {
    /// How long to wait for an event, in milliseconds (capped at 20 s and at the worker's
    /// remaining lease).
    pub wait_ms: Option<u64>,
}

/// Records a heartbeat and grants a lease.
#[utoipa::path(post, path = "/worker/v1/heartbeat", tag = "worker",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Recorded: carry on (or finish and exit, when draining), within the lease", body = HeartbeatAnswer),
        (status = 401, description = "The credential does not verify", body = ErrorAnswer),
        (status = 410, description = "Fenced: the registry counts the worker dead; stop now", body = FencedAnswer),
        (status = 503, description = "The registry's backend cannot answer now (the lease keeps running)", body = ErrorAnswer,
         headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ))]
pub(crate) async fn heartbeat(State(app): State<App>, headers: HeaderMap) -> Response {
    let who = match authenticate(&app, &headers) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let served = app.protocol().hub().get(who.worker);
    let started = Instant::now();
    let ack = match app.registry().heartbeat(who.worker).await {
        Ok(ack) => ack,
        Err(e) => return refusal(who.worker, &e),
    };
    let now = Instant::now();
    let rules = app.protocol().rules();
    let (status, lease) = match (ack, &served) {
        (HeartbeatAck::Active, _) => {
            if let Some(s) = &served {
                s.seen_active(started);
            }
            ("active", rules.active())
        }
        // Draining (or anything the registry learns to say later): counted from the last call
        // that showed it active.
        (_, Some(s)) => ("draining", rules.draining(s.since_active(now))),
        // Not served here: when the drain began is unknown, so nothing is granted.
        (_, None) => ("draining", Duration::ZERO),
    };
    if let Some(s) = &served {
        s.leased(now, lease);
    }
    let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
    Json(HeartbeatAnswer {
        status: status.to_owned(),
        lease_ms,
    })
    .into_response()
}

/// The next event: the body exactly as GitHub sent it, its metadata in headers.
#[utoipa::path(get, path = "/worker/v1/next", tag = "worker",
    params(NextQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The event: the body as GitHub sent it, with `Content-Type`, `X-GitHub-Event`, `X-GitHub-Delivery`, `X-GitHub-Action`, `X-Hub-Signature-256`, `X-Worker-Target`, `X-Worker-Fencing-Token` and `traceparent`"),
        (status = 204, description = "Nothing within the wait (ask again)"),
        (status = 401, description = "The credential does not verify", body = ErrorAnswer),
        (status = 410, description = "Fenced: stop now", body = FencedAnswer),
        (status = 503, description = "The registry's backend cannot answer now", body = ErrorAnswer,
         headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ))]
pub(crate) async fn next(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<NextQuery>,
) -> Response {
    let (who, served) = match alive_and_served(&app, &headers).await {
        Ok(w) => w,
        Err(r) => return r.into_response(),
    };
    let left = served.lease_left(Instant::now());
    if left.is_zero() {
        // No lease (before its first heartbeat, or run out): it may act on nothing.
        return StatusCode::NO_CONTENT.into_response();
    }
    let asked = Duration::from_millis(q.wait_ms.unwrap_or(0));
    let wait = asked.min(DEFAULT_LONG_POLL).min(left);
    match served.next(wait).await {
        Some(job) => {
            tracing::debug!(worker = %who.worker, target = %job.target, event = %job.event, "event handed over the worker protocol");
            event_response(&job)
        }
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// The event's HTTP answer (see [`next`]).
fn event_response(job: &crate::mailbox::Job) -> Response {
    let body = job
        .payload
        .as_ref()
        .map_or_else(Default::default, |p| p.body().clone());
    let mut r = Response::new(Body::from(body));
    let h = r.headers_mut();
    let mut put = |name: &str, value: &str| {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            h.insert(n, v);
        }
    };
    put("x-github-delivery", job.event.as_str());
    put("x-worker-target", &job.target.to_string());
    put("x-worker-fencing-token", &job.token.to_string());
    if let Some(tp) = job.trace.as_str() {
        put("traceparent", tp);
    }
    if let Some(p) = &job.payload {
        put(header::CONTENT_TYPE.as_str(), p.content_type());
        put("x-github-event", p.event());
        if let Some(action) = p.action() {
            put("x-github-action", action);
        }
        for (name, value) in p.headers() {
            put(name, value);
        }
    }
    r
}

/// The worker started the loop of an event it was handed.
#[utoipa::path(post, path = "/worker/v1/loop/started", tag = "worker",
    request_body = LoopStarted,
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Recorded: the worker is busy"),
        (status = 401, description = "The credential does not verify", body = ErrorAnswer),
        (status = 410, description = "Fenced: stop now", body = FencedAnswer),
        (status = 503, description = "The registry's backend cannot answer now", body = ErrorAnswer),
    ))]
pub(crate) async fn loop_started(
    State(app): State<App>,
    headers: HeaderMap,
    Json(_body): Json<LoopStarted>,
) -> Response {
    let who = match authenticate(&app, &headers) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let started = Instant::now();
    match app.registry().loop_started(who.worker).await {
        Ok(status) => {
            if status == Status::Active {
                if let Some(s) = app.protocol().hub().get(who.worker) {
                    s.seen_active(started);
                }
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => refusal(who.worker, &e),
    }
}

/// The worker's command for an event ended: the delivery is completed (also when it failed,
/// which is reported).
#[utoipa::path(post, path = "/worker/v1/complete", tag = "worker",
    request_body = Complete,
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Completed"),
        (status = 401, description = "The credential does not verify", body = ErrorAnswer),
        (status = 409, description = "No such event was handed to this worker, or the registry no longer counts it the holder (a stuck delivery, released)", body = ErrorAnswer),
        (status = 410, description = "Fenced: stop now", body = FencedAnswer),
        (status = 503, description = "The registry's backend cannot answer now (send it again)", body = ErrorAnswer),
    ))]
pub(crate) async fn complete(
    State(app): State<App>,
    headers: HeaderMap,
    Json(body): Json<Complete>,
) -> Response {
    let (who, served) = match served(&app, &headers) {
        Ok(w) => w,
        Err(r) => return r.into_response(),
    };
    let delivery = &body.delivery;
    let Some(job) = served.take_handed(delivery) else {
        return error_response(
            StatusCode::CONFLICT,
            format!(
                "delivery {delivery} is not an event handed to worker {} and not completed",
                who.worker
            ),
        );
    };
    match app
        .registry()
        .complete_by(who.worker, &job.target, &job.event)
        .await
    {
        Ok(()) => {}
        Err(e) if e.is_retryable() => {
            served.hand_back(job);
            return refusal(who.worker, &e);
        }
        Err(e) => return refusal(who.worker, &e),
    }
    if body.outcome == CompleteOutcome::Failed {
        reported(&app, who.worker, &job, &body);
    }
    let containers = app.containers();
    containers
        .runs()
        .ran(who.worker, &job.target, &job.event, job.payload.as_ref());
    containers.traces().completed(&job.target, &job.event);
    StatusCode::NO_CONTENT.into_response()
}

/// A delivery completed as failed, reported: counted, logged and kept for the admin API
/// (`GET /deliveries/failed`).
fn reported(app: &App, worker: WorkerId, job: &crate::mailbox::Job, body: &Complete) {
    let failed = FailedDelivery::now(
        job.event.clone(),
        job.target.clone(),
        worker,
        job.token,
        body.attempts,
        body.reason.as_deref(),
    );
    app.metrics().worker_failed();
    tracing::error!(
        %worker, target = %job.target, delivery = %job.event, attempts = body.attempts,
        reason = failed.reason.as_deref().unwrap_or("-"),
        "an event's command failed every attempt: completed as failed"
    );
    app.failed().record(failed);
}

/// The worker's loop finished (after its command ended).
#[utoipa::path(post, path = "/worker/v1/loop/finished", tag = "worker",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Its status: `dead` for a draining worker's last loop (exit now)", body = LoopFinishedAnswer),
        (status = 401, description = "The credential does not verify", body = ErrorAnswer),
        (status = 410, description = "Fenced: stop now", body = FencedAnswer),
        (status = 503, description = "The registry's backend cannot answer now", body = ErrorAnswer),
    ))]
pub(crate) async fn loop_finished(State(app): State<App>, headers: HeaderMap) -> Response {
    let who = match authenticate(&app, &headers) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    match app.registry().loop_finished(who.worker).await {
        Ok(status) => Json(LoopFinishedAnswer {
            status: status.as_str().to_owned(),
        })
        .into_response(),
        Err(e) => refusal(who.worker, &e),
    }
}

/// The worker leaves (its last call, after its command ended): deregistered.
#[utoipa::path(post, path = "/worker/v1/exit", tag = "worker",
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Deregistered"),
        (status = 401, description = "The credential does not verify", body = ErrorAnswer),
        (status = 410, description = "Fenced (already dead)", body = FencedAnswer),
        (status = 503, description = "The registry's backend cannot answer now", body = ErrorAnswer),
    ))]
pub(crate) async fn exit(State(app): State<App>, headers: HeaderMap) -> Response {
    let who = match authenticate(&app, &headers) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    match app.registry().deregister(who.worker).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refusal(who.worker, &e),
    }
}

/// Why a call is refused before it reaches the registry's answer (see [`IntoResponse`]).
enum Refused {
    /// 401: the credential does not verify.
    Unauthorized(String),
    /// 410: dead, unknown, or not served here.
    Fenced {
        worker: WorkerId,
        reason: &'static str,
    },
    /// A registry call failed.
    Registry {
        worker: WorkerId,
        error: RegistryError,
    },
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Self::Unauthorized(error) => {
                let mut r = error_response(StatusCode::UNAUTHORIZED, error);
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"worker\""),
                );
                r
            }
            Self::Fenced { worker, reason } => fenced(worker, reason),
            Self::Registry { worker, error } => refusal(worker, &error),
        }
    }
}

/// The credential's owner, or the 401.
fn authenticate(app: &App, headers: &HeaderMap) -> Result<Verified, Refused> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            Refused::Unauthorized("missing Authorization: Bearer <worker credential>".to_owned())
        })?;
    app.protocol()
        .key()
        .verify(presented.trim())
        .map_err(|e| Refused::Unauthorized(e.to_string()))
}

/// The credential's owner and its served state, if this router serves it (410 otherwise: no
/// event can reach it here).
fn served(app: &App, headers: &HeaderMap) -> Result<(Verified, Arc<Served>), Refused> {
    let who = authenticate(app, headers)?;
    match app.protocol().hub().get(who.worker) {
        Some(s) => Ok((who, s)),
        None => Err(Refused::Fenced {
            worker: who.worker,
            reason: "unknown",
        }),
    }
}

/// Like [`served`], and alive in the registry (a call of its own: a dead worker is fenced on
/// every call, `next` included).
async fn alive_and_served(
    app: &App,
    headers: &HeaderMap,
) -> Result<(Verified, Arc<Served>), Refused> {
    let (who, s) = served(app, headers)?;
    let worker = who.worker;
    match app.registry().worker(worker).await {
        Ok(Some(info)) => match info.status {
            Status::Dead(reason) => Err(Refused::Fenced {
                worker,
                reason: reason.as_str(),
            }),
            _ => Ok((who, s)),
        },
        Ok(None) => Err(Refused::Fenced {
            worker,
            reason: "unknown",
        }),
        Err(error) => Err(Refused::Registry { worker, error }),
    }
}

/// A registry refusal as the protocol answers it.
fn refusal(worker: WorkerId, e: &RegistryError) -> Response {
    match e {
        RegistryError::WorkerDead { reason, .. } => fenced(worker, reason.as_str()),
        RegistryError::UnknownWorker { .. } => fenced(worker, "unknown"),
        e if e.is_retryable() => {
            let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, e);
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        RegistryError::NotHolder { .. } => error_response(StatusCode::CONFLICT, e),
        e => error_response(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// `410 {"error": "fenced", ...}`.
fn fenced(worker: WorkerId, reason: &str) -> Response {
    (
        StatusCode::GONE,
        Json(FencedAnswer {
            error: "fenced".to_owned(),
            worker: worker.get(),
            reason: reason.to_owned(),
        }),
    )
        .into_response()
}

/// Every reason a fenced answer can give.
pub const FENCED_REASONS: [&str; 5] = [
    "missed_heartbeats",
    "drain_timed_out",
    "exited",
    "deregistered",
    "unknown",
];

const _: () = assert!(DeadReason::ALL.len() + 1 == FENCED_REASONS.len());
