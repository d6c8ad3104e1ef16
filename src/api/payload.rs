//! [`Payload`]: what GitHub sent with a delivery, carried with the delivery's claim so that
//! whichever worker runs it next (after a death, a promotion out of the waiting room, a
//! re-dispatch by another replica) gets the same bytes. Its lifecycle in the registry is written
//! once, on [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

/// The longest event name (`X-GitHub-Event`) and the longest action accepted, in bytes (GitHub's
/// longest is under 40).
pub const MAX_EVENT_NAME_LEN: usize = 64;
/// The longest content type accepted, in bytes.
pub const MAX_CONTENT_TYPE_LEN: usize = 255;
/// The most extra headers a payload carries.
pub const MAX_PAYLOAD_HEADERS: usize = 16;
/// The longest extra header name accepted, in bytes.
pub const MAX_HEADER_NAME_LEN: usize = 64;
/// The longest extra header value accepted, in bytes (a `sha256=` signature is 71).
pub const MAX_HEADER_VALUE_LEN: usize = 512;
/// The most bytes a payload's metadata (event name, action, content type and extra headers,
/// names and values) can count in [`Payload::size`]: the sum of the bounds above.
pub const MAX_PAYLOAD_META_LEN: usize = 2 * MAX_EVENT_NAME_LEN
    + MAX_CONTENT_TYPE_LEN
    + MAX_PAYLOAD_HEADERS * (MAX_HEADER_NAME_LEN + MAX_HEADER_VALUE_LEN);
/// The content type a [`PayloadBuilder`] starts with: what GitHub sends for a webhook whose
/// content type is set to `application/json`.
pub const DEFAULT_CONTENT_TYPE: &str = "application/json";

/// What GitHub sent with one delivery: the event name (`X-GitHub-Event`), its action (the
/// payload's `action`, if it has one), the content type, the body **exactly as received** (so a
/// worker can verify its signature or parse it again), and a few extra headers the router hands
/// on with it (the hook id, the signature, ...).
///
/// Admitted with [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with), it is stored
/// with the delivery's claim and handed out wherever the delivery goes next (in a
/// [`ReleasedEvent`](crate::ReleasedEvent), and by
/// [`WorkerRegistry::payload`](crate::WorkerRegistry::payload)).
///
/// Validated when built, with a [`PayloadError`] that says what was wrong; its metadata is
/// bounded (at most [`MAX_PAYLOAD_META_LEN`] bytes), its body by the registry's
/// [`max_payload_bytes`](crate::RegistryConfig::max_payload_bytes). Cloning is cheap (one
/// reference count: the body is `bytes::Bytes`, what axum, hyper, redis-rs and tokio-postgres
/// hand out and take), and clones share the body's bytes. Two payloads are equal when every field
/// and every byte of the body are.
///
/// # Examples
///
/// ```
/// use bytes::Bytes;
/// use worker_registry::Payload;
///
/// let p = Payload::builder("pull_request", Bytes::from_static(br#"{"action":"opened"}"#))
///     .action("opened")
///     .header("X-GitHub-Hook-ID", "123")
///     .build()
///     .unwrap();
/// assert_eq!((p.event(), p.action(), p.content_type()), ("pull_request", Some("opened"), "application/json"));
/// assert_eq!(p.header("x-github-hook-id"), Some("123"));
/// // What the budget counts: the body plus every byte of metadata.
/// assert_eq!(p.size(), 19 + 12 + 6 + 16 + 16 + 3);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Payload(Arc<Inner>);

/// Extra headers: (name, value) pairs.
type Headers = Box<[(Box<str>, Box<str>)]>;

#[derive(PartialEq, Eq)]
struct Inner {
    event: Box<str>,
    action: Option<Box<str>>,
    content_type: Box<str>,
    body: Bytes,
    /// Names in lower case, in the order given.
    headers: Headers,
    /// See [`Payload::size`].
    size: u64,
}

impl Payload {
    /// A builder for a payload of `event` (the `X-GitHub-Event` header) with `body`, with the
    /// [`DEFAULT_CONTENT_TYPE`], no action and no extra header.
    pub fn builder(event: impl Into<String>, body: impl Into<Bytes>) -> PayloadBuilder {
        PayloadBuilder {
            event: event.into(),
            action: None,
            content_type: DEFAULT_CONTENT_TYPE.to_owned(),
            body: body.into(),
            headers: Vec::new(),
        }
    }

    /// The event name (`X-GitHub-Event`).
    pub fn event(&self) -> &str {
        &self.0.event
    }

    /// The action (`opened`, `synchronize`, ...), if the event has one.
    pub fn action(&self) -> Option<&str> {
        self.0.action.as_deref()
    }

