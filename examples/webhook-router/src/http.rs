//! The router's HTTP app: `POST /webhook`, `POST /debug/workers/{id}/crash`, and the library's
//! admin API (`/workers`, `/metrics`, `/openapi.json`, `/healthz`) merged at the root; JSON errors
//! everywhere, unknown paths and wrong methods included.
//!
//! A delivery is refused before its body is read when its headers already rule it out (the router
//! is shutting down, a missing or repeated identity header, a content type GitHub does not send, a
//! missing or malformed signature, a `Content-Length` above the cap); its body is then read under
//! the limits of [`crate::body`], its HMAC computed as it arrives.

use crate::answer::{
    ClaimStateName, CrashAnswer, DeliveryAnswer, ErrorAnswer, Outcome, TargetAnswer,
};
use crate::app::{App, CrashError, Dispatch, TargetOutcome};
use crate::body::{self, BodyError};
use crate::containers::Handed;
use crate::github::{self, Route, SignatureError, Verifier};
use crate::remote::{ForwardAnswer, ForwardedJob};
use crate::worker::Job;

use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::BoxError;
use axum::{Json, Router};
use tower::limit::ConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::ServiceBuilder;
use worker_registry::http::{admin_router, require_bearer_method, AdminOptions};
use worker_registry::metrics::Metrics;
use worker_registry::{
    ClaimState, DeliveryId, FencingToken, Rejection, Target, WorkerId, WorkerRegistry,
};

/// The HTTP app: webhook, debug endpoint and the library's admin API, serving `metrics`.
///
/// With an admin token, every admin endpoint but `/healthz` needs it, reads included (the worker
/// list names repositories and pull requests, private ones too).
///
/// At most `max_concurrent_webhooks` webhook requests are handled at once (a tower
/// `ConcurrencyLimit`); beyond that a `LoadShed` answers 503 with `Retry-After` at once, before any
/// body is read.
pub fn router(app: &App, metrics: Metrics, max_concurrent_webhooks: usize) -> Router {
    let token = app.options().admin_token.clone();
    let admin = AdminOptions::new()
        .metrics(metrics)
        .maybe_bearer_token(token.clone())
        .protect_reads(true)
        .openapi(crate::openapi::document());
    // The debug endpoint mutates, so it takes the admin API's bearer token (same 401 answer), checked
    // once the method matched (a GET is 405 first).
    let crash_route = match &token {
        Some(token) => require_bearer_method(post(crash), token.clone()),
        None => post(crash),
    };
    // Replicas in other processes forward events for this router's containers here.
    let internal = app.remote().map(|_| match token {
        Some(token) => require_bearer_method(post(internal_jobs), token),
        None => post(internal_jobs),
    });
    let router = Router::new();
    let router = match internal {
        Some(route) => router.route("/internal/workers/{id}/jobs", route),
        None => router,
    };
    router
        .route(
            "/webhook",
            post(webhook).layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new({
                        let app = app.clone();
                        move |headers: HeaderMap, error: BoxError| {
                            let app = app.clone();
                            async move { overloaded(&app, &headers, error) }
                        }
                    }))
                    .layer(LoadShedLayer::new())
                    .layer(ConcurrencyLimitLayer::new(max_concurrent_webhooks.max(1))),
            ),
        )
        .route("/debug/workers/{id}/crash", crash_route)
        .with_state(app.clone())
        .merge(admin_router(app.registry().clone(), admin))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

/// Seconds for a `Retry-After` header: rounded up, at least 1, saturating (a duration of any size
/// gives a valid header).
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0))
        .max(1)
}

/// The answer to one `POST /webhook`.
#[derive(Debug)]
pub enum Reply {
    /// A delivery the router understood.
    Answer {
        /// 200, 202 or 503.
        status: StatusCode,
        /// For 503.
        retry_after: Option<u64>,
        /// The body.
        body: DeliveryAnswer,
    },
    /// A refusal of the request itself.
    Error {
        /// 400, 401, 408, 413, 415.
        status: StatusCode,
        /// Why.
        error: String,
    },
}

impl Reply {
    /// The `webhook_router_deliveries_total` label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Answer { body, .. } if body.reason.as_deref() == Some(OVERLOADED) => "overloaded",
            Self::Answer { body, .. } => body.outcome.as_str(),
            Self::Error { status, .. } if *status == StatusCode::UNAUTHORIZED => "unauthorized",
            Self::Error { .. } => "invalid",
        }
    }

    fn error(status: StatusCode, error: impl ToString) -> Self {
        Self::Error {
            status,
            error: error.to_string(),
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        match self {
            Self::Answer {
                status,
                retry_after,
                body,
            } => {
                let mut r = (status, Json(body)).into_response();
                if let Some(secs) = retry_after {
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
                }
                r
            }
            // A bad webhook signature is not an HTTP authentication challenge: no WWW-Authenticate.
            Self::Error { status, error } => (status, Json(ErrorAnswer { error })).into_response(),
        }
    }
}

