//! GitHub webhook deliveries: the three headers, the `X-Hub-Signature-256` HMAC, and the pull-request
//! target inside the payload (parsed with serde into small typed structs holding only what is used).

use std::fmt;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, Method};
use axum::Form;
use hmac::{Hmac, Mac};
use serde::de::IgnoredAny;
use serde::Deserialize;
use sha2::Sha256;
use worker_registry::{DeliveryId, DeliveryIdError, Target, TargetError};

/// GitHub caps webhook payloads at 25 MB; anything larger is not a GitHub delivery.
pub const MAX_PAYLOAD_BYTES: usize = 25 * 1024 * 1024;
/// The event name header (`pull_request`, `issue_comment`, `push`, `ping`, ...).
pub const EVENT_HEADER: &str = "x-github-event";
/// The delivery id header; a redelivery repeats it, which is what deduplication keys on.
pub const DELIVERY_HEADER: &str = "x-github-delivery";
/// `sha256=<hex HMAC-SHA256 of the raw body under the webhook secret>`.
pub const SIGNATURE_HEADER: &str = "x-hub-signature-256";

type HmacSha256 = Hmac<Sha256>;

/// The `X-Hub-Signature-256` value GitHub would send for `body` under `secret`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Why a delivery's signature was refused (all answered with 401).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignatureError {
    /// A secret is configured but the delivery carries no `X-Hub-Signature-256`.
    Missing,
    /// The header is not `sha256=` followed by 64 hex digits.
    Malformed,
    /// The HMAC does not match the body.
    Mismatch,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => write!(f, "missing X-Hub-Signature-256 header"),
            Self::Malformed => {
                write!(
                    f,
                    "X-Hub-Signature-256 is not `sha256=` followed by 64 hex digits"
                )
            }
            Self::Mismatch => write!(f, "X-Hub-Signature-256 does not match the payload"),
        }
    }
}

/// Checks the delivery's HMAC-SHA256 against `secret`, in constant time (`Mac::verify_slice`).
pub fn verify(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), SignatureError> {
    let value = headers
        .get(SIGNATURE_HEADER)
        .ok_or(SignatureError::Missing)?;
    let hex_digest = value
        .as_bytes()
        .strip_prefix(b"sha256=")
        .ok_or(SignatureError::Malformed)?;
    let mut expected = [0u8; 32];
    hex::decode_to_slice(hex_digest, &mut expected).map_err(|_| SignatureError::Malformed)?;
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(body);
    mac.verify_slice(&expected)
        .map_err(|_| SignatureError::Mismatch)
}

/// A delivery's identity, read from its headers.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// `X-GitHub-Event`.
    pub event: String,
    /// `X-GitHub-Delivery`, validated.
    pub id: DeliveryId,
}

/// A header that is missing or unusable (answered with 400).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderError {
    /// The header is absent.
    Missing(&'static str),
    /// `X-GitHub-Event` is not a plain event name.
    BadEvent,
    /// `X-GitHub-Delivery` is not a valid delivery id.
    BadDelivery(DeliveryIdError),
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(name) => write!(f, "missing {name} header"),
            Self::BadEvent => write!(f, "X-GitHub-Event is not an event name"),
            Self::BadDelivery(e) => write!(f, "X-GitHub-Delivery: {e}"),
        }
    }
}

/// Reads `X-GitHub-Event` and `X-GitHub-Delivery`.
pub fn delivery(headers: &HeaderMap) -> Result<Delivery, HeaderError> {
    let event = headers
        .get(EVENT_HEADER)
        .ok_or(HeaderError::Missing("X-GitHub-Event"))?
        .to_str()
        .ok()
        .filter(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or(HeaderError::BadEvent)?
        .to_owned();
    let raw = headers
        .get(DELIVERY_HEADER)
        .ok_or(HeaderError::Missing("X-GitHub-Delivery"))?;
    // Not `to_str`: `DeliveryId::new` reports the first offending byte itself.
    let text = String::from_utf8_lossy(raw.as_bytes());
    let id = DeliveryId::new(&text).map_err(HeaderError::BadDelivery)?;
    Ok(Delivery { event, id })
}

/// GitHub's form-encoded delivery: the JSON document is the `payload` field.
#[derive(Deserialize)]
struct FormDelivery {
    payload: String,
}

/// The JSON document of a delivery: the body itself (content type `application/json`), or the
/// `payload` field of a form-encoded body (`application/x-www-form-urlencoded`, GitHub's other
/// content-type setting), decoded by axum's `Form` extractor.
pub async fn json_payload(headers: &HeaderMap, body: Bytes) -> Result<Bytes, String> {
    let Some(content_type) = headers.get(header::CONTENT_TYPE) else {
        return Ok(body);
    };
    if !content_type
        .as_bytes()
        .starts_with(b"application/x-www-form-urlencoded")
    {
        return Ok(body);
    }
    let mut request = Request::new(Body::from(body));
    *request.method_mut() = Method::POST;
    request
        .headers_mut()
        .insert(header::CONTENT_TYPE, content_type.clone());
    match Form::<FormDelivery>::from_request(request, &()).await {
        Ok(Form(form)) => Ok(Bytes::from(form.payload)),
        Err(e) => Err(format!("form-encoded delivery: {}", e.body_text())),
    }
}

/// Where a delivery goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A pull request: hand it to that target's worker.
    Target(Target),
    /// Nothing to do (push, ping, a comment on an issue...): why.
    Ignored(String),
}