    /// The body's content type (`application/json`, `application/x-www-form-urlencoded`).
    pub fn content_type(&self) -> &str {
        &self.0.content_type
    }

    /// The body, byte for byte as it was admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::Payload;
    ///
    /// let p = Payload::builder("ping", &b"{}"[..]).build().unwrap();
    /// assert_eq!(&p.body()[..], b"{}");
    /// ```
    pub fn body(&self) -> &Bytes {
        &self.0.body
    }

    /// The extra headers, as (name in lower case, value), in the order they were added.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::Payload;
    ///
    /// let p = Payload::builder("ping", &b"{}"[..]).header("X-A", "1").header("x-b", "2").build().unwrap();
    /// assert_eq!(p.headers().collect::<Vec<_>>(), vec![("x-a", "1"), ("x-b", "2")]);
    /// ```
    pub fn headers(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.0.headers.iter().map(|(n, v)| (&**n, &**v))
    }

    /// The value of the extra header `name` (compared without regard to case), if it was added.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.0
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| &**v)
    }

    /// What this payload counts against the registry's limits
    /// ([`max_payload_bytes`](crate::RegistryConfig::max_payload_bytes) and
    /// [`payload_budget`](crate::RegistryConfig::payload_budget)), on every backend: the body's
    /// length plus the length of every piece of metadata (the event name, the action, the content
    /// type, each extra header's name and value). Not the memory a backend spends on it (a
    /// backend's own overhead per payload is a few dozen bytes, see its page in `docs`): a
    /// number every backend computes alike, so that one budget means the same everywhere.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::Payload;
    ///
    /// let p = Payload::builder("ping", vec![0u8; 1000]).content_type("a/b").build().unwrap();
    /// assert_eq!(p.size(), 1000 + 4 + 3);
    /// ```
    pub fn size(&self) -> u64 {
        self.0.size
    }
}

impl fmt::Debug for Payload {
    /// The metadata and the body's length (not its bytes, which may be megabytes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Payload")
            .field("event", &self.event())
            .field("action", &self.action())
            .field("content_type", &self.content_type())
            .field("body_len", &self.0.body.len())
            .field(
                "headers",
                &self.0.headers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Builds a [`Payload`] and validates it (see [`Payload::builder`]).
///
/// # Examples
///
/// ```
/// use worker_registry::{Payload, PayloadError};
///
/// let err = Payload::builder("pull request", &b""[..]).build().unwrap_err();
/// assert_eq!(err, PayloadError::BadByte { field: "event", found: b' ' });
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct PayloadBuilder {
    event: String,
    action: Option<String>,
    content_type: String,
    body: Bytes,
    headers: Vec<(String, String)>,
}

impl PayloadBuilder {
    /// Sets the action.
    pub fn action(mut self, action: impl Into<String>) -> Self {
        self.action = Some(action.into());
        self
    }

    /// Sets the content type (instead of [`DEFAULT_CONTENT_TYPE`]).
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = content_type.into();
        self
    }

    /// Adds an extra header (kept with its name in lower case).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Validates and returns the payload: the event name and the action are 1 to
    /// [`MAX_EVENT_NAME_LEN`] bytes of ASCII letters, digits, `_`, `-` and `.`; the content type
    /// 1 to [`MAX_CONTENT_TYPE_LEN`] bytes of visible ASCII and spaces; at most
    /// [`MAX_PAYLOAD_HEADERS`] extra headers, each name 1 to [`MAX_HEADER_NAME_LEN`] bytes of
    /// HTTP token characters and used once (whatever its case), each value at most
    /// [`MAX_HEADER_VALUE_LEN`] bytes of visible ASCII, spaces and tabs. The body is not looked
    /// at (its size is checked by the registry that stores it).
    pub fn build(self) -> Result<Payload, PayloadError> {
        name("event", &self.event)?;
        if let Some(a) = &self.action {
            name("action", a)?;
        }
        text(
            "content type",
            &self.content_type,
            MAX_CONTENT_TYPE_LEN,
            |b| b == b' ' || b.is_ascii_graphic(),
        )?;
        if self.content_type.is_empty() {
            return Err(PayloadError::Empty {
                field: "content type",
            });
        }
        let headers = headers(self.headers)?;
        let meta = self.event.len()
            + self.action.as_ref().map_or(0, String::len)
            + self.content_type.len()
            + headers
                .iter()
                .map(|(n, v)| n.len() + v.len())
                .sum::<usize>();
        let size = (self.body.len() as u64).saturating_add(meta as u64);
        Ok(Payload(Arc::new(Inner {
            event: self.event.into_boxed_str(),
            action: self.action.map(String::into_boxed_str),
            content_type: self.content_type.into_boxed_str(),
            body: self.body,
            headers,
            size,
        })))
    }
}

/// An event name or an action.
fn name(field: &'static str, s: &str) -> Result<(), PayloadError> {
    if s.is_empty() {
        return Err(PayloadError::Empty { field });
    }
    text(field, s, MAX_EVENT_NAME_LEN, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
    })
}

