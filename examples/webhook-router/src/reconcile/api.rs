//! The three calls of GitHub's REST API the reconciler makes on one hook's delivery log, and the
//! rate limits around them:
//!
//! | call | App webhook | repository / organisation hook |
//! |---|---|---|
//! | list, newest first | `GET /app/hook/deliveries` | `GET /repos/{owner}/{repo}/hooks/{id}/deliveries`, `GET /orgs/{org}/hooks/{id}/deliveries` |
//! | one, with its request | `GET /app/hook/deliveries/{delivery_id}` | `.../deliveries/{delivery_id}` |
//! | redeliver | `POST /app/hook/deliveries/{delivery_id}/attempts` | `.../deliveries/{delivery_id}/attempts` |
//!
//! Pages follow the `cursor` of the `Link` header's `rel="next"`. An answer with
//! `X-RateLimit-Remaining: 0` makes the next call wait until `X-RateLimit-Reset`; a 403 or 429
//! (a secondary rate limit) is retried after its `Retry-After`, or after a minute doubling each
//! time without one; a 5xx or a lost connection after a second doubling each time; at most
//! [`MAX_RETRIES`] times, then the call fails with what was observed.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, AUTHORIZATION, LINK, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use super::auth::Auth;

/// GitHub keeps a hook's delivery log for three days.
pub const GITHUB_LOG_RETENTION: Duration = Duration::from_secs(3 * 24 * 3600);
/// Retries of one call (rate limited, 5xx, lost connection) before it fails.
pub const MAX_RETRIES: u32 = 5;
/// The longest single wait for a rate limit (a reset further away is waited for in steps).
pub const MAX_WAIT: Duration = Duration::from_secs(15 * 60);
/// A secondary rate limit without `Retry-After` waits this long first (GitHub: "at least one minute").
const SECONDARY_WAIT: Duration = Duration::from_secs(60);
/// A 5xx or a lost connection waits this long first.
const ERROR_WAIT: Duration = Duration::from_secs(1);
/// Per request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Whose delivery log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hook {
    /// The App's webhook (authenticated as the App).
    App,
    /// A repository's hook.
    Repo {
        /// `owner/repo`.
        repo: String,
        /// The hook's id.
        id: u64,
    },
    /// An organisation's hook.
    Org {
        /// The organisation's login.
        org: String,
        /// The hook's id.
        id: u64,
    },
}

impl Hook {
    /// The path of its delivery log.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::api::Hook;
    ///
    /// assert_eq!(Hook::App.deliveries(), "/app/hook/deliveries");
    /// let h = Hook::Repo { repo: "o/r".into(), id: 7 };
    /// assert_eq!(h.deliveries(), "/repos/o/r/hooks/7/deliveries");
    /// ```
    pub fn deliveries(&self) -> String {
        match self {
            Self::App => "/app/hook/deliveries".to_owned(),
            Self::Repo { repo, id } => format!("/repos/{repo}/hooks/{id}/deliveries"),
            Self::Org { org, id } => format!("/orgs/{org}/hooks/{id}/deliveries"),
        }
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::App => write!(f, "app"),
            Self::Repo { repo, id } => write!(f, "repo:{repo}:{id}"),
            Self::Org { org, id } => write!(f, "org:{org}:{id}"),
        }
    }
}

/// One attempt in a delivery log (GitHub's `hook-delivery-item`; fields the reconciler does not
/// use are not read).
#[derive(Debug, Clone, Deserialize)]
pub struct Attempt {
    /// The attempt's id (larger is newer).
    pub id: u64,
    /// The event's GUID (`X-GitHub-Delivery`), shared by its attempts and by every hook.
    pub guid: String,
    /// When it was made (RFC 3339).
    pub delivered_at: String,
    /// Whether it was a redelivery.
    #[serde(default)]
    pub redelivery: bool,
    /// The router's answer; 0 when none came (no connection, a timeout).
    #[serde(default)]
    pub status_code: u16,
    /// The event name.
    #[serde(default)]
    pub event: String,
}