const OVERLOADED: &str =
    "too many deliveries are being received at once; send this one again shortly";

/// A delivery refused as a whole before its pull requests are known.
fn refused(event: Option<String>, outcome: Outcome, reason: &str, wait: Duration) -> Reply {
    Reply::Answer {
        status: StatusCode::SERVICE_UNAVAILABLE,
        retry_after: Some(retry_after_secs(wait)),
        body: DeliveryAnswer {
            outcome,
            decision: None,
            event,
            action: None,
            worker: None,
            new: None,
            token: None,
            state: None,
            limit: None,
            reason: Some(reason.to_owned()),
            targets: Vec::new(),
        },
    }
}

impl App {
    /// How long a client should wait before sending a refused delivery again.
    fn wait_for(&self, d: &Dispatch) -> Duration {
        let cfg = self.registry().config();
        match d {
            Dispatch::Rejected(Rejection::TargetDraining { .. }) | Dispatch::Backlog { .. } => {
                self.options().work
            }
            Dispatch::Closing => cfg.heartbeat_timeout(),
            _ => cfg.sweep_interval(),
        }
    }

    /// One pull request's answer, and how long to wait if it was refused.
    fn target_answer(
        &self,
        target: &Target,
        outcome: TargetOutcome,
        event: &str,
        action: Option<&str>,
    ) -> (TargetAnswer, Option<Duration>) {
        let mut a = TargetAnswer {
            target: target.to_string(),
            outcome: Outcome::Ignored,
            worker: None,
            new: None,
            token: None,
            state: None,
            limit: None,
            reason: None,
        };
        let mut wait = None;
        match outcome {
            TargetOutcome::Dispatched(d) => {
                match &d {
                    Dispatch::Assigned(x) => {
                        a.outcome = Outcome::Assigned;
                        a.worker = Some(x.worker.get());
                        a.new = Some(x.new);
                        a.token = Some(x.token.get());
                    }
                    Dispatch::Duplicate(dup) => {
                        a.outcome = Outcome::Duplicate;
                        a.worker = dup.holder.map(WorkerId::get);
                        a.state = Some(match dup.state {
                            ClaimState::Completed => ClaimStateName::Completed,
                            _ => ClaimStateName::InFlight,
                        });
                    }
                    Dispatch::Rejected(Rejection::CapacityFull { limit }) => {
                        a.outcome = Outcome::Capacity;
                        a.limit = Some(*limit as u64);
                        a.reason = Some(format!("{limit} live workers is the limit"));
                    }
                    Dispatch::Rejected(Rejection::TargetDraining { worker }) => {
                        a.outcome = Outcome::Draining;
                        a.worker = Some(worker.get());
                        a.reason = Some(format!("its worker {worker} is draining"));
                    }
                    Dispatch::Rejected(r) => {
                        a.outcome = Outcome::Capacity;
                        a.reason = Some(r.to_string());
                    }
                    Dispatch::Backlog { worker } => {
                        a.outcome = Outcome::Capacity;
                        a.worker = Some(worker.get());
                        a.reason = Some("the worker's queue is full".to_owned());
                    }
                    Dispatch::Closing => {
                        a.outcome = Outcome::Closing;
                        a.reason = Some("the router is shutting down".to_owned());
                    }
                    Dispatch::Unavailable(e) => {
                        a.outcome = Outcome::Unavailable;
                        a.reason = Some(e.to_string());
                    }
                    Dispatch::Unreachable { worker, reason } => {
                        a.outcome = Outcome::Unavailable;
                        a.worker = Some(worker.get());
                        a.reason = Some(reason.clone());
                    }
                }
                if a.outcome.is_refusal() {
                    wait = Some(self.wait_for(&d));
                }
            }
            TargetOutcome::Drained { assignment } => {
                a.outcome = Outcome::Drained;
                a.worker = Some(assignment.worker.get());
                a.new = Some(assignment.new);
                a.token = Some(assignment.token.get());
            }
            TargetOutcome::AlreadyDraining { worker } => {
                a.worker = Some(worker.get());
                a.reason = Some(format!("its worker {worker} is already draining"));
            }
            TargetOutcome::NoWorker(decision) => {
                a.reason = Some(format!(
                    "no live worker serves {target}, and {event}{} events ({decision}) start none",
                    action.map(|a| format!(".{a}")).unwrap_or_default()
                ));
            }
            TargetOutcome::Ignored => {
                a.reason = Some(format!(
                    "the routing policy ignores {event}{} events",
                    action.map(|a| format!(".{a}")).unwrap_or_default()
                ));
            }
        }
        (a, wait)
    }

