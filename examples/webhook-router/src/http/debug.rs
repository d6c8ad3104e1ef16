//! `POST /debug/workers/{id}/crash`: fault injection for demonstrations.

use super::answer::{CrashAnswer, ErrorAnswer};
use super::reply::error_response;
use crate::app::App;
use crate::outcome::CrashError;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use worker_registry::WorkerId;

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
    match app.lifecycle().crash(id).await {
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
