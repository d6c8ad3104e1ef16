//! The bearer-token check guarding the admin API's mutating (optionally all) endpoints.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;

use super::error::ApiError;

/// The configured token, shared by the middleware instances.
pub(crate) type Token = Arc<[u8]>;

/// Whether `headers` carry `Authorization: Bearer <token>` with the configured token.
///
/// The comparison is constant-time in the token's content (`subtle`); only a difference in length
/// returns early. The scheme is matched case-insensitively (RFC 7235); an empty token never matches,
/// so an empty configured token refuses everything.
pub(crate) fn authorized(headers: &HeaderMap, expected: &[u8]) -> bool {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    let Some((scheme, token)) = value.split_at_checked(7) else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case(b"bearer ") || token.is_empty() {
        return false;
    }
    bool::from(token.ct_eq(expected))
}

/// Middleware: 401 with `WWW-Authenticate: Bearer` unless the request carries the token.
pub(crate) async fn require_token(
    State(token): State<Token>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if authorized(request.headers(), &token) {
        Ok(next.run(request).await)
    } else {
        tracing::warn!(
            method = %request.method(),
            path = %request.uri().path(),
            "admin API request refused: missing or wrong bearer token"
        );
        Err(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let t = b"s3cret";
        assert!(authorized(&with("Bearer s3cret"), t));
        assert!(authorized(&with("bearer s3cret"), t));
        assert!(!authorized(&HeaderMap::new(), t));
        assert!(!authorized(&with("Bearer s3cre"), t));
        assert!(!authorized(&with("Bearer s3cret2"), t));
        assert!(!authorized(&with("Basic s3cret"), t));
        assert!(!authorized(&with("Bearer"), t));
        assert!(!authorized(&with("Bearer "), b""));
    }
}
