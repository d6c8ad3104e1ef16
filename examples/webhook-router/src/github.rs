//! GitHub webhook deliveries: the headers (read and refused before the body is read), the
//! `X-Hub-Signature-256` HMAC, the two content types, and the pull requests a payload concerns
//! (parsed with serde into small typed structs holding only what is used).

use std::fmt;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use hmac::{KeyInit, Mac};
use serde::de::IgnoredAny;
use serde::Deserialize;
use worker_registry::{
    DeliveryId, DeliveryIdError, Payload, PayloadError as EventError, Target, TargetError,
};

use crate::secrets::HmacSha256;

/// GitHub caps webhook payloads at 25 MB; anything larger is not a GitHub delivery. The cap is the
/// same for both content types.
pub const MAX_PAYLOAD_BYTES: usize = 25 * 1024 * 1024;
/// The event name header (`pull_request`, `issue_comment`, `push`, `ping`, ...).
pub const EVENT_HEADER: &str = "x-github-event";
/// The delivery id header; a redelivery repeats it, which is what deduplication keys on.
pub const DELIVERY_HEADER: &str = "x-github-delivery";
/// `sha256=<hex HMAC-SHA256 of the raw body under the webhook secret>`.
pub const SIGNATURE_HEADER: &str = "x-hub-signature-256";
/// The id of the hook (repository, organisation or App webhook) that sent the delivery. One event
/// reaches every hook subscribed to it under the same `X-GitHub-Delivery`; this tells them apart.
pub const HOOK_ID_HEADER: &str = "x-github-hook-id";
/// What the hook is installed on (`repository`, `organization`, `integration` for an App).
pub const HOOK_TARGET_TYPE_HEADER: &str = "x-github-hook-installation-target-type";
/// The id of what the hook is installed on (the repository, organisation or App id).
pub const HOOK_TARGET_ID_HEADER: &str = "x-github-hook-installation-target-id";

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
    /// The header is not `sha256=` followed by 64 hex digits, or appears twice.
    Malformed,
    /// The HMAC does not match the body.
    Mismatch,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => write!(f, "missing X-Hub-Signature-256 header"),
            Self::Malformed => write!(
                f,
                "X-Hub-Signature-256 is not one `sha256=` followed by 64 hex digits"
            ),
            Self::Mismatch => write!(f, "X-Hub-Signature-256 does not match the payload"),
        }
    }
}

/// The digest an `X-Hub-Signature-256` header announces, checked for form only (the body is not
/// needed for that, so a malformed header is refused before the body is read).
pub fn signature(headers: &HeaderMap) -> Result<[u8; 32], SignatureError> {
    let mut values = headers.get_all(SIGNATURE_HEADER).iter();
    let value = values.next().ok_or(SignatureError::Missing)?;
    if values.next().is_some() {
        return Err(SignatureError::Malformed);
    }
    let hex_digest = value
        .as_bytes()
        .strip_prefix(b"sha256=")
        .ok_or(SignatureError::Malformed)?;
    let mut expected = [0u8; 32];
    hex::decode_to_slice(hex_digest, &mut expected).map_err(|_| SignatureError::Malformed)?;
    Ok(expected)
}

/// An HMAC-SHA256 computed over a body as it arrives, chunk by chunk: under the secret, and
/// during a rotation window under the previous one too.
pub struct Verifier {
    current: HmacSha256,
    previous: Option<HmacSha256>,
}

fn hmac(secret: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length")
}

impl Verifier {
    /// Starts the HMAC under `secret`.
    pub fn new(secret: &[u8]) -> Self {
        Self::rotating(secret, None)
    }

    /// Starts the HMAC under `secret`, and under `previous` if given (a body signed with either
    /// verifies).
    pub fn rotating(secret: &[u8], previous: Option<&[u8]>) -> Self {
        Self {
            current: hmac(secret),
            previous: previous.map(hmac),
        }
    }

