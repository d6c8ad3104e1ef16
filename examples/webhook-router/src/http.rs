//! The router's HTTP app: `POST /webhook`, `POST /debug/workers/{id}/crash`, and the library's
//! admin API (`/workers`, `/metrics`, `/openapi.json`, `/healthz`) merged at the root.

use crate::app::{App, CrashError, Dispatch, Source};
use crate::github::{self, Route};

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use worker_registry::http::{admin_router, require_bearer_method, AdminOptions};
use worker_registry::metrics::Metrics;
use worker_registry::{AlreadyClaimed, Assignment, Rejection, WorkerId, WorkerRegistry};

/// The HTTP app: webhook, debug endpoint and the library's admin API, serving `metrics`.
pub fn router(app: &App, metrics: Metrics) -> Router {
    let token = app.options().admin_token.clone();
    let admin = AdminOptions::new()
        .metrics(metrics)
        .maybe_bearer_token(token.clone());
    // The debug endpoint mutates, so it takes the admin API's bearer token (same 401 answer).
    let crash_route = match token {
        Some(token) => require_bearer_method(post(crash), token),
        None => post(crash),
    };
    Router::new()
        .route(
            "/webhook",
            post(webhook).layer(DefaultBodyLimit::max(github::MAX_PAYLOAD_BYTES)),
        )
        .route("/debug/workers/{id}/crash", crash_route)
        .with_state(app.clone())
        .merge(admin_router(app.registry().clone(), admin))
}

/// Seconds for a `Retry-After` header: rounded up, at least 1, saturating (a duration of any size
/// gives a valid header).
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0))
        .max(1)
}

impl App {
    fn retry_after(&self, reason: &Dispatch) -> HeaderValue {
        let cfg = self.registry().config();
        let wait = match reason {
            Dispatch::Rejected(Rejection::TargetDraining { .. }) | Dispatch::Backlog { .. } => {
                self.options().work
            }
            Dispatch::Closing => cfg.heartbeat_timeout(),
            _ => cfg.sweep_interval(),
        };
        HeaderValue::from(retry_after_secs(wait))
    }

    /// The whole handling of one `POST /webhook`.
    async fn handle_delivery(
        &self,
        headers: &HeaderMap,
        body: Result<Bytes, BytesRejection>,
    ) -> Reply {
        let body = match body {
            Ok(b) => b,
            Err(e) => return Reply::Error(e.status(), e.body_text()),
        };
        // The signature covers the raw body, whichever content type the webhook uses.
        if let Some(secret) = &self.options().webhook_secret {
            if let Err(e) = github::verify(secret, headers, &body) {
                return Reply::Error(StatusCode::UNAUTHORIZED, e.to_string());
            }
        }
        let body = match github::json_payload(headers, body).await {
            Ok(b) => b,
            Err(e) => return Reply::Error(StatusCode::BAD_REQUEST, e),
        };
        let delivery = match github::delivery(headers) {
            Ok(d) => d,
            Err(e) => return Reply::Error(StatusCode::BAD_REQUEST, e.to_string()),
        };
        let target = match github::route(&delivery.event, &body) {
            Ok(Route::Target(t)) => t,
            Ok(Route::Ignored(reason)) => return Reply::Ignored(reason),
            Err(e) => return Reply::Error(StatusCode::BAD_REQUEST, e.to_string()),
        };
        let d = self.dispatch(&target, &delivery.id, Source::Webhook).await;
        tracing::debug!(%target, delivery = %delivery.id, event = %delivery.event, outcome = ?d, "delivery");
        match d {
            Dispatch::Assigned(a) => Reply::Assigned(a),
            Dispatch::Duplicate(dup) => Reply::Duplicate(dup),
            other => {
                let retry_after = self.retry_after(&other);
                Reply::Unavailable(other, retry_after)
            }
        }
    }
}

/// The answer to one delivery.
enum Reply {
    Assigned(Assignment),
    Duplicate(AlreadyClaimed),
    Unavailable(Dispatch, HeaderValue),
    Ignored(String),
    Error(StatusCode, String),
}

impl Reply {
    fn outcome(&self) -> &'static str {
        match self {
            Self::Assigned(_) => "assigned",
            Self::Duplicate(_) => "duplicate",
            Self::Unavailable(d, _) => d.outcome(),
            Self::Ignored(_) => "ignored",
            Self::Error(s, _) if *s == StatusCode::UNAUTHORIZED => "unauthorized",
            Self::Error(..) => "invalid",
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let outcome = self.outcome();
        match self {
            Self::Assigned(a) => (
                StatusCode::ACCEPTED,
                Json(json!({
                    "outcome": outcome,
                    "worker": a.worker.get(),
                    "new": a.new,
                    "token": a.token.get(),
                })),
            )
                .into_response(),
            Self::Duplicate(d) => (
                StatusCode::OK,
                Json(json!({
                    "outcome": outcome,
                    "worker": d.holder.map(WorkerId::get),
                    "state": d.state.as_str(),
                })),
            )
                .into_response(),
            Self::Unavailable(why, retry_after) => {
                let mut body = json!({ "outcome": outcome });
                match why {
                    Dispatch::Rejected(Rejection::CapacityFull { limit }) => {
                        body["limit"] = limit.into();
                    }
                    Dispatch::Rejected(Rejection::TargetDraining { worker }) => {
                        body["worker"] = worker.get().into();
                    }
                    Dispatch::Backlog { worker } => {
                        body["worker"] = worker.get().into();
                        body["reason"] = "the worker's queue is full".into();
                    }
                    Dispatch::Closing => body["reason"] = "the router is shutting down".into(),
                    Dispatch::Unavailable(e) => body["reason"] = e.to_string().into(),
                    _ => {}
                }
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, retry_after)],
                    Json(body),
                )
                    .into_response()
            }
            Self::Ignored(reason) => (
                StatusCode::ACCEPTED,
                Json(json!({ "outcome": outcome, "reason": reason })),
            )
                .into_response(),
            Self::Error(status, error) => error_response(status, error),
        }
    }
}

pub(crate) fn error_response(status: StatusCode, error: String) -> Response {
    let mut r = (status, Json(json!({ "error": error }))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// `POST /webhook`.
async fn webhook(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let reply = app.handle_delivery(&headers, body).await;
    app.inner.metrics.delivery(reply.outcome());
    reply.into_response()
}

/// `POST /debug/workers/{id}/crash`.
async fn crash(State(app): State<App>, Path(id): Path<String>) -> Response {
    let id: WorkerId = match id.parse() {
        Ok(id) => id,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, format!("{e}")),
    };
    match app.crash(id).await {
        Ok(()) => (
            StatusCode::ACCEPTED,
            Json(json!({ "worker": id.get(), "crashed": true })),
        )
            .into_response(),
        Err(e @ CrashError::Unknown(_)) => error_response(StatusCode::NOT_FOUND, e.to_string()),
        Err(e @ CrashError::Unavailable(_)) => {
            let mut r = error_response(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        Err(e) => error_response(StatusCode::CONFLICT, e.to_string()),
    }
}
