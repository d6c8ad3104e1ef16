//! The reconciler of failed deliveries. GitHub does not retry a delivery the router did not
//! accept (it was down, restarting, unreachable, or answered 5xx); the delivery stays failed in the
//! hook's log. Every `interval`, the replica holding the reconciling lease ([`shared`]) reads each
//! configured hook's log ([`api`]), newest first, back to the `horizon` or the position it
//! reconciled up to last time, groups the attempts by GUID, and for each GUID whose latest attempt
//! failed in a way a retry can help with (no answer, 5xx, 408, 429):
//!
//! 1. reads that attempt's request (its headers and payload) and recomputes what the router would
//!    claim: the key ([`github::delivery`], hook identity included) and the pull requests
//!    ([`github::route`]); an event the routing policy ignores, or that names no pull request, is
//!    skipped;
//! 2. asks the registry whether it knows the delivery: a [`claim`](WorkerRegistry::claim) of
//!    each (pull request, key) pair, which is a duplicate if the pair is in flight or retained, and
//!    otherwise is a bare claim removed again at once ([`release`](WorkerRegistry::release));
//! 3. if some pair is unknown, asks GitHub to redeliver the attempt
//!    (`POST .../deliveries/{id}/attempts`), after renewing the lease; GitHub then sends it to the
//!    router, which admits it like any delivery (its known pairs are duplicates there).
//!
//! A GUID with [`MAX_ATTEMPTS`] failed attempts in view is given up on (logged and counted).
//! The position advances, under the lease, to the newest attempt older than `settle` once a hook's
//! log was read and acted on to the end without an error.

pub mod api;
pub mod auth;
pub mod flags;
pub mod shared;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use worker_registry::{ClaimOutcome, RegistryError, WorkerRegistry};

use crate::app::App;
use crate::github::{self, Route};
use crate::policy::Decision;
use crate::secrets::Secret;
use api::{ApiError, Attempt, Client, Detail, Hook};
use auth::{AppAuth, Auth};
use shared::Shared;

/// GitHub keeps a hook's delivery log for three days.
pub const GITHUB_LOG_RETENTION: Duration = Duration::from_secs(3 * 24 * 3600);
/// The default `--reconcile-interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// The default `--reconcile-horizon`: GitHub's three days less an hour of margin.
pub const DEFAULT_HORIZON: Duration = Duration::from_secs(71 * 3600);
/// Attempts younger than this are read again next pass (GitHub may still be logging around them).
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(60);
/// Failed attempts of one GUID in view after which it is given up on.
pub const MAX_ATTEMPTS: usize = 5;
/// `per_page` of the log reads (GitHub's maximum).
pub const DEFAULT_PER_PAGE: u8 = 100;

/// What the reconciler reads and how often.
#[derive(Clone)]
pub struct Config {
    /// GitHub's REST API (`https://api.github.com`, or GitHub Enterprise Server's `/api/v3`).
    pub api_url: String,
    /// The App's id and its private key (PEM, read again from its file when it changes), to
    /// reconcile the App's webhook.
    pub app: Option<(String, Secret)>,
    /// Repository and organisation hooks, read with `token`.
    pub hooks: Vec<Hook>,
    /// The token for `hooks` (read again from `--github-token-file` when it changes).
    pub token: Option<Secret>,
    /// Certificates (PEM) trusted for GitHub's API beside the usual roots: GitHub Enterprise
    /// Server behind a private CA (`--github-ca-bundle`).
    pub ca_bundle: Option<Arc<[u8]>>,
    /// How often a pass runs.
    pub interval: Duration,
    /// How far back a pass reads (at most GitHub's three days).
    pub horizon: Duration,
    /// See [`DEFAULT_SETTLE`].
    pub settle: Duration,
    /// Attempts per page.
    pub per_page: u8,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("api_url", &self.api_url)
            .field("app", &self.app.as_ref().map(|(id, _)| id))
            .field("hooks", &self.hooks)
            .field("token", &self.token)
            .field("ca_bundle", &self.ca_bundle.as_ref().map(|b| b.len()))
            .field("interval", &self.interval)
            .field("horizon", &self.horizon)
            .field("settle", &self.settle)
            .field("per_page", &self.per_page)
            .finish()
    }
}