    /// Starts from HMAC states keyed already (a [`Keys`](crate::secrets::Keys)' own).
    pub fn keyed(current: &HmacSha256, previous: Option<&HmacSha256>) -> Self {
        Self {
            current: current.clone(),
            previous: previous.cloned(),
        }
    }

    /// Feeds the next chunk of the body.
    pub fn update(&mut self, chunk: &[u8]) {
        self.current.update(chunk);
        if let Some(p) = &mut self.previous {
            p.update(chunk);
        }
    }

    /// Compares with the announced digest, in constant time (`Mac::verify_slice`), under both
    /// secrets when there are two (both compared, whichever matches).
    pub fn verify(self, expected: &[u8; 32]) -> Result<(), SignatureError> {
        let current = self.current.verify_slice(expected).is_ok();
        let previous = self
            .previous
            .is_some_and(|p| p.verify_slice(expected).is_ok());
        if current | previous {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

/// Checks a delivery's HMAC-SHA256 against `secret` (header and whole body at once).
pub fn verify(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), SignatureError> {
    let expected = signature(headers)?;
    let mut v = Verifier::new(secret);
    v.update(body);
    v.verify(&expected)
}

/// The two content types a GitHub webhook can be configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentType {
    /// `application/json`: the body is the JSON document.
    Json,
    /// `application/x-www-form-urlencoded`: the JSON document is the `payload` field.
    Form,
}

/// A delivery's identity, read from its headers.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// `X-GitHub-Event`.
    pub event: String,
    /// `X-GitHub-Delivery`, validated.
    pub id: DeliveryId,
    /// The claim key deduplication uses: the GUID and the hook that sent it (see
    /// [`delivery_key`]), so that two hooks' copies of one event are two deliveries while each
    /// one's redelivery is a duplicate.
    pub key: DeliveryId,
    /// `Content-Type`.
    pub content_type: ContentType,
}

/// A header that is missing, repeated or unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderError {
    /// The header is absent (400; 415 for `Content-Type`).
    Missing(&'static str),
    /// The header appears more than once: an ambiguous delivery (400).
    Repeated(&'static str),
    /// `X-GitHub-Event` is not a plain event name (400).
    BadEvent,
    /// `X-GitHub-Delivery` is not a valid delivery id (400).
    BadDelivery(DeliveryIdError),
    /// A content type GitHub does not send (415).
    UnsupportedContentType(String),
    /// `X-GitHub-Hook-ID` or `X-GitHub-Hook-Installation-Target-Type`/`-ID` is not what GitHub
    /// sends (a decimal id, a lower-case word) (400).
    BadHook(&'static str),
}

impl HeaderError {
    /// The status to answer with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Missing("Content-Type") | Self::UnsupportedContentType(_) => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing("Content-Type") => write!(
                f,
                "missing Content-Type header: GitHub sends application/json or application/x-www-form-urlencoded"
            ),
            Self::Missing(name) => write!(f, "missing {name} header"),
            Self::Repeated(name) => {
                write!(f, "{name} appears more than once: the delivery is ambiguous")
            }
            Self::BadEvent => write!(f, "X-GitHub-Event is not an event name"),
            Self::BadDelivery(e) => write!(f, "X-GitHub-Delivery: {e}"),
            Self::UnsupportedContentType(ct) => write!(
                f,
                "Content-Type {ct:?} is not application/json or application/x-www-form-urlencoded"
            ),
            Self::BadHook(name) => write!(
                f,
                "{name} is not what GitHub sends (a decimal id, or a lower-case type name)"
            ),
        }
    }
}

/// The one value of a header that must appear exactly once.
fn single<'h>(
    headers: &'h HeaderMap,
    name: &str,
    shown: &'static str,
) -> Result<&'h [u8], HeaderError> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(HeaderError::Missing(shown))?;
    if values.next().is_some() {
        return Err(HeaderError::Repeated(shown));
    }
    Ok(value.as_bytes())
}

