//! `GET /deliveries/failed`: the most recent deliveries whose command failed every attempt, as
//! this replica recorded them ([`crate::failed`]), newest first.

use super::answer::ErrorAnswer;
use super::reply::error_response;
use crate::app::App;
use crate::failed::FailedDelivery;

use std::time::{Duration, SystemTime};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// How many records an answer holds when `limit` is not given.
pub const DEFAULT_FAILED_LIMIT: usize = 100;

/// `GET /deliveries/failed`'s query.
#[derive(Debug, Clone, Deserialize, IntoParams)]
pub struct FailedQuery {
    /// How many records, newest first (default 100; more than the router keeps means all).
    pub limit: Option<usize>,
}

/// One delivery whose command failed every attempt; it was completed as failed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FailedDeliveryAnswer {
    /// The delivery (`X-GitHub-Delivery`).
    pub delivery: String,
    /// Its pull request, `owner/repo#number`.
    pub target: String,
    /// The worker that ran it.
    pub worker: u64,
    /// The fencing token of the event it was handed.
    pub token: u64,
    /// How many times its command ran, as the worker said.
    pub attempts: u32,
    /// Why it failed, as the worker said (at most 1,024 bytes); `null` if it said nothing.
    pub reason: Option<String>,
    /// Whether `reason` was cut.
    pub reason_truncated: bool,
    /// When the router recorded it: RFC 3339 UTC with milliseconds.
    pub at: String,
}

/// The answer of `GET /deliveries/failed`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FailedDeliveriesAnswer {
    /// The most recent, newest first.
    pub failed: Vec<FailedDeliveryAnswer>,
    /// Every failed delivery this router recorded since it started (more than it keeps: the
    /// oldest were pushed out).
    pub total: u64,
    /// How many it keeps.
    pub kept: usize,
}

impl From<FailedDelivery> for FailedDeliveryAnswer {
    fn from(f: FailedDelivery) -> Self {
        Self {
            delivery: f.delivery.as_str().to_owned(),
            target: f.target.to_string(),
            worker: f.worker.get(),
            token: f.token.get(),
            attempts: f.attempts,
            reason: f.reason,
            reason_truncated: f.reason_truncated,
            at: rfc3339(f.at),
        }
    }
}

/// `t` as RFC 3339 UTC with milliseconds, clamped to the years humantime formats (no panic from a
/// strange clock).
fn rfc3339(t: SystemTime) -> String {
    let last = SystemTime::UNIX_EPOCH + Duration::from_millis(253_402_300_799_999);
    humantime::format_rfc3339_millis(t.clamp(SystemTime::UNIX_EPOCH, last)).to_string()
}

/// The most recent failed deliveries.
#[utoipa::path(get, path = "/deliveries/failed", tag = "deliveries",
    description = "The most recent deliveries whose command failed every attempt (reported by a \
                   worker with `POST /worker/v1/complete` and `\"outcome\": \"failed\"`, and \
                   completed), newest first. This replica's record: a fixed number kept in \
                   memory, empty after a restart; `webhook_router_worker_failed_total` counts them all.",
    params(FailedQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The most recent, newest first", body = FailedDeliveriesAnswer),
        (status = 400, description = "`limit` is not a non-negative integer", body = ErrorAnswer),
        (status = 401, description = "Bearer token missing or wrong (when one is configured)", body = ErrorAnswer),
    ))]
pub(crate) async fn failed(
    State(app): State<App>,
    query: Result<Query<FailedQuery>, QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let ring = app.failed();
    let (newest, total) = ring.newest(q.limit.unwrap_or(DEFAULT_FAILED_LIMIT));
    Json(FailedDeliveriesAnswer {
        failed: newest.into_iter().map(Into::into).collect(),
        total,
        kept: ring.kept(),
    })
    .into_response()
}