/// What one pass did (summed over the hooks).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Whether this replica held the lease (nothing else is done without it).
    pub leased: bool,
    /// Log pages read.
    pub pages: u64,
    /// Distinct GUIDs in view.
    pub guids: u64,
    /// Failed GUIDs redelivered.
    pub redelivered: u64,
    /// Failed GUIDs the registry knows (not redelivered).
    pub known: u64,
    /// Failed GUIDs of events the router ignores.
    pub ignored: u64,
    /// Failed GUIDs a retry cannot help (a 4xx answer).
    pub permanent: u64,
    /// Failed GUIDs given up on ([`MAX_ATTEMPTS`]).
    pub gave_up: u64,
    /// Hooks whose pass stopped on an error (their position did not advance).
    pub errors: u64,
    /// Waits for a rate limit.
    pub rate_limited: u64,
}

/// Why a hook's pass stopped.
#[derive(Debug)]
enum Stop {
    Api(ApiError),
    Registry(RegistryError),
    /// Another replica holds the lease now.
    LeaseLost,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Api(e) => write!(f, "{e}"),
            Self::Registry(e) => write!(f, "the registry: {e}"),
            Self::LeaseLost => write!(f, "another replica took the reconciling lease"),
        }
    }
}

impl From<ApiError> for Stop {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

impl From<RegistryError> for Stop {
    fn from(e: RegistryError) -> Self {
        Self::Registry(e)
    }
}

/// What the registry knows of a failed attempt.
enum Known {
    /// Every pair it would claim is in flight or retained.
    Yes,
    /// Some pair is not: redeliver it.
    No,
    /// The router would claim nothing (ignored event, no pull request, unreadable request).
    Nothing,
}

/// The reconciler of one router replica.
pub struct Reconciler {
    app: App,
    shared: Shared,
    holder: String,
    clients: Vec<Client>,
    cfg: Config,
}

impl Reconciler {
    /// A reconciler for `app`'s registry with `cfg`, sharing its lease and positions through
    /// `shared` ([`Shared::open`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::{Config, Reconciler, DEFAULT_INTERVAL};
    ///
    /// // Nothing to reconcile: no App, no hook.
    /// let cfg = Config {
    ///     api_url: "https://api.github.com".into(),
    ///     app: None,
    ///     hooks: vec![],
    ///     token: None,
    ///     ca_bundle: None,
    ///     interval: DEFAULT_INTERVAL,
    ///     horizon: DEFAULT_INTERVAL,
    ///     settle: DEFAULT_INTERVAL,
    ///     per_page: 100,
    /// };
    /// assert!(cfg.app.is_none() && cfg.hooks.is_empty());
    /// # let _ = Reconciler::new;
    /// ```
    pub fn new(app: App, cfg: Config, shared: Shared) -> Result<Self, String> {
        let mut clients = Vec::new();
        if let Some((id, pem)) = &cfg.app {
            let auth = Auth::App(AppAuth::reloading(id, pem.clone())?);
            clients.push(Client::with_roots(
                &cfg.api_url,
                Hook::App,
                auth,
                cfg.ca_bundle.as_deref(),
            )?);
        }
        if !cfg.hooks.is_empty() {
            let token = cfg
                .token
                .clone()
                .ok_or("repository and organisation hooks need a token (--github-token)")?;
            for hook in &cfg.hooks {
                clients.push(Client::with_roots(
                    &cfg.api_url,
                    hook.clone(),
                    Auth::Token(token.clone()),
                    cfg.ca_bundle.as_deref(),
                )?);
            }
        }
        Ok(Self {
            app,
            shared,
            holder: format!("{:032x}", rand::thread_rng().gen::<u128>()),
            clients,
            cfg,
        })
    }

    /// This replica's lease holder id.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// How long a lease lasts without renewal: two intervals (so the holder keeps it from pass
    /// to pass, and another replica takes over within two intervals of its end), at least 30 s.
    pub fn lease_ttl(&self) -> Duration {
        (self.cfg.interval * 2).max(Duration::from_secs(30))
    }

