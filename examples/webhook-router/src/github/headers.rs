//! A delivery's identity from its headers (each read exactly once, before the body), its claim
//! key, and the [`Payload`] its worker gets.

use std::fmt;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use worker_registry::{DeliveryId, DeliveryIdError, Payload, PayloadError as EventError};

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
