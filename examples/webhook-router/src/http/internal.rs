//! `POST /internal/workers/{id}/jobs`: events other replicas (in other processes, sharing the
//! registry) forward for this replica's containers; see [`crate::remote`].

use super::answer::ErrorAnswer;
use super::reply::error_response;
use crate::app::App;
use crate::remote::{decode_job, ForwardAnswer, ForwardedJob};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use worker_registry::WorkerId;

/// Takes an event another replica forwards for one of this router's containers.
#[utoipa::path(
    post,
    path = "/internal/workers/{id}/jobs",
    tag = "internal",
    description = "An event another replica of the router admitted for a worker whose container \
                   this replica runs (served only with a shared registry, replicas in separate \
                   processes). It is put in the container's queue as it is, or parked for the \
                   container if this replica has claimed its start and not started it yet; the \
                   registry's decision was made by the forwarding replica. An event that carries \
                   its payload is sent as `application/vnd.webhook-router.job+body`, so that its \
                   body travels as GitHub sent it.",
    params(("id" = u64, Path, minimum = 0, maximum = 17592186044415_u64,
            description = "Worker id: a decimal integer without sign or leading zeros, at most 2^44 - 1")),
    request_body(
        description = "The job as JSON; with its payload (what GitHub sent), the job's JSON on one line, a line feed, then the payload's body as GitHub sent it (`body_len` bytes)",
        content(
            (ForwardedJob = "application/json"),
            (ForwardedJob = "application/vnd.webhook-router.job+body"),
        ),
    ),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "Queued (or parked for the container this replica is starting), or (`overflowed`, with its `position`) queued behind the container's full mailbox", body = ForwardAnswer),
        (status = 400, description = "A bad id or body", body = ErrorAnswer),
        (status = 401, description = "Bearer token missing or wrong (when one is configured)", body = ErrorAnswer),
        (status = 410, description = "Its container here has stopped", body = ForwardAnswer),
        (status = 429, description = "Its mailbox and the overflow behind it are full", body = ForwardAnswer),
    ),
)]
pub(crate) async fn internal_jobs(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let id: WorkerId = match id.parse() {
        Ok(id) => id,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e),
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let job = match decode_job(content_type, body) {
        Ok(job) => job,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, e),
    };
    // The forwarding replica read this replica's owner record, which is written before the
    // container starts: without a container yet, the event is parked for it (if it never starts,
    // the worker dies unstarted, the registry releases its events and the mailbox is forgotten).
    let (status, answer) = ForwardAnswer::of(id, &app.containers().hand(id, job, true));
    (status, Json(answer)).into_response()
}