/// A payload that is not what its event promises (answered with 400).
#[derive(Debug)]
#[non_exhaustive]
pub enum PayloadError {
    /// Not JSON, or JSON without the fields this event must have.
    Json {
        /// The event name.
        event: String,
        /// serde's message (with line and column).
        source: serde_json::Error,
    },
    /// The repository name or number is not a valid target.
    Target(TargetError),
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Json { event, source } => write!(f, "{event} payload: {source}"),
            Self::Target(e) => write!(f, "payload target: {e}"),
        }
    }
}

#[derive(Deserialize)]
struct Repository {
    full_name: String,
}

#[derive(Deserialize)]
struct Numbered {
    number: u64,
}

/// `pull_request`, `pull_request_review`, `pull_request_review_comment`.
#[derive(Deserialize)]
struct PullRequestPayload {
    repository: Repository,
    pull_request: Numbered,
}

#[derive(Deserialize)]
struct Issue {
    number: u64,
    /// Present (an object of links) only when the issue is a pull request.
    pull_request: Option<IgnoredAny>,
}

/// `issue_comment`.
#[derive(Deserialize)]
struct IssueCommentPayload {
    repository: Repository,
    issue: Issue,
}

/// Finds the target of a delivery of `event` from its JSON `body`.
///
/// Every body must be JSON (even for ignored events); the events that concern a pull request must
/// carry the fields naming it.
pub fn route(event: &str, body: &[u8]) -> Result<Route, PayloadError> {
    let json_err = |source| PayloadError::Json {
        event: event.to_owned(),
        source,
    };
    let target = |repo: &str, number: u64| {
        Target::new(repo, number)
            .map(Route::Target)
            .map_err(PayloadError::Target)
    };
    match event {
        "pull_request" | "pull_request_review" | "pull_request_review_comment" => {
            let p: PullRequestPayload = serde_json::from_slice(body).map_err(json_err)?;
            target(&p.repository.full_name, p.pull_request.number)
        }
        "issue_comment" => {
            let p: IssueCommentPayload = serde_json::from_slice(body).map_err(json_err)?;
            if p.issue.pull_request.is_some() {
                target(&p.repository.full_name, p.issue.number)
            } else {
                Ok(Route::Ignored(format!(
                    "issue_comment on issue #{}, not on a pull request",
                    p.issue.number
                )))
            }
        }
        other => {
            serde_json::from_slice::<IgnoredAny>(body).map_err(json_err)?;
            Ok(Route::Ignored(if other == "ping" {
                "ping: the webhook is set up".to_owned()
            } else {
                format!("{other} events have no pull-request target")
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn signature_round_trips_and_rejects_tampering() {
        let body = br#"{"zen":"Keep it logically awesome."}"#;
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, sign(b"s3cret", body).parse().unwrap());
        assert_eq!(verify(b"s3cret", &h, body), Ok(()));
        assert_eq!(verify(b"other", &h, body), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"s3cret", &h, b"{}"), Err(SignatureError::Mismatch));
        h.insert(SIGNATURE_HEADER, HeaderValue::from_static("sha1=abcd"));
        assert_eq!(verify(b"s3cret", &h, body), Err(SignatureError::Malformed));
        h.remove(SIGNATURE_HEADER);
        assert_eq!(verify(b"s3cret", &h, body), Err(SignatureError::Missing));
    }

    #[test]
    fn github_documented_signature_example() {
        // The example from GitHub's "Validating webhook deliveries" page.
        let sig = sign(b"It's a Secret to Everybody", b"Hello, World!");
        assert_eq!(
            sig,
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    #[test]
    fn routes_pull_request_events_and_comments_on_prs_only() {
        let pr = br#"{"action":"opened","number":5,"repository":{"full_name":"Octo/Repo"},"pull_request":{"number":5}}"#;
        assert_eq!(
            route("pull_request", pr).unwrap(),
            Route::Target(Target::new("octo/repo", 5).unwrap())
        );
        let on_pr = br#"{"repository":{"full_name":"o/r"},"issue":{"number":9,"pull_request":{"url":"x"}}}"#;
        assert_eq!(
            route("issue_comment", on_pr).unwrap(),
            Route::Target(Target::new("o/r", 9).unwrap())
        );
        let on_issue = br#"{"repository":{"full_name":"o/r"},"issue":{"number":9}}"#;
        assert!(matches!(
            route("issue_comment", on_issue).unwrap(),
            Route::Ignored(_)
        ));
        assert!(matches!(route("push", b"{}").unwrap(), Route::Ignored(_)));
        assert!(matches!(
            route("push", b"{"),
            Err(PayloadError::Json { .. })
        ));
        assert!(matches!(
            route("pull_request", br#"{"repository":{"full_name":"o/r"}}"#),
            Err(PayloadError::Json { .. })
        ));
        assert!(matches!(
            route(
                "pull_request",
                br#"{"repository":{"full_name":"no-slash"},"pull_request":{"number":1}}"#
            ),
            Err(PayloadError::Target(_))
        ));
    }
}