/// The media type of a `Content-Type` value: case-insensitive, parameters (`; charset=utf-8`)
/// allowed and ignored.
pub fn content_type(headers: &HeaderMap) -> Result<ContentType, HeaderError> {
    let raw = single(headers, header::CONTENT_TYPE.as_str(), "Content-Type")?;
    let text = String::from_utf8_lossy(raw);
    let media = text.split(';').next().unwrap_or("").trim();
    if media.eq_ignore_ascii_case("application/json") {
        Ok(ContentType::Json)
    } else if media.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        Ok(ContentType::Form)
    } else {
        Err(HeaderError::UnsupportedContentType(
            text.chars().take(100).collect(),
        ))
    }
}

/// Reads `Content-Type`, `X-GitHub-Event` and `X-GitHub-Delivery`, each exactly once.
pub fn delivery(headers: &HeaderMap) -> Result<Delivery, HeaderError> {
    let content_type = content_type(headers)?;
    let event = std::str::from_utf8(single(headers, EVENT_HEADER, "X-GitHub-Event")?)
        .ok()
        .filter(|e| !e.is_empty() && e.len() <= 64 && e.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or(HeaderError::BadEvent)?
        .to_owned();
    let raw = single(headers, DELIVERY_HEADER, "X-GitHub-Delivery")?;
    // Not `to_str`: `DeliveryId::new` reports the first offending byte itself.
    let text = String::from_utf8_lossy(raw);
    let id = DeliveryId::new(&text).map_err(HeaderError::BadDelivery)?;
    let key = delivery_key(&id, hook(headers)?.as_deref()).map_err(HeaderError::BadDelivery)?;
    Ok(Delivery {
        event,
        id,
        key,
        content_type,
    })
}

/// The hook identity of a delivery: `hook-<X-GitHub-Hook-ID>` when it has one, else
/// `<installation target type>-<installation target id>` when it has both of those, else none
/// (a sender that is not GitHub, or an old GitHub Enterprise Server).
///
/// # Examples
///
/// ```
/// use axum::http::HeaderMap;
/// use webhook_router::github::hook;
///
/// let mut h = HeaderMap::new();
/// assert_eq!(hook(&h), Ok(None));
/// h.insert("x-github-hook-installation-target-type", "integration".parse().unwrap());
/// h.insert("x-github-hook-installation-target-id", "42".parse().unwrap());
/// assert_eq!(hook(&h).unwrap().as_deref(), Some("integration-42"));
/// h.insert("x-github-hook-id", "123".parse().unwrap());
/// assert_eq!(hook(&h).unwrap().as_deref(), Some("hook-123"));
/// ```
pub fn hook(headers: &HeaderMap) -> Result<Option<String>, HeaderError> {
    fn optional<'h>(
        headers: &'h HeaderMap,
        name: &str,
        shown: &'static str,
        ok: fn(&[u8]) -> bool,
    ) -> Result<Option<&'h str>, HeaderError> {
        if !headers.contains_key(name) {
            return Ok(None);
        }
        let v = single(headers, name, shown)?;
        if v.is_empty() || v.len() > 32 || !ok(v) {
            return Err(HeaderError::BadHook(shown));
        }
        // Checked ASCII just above.
        Ok(std::str::from_utf8(v).ok())
    }
    let digits = |v: &[u8]| v.iter().all(u8::is_ascii_digit);
    let word = |v: &[u8]| v.iter().all(|b| b.is_ascii_lowercase() || *b == b'_');
    if let Some(id) = optional(headers, HOOK_ID_HEADER, "X-GitHub-Hook-ID", digits)? {
        return Ok(Some(format!("hook-{id}")));
    }
    let kind = optional(
        headers,
        HOOK_TARGET_TYPE_HEADER,
        "X-GitHub-Hook-Installation-Target-Type",
        word,
    )?;
    let id = optional(
        headers,
        HOOK_TARGET_ID_HEADER,
        "X-GitHub-Hook-Installation-Target-ID",
        digits,
    )?;
    Ok(kind.zip(id).map(|(k, i)| format!("{k}-{i}")))
}