/// At most `max` bytes, each allowed by `ok`.
fn text(field: &'static str, s: &str, max: usize, ok: fn(u8) -> bool) -> Result<(), PayloadError> {
    if s.len() > max {
        return Err(PayloadError::TooLong {
            field,
            len: s.len(),
            max,
        });
    }
    match s.bytes().find(|b| !ok(*b)) {
        Some(found) => Err(PayloadError::BadByte { field, found }),
        None => Ok(()),
    }
}

/// The extra headers, validated, names in lower case.
fn headers(given: Vec<(String, String)>) -> Result<Headers, PayloadError> {
    if given.len() > MAX_PAYLOAD_HEADERS {
        return Err(PayloadError::TooManyHeaders {
            count: given.len(),
            max: MAX_PAYLOAD_HEADERS,
        });
    }
    let mut out: Vec<(Box<str>, Box<str>)> = Vec::with_capacity(given.len());
    for (name, value) in given {
        let shown = super::ids::truncate(&name, MAX_HEADER_NAME_LEN);
        let bad = |reason| PayloadError::BadHeader {
            name: shown.clone(),
            reason,
        };
        if name.is_empty() {
            return Err(bad("has an empty name"));
        }
        if name.len() > MAX_HEADER_NAME_LEN {
            return Err(bad("has a name longer than 64 bytes (MAX_HEADER_NAME_LEN)"));
        }
        if !name.bytes().all(is_tchar) {
            return Err(bad("has a name that is not an HTTP token"));
        }
        if value.len() > MAX_HEADER_VALUE_LEN {
            return Err(bad(
                "has a value longer than 512 bytes (MAX_HEADER_VALUE_LEN)",
            ));
        }
        if !value
            .bytes()
            .all(|b| b == b'\t' || b == b' ' || b.is_ascii_graphic())
        {
            return Err(bad(
                "has a value with a byte that is not visible ASCII, space or tab",
            ));
        }
        let name = name.to_ascii_lowercase();
        if out.iter().any(|(n, _)| **n == *name) {
            return Err(PayloadError::DuplicateHeader { name });
        }
        out.push((name.into_boxed_str(), value.into_boxed_str()));
    }
    Ok(out.into_boxed_slice())
}

/// An HTTP token character (RFC 9110 `tchar`).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Why a [`Payload`] could not be built.
///
/// # Examples
///
/// ```
/// use worker_registry::limits::MAX_EVENT_NAME_LEN;
/// use worker_registry::{Payload, PayloadError};
///
/// let err = Payload::builder("e".repeat(65), &b""[..]).build().unwrap_err();
/// assert_eq!(err, PayloadError::TooLong { field: "event", len: 65, max: MAX_EVENT_NAME_LEN });
/// assert_eq!(err.to_string(), "payload event is 65 bytes long; the limit is 64");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PayloadError {
    /// A field that must have a value is empty.
    Empty {
        /// `"event"`, `"action"` or `"content type"`.
        field: &'static str,
    },
    /// A field is longer than its bound.
    TooLong {
        /// `"event"`, `"action"` or `"content type"`.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A field contains a byte it may not.
    BadByte {
        /// `"event"`, `"action"` or `"content type"`.
        field: &'static str,
        /// The first offending byte.
        found: u8,
    },
    /// More extra headers than [`MAX_PAYLOAD_HEADERS`].
    TooManyHeaders {
        /// How many were given.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// An extra header's name or value is not acceptable.
    BadHeader {
        /// Its name as given (at most [`MAX_HEADER_NAME_LEN`] bytes of it).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The same extra header twice (names compare without regard to case).
    DuplicateHeader {
        /// The name, in lower case.
        name: String,
    },
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty { field } => write!(f, "payload {field} is empty"),
            Self::TooLong { field, len, max } => {
                write!(f, "payload {field} is {len} bytes long; the limit is {max}")
            }
            Self::BadByte { field, found } => {
                write!(
                    f,
                    "payload {field} contains the byte 0x{found:02x}, which is not allowed there"
                )
            }
            Self::TooManyHeaders { count, max } => {
                write!(f, "payload has {count} extra headers; the limit is {max}")
            }
            Self::BadHeader { name, reason } => write!(f, "payload header {name:?} {reason}"),
            Self::DuplicateHeader { name } => write!(f, "payload header {name:?} is given twice"),
        }
    }
}