    /// The whole handling of one `POST /webhook`.
    pub async fn handle_webhook(&self, request: Request) -> Reply {
        let (parts, body) = request.into_parts();
        let headers = &parts.headers;
        let event_header = headers
            .get(github::EVENT_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|e| e.chars().take(64).collect::<String>());
        // Everything that rules the delivery out without its body, before reading it.
        if self.is_closing() {
            let wait = self.registry().config().heartbeat_timeout();
            return refused(
                event_header,
                Outcome::Closing,
                "the router is shutting down",
                wait,
            );
        }
        let delivery = match github::delivery(headers) {
            Ok(d) => d,
            Err(e) => return Reply::error(e.status(), e),
        };
        // A signature header must be well-formed even without a secret (GitHub never sends a
        // malformed one); with a secret it must be there, and match.
        let verify = match (&self.options().webhook_secret, github::signature(headers)) {
            (Some(secret), Ok(digest)) => Some((Verifier::new(secret), digest)),
            (None, Ok(_) | Err(SignatureError::Missing)) => None,
            (_, Err(e)) => return Reply::error(StatusCode::UNAUTHORIZED, e),
        };
        let limits = &self.options().body;
        let announced = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if announced.is_some_and(|n| n > limits.max as u64) {
            return Reply::error(
                StatusCode::PAYLOAD_TOO_LARGE,
                BodyError::TooLarge { max: limits.max },
            );
        }
        let raw = match body::read(body, limits, verify).await {
            Ok(b) => b,
            Err(e @ BodyError::Overloaded) => {
                return refused(
                    Some(delivery.event),
                    Outcome::Unavailable,
                    &e.to_string(),
                    Duration::from_secs(1),
                )
            }
            Err(e) => {
                let status = match e {
                    BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                    BodyError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
                    BodyError::Signature(_) => StatusCode::UNAUTHORIZED,
                    _ => StatusCode::BAD_REQUEST,
                };
                return Reply::error(status, e);
            }
        };
        let payload = match github::json_payload(delivery.content_type, &raw.bytes) {
            Ok(p) => p,
            Err(e) => return Reply::error(StatusCode::BAD_REQUEST, e),
        };
        drop(raw);
        let (action, targets) = match github::route(&delivery.event, &payload) {
            Ok(Route::Targets { action, targets }) => (action, targets),
            Ok(Route::Ignored(reason)) => {
                return Reply::Answer {
                    status: StatusCode::ACCEPTED,
                    retry_after: None,
                    body: DeliveryAnswer {
                        outcome: Outcome::Ignored,
                        decision: None,
                        event: Some(delivery.event),
                        action: None,
                        worker: None,
                        new: None,
                        token: None,
                        state: None,
                        limit: None,
                        reason: Some(reason),
                        targets: Vec::new(),
                    },
                }
            }
            Err(e) => return Reply::error(StatusCode::BAD_REQUEST, e),
        };
        drop(payload);
        let decision = self
            .options()
            .policy
            .decide(&delivery.event, action.as_deref());
        let mut answers = Vec::with_capacity(targets.len());
        let mut wait: Option<Duration> = None;
        for target in &targets {
            let outcome = self.apply(decision, target, &delivery.id).await;
            tracing::debug!(%target, delivery = %delivery.id, event = %delivery.event, %decision, ?outcome, "delivery");
            let (answer, w) =
                self.target_answer(target, outcome, &delivery.event, action.as_deref());
            wait = wait.max(w);
            answers.push(answer);
        }
        let outcome = summary(&answers);
        let status = if outcome.is_refusal() {
            StatusCode::SERVICE_UNAVAILABLE
        } else if outcome == Outcome::Duplicate {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        };
        let single = (answers.len() == 1).then(|| answers[0].clone());
        let pick = |f: fn(&TargetAnswer) -> Option<u64>| single.as_ref().and_then(f);
        Reply::Answer {
            status,
            retry_after: outcome
                .is_refusal()
                .then(|| retry_after_secs(wait.unwrap_or_default())),
            body: DeliveryAnswer {
                outcome,
                decision: Some(decision),
                event: Some(delivery.event),
                action,
                worker: pick(|a| a.worker),
                new: single.as_ref().and_then(|a| a.new),
                token: pick(|a| a.token),
                state: single.as_ref().and_then(|a| a.state),
                limit: pick(|a| a.limit),
                reason: single.as_ref().and_then(|a| a.reason.clone()),
                targets: answers,
            },
        }
    }
}