/// The claim key of delivery `guid` from `hook` ([`hook`]'s answer): the GUID alone without a hook
/// identity, else `<guid>@<hook>`. A GUID is at most 255 bytes, so a key that would not fit is
/// refused ([`DeliveryIdError::TooLong`]); GitHub's GUIDs are 36.
///
/// # Examples
///
/// ```
/// use webhook_router::github::delivery_key;
/// use worker_registry::DeliveryId;
///
/// let guid = DeliveryId::new("72d3162e-cc78-11e3-81ab-4c9367dc0958").unwrap();
/// assert_eq!(delivery_key(&guid, None).unwrap(), guid);
/// assert_eq!(
///     delivery_key(&guid, Some("hook-7")).unwrap().as_str(),
///     "72d3162e-cc78-11e3-81ab-4c9367dc0958@hook-7"
/// );
/// ```
pub fn delivery_key(guid: &DeliveryId, hook: Option<&str>) -> Result<DeliveryId, DeliveryIdError> {
    match hook {
        None => Ok(guid.clone()),
        Some(h) => DeliveryId::new(&format!("{guid}@{h}")),
    }
}

/// The headers a delivery's [`Payload`] carries to its worker, when GitHub sent them: the
/// delivery id, the signature (so the worker can verify the body itself), and the hook's identity.
pub const PAYLOAD_HEADERS: [&str; 5] = [
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    HOOK_ID_HEADER,
    HOOK_TARGET_TYPE_HEADER,
    HOOK_TARGET_ID_HEADER,
];

/// What GitHub sent with `delivery`, as its worker gets it: the event name, `action`, the
/// `Content-Type` as sent, `body` as received (shared, not copied) and the [`PAYLOAD_HEADERS`]
/// present. An `Err` is a header or action GitHub never sends (a 400).
///
/// # Examples
///
/// ```
/// use axum::body::Bytes;
/// use axum::http::HeaderMap;
/// use webhook_router::github::{delivery, payload};
///
/// let mut h = HeaderMap::new();
/// h.insert("x-github-event", "pull_request".parse().unwrap());
/// h.insert("x-github-delivery", "d-1".parse().unwrap());
/// h.insert("x-github-hook-id", "7".parse().unwrap());
/// h.insert("content-type", "application/json".parse().unwrap());
/// let d = delivery(&h).unwrap();
/// let p = payload(&d, Some("opened"), &h, Bytes::from_static(b"{}")).unwrap();
/// assert_eq!((p.event(), p.action(), p.content_type()), ("pull_request", Some("opened"), "application/json"));
/// assert_eq!((p.header("x-github-delivery"), p.header("x-github-hook-id")), (Some("d-1"), Some("7")));
/// assert_eq!(&p.body()[..], b"{}");
/// ```
pub fn payload(
    delivery: &Delivery,
    action: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Payload, EventError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(match delivery.content_type {
            ContentType::Json => "application/json",
            ContentType::Form => "application/x-www-form-urlencoded",
        });
    let mut p = Payload::builder(delivery.event.as_str(), body).content_type(content_type);
    if let Some(a) = action {
        p = p.action(a);
    }
    for name in PAYLOAD_HEADERS {
        // Each of these is single where it matters (checked with the delivery); the first is kept.
        if let Some(v) = headers.get(name) {
            let v = v.to_str().map_err(|_| EventError::BadHeader {
                name: name.to_owned(),
                reason: "has a value that is not visible ASCII",
            })?;
            p = p.header(name, v);
        }
    }
    p.build()
}