impl std::error::Error for PayloadError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(b: PayloadBuilder) -> Result<Payload, PayloadError> {
        b.build()
    }

    #[test]
    fn every_event_github_sends_is_accepted_and_sizes_add_up() {
        for event in [
            "pull_request",
            "pull_request_review_comment",
            "check_suite",
            "ping",
        ] {
            let p =
                build(Payload::builder(event, vec![7u8; 100]).action("ready_for_review")).unwrap();
            assert_eq!(
                p.size(),
                100 + event.len() as u64 + 16 + DEFAULT_CONTENT_TYPE.len() as u64
            );
        }
    }

    #[test]
    fn bounds_are_enforced_at_the_edge_and_not_past_it() {
        let ok = "e".repeat(MAX_EVENT_NAME_LEN);
        assert!(build(Payload::builder(ok.clone(), &b""[..]).action(ok)).is_ok());
        let long = "a".repeat(MAX_EVENT_NAME_LEN + 1);
        assert_eq!(
            build(Payload::builder("e", &b""[..]).action(long)),
            Err(PayloadError::TooLong {
                field: "action",
                len: MAX_EVENT_NAME_LEN + 1,
                max: MAX_EVENT_NAME_LEN
            })
        );
        assert_eq!(
            build(Payload::builder("", &b""[..])),
            Err(PayloadError::Empty { field: "event" })
        );
        assert_eq!(
            build(Payload::builder("e", &b""[..]).content_type("")),
            Err(PayloadError::Empty {
                field: "content type"
            })
        );
        assert_eq!(
            build(Payload::builder("e", &b""[..]).content_type("a\r\nb")),
            Err(PayloadError::BadByte {
                field: "content type",
                found: b'\r'
            })
        );
        let ct = "c".repeat(MAX_CONTENT_TYPE_LEN);
        assert!(build(Payload::builder("e", &b""[..]).content_type(ct)).is_ok());
    }

    #[test]
    fn headers_are_bounded_validated_and_unique_whatever_their_case() {
        let mut b = Payload::builder("e", &b""[..]);
        for i in 0..MAX_PAYLOAD_HEADERS {
            b = b.header(
                format!("{}{i:02}", "h".repeat(MAX_HEADER_NAME_LEN - 2)),
                "v".repeat(MAX_HEADER_VALUE_LEN),
            );
        }
        let full = build(b.clone()).unwrap();
        assert_eq!(full.headers().len(), MAX_PAYLOAD_HEADERS);
        assert_eq!(
            full.size() as usize,
            1 + DEFAULT_CONTENT_TYPE.len()
                + MAX_PAYLOAD_HEADERS * (MAX_HEADER_NAME_LEN + MAX_HEADER_VALUE_LEN)
        );
        assert!(full.size() as usize <= MAX_PAYLOAD_META_LEN);
        assert_eq!(
            build(b.header("x", "y")),
            Err(PayloadError::TooManyHeaders {
                count: MAX_PAYLOAD_HEADERS + 1,
                max: MAX_PAYLOAD_HEADERS
            })
        );
        assert_eq!(
            build(
                Payload::builder("e", &b""[..])
                    .header("X-A", "1")
                    .header("x-a", "2")
            ),
            Err(PayloadError::DuplicateHeader { name: "x-a".into() })
        );
        for (name, value) in [
            ("", "v"),
            ("has space", "v"),
            ("x", "line\nbreak"),
            ("x", &*"v".repeat(MAX_HEADER_VALUE_LEN + 1)),
            (&*"n".repeat(MAX_HEADER_NAME_LEN + 1), "v"),
        ] {
            let err = build(Payload::builder("e", &b""[..]).header(name, value)).unwrap_err();
            assert!(matches!(err, PayloadError::BadHeader { .. }), "{err}");
        }
        let p = build(Payload::builder("e", &b""[..]).header("X-Hub-Signature-256", "sha256=ab"))
            .unwrap();
        assert_eq!(p.header("X-HUB-SIGNATURE-256"), Some("sha256=ab"));
        assert_eq!(p.header("x-other"), None);
    }

    #[test]
    fn clones_share_the_body_and_compare_equal_byte_for_byte() {
        let body = Bytes::from(vec![1u8, 2, 3]);
        let p = build(Payload::builder("e", body.clone())).unwrap();
        let q = p.clone();
        assert_eq!(p, q);
        assert_eq!(q.body().as_ptr(), body.as_ptr(), "no copy of the body");
        let r = build(Payload::builder("e", vec![1u8, 2, 4])).unwrap();
        assert_ne!(p, r);
        assert!(
            !format!("{p:?}").contains("[1, 2, 3]"),
            "Debug shows no body"
        );
    }
}