impl Attempt {
    /// Whether the router accepted it (2xx).
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::api::Attempt;
    ///
    /// let a: Attempt = serde_json::from_str(
    ///     r#"{"id":1,"guid":"g","delivered_at":"2026-01-01T00:00:00Z","status_code":503}"#,
    /// ).unwrap();
    /// assert!(!a.succeeded());
    /// ```
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.status_code)
    }

    /// Whether sending it again can help: no answer, a 5xx, 408 or 429. A 4xx (a bad signature,
    /// a malformed payload) would be refused again.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::api::Attempt;
    ///
    /// let mut a: Attempt = serde_json::from_str(
    ///     r#"{"id":1,"guid":"g","delivered_at":"2026-01-01T00:00:00Z","status_code":0}"#,
    /// ).unwrap();
    /// assert!(a.retryable());
    /// a.status_code = 401;
    /// assert!(!a.retryable());
    /// ```
    pub fn retryable(&self) -> bool {
        matches!(self.status_code, 0 | 408 | 429 | 500..=599)
    }

    /// When it was made, if `delivered_at` parses.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::api::Attempt;
    ///
    /// let a: Attempt = serde_json::from_str(
    ///     r#"{"id":1,"guid":"g","delivered_at":"2026-01-01T00:00:00Z"}"#,
    /// ).unwrap();
    /// assert!(a.at().is_some());
    /// ```
    pub fn at(&self) -> Option<SystemTime> {
        humantime::parse_rfc3339_weak(self.delivered_at.trim_end_matches('Z')).ok()
    }
}

/// One attempt with the request GitHub sent (`GET .../deliveries/{id}`): the headers and payload
/// the router needs to recompute its claim key and targets.
#[derive(Debug, Clone, Deserialize)]
pub struct Detail {
    /// The request.
    pub request: Request,
}

/// A logged request.
#[derive(Debug, Clone, Deserialize)]
pub struct Request {
    /// Its headers (GitHub's capitalisation), `None` if GitHub has none.
    #[serde(default)]
    pub headers: Option<serde_json::Map<String, serde_json::Value>>,
    /// Its JSON payload.
    #[serde(default)]
    pub payload: Option<serde_json::Value>,
}

/// A page of a delivery log and the cursor of the next one.
#[derive(Debug, Clone)]
pub struct Page {
    /// Newest first.
    pub attempts: Vec<Attempt>,
    /// The `cursor` of `Link: <...>; rel="next"`, if there is a next page.
    pub next: Option<String>,
}

/// Why a call failed, with what was observed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApiError {
    /// No answer (connection, timeout) after every retry.
    Transport(String),
    /// An answer that retrying did not change, or did not help.
    Status {
        /// The method and path.
        call: String,
        /// GitHub's status.
        status: u16,
        /// The start of its body.
        body: String,
    },
    /// A 2xx whose body is not what the REST description says.
    Decode(String),
    /// The credentials could not be prepared (JWT).
    Auth(String),
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transport(e) => write!(f, "no answer from GitHub: {e}"),
            Self::Status { call, status, body } => {
                write!(f, "{call}: GitHub answered {status}: {body}")
            }
            Self::Decode(e) => write!(f, "GitHub's answer does not decode: {e}"),
            Self::Auth(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ApiError {}

/// Rate-limit waits the client made (the reconciler turns them into metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    /// Waits for a secondary rate limit or an exhausted primary one.
    pub rate_limited: u64,
    /// Waits after a 5xx or a lost connection.
    pub errors: u64,
}

/// A client of one GitHub API base URL for one hook.
pub struct Client {
    http: reqwest::Client,
    base: String,
    hook: Hook,
    auth: Auth,
    /// Not before this instant (an exhausted primary limit).
    not_before: Option<tokio::time::Instant>,
    /// What waited so far.
    pub waits: Waits,
}

impl Client {
    /// A client of `base` (`https://api.github.com`, or a GitHub Enterprise Server's
    /// `https://HOST/api/v3`) for `hook`'s log, authenticated by `auth`, trusting the usual roots.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::api::{Client, Hook};
    /// use webhook_router::reconcile::auth::Auth;
    /// use webhook_router::secrets::Secret;
    ///
    /// let token = Auth::Token(Secret::from(Some("t")));
    /// let c = Client::new("https://api.github.com", Hook::App, token).unwrap();
    /// assert_eq!(c.hook(), &Hook::App);
    /// ```
    pub fn new(base: &str, hook: Hook, auth: Auth) -> Result<Self, String> {
        Self::with_roots(base, hook, auth, None)
    }