    async fn renew(&self) -> Result<(), Stop> {
        if self.shared.lease(&self.holder, self.lease_ttl()).await? {
            Ok(())
        } else {
            Err(Stop::LeaseLost)
        }
    }

    /// One pass over every hook, if this replica holds (or takes) the lease.
    pub async fn pass(&mut self) -> Result<Pass, RegistryError> {
        let mut pass = Pass::default();
        if !self.shared.lease(&self.holder, self.lease_ttl()).await? {
            tracing::debug!("reconcile: another replica holds the lease");
            return Ok(pass);
        }
        pass.leased = true;
        for i in 0..self.clients.len() {
            let before = self.clients[i].waits;
            let hook = self.clients[i].hook().to_string();
            let result = self.hook_pass(i, &mut pass).await;
            pass.rate_limited += self.clients[i].waits.rate_limited - before.rate_limited;
            if let Err(e) = result {
                pass.errors += 1;
                tracing::warn!(%hook, "reconcile: pass stopped, its position stays: {e}");
                if matches!(e, Stop::LeaseLost) {
                    break;
                }
            }
        }
        let m = self.app.metrics();
        m.reconcile("passes", 1);
        m.reconcile("pages", pass.pages);
        m.reconcile("redelivered", pass.redelivered);
        m.reconcile("known", pass.known);
        m.reconcile("ignored", pass.ignored);
        m.reconcile("permanent", pass.permanent);
        m.reconcile("gave_up", pass.gave_up);
        m.reconcile("errors", pass.errors);
        m.reconcile("rate_limited", pass.rate_limited);
        tracing::info!(
            pages = pass.pages,
            guids = pass.guids,
            redelivered = pass.redelivered,
            known = pass.known,
            ignored = pass.ignored,
            permanent = pass.permanent,
            gave_up = pass.gave_up,
            errors = pass.errors,
            rate_limited = pass.rate_limited,
            "reconcile pass"
        );
        Ok(pass)
    }

