//! [`ApiError`]: every refusal of the admin API, as a status code and a JSON `{"error": "..."}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::model::ErrorBody;
use crate::api::error::RegistryError;
use crate::api::ids::WorkerIdError;

/// Why an admin request was refused.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// The `{id}` path segment is not a worker id (400).
    BadWorkerId(WorkerIdError),
    /// The path could not be decoded at all (400).
    BadPath(String),
    /// Missing or wrong bearer token (401).
    Unauthorized,
    /// The registry refused: unknown worker (404), dead worker (409), a backend that cannot answer
    /// now (503, with `Retry-After: 1`), anything else (500).
    Registry(RegistryError),
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            Self::BadWorkerId(_) | Self::BadPath(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Registry(RegistryError::UnknownWorker { .. }) => StatusCode::NOT_FOUND,
            Self::Registry(RegistryError::WorkerDead { .. }) => StatusCode::CONFLICT,
            Self::Registry(e) if e.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
            Self::Registry(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn message(&self) -> String {
        match self {
            Self::BadWorkerId(e) => e.to_string(),
            Self::BadPath(e) => e.clone(),
            Self::Unauthorized => "missing or invalid bearer token".to_owned(),
            Self::Registry(e) => e.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status(),
            Json(ErrorBody {
                error: self.message(),
            }),
        )
            .into_response();
        if let Self::Unauthorized = self {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"worker-registry\""),
            );
        }
        // A backend that cannot answer now: ask again in a second (a connection is usually
        // re-established within that; the sweeper retries at its own interval).
        if response.status() == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        Self::Registry(e)
    }
}