    /// Like [`new`](Self::new), also trusting the certificates of `ca_bundle` (PEM; see
    /// [`http_client`]).
    pub fn with_roots(
        base: &str,
        hook: Hook,
        auth: Auth,
        ca_bundle: Option<&[u8]>,
    ) -> Result<Self, String> {
        let http = http_client(ca_bundle)?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            hook,
            auth,
            not_before: None,
            waits: Waits::default(),
        })
    }

    /// The hook.
    pub fn hook(&self) -> &Hook {
        &self.hook
    }

    /// One page of the log, newest first: the first (`cursor` `None`) or the one `cursor` names.
    pub async fn page(&mut self, per_page: u8, cursor: Option<&str>) -> Result<Page, ApiError> {
        let mut path = format!("{}?per_page={per_page}", self.hook.deliveries());
        if let Some(c) = cursor {
            path.push_str("&cursor=");
            path.extend(form_urlencoded::byte_serialize(c.as_bytes()));
        }
        let (headers, body) = self.call(Method::GET, &path).await?;
        let attempts =
            serde_json::from_slice(&body).map_err(|e| ApiError::Decode(e.to_string()))?;
        Ok(Page {
            attempts,
            next: next_cursor(&headers),
        })
    }

    /// One attempt with its request.
    pub async fn detail(&mut self, attempt: u64) -> Result<Detail, ApiError> {
        let path = format!("{}/{attempt}", self.hook.deliveries());
        let (_, body) = self.call(Method::GET, &path).await?;
        serde_json::from_slice(&body).map_err(|e| ApiError::Decode(e.to_string()))
    }

    /// Asks GitHub to send attempt `attempt`'s delivery again (answered 202; the new attempt
    /// appears in the log).
    pub async fn redeliver(&mut self, attempt: u64) -> Result<(), ApiError> {
        let path = format!("{}/{attempt}/attempts", self.hook.deliveries());
        self.call(Method::POST, &path).await.map(|_| ())
    }

    /// One call with the rate limits and retries of the [module documentation](self).
    async fn call(&mut self, method: Method, path: &str) -> Result<(HeaderMap, Vec<u8>), ApiError> {
        let call = format!("{method} {path}");
        let mut backoff_secondary = SECONDARY_WAIT;
        let mut backoff_error = ERROR_WAIT;
        let mut attempt = 0;
        loop {
            if let Some(at) = self.not_before.take() {
                tokio::time::sleep_until(at).await;
            }
            // Every path that goes round the loop again is a retry: count it here.
            let may_retry = attempt < MAX_RETRIES;
            attempt += 1;
            let res = match self.send(&method, path).await? {
                Ok(res) => res,
                Err(e) if may_retry => {
                    tracing::warn!(%call, "GitHub did not answer, retrying in {backoff_error:?}: {e}");
                    self.back_off(&mut backoff_error).await;
                    continue;
                }
                Err(e) => return Err(ApiError::Transport(e.to_string())),
            };
            let status = res.status();
            let headers = res.headers().clone();
            let quota = Quota::read(&headers);
            if let (true, Some(wait)) = (quota.exhausted, quota.reset_wait) {
                self.not_before = Some(tokio::time::Instant::now() + wait.min(MAX_WAIT));
            }
            let body = res
                .bytes()
                .await
                .map_err(|e| ApiError::Transport(e.to_string()))?
                .to_vec();
            if status.is_success() {
                return Ok((headers, body));
            }
            let shown = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            if quota.limited(status, &headers, &shown) && may_retry {
                let wait = quota.wait(&headers, &mut backoff_secondary);
                tracing::warn!(%call, status = status.as_u16(), ?wait, "GitHub rate limit: waiting");
                self.waits.rate_limited += 1;
                self.not_before = None;
                tokio::time::sleep(wait).await;
                continue;
            }
            if status.is_server_error() && may_retry {
                tracing::warn!(%call, status = status.as_u16(), "GitHub failed, retrying in {backoff_error:?}");
                self.back_off(&mut backoff_error).await;
                continue;
            }
            return Err(ApiError::Status {
                call,
                status: status.as_u16(),
                body: shown,
            });
        }
    }

    /// Sends one request with the App's (or token's) authorisation and GitHub's API headers: the
    /// outer error is one of authorisation (not retried), the inner one of transport.
    async fn send(
        &mut self,
        method: &Method,
        path: &str,
    ) -> Result<Result<reqwest::Response, reqwest::Error>, ApiError> {
        let auth = self.auth.header().map_err(ApiError::Auth)?;
        Ok(self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .header(AUTHORIZATION, auth)
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28")
            .send()
            .await)
    }

    /// Waits out an error (no answer, or a 5xx) and doubles the next wait.
    async fn back_off(&mut self, backoff: &mut Duration) {
        self.waits.errors += 1;
        tokio::time::sleep(*backoff).await;
        *backoff *= 2;
    }
}