/// The JSON document of a delivery: the body itself (not copied), or the `payload` field of a
/// form-encoded body (decoded here, so the same 25 MiB cap holds for both content types).
pub fn json_payload(
    content_type: ContentType,
    body: &[u8],
) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    match content_type {
        ContentType::Json => Ok(std::borrow::Cow::Borrowed(body)),
        ContentType::Form => {
            let mut payload = None;
            for (key, value) in form_urlencoded::parse(body) {
                if key == "payload" {
                    if payload.is_some() {
                        return Err(
                            "form-encoded delivery: `payload` appears more than once".to_owned()
                        );
                    }
                    payload = Some(value.into_owned().into_bytes());
                }
            }
            payload
                .map(std::borrow::Cow::Owned)
                .ok_or_else(|| "form-encoded delivery: no `payload` field".to_owned())
        }
    }
}

/// Where a delivery goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// One or more pull requests (deduplicated, in order): hand the delivery to each one's worker.
    Targets {
        /// The payload's `action`, if it has one.
        action: Option<String>,
        /// The pull requests.
        targets: Vec<Target>,
    },
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
    #[serde(default)]
    id: Option<u64>,
}

#[derive(Deserialize)]
struct Numbered {
    number: u64,
}

/// `pull_request`, `pull_request_review`, `pull_request_review_comment`,
/// `pull_request_review_thread`.
#[derive(Deserialize)]
struct PullRequestPayload {
    action: Option<String>,
    repository: Repository,
    pull_request: Numbered,
}

#[derive(Deserialize)]
struct Issue {
    number: u64,
    /// Present (an object of links) only when the issue is a pull request.
    pull_request: Option<IgnoredAny>,
}

/// `issue_comment`, `issues`.
#[derive(Deserialize)]
struct IssuePayload {
    action: Option<String>,
    repository: Repository,
    issue: Issue,
}

/// The base repository of a pull request as `check_run` & co. describe it: no `full_name`, an API
/// URL (`https://api.github.com/repos/{owner}/{name}`) and an id.
#[derive(Deserialize)]
struct BaseRepo {
    id: Option<u64>,
    url: Option<String>,
}

#[derive(Deserialize)]
struct Base {
    repo: Option<BaseRepo>,
}

#[derive(Deserialize)]
struct LinkedPullRequest {
    number: u64,
    base: Option<Base>,
}

#[derive(Deserialize)]
struct WithPullRequests {
    #[serde(default)]
    pull_requests: Vec<LinkedPullRequest>,
}

/// `check_run`, `check_suite`, `workflow_run`: the object named like the event carries the pull
/// requests it ran for.
#[derive(Deserialize)]
struct CiPayload {
    action: Option<String>,
    repository: Repository,
    check_run: Option<WithPullRequests>,
    check_suite: Option<WithPullRequests>,
    workflow_run: Option<WithPullRequests>,
}

#[derive(Deserialize)]
struct MergeGroup {
    head_ref: String,
}

/// `merge_group`: the queued pull request is named only in the temporary branch.
#[derive(Deserialize)]
struct MergeGroupPayload {
    action: Option<String>,
    repository: Repository,
    merge_group: MergeGroup,
}