/// The outcome of a delivery from its pull requests': the first refusal (send it again), else
/// assigned, drained, duplicate (all of them) or ignored.
fn summary(answers: &[TargetAnswer]) -> Outcome {
    if let Some(r) = answers.iter().find(|a| a.outcome.is_refusal()) {
        return r.outcome;
    }
    for o in [Outcome::Assigned, Outcome::Drained] {
        if answers.iter().any(|a| a.outcome == o) {
            return o;
        }
    }
    if !answers.is_empty() && answers.iter().all(|a| a.outcome == Outcome::Duplicate) {
        Outcome::Duplicate
    } else {
        Outcome::Ignored
    }
}

/// Receives a GitHub webhook delivery.
#[utoipa::path(
    post,
    path = "/webhook",
    tag = "webhook",
    description = "A GitHub webhook delivery. The router finds the pull requests it concerns \
                   (`pull_request*`, `issue_comment` and `issues` on a pull request, `check_run`, \
                   `check_suite` and `workflow_run` through `pull_requests[]`, `merge_group` \
                   through its queue branch), applies the routing policy (`decision`: start, reach, \
                   drain or ignore) and admits the delivery to each one's worker. A redelivery (same \
                   `X-GitHub-Delivery`) is a duplicate. Headers are checked before the body is read.",
    params(
        ("X-GitHub-Event" = String, Header, pattern = r"^[!-~]{1,64}$",
         description = "The event name, e.g. `pull_request` (visible ASCII, at most 64 bytes)"),
        ("X-GitHub-Delivery" = String, Header, pattern = r"^[!-~]{1,255}$",
         description = "The delivery id (visible ASCII, at most 255 bytes); a redelivery repeats it"),
        ("X-Hub-Signature-256" = Option<String>, Header, pattern = r"^sha256=[0-9a-fA-F]{64}$",
         description = "`sha256=` and the hex HMAC-SHA256 of the body under the webhook secret (required when the router has one)"),
    ),
    request_body(
        description = "The event's payload as JSON, or form-encoded with the JSON in its `payload` field (GitHub's two content types); at most 25 MiB",
        content(
            (Object = "application/json"),
            (FormDelivery = "application/x-www-form-urlencoded"),
        ),
    ),
    responses(
        (status = 200, description = "Every pull request it concerns already has it (a redelivery)", body = DeliveryAnswer),
        (status = 202, description = "Assigned, drained or ignored", body = DeliveryAnswer),
        (status = 400, description = "A missing, repeated or invalid header, or a payload that is not what its event promises", body = ErrorAnswer),
        (status = 401, description = "A malformed X-Hub-Signature-256, or (when the router has a secret) a missing or wrong one", body = ErrorAnswer),
        (status = 408, description = "The body was not received in time", body = ErrorAnswer),
        (status = 413, description = "Larger than GitHub's 25 MiB", body = ErrorAnswer),
        (status = 415, description = "Not application/json nor application/x-www-form-urlencoded", body = ErrorAnswer),
        (status = 503, description = "Not accepted now (no capacity, the worker drains or its queue is full, shutting down, the registry's backend is away, or too many deliveries at once): send it again after Retry-After; nothing was left behind",
         body = DeliveryAnswer,
         headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(crate) async fn webhook(State(app): State<App>, request: Request) -> Response {
    let reply = app.handle_webhook(request).await;
    app.metrics().delivery(reply.label());
    reply.into_response()
}

/// GitHub's form-encoded delivery.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // a schema only
pub(crate) struct FormDelivery {
    /// The event's JSON payload, as the `application/json` body would be.
    #[schema(content_media_type = "application/json")]
    payload: String,
}

fn error_response(status: StatusCode, error: impl ToString) -> Response {
    (
        status,
        Json(ErrorAnswer {
            error: error.to_string(),
        }),
    )
        .into_response()
}

/// Makes a worker's container crash (it stops heartbeating; the sweep then declares it dead and
/// re-dispatches its events).
#[utoipa::path(
    post,
    path = "/debug/workers/{id}/crash",
    tag = "debug",
    description = "Makes the worker's simulated container crash: it stops heartbeating and working \
                   without telling the registry, so the sweep declares it dead after the heartbeat \
                   timeout and its events are released and re-dispatched.",
    params(("id" = u64, Path, minimum = 0, maximum = 17592186044415_u64,
            description = "Worker id: a decimal integer without sign or leading zeros, at most 2^44 - 1")),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "Its container crashed", body = CrashAnswer),
        (status = 400, description = "The id is not a canonical decimal integer of at most 2^44 - 1", body = ErrorAnswer),
        (status = 401, description = "Bearer token missing or wrong (when one is configured)", body = ErrorAnswer),
        (status = 404, description = "No such worker", body = ErrorAnswer),
        (status = 409, description = "The worker is dead, has no container here, or its container stopped", body = ErrorAnswer),
        (status = 503, description = "The registry's backend cannot answer now", body = ErrorAnswer,
         headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(crate) async fn crash(State(app): State<App>, Path(id): Path<String>) -> Response {
    let id: WorkerId = match id.parse() {
        Ok(id) => id,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e),
    };
    match app.crash(id).await {
        Ok(()) => (
            StatusCode::ACCEPTED,
            Json(CrashAnswer {
                worker: id.get(),
                crashed: true,
            }),
        )
            .into_response(),
        Err(e @ CrashError::Unknown(_)) => error_response(StatusCode::NOT_FOUND, e),
        Err(e @ CrashError::Unavailable(_)) => {
            let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, e);
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        Err(e) => error_response(StatusCode::CONFLICT, e),
    }
}

/// Takes an event another replica forwards for one of this router's containers.
#[utoipa::path(
    post,
    path = "/internal/workers/{id}/jobs",
    tag = "internal",
    description = "An event another replica of the router admitted for a worker whose container \
                   this replica runs (served only with a shared registry, replicas in separate \
                   processes). It is put in the container's queue as it is; the registry's \
                   decision was made by the forwarding replica.",
    params(("id" = u64, Path, minimum = 0, maximum = 17592186044415_u64,
            description = "Worker id: a decimal integer without sign or leading zeros, at most 2^44 - 1")),
    request_body(content = ForwardedJob, content_type = "application/json"),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "Queued", body = ForwardAnswer),
        (status = 400, description = "A bad id or body", body = ErrorAnswer),
        (status = 401, description = "Bearer token missing or wrong (when one is configured)", body = ErrorAnswer),
        (status = 404, description = "No container of this replica has that id", body = ForwardAnswer),
        (status = 410, description = "Its container here has stopped", body = ForwardAnswer),
        (status = 429, description = "Its queue is full", body = ForwardAnswer),
    ),
)]
pub(crate) async fn internal_jobs(
    State(app): State<App>,
    Path(id): Path<String>,
    body: Result<Json<ForwardedJob>, JsonRejection>,
) -> Response {
    let id: WorkerId = match id.parse() {
        Ok(id) => id,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e),
    };
    let job = match body {
        Ok(Json(job)) => job,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let target: Target = match job.target.parse() {
        Ok(t) => t,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e),
    };
    let delivery = match DeliveryId::new(&job.delivery) {
        Ok(d) => d,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e),
    };
    let job = Job {
        target,
        event: delivery,
        token: FencingToken::from_raw(job.token),
    };
    let (status, result) = match app.containers().hand(id, job, false) {
        Handed::Queued => (StatusCode::ACCEPTED, "queued"),
        Handed::Full => (StatusCode::TOO_MANY_REQUESTS, "full"),
        Handed::Stopped => (StatusCode::GONE, "stopped"),
        Handed::Absent(_) => (StatusCode::NOT_FOUND, "unknown"),
    };
    (
        status,
        Json(ForwardAnswer {
            worker: id.get(),
            result: result.to_owned(),
        }),
    )
        .into_response()
}

/// The webhook route is at its concurrency limit (or its service failed, which it cannot).
fn overloaded(app: &App, headers: &HeaderMap, error: BoxError) -> Response {
    tracing::debug!("webhook request shed: {error}");
    let event = headers
        .get(github::EVENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|e| e.chars().take(64).collect::<String>());
    let reply = refused(
        event,
        Outcome::Unavailable,
        OVERLOADED,
        Duration::from_secs(1),
    );
    app.metrics().delivery(reply.label());
    reply.into_response()
}

async fn not_found(request: Request) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        format!("no such path: {}", request.uri().path()),
    )
}

async fn method_not_allowed(request: Request) -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}