/// The HTTP client of GitHub's API: the web's roots (webpki), and the certificates of `ca_bundle`
/// (PEM, one or more) beside them: GitHub Enterprise Server behind a private CA.
///
/// # Examples
///
/// ```
/// use webhook_router::reconcile::api::http_client;
///
/// assert!(http_client(None).is_ok());
/// assert!(http_client(Some(b"not PEM")).is_err());
/// ```
pub fn http_client(ca_bundle: Option<&[u8]>) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .user_agent(concat!("webhook-router/", env!("CARGO_PKG_VERSION")));
    if let Some(pem) = ca_bundle {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| format!("the CA bundle is not PEM certificates: {e}"))?;
        if certs.is_empty() {
            return Err("the CA bundle holds no certificate".into());
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| e.to_string())
}

/// What an answer's rate-limit headers say about the primary quota.
struct Quota {
    /// `x-ratelimit-remaining` is 0.
    exhausted: bool,
    /// Until `x-ratelimit-reset`.
    reset_wait: Option<Duration>,
}

impl Quota {
    fn read(headers: &HeaderMap) -> Self {
        Self {
            exhausted: header_u64(headers, "x-ratelimit-remaining") == Some(0),
            reset_wait: header_u64(headers, "x-ratelimit-reset").map(until_epoch),
        }
    }

    /// Whether a failed answer is a rate limit (primary or secondary) rather than an error.
    fn limited(&self, status: StatusCode, headers: &HeaderMap, shown: &str) -> bool {
        status == StatusCode::TOO_MANY_REQUESTS
            || (status == StatusCode::FORBIDDEN
                && (self.exhausted
                    || headers.contains_key(RETRY_AFTER)
                    || shown.contains("rate limit")))
    }

    /// How long to wait before retrying a rate-limited call: `retry-after` if given, else the
    /// primary quota's reset, else the secondary limit's doubling wait; at most [`MAX_WAIT`].
    fn wait(&self, headers: &HeaderMap, backoff_secondary: &mut Duration) -> Duration {
        match header_u64(headers, RETRY_AFTER.as_str()) {
            Some(s) => Duration::from_secs(s),
            None if self.exhausted => self.reset_wait.unwrap_or(*backoff_secondary),
            None => {
                let w = *backoff_secondary;
                *backoff_secondary *= 2;
                w
            }
        }
        .min(MAX_WAIT)
    }
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// How long until the epoch second `reset` (0 if it has passed).
fn until_epoch(reset: u64) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Duration::from_secs(reset).saturating_sub(now)
}

/// The `cursor` query parameter of the `rel="next"` link of a `Link` header.
///
/// # Examples
///
/// ```
/// use reqwest::header::{HeaderMap, HeaderValue, LINK};
/// use webhook_router::reconcile::api::next_cursor;
///
/// let mut h = HeaderMap::new();
/// h.insert(LINK, HeaderValue::from_static(
///     "<https://api.github.com/app/hook/deliveries?per_page=2&cursor=v1_12>; rel=\"next\"",
/// ));
/// assert_eq!(next_cursor(&h).as_deref(), Some("v1_12"));
/// assert_eq!(next_cursor(&HeaderMap::new()), None);
/// ```
pub fn next_cursor(headers: &HeaderMap) -> Option<String> {
    for value in headers.get_all(LINK) {
        let Ok(text) = value.to_str() else { continue };
        for link in text.split(',') {
            let mut parts = link.split(';');
            let url = parts
                .next()?
                .trim()
                .trim_start_matches('<')
                .trim_end_matches('>');
            if !parts.any(|p| p.trim().replace(' ', "") == "rel=\"next\"") {
                continue;
            }
            let query = url.split_once('?').map_or("", |(_, q)| q);
            for (k, v) in form_urlencoded::parse(query.as_bytes()) {
                if k == "cursor" {
                    return Some(v.into_owned());
                }
            }
        }
    }
    None
}
