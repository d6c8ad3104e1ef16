//! The answers of the HTTP edge: [`Reply`] to a `POST /webhook`, the JSON error every other
//! refusal carries, and `Retry-After`.

use super::answer::{DeliveryAnswer, ErrorAnswer};
use crate::outcome::Outcome;

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// Seconds for a `Retry-After` header: rounded up, at least 1, saturating (a duration of any size
/// gives a valid header).
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0))
        .max(1)
}

/// Room for a typical answer's JSON (one pull request: about 300 bytes).
const ANSWER_CAPACITY: usize = 512;

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

    pub(crate) fn error(status: StatusCode, error: impl ToString) -> Self {
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
                // Serialised at once into a buffer an answer fits (Json starts at 128 bytes and
                // grows: two reallocations for a typical answer).
                let mut buf = Vec::with_capacity(ANSWER_CAPACITY);
                let mut r = match serde_json::to_writer(&mut buf, &body) {
                    Ok(()) => (
                        status,
                        [(
                            header::CONTENT_TYPE,
                            HeaderValue::from_static("application/json"),
                        )],
                        buf,
                    )
                        .into_response(),
                    Err(e) => error_response(StatusCode::INTERNAL_SERVER_ERROR, e),
                };
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

/// The reason given when the webhook route sheds a request.
pub(crate) const OVERLOADED: &str =
    "too many deliveries are being received at once; send this one again shortly";

/// A delivery refused as a whole before its pull requests are known.
pub(crate) fn refused(
    event: Option<String>,
    outcome: Outcome,
    reason: &str,
    wait: Duration,
) -> Reply {
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
            position: None,
            targets: Vec::new(),
        },
    }
}

/// A JSON error answer.
pub(crate) fn error_response(status: StatusCode, error: impl ToString) -> Response {
    (
        status,
        Json(ErrorAnswer {
            error: error.to_string(),
        }),
    )
        .into_response()
}
