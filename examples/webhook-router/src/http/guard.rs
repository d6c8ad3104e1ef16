//! The admin token's check in front of the admin endpoints (all but `/healthz`), against the
//! token's current value and, during a rotation window, its previous one (see
//! [`crate::secrets`]), so that a token read again from its file takes effect at once. (The
//! library's own guard takes a token fixed when the routes are built.)
//!
//! It wraps the routes' handlers only: a method a route does not serve is answered 405 by the
//! method-not-allowed fallback the app sets around them, before any token is checked, and an
//! unknown path 404; a refusal is the admin API's own 401 (`WWW-Authenticate: Bearer`, a JSON
//! error, a warning in the log).

use crate::secrets::Secret;

use super::reply::error_response;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use axum::Router;

/// Paths open without the token.
const OPEN: [&str; 1] = ["/healthz"];

/// `routes` behind `token`.
pub(crate) fn guarded(routes: Router, token: Secret) -> Router {
    routes.layer(from_fn_with_state(token, check))
}

async fn check(State(token): State<Secret>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if OPEN.contains(&path) || bearer(request.headers()).is_some_and(|t| token.accepts(t)) {
        return next.run(request).await;
    }
    tracing::warn!(
        method = %request.method(),
        path,
        "admin API request refused: missing or wrong bearer token"
    );
    let mut refused = error_response(StatusCode::UNAUTHORIZED, "missing or invalid bearer token");
    refused.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"worker-registry\""),
    );
    refused
}

/// The token of `Authorization: Bearer <token>` (the scheme in any case, RFC 7235).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
}
