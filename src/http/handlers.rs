//! The admin API's handlers. Each carries its `#[utoipa::path]` description, from which the
//! OpenAPI document is generated.

use crate::WorkerRegistryExt;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::IntoResponse;
use axum::Json;

use super::error::ApiError;
use super::model::{ErrorBody, HealthBody, WorkerBody, WorkersBody};
use super::AdminState;
use crate::api::contract::WorkerRegistry;
use crate::api::error::RegistryError;
use crate::api::ids::WorkerId;
use crate::metrics::Format;

fn worker_id(path: Result<Path<String>, PathRejection>) -> Result<WorkerId, ApiError> {
    let Path(raw) = path.map_err(|e| ApiError::BadPath(e.body_text()))?;
    raw.parse().map_err(ApiError::BadWorkerId)
}

/// Every tracked worker, with counts, capacity and claims, from the last sweep's snapshot.
#[utoipa::path(
    get,
    path = "/workers",
    tag = "workers",
    description = "Every tracked worker (dead ones until their retention ends), from the snapshot \
                   the last sweep published: never blocks the registry, at most one sweep interval old.",
    responses(
        (status = 200, description = "The snapshot", body = WorkersBody),
        (status = 401, description = "Bearer token required (only if reads are protected)", body = ErrorBody),
    ),
)]
pub(crate) async fn list_workers<R: WorkerRegistry + Clone + 'static>(
    State(s): State<AdminState<R>>,
) -> Json<WorkersBody> {
    Json(WorkersBody::from(&*s.registry.status()))
}

/// One worker, read now.
#[utoipa::path(
    get,
    path = "/workers/{id}",
    tag = "workers",
    description = "One worker's current state, read now (not from the snapshot).",
    params(("id" = u64, Path, minimum = 0, maximum = 17592186044415_u64,
        description = "Worker id: a decimal integer without sign or leading zeros, at most 2^44 - 1")),
    responses(
        (status = 200, description = "The worker", body = WorkerBody),
        (status = 400, description = "The id is not a canonical decimal integer of at most 2^44 - 1", body = ErrorBody),
        (status = 401, description = "Bearer token required (only if reads are protected)", body = ErrorBody),
        (status = 404, description = "No such worker (never existed, or dead and purged)", body = ErrorBody),
        (status = 503, description = "The registry's backend cannot answer now", body = ErrorBody,
         headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(crate) async fn get_worker<R: WorkerRegistry + Clone + 'static>(
    State(s): State<AdminState<R>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<WorkerBody>, ApiError> {
    let id = worker_id(path)?;
    worker_body(&s.registry, id).await
}

/// The worker's current state as the API shows it, or 404.
async fn worker_body<R: WorkerRegistry>(
    registry: &R,
    id: WorkerId,
) -> Result<Json<WorkerBody>, ApiError> {
    let info = registry
        .worker(id)
        .await?
        .ok_or(ApiError::Registry(RegistryError::UnknownWorker { id }))?;
    Ok(Json(WorkerBody::from(&info)))
}

/// Sets a worker draining.
#[utoipa::path(
    post,
    path = "/workers/{id}/drain",
    tag = "workers",
    description = "Sets the worker draining: it gets no new assignment and exits when its current \
                   loop finishes. Idempotent. A worker that is idle has no loop to finish and exits \
                   at once: the answer then shows it dead with reason `exited`.",
    params(("id" = u64, Path, minimum = 0, maximum = 17592186044415_u64,
        description = "Worker id: a decimal integer without sign or leading zeros, at most 2^44 - 1")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The worker, now draining (or exited, if it was idle)", body = WorkerBody),
        (status = 400, description = "The id is not a canonical decimal integer of at most 2^44 - 1", body = ErrorBody),
        (status = 401, description = "Bearer token missing or wrong (when one is configured)", body = ErrorBody),
        (status = 404, description = "No such worker", body = ErrorBody),
        (status = 409, description = "The worker is already dead", body = ErrorBody),
        (status = 503, description = "The registry's backend cannot answer now", body = ErrorBody,
         headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(crate) async fn drain_worker<R: WorkerRegistry + Clone + 'static>(
    State(s): State<AdminState<R>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<WorkerBody>, ApiError> {
    let id = worker_id(path)?;
    let status = s.registry.drain(id).await?;
    tracing::info!(worker = %id, %status, "worker drained through the admin API");
    worker_body(&s.registry, id).await
}

/// Prometheus metrics.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    description = "The registry's metrics (and any the application registered). The format follows \
                   the `Accept` header: OpenMetrics text when it asks for \
                   `application/openmetrics-text` (as Prometheus does), the classic Prometheus text \
                   format 0.0.4 otherwise.",
    params(("Accept" = Option<String>, Header, description = "`application/openmetrics-text` for OpenMetrics; anything else (or nothing) for the classic text format")),
    responses(
        (status = 200, description = "The metrics", content(
            (String = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
            (String = "text/plain; version=0.0.4; charset=utf-8"),
        )),
        (status = 401, description = "Bearer token required (only if reads are protected)", body = ErrorBody),
    ),
)]
pub(crate) async fn metrics<R: WorkerRegistry + Clone + 'static>(
    State(s): State<AdminState<R>>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let accept = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    let format = Format::from_accept((!accept.is_empty()).then_some(accept.as_str()));
    (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::VARY, "accept"),
        ],
        s.metrics.encode_as(format),
    )
}

/// Liveness.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    description = "200 while the process serves requests. Never requires a token.",
    responses((status = 200, description = "Alive", body = HealthBody)),
)]
pub(crate) async fn healthz() -> Json<HealthBody> {
    Json(HealthBody { status: "ok" })
}

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    description = "The OpenAPI 3 description of this API.",
    responses(
        (status = 200, description = "The OpenAPI document", content_type = "application/json"),
        (status = 401, description = "Bearer token required (only if reads are protected)", body = ErrorBody),
    ),
)]
pub(crate) async fn openapi_json<R: WorkerRegistry + Clone + 'static>(
    State(s): State<AdminState<R>>,
) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        s.openapi.clone(),
    )
}