    /// The pass over hook `i`'s log.
    async fn hook_pass(&mut self, i: usize, pass: &mut Pass) -> Result<(), Stop> {
        let name = self.clients[i].hook().to_string();
        let stop_at = self.shared.position(&name).await?;
        let now = SystemTime::now();
        let oldest = now.checked_sub(self.cfg.horizon).unwrap_or(now);
        let settled = now.checked_sub(self.cfg.settle).unwrap_or(now);
        // The latest attempt of each GUID, in the log's order (newest first), and how many
        // attempts of it are in view.
        let mut latest: Vec<(Attempt, usize)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut position = None;
        let mut cursor: Option<String> = None;
        'pages: loop {
            let page = self.clients[i]
                .page(self.cfg.per_page, cursor.as_deref())
                .await?;
            pass.pages += 1;
            for a in page.attempts {
                if stop_at.is_some_and(|p| a.id <= p) {
                    break 'pages;
                }
                let at = a.at();
                if at.is_some_and(|t| t < oldest) {
                    break 'pages;
                }
                if position.is_none() && at.is_some_and(|t| t <= settled) {
                    position = Some(a.id);
                }
                match index.get(&a.guid) {
                    Some(&k) => latest[k].1 += 1,
                    None => {
                        index.insert(a.guid.clone(), latest.len());
                        latest.push((a, 1));
                    }
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
            self.renew().await?;
        }
        pass.guids += latest.len() as u64;
        // Oldest first: redeliveries go out in the order the events happened.
        for (a, seen) in latest.iter().rev() {
            if a.succeeded() {
                continue;
            }
            if !a.retryable() {
                pass.permanent += 1;
                tracing::info!(hook = %name, guid = %a.guid, status = a.status_code, "reconcile: not redelivered, the router refused it for good");
                continue;
            }
            if *seen >= MAX_ATTEMPTS {
                pass.gave_up += 1;
                tracing::warn!(hook = %name, guid = %a.guid, attempts = seen, "reconcile: given up, every attempt failed");
                continue;
            }
            let detail = self.clients[i].detail(a.id).await?;
            match self.known(&detail).await? {
                Known::Yes => {
                    pass.known += 1;
                    tracing::debug!(hook = %name, guid = %a.guid, "reconcile: known to the registry, skipped");
                }
                Known::Nothing => pass.ignored += 1,
                Known::No => {
                    self.renew().await?;
                    self.clients[i].redeliver(a.id).await?;
                    pass.redelivered += 1;
                    tracing::info!(hook = %name, guid = %a.guid, attempt = a.id, event = %a.event, "reconcile: redelivered");
                }
            }
        }
        if let Some(p) = position {
            if !self.shared.set_position(&self.holder, &name, p).await? {
                return Err(Stop::LeaseLost);
            }
        }
        Ok(())
    }

    /// Whether the registry knows every (pull request, key) pair the router would claim for
    /// `detail`'s request.
    async fn known(&self, detail: &Detail) -> Result<Known, RegistryError> {
        let Some((headers, payload)) = request_of(detail) else {
            return Ok(Known::Nothing);
        };
        let Ok(delivery) = github::delivery(&headers) else {
            return Ok(Known::Nothing);
        };
        let Ok(Route::Targets { action, targets }) = github::route(&delivery.event, &payload)
        else {
            return Ok(Known::Nothing);
        };
        let decision = self
            .app
            .options()
            .policy
            .decide(&delivery.event, action.as_deref());
        if decision == Decision::Ignore {
            return Ok(Known::Nothing);
        }
        let registry = self.app.registry();
        for target in &targets {
            match registry.claim(target, &delivery.key).await? {
                ClaimOutcome::AlreadyClaimed(_) => {}
                ClaimOutcome::Claimed => {
                    // Our probe's bare claim: removed, so the redelivery is admitted. Should this
                    // fail, the bare claim is released after the heartbeat timeout and
                    // re-dispatched by the sweep; the redelivery is then a duplicate.
                    if let Err(e) = registry.release(target, &delivery.key).await {
                        tracing::warn!(%target, delivery = %delivery.key, "reconcile: the probe's claim stays until it expires: {e}");
                    }
                    return Ok(Known::No);
                }
            }
        }
        Ok(Known::Yes)
    }

    /// Gives the lease up (see [`Shared::release`]).
    pub async fn release(&self) -> Result<(), RegistryError> {
        self.shared.release(&self.holder).await
    }

    /// Runs a pass every interval (the first at once) until [`Running::stop`] or the router's
    /// shutdown.
    pub fn spawn(mut self) -> Running {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.cfg.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => break,
                }
                if self.app.is_closing() {
                    break;
                }
                // A pass cut short by the stop leaves its position where it was.
                let result = tokio::select! {
                    r = self.pass() => r,
                    _ = stopped.changed() => break,
                };
                if let Err(e) = result {
                    self.app.metrics().reconcile("errors", 1);
                    tracing::warn!("reconcile: no pass, the lease could not be read: {e}");
                }
            }
            if let Err(e) = self.release().await {
                tracing::warn!(
                    "reconcile: the lease could not be given up, it expires by itself: {e}"
                );
            }
        });
        Running { task, stop }
    }
}

/// A reconciler running in the background ([`Reconciler::spawn`]).
pub struct Running {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl Running {
    /// Stops it (a pass in progress is cut short) and gives its lease up.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// The request of a logged attempt as the router received it: its headers (with
/// `Content-Type: application/json`, as the log holds the JSON payload whichever content type
/// was sent) and its JSON payload.
fn request_of(detail: &Detail) -> Option<(HeaderMap, Vec<u8>)> {
    let logged = detail.request.headers.as_ref()?;
    let mut headers = HeaderMap::new();
    for (k, v) in logged {
        let (Ok(name), Some(value)) = (
            HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()),
            v.as_str().and_then(|v| HeaderValue::from_str(v).ok()),
        ) else {
            continue;
        };
        headers.insert(name, value);
    }
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let payload = serde_json::to_vec(detail.request.payload.as_ref()?).ok()?;
    Some((headers, payload))
}