/// The pull-request number in a merge queue branch, `gh-readonly-queue/<base>/pr-<N>-<sha>` (the
/// base may contain slashes; `refs/heads/` may precede it).
pub fn merge_queue_number(head_ref: &str) -> Option<u64> {
    let rest = head_ref
        .strip_prefix("refs/heads/")
        .unwrap_or(head_ref)
        .strip_prefix("gh-readonly-queue/")?;
    let last = rest.rsplit('/').next()?;
    let digits = last.strip_prefix("pr-")?.split('-').next()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `owner/name` from a repository API URL (`.../repos/{owner}/{name}`).
fn repo_from_api_url(url: &str) -> Option<String> {
    let (_, path) = url.split_once("/repos/")?;
    let mut parts = path.trim_end_matches('/').splitn(3, '/');
    let (owner, name) = (parts.next()?, parts.next()?);
    (parts.next().is_none() && !owner.is_empty() && !name.is_empty())
        .then(|| format!("{owner}/{name}"))
}

/// The events this router routes to a pull request's worker.
pub const PR_EVENTS: [&str; 10] = [
    "pull_request",
    "pull_request_review",
    "pull_request_review_comment",
    "pull_request_review_thread",
    "issue_comment",
    "issues",
    "check_run",
    "check_suite",
    "workflow_run",
    "merge_group",
];

/// Finds the pull requests a delivery of `event` concerns from its JSON `body`.
///
/// Every body must be a JSON object (even for ignored events); the events that concern a pull
/// request must carry the fields naming it.
pub fn route(event: &str, body: &[u8]) -> Result<Route, PayloadError> {
    let json_err = json_error(event);
    match event {
        "pull_request"
        | "pull_request_review"
        | "pull_request_review_comment"
        | "pull_request_review_thread" => {
            let p: PullRequestPayload = serde_json::from_slice(body).map_err(json_err)?;
            Ok(targets(
                p.action,
                vec![target(&p.repository.full_name, p.pull_request.number)?],
            ))
        }
        "issue_comment" | "issues" => {
            let p: IssuePayload = serde_json::from_slice(body).map_err(json_err)?;
            if p.issue.pull_request.is_some() {
                Ok(targets(
                    p.action,
                    vec![target(&p.repository.full_name, p.issue.number)?],
                ))
            } else {
                Ok(Route::Ignored(format!(
                    "{event} on issue #{}, not on a pull request",
                    p.issue.number
                )))
            }
        }
        "check_run" | "check_suite" | "workflow_run" => ci_route(event, body),
        "merge_group" => {
            let p: MergeGroupPayload = serde_json::from_slice(body).map_err(json_err)?;
            match merge_queue_number(&p.merge_group.head_ref) {
                Some(n) => Ok(targets(p.action, vec![target(&p.repository.full_name, n)?])),
                None => Ok(Route::Ignored(format!(
                    "merge_group head_ref {:?} names no pull request",
                    p.merge_group.head_ref.chars().take(200).collect::<String>()
                ))),
            }
        }
        other => {
            // Every GitHub payload is a JSON object, whatever its event.
            serde_json::from_slice::<std::collections::BTreeMap<String, IgnoredAny>>(body)
                .map_err(json_err)?;
            Ok(Route::Ignored(if other == "ping" {
                "ping: the webhook is set up".to_owned()
            } else {
                format!("{other} events have no pull-request target")
            }))
        }
    }
}

/// The pull requests a `check_run`, `check_suite` or `workflow_run` ran for: each in its base
/// repository, which is the delivery's unless the payload says otherwise.
fn ci_route(event: &str, body: &[u8]) -> Result<Route, PayloadError> {
    let json_err = json_error(event);
    let p: CiPayload = serde_json::from_slice(body).map_err(&json_err)?;
    let run = match event {
        "check_run" => p.check_run,
        "check_suite" => p.check_suite,
        _ => p.workflow_run,
    };
    let Some(run) = run else {
        return Err(json_err(serde::de::Error::missing_field(match event {
            "check_run" => "check_run",
            "check_suite" => "check_suite",
            _ => "workflow_run",
        })));
    };
    if run.pull_requests.is_empty() {
        return Ok(Route::Ignored(format!(
            "{event} for no pull request (pull_requests is empty: a push, or a pull request from a fork)"
        )));
    }
    let mut found = Vec::with_capacity(run.pull_requests.len());
    for pr in run.pull_requests {
        let base = pr.base.and_then(|b| b.repo);
        // The pull request lives in its base repository, which is the delivery's repository
        // unless the payload says otherwise.
        let repo = match base {
            Some(b) if b.id.is_some() && b.id != p.repository.id => b
                .url
                .as_deref()
                .and_then(repo_from_api_url)
                .unwrap_or_else(|| p.repository.full_name.clone()),
            _ => p.repository.full_name.clone(),
        };
        found.push(target(&repo, pr.number)?);
    }
    Ok(targets(p.action, found))
}

/// Turns serde's error on a payload of `event` into a [`PayloadError`].
fn json_error(event: &str) -> impl Fn(serde_json::Error) -> PayloadError + '_ {
    move |source| PayloadError::Json {
        event: event.to_owned(),
        source,
    }
}

