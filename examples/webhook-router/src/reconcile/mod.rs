//! The reconciler of failed deliveries. GitHub does not retry a delivery the router did not
//! accept (it was down, restarting, unreachable, or answered 5xx); the delivery stays failed in the
//! hook's log. Every `interval`, the replica holding the reconciling lease ([`shared`]) makes a
//! pass over each configured hook:
//!
//! 1. it reads the hook's log ([`api`]; `scan.rs`), newest first, back to the `horizon` or the
//!    position reached last time; a GUID it chases whose latest attempt the router accepted (a
//!    202) is caught;
//! 2. the **chase** (`chase.rs`): each GUID it redelivered earlier and still chases, once due, is
//!    checked against the registry: caught if the registry knows it, else redelivered again with
//!    a doubling backoff, or given up once out of the horizon;
//! 3. each GUID of the log whose latest attempt failed in a way a retry can help (no answer, 5xx,
//!    408, 429) and that is not chased yet has its request read, what the router would claim
//!    recomputed and checked against the registry ([`probe`]); an unknown one is recorded as
//!    chased, then redelivered. The position then moves to the newest attempt older than
//!    `settle`.
//!
//! So the position moves past a failed GUID only once the registry knows it, the router would
//! claim nothing for it, it was refused for good (a 4xx), or it is recorded in the shared chase,
//! which outlives the replica.
//! `pass.rs` holds what a pass did ([`Pass`]) and what its steps work with. A [`Reconciler`] holds
//! only what it uses of its replica ([`Router`]: the registry, the routing policy, the metrics and
//! the closing flag), besides its own lease, positions and chase ([`shared`]).

pub mod api;
pub mod auth;
pub mod chase;
pub mod flags;
mod pass;
pub mod probe;
mod scan;
pub mod shared;

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use worker_registry::{DynRegistry, RegistryError};

use crate::closing::Closing;
use crate::metrics::RouterMetrics;
use crate::policy::Policy;
use crate::secrets::Secret;
use api::{Client, Hook};
use auth::{AppAuth, Auth};
use pass::{Limits, Step, Stop};
use shared::Shared;

pub use api::GITHUB_LOG_RETENTION;
pub use pass::Pass;

/// The default `--reconcile-interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// The default `--reconcile-horizon`: GitHub's three days less an hour of margin.
pub const DEFAULT_HORIZON: Duration = Duration::from_secs(71 * 3600);
/// Attempts younger than this are read again next pass (GitHub may still be logging around them).
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(60);
/// The default [`Config::chase_backoff`]: a chased GUID the registry does not know yet is
/// redelivered again no sooner than this after its first redelivery, doubling each time (see
/// [`chase::backoff`]).
pub const DEFAULT_CHASE_BACKOFF: Duration = Duration::from_secs(60);
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
    /// See [`DEFAULT_CHASE_BACKOFF`].
    pub chase_backoff: Duration,
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
            .field("chase_backoff", &self.chase_backoff)
            .finish()
    }
}

/// What the reconciler uses of its router replica, and nothing else of it.
#[derive(Clone)]
pub struct Router {
    /// The registry it asks whether a delivery is known.
    pub registry: DynRegistry,
    /// The routing policy, to recompute what the router would claim for a logged delivery.
    pub policy: Arc<Policy>,
    /// Where its passes are counted.
    pub metrics: RouterMetrics,
    /// Set when the router shuts down: no pass begins after it.
    pub closing: Closing,
}

/// The reconciler of one router replica.
pub struct Reconciler {
    router: Router,
    shared: Shared,
    holder: String,
    clients: Vec<Client>,
    cfg: Config,
}

impl Reconciler {
    /// A reconciler for `router`'s registry with `cfg`, sharing its lease and positions through
    /// `shared` ([`Shared::open`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::reconcile::{Config, Reconciler, DEFAULT_CHASE_BACKOFF, DEFAULT_INTERVAL};
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
    ///     chase_backoff: DEFAULT_CHASE_BACKOFF,
    /// };
    /// assert!(cfg.app.is_none() && cfg.hooks.is_empty());
    /// # let _ = Reconciler::new;
    /// ```
    pub fn new(router: Router, cfg: Config, shared: Shared) -> Result<Self, String> {
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
            router,
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

    fn limits(&self) -> Limits {
        Limits {
            horizon: self.cfg.horizon,
            settle: self.cfg.settle,
            per_page: self.cfg.per_page,
            chase_backoff: self.cfg.chase_backoff,
            lease_ttl: self.lease_ttl(),
        }
    }

    /// One pass over every hook, if this replica holds (or takes) the lease: on each hook, its
    /// log read, the chase of the GUIDs redelivered earlier, then the log's failures acted on
    /// (see the [module documentation](self)).
    pub async fn pass(&mut self) -> Result<Pass, RegistryError> {
        let mut pass = Pass::default();
        if !self.shared.lease(&self.holder, self.lease_ttl()).await? {
            tracing::debug!("reconcile: another replica holds the lease");
            // The holder reports the chase; the sum over the replicas stays right.
            self.router.metrics.set_reconcile_chasing(0);
            return Ok(pass);
        }
        pass.leased = true;
        let limits = self.limits();
        for client in &mut self.clients {
            let before = client.waits;
            let hook = client.hook().to_string();
            let mut step = Step {
                router: &self.router,
                shared: &self.shared,
                holder: &self.holder,
                limits,
                client: &mut *client,
                hook: hook.clone(),
                pass: &mut pass,
            };
            let result = async {
                let log = step.read_log().await?;
                step.caught_in_log(&log).await?;
                step.chase().await?;
                step.act_on_log(log).await
            }
            .await;
            // Counted whatever stopped the steps, so the gauge stays right.
            let chasing = step.still_chasing().await;
            pass.rate_limited += client.waits.rate_limited - before.rate_limited;
            if let Err(e) = result.and(chasing.map(|n| pass.chasing += n)) {
                pass.errors += 1;
                tracing::warn!(%hook, "reconcile: pass stopped, its position stays: {e}");
                if matches!(e, Stop::LeaseLost) {
                    break;
                }
            }
        }
        pass.record(&self.router.metrics);
        tracing::info!(
            pages = pass.pages,
            guids = pass.guids,
            redelivered = pass.redelivered,
            redelivered_again = pass.redelivered_again,
            caught = pass.caught,
            chasing = pass.chasing,
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
                if self.router.closing.is_set() {
                    break;
                }
                // A pass cut short by the stop leaves its position where it was.
                let result = tokio::select! {
                    r = self.pass() => r,
                    _ = stopped.changed() => break,
                };
                if let Err(e) = result {
                    self.router.metrics.reconcile("errors", 1);
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