fn target(repo: &str, number: u64) -> Result<Target, PayloadError> {
    Target::new(repo, number).map_err(PayloadError::Target)
}

/// A route to `targets`, each once, in order.
fn targets(action: Option<String>, targets: Vec<Target>) -> Route {
    let mut unique: Vec<Target> = Vec::with_capacity(targets.len());
    for t in targets {
        if !unique.contains(&t) {
            unique.push(t);
        }
    }
    Route::Targets {
        action,
        targets: unique,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn one(action: &str, repo: &str, n: u64) -> Route {
        Route::Targets {
            action: Some(action.to_owned()),
            targets: vec![Target::new(repo, n).unwrap()],
        }
    }

    #[test]
    fn signature_round_trips_and_rejects_tampering() {
        let body = br#"{"zen":"Keep it logically awesome."}"#;
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, sign(b"s3cret", body).parse().unwrap());
        assert_eq!(verify(b"s3cret", &h, body), Ok(()));
        assert_eq!(verify(b"other", &h, body), Err(SignatureError::Mismatch));
        assert_eq!(verify(b"s3cret", &h, b"{}"), Err(SignatureError::Mismatch));
        h.append(SIGNATURE_HEADER, sign(b"s3cret", body).parse().unwrap());
        assert_eq!(signature(&h), Err(SignatureError::Malformed), "twice");
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
    fn content_types_are_case_insensitive_with_parameters() {
        let ct = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            content_type(&h)
        };
        assert_eq!(ct("application/json"), Ok(ContentType::Json));
        assert_eq!(ct("Application/JSON; charset=utf-8"), Ok(ContentType::Json));
        assert_eq!(
            ct("Application/X-WWW-Form-Urlencoded"),
            Ok(ContentType::Form)
        );
        assert_eq!(
            ct(" application/x-www-form-urlencoded ;charset=UTF-8"),
            Ok(ContentType::Form)
        );
        assert!(matches!(
            ct("text/plain"),
            Err(HeaderError::UnsupportedContentType(_))
        ));
        assert!(matches!(
            ct("application/jsonx"),
            Err(HeaderError::UnsupportedContentType(_))
        ));
        assert_eq!(
            content_type(&HeaderMap::new()),
            Err(HeaderError::Missing("Content-Type"))
        );
    }

    #[test]
    fn repeated_identity_headers_are_refused() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(EVENT_HEADER, HeaderValue::from_static("push"));
        h.insert(DELIVERY_HEADER, HeaderValue::from_static("a"));
        assert!(delivery(&h).is_ok());
        h.append(DELIVERY_HEADER, HeaderValue::from_static("b"));
        assert_eq!(
            delivery(&h).unwrap_err(),
            HeaderError::Repeated("X-GitHub-Delivery")
        );
        h.remove(DELIVERY_HEADER);
        h.insert(DELIVERY_HEADER, HeaderValue::from_static("a"));
        h.append(EVENT_HEADER, HeaderValue::from_static("pull_request"));
        assert_eq!(
            delivery(&h).unwrap_err(),
            HeaderError::Repeated("X-GitHub-Event")
        );
    }

    #[test]
    fn form_payloads_are_decoded_without_a_size_limit_of_their_own() {
        let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(3 << 20));
        let body = format!(
            "payload={}",
            big.replace('"', "%22")
                .replace('{', "%7B")
                .replace('}', "%7D")
        );
        assert_eq!(
            &*json_payload(ContentType::Form, body.as_bytes()).unwrap(),
            big.as_bytes()
        );
        assert!(json_payload(ContentType::Form, b"other=1").is_err());
        assert!(json_payload(ContentType::Form, b"payload=1&payload=2").is_err());
    }

    #[test]
    fn routes_every_event_that_names_a_pull_request() {
        let pr = br#"{"action":"opened","number":5,"repository":{"full_name":"Octo/Repo"},"pull_request":{"number":5}}"#;
        assert_eq!(
            route("pull_request", pr).unwrap(),
            one("opened", "octo/repo", 5)
        );
        let thread = br#"{"action":"resolved","repository":{"full_name":"o/r"},"pull_request":{"number":3},"thread":{"comments":[]}}"#;
        assert_eq!(
            route("pull_request_review_thread", thread).unwrap(),
            one("resolved", "o/r", 3)
        );
        let on_pr = br#"{"action":"labeled","repository":{"full_name":"o/r"},"issue":{"number":9,"pull_request":{"url":"x"}}}"#;
        assert_eq!(route("issues", on_pr).unwrap(), one("labeled", "o/r", 9));
        assert_eq!(
            route("issue_comment", on_pr).unwrap(),
            one("labeled", "o/r", 9)
        );
        let on_issue = br#"{"repository":{"full_name":"o/r"},"issue":{"number":9}}"#;
        assert!(matches!(
            route("issues", on_issue).unwrap(),
            Route::Ignored(_)
        ));

        let ci = br#"{"action":"completed","repository":{"id":1,"full_name":"o/r"},
            "check_run":{"pull_requests":[
                {"number":2,"base":{"repo":{"id":1,"url":"https://api.github.com/repos/o/r","name":"r"}}},
                {"number":7,"base":{"repo":{"id":9,"url":"https://api.github.com/repos/up/stream","name":"stream"}}},
                {"number":2,"base":{"repo":{"id":1,"url":"https://api.github.com/repos/o/r","name":"r"}}}]}}"#;
        assert_eq!(
            route("check_run", ci).unwrap(),
            Route::Targets {
                action: Some("completed".into()),
                targets: vec![
                    Target::new("o/r", 2).unwrap(),
                    Target::new("up/stream", 7).unwrap()
                ]
            }
        );
        let suite = br#"{"action":"completed","repository":{"full_name":"o/r"},"check_suite":{"pull_requests":[{"number":4}]}}"#;
        assert_eq!(
            route("check_suite", suite).unwrap(),
            one("completed", "o/r", 4)
        );
        let run = br#"{"action":"completed","repository":{"full_name":"o/r"},"workflow_run":{"pull_requests":[]}}"#;
        assert!(matches!(
            route("workflow_run", run).unwrap(),
            Route::Ignored(_)
        ));
        assert!(matches!(
            route("workflow_run", br#"{"repository":{"full_name":"o/r"}}"#),
            Err(PayloadError::Json { .. })
        ));

        let queue = br#"{"action":"checks_requested","repository":{"full_name":"o/r"},
            "merge_group":{"head_ref":"refs/heads/gh-readonly-queue/release/1.x/pr-123-0123456789abcdef0123456789abcdef01234567"}}"#;
        assert_eq!(
            route("merge_group", queue).unwrap(),
            one("checks_requested", "o/r", 123)
        );
        assert_eq!(
            merge_queue_number("gh-readonly-queue/main/pr-9-abc"),
            Some(9)
        );
        assert_eq!(merge_queue_number("feature/pr-9-abc"), None);
        assert_eq!(merge_queue_number("gh-readonly-queue/main/pr--abc"), None);

        assert!(matches!(route("push", b"{}").unwrap(), Route::Ignored(_)));
        for not_an_object in [&b"8115548734529121.0"[..], b"[]", b"\"x\"", b"null"] {
            assert!(matches!(
                route("push", not_an_object),
                Err(PayloadError::Json { .. })
            ));
        }
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
