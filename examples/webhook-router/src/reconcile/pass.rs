//! What one reconciling pass did ([`Pass`]), why a hook's part of it stopped ([`Stop`]), and what
//! its two steps on one hook work with ([`Step`]): the chase of GUIDs already redelivered
//! (`chase.rs`) and the read of the hook's log (`scan.rs`).

use std::time::Duration;

use worker_registry::RegistryError;

use super::api::{ApiError, Client};
use super::shared::Shared;
use crate::metrics::RouterMetrics;

/// What one pass did (summed over the hooks).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Whether this replica held the lease (nothing else is done without it).
    pub leased: bool,
    /// Log pages read.
    pub pages: u64,
    /// Distinct GUIDs in view.
    pub guids: u64,
    /// Failed GUIDs redelivered for the first time (each one is chased from then on).
    pub redelivered: u64,
    /// Chased GUIDs redelivered again: the registry still did not know them when they were due.
    pub redelivered_again: u64,
    /// Chased GUIDs the registry came to know (claimed, waiting or completed): no longer chased.
    pub caught: u64,
    /// GUIDs still chased when the pass ended (the holder's count; 0 on the other replicas).
    pub chasing: u64,
    /// Failed GUIDs the registry knows (not redelivered).
    pub known: u64,
    /// Failed GUIDs of events the router ignores.
    pub ignored: u64,
    /// Failed GUIDs a retry cannot help (a 4xx answer).
    pub permanent: u64,
    /// Chased GUIDs given up on: their first failure fell out of the horizon, or GitHub's log
    /// no longer has the attempt.
    pub gave_up: u64,
    /// Hooks whose pass stopped on an error (their position did not advance).
    pub errors: u64,
    /// Waits for a rate limit.
    pub rate_limited: u64,
}

impl Pass {
    /// Adds the pass to the reconciler's metrics (`webhook_router_reconcile_total{what}` and the
    /// `webhook_router_reconcile_chasing` gauge).
    pub(super) fn record(&self, m: &RouterMetrics) {
        m.reconcile("passes", 1);
        m.reconcile("pages", self.pages);
        m.reconcile("redelivered", self.redelivered);
        m.reconcile("redelivered_again", self.redelivered_again);
        m.reconcile("caught", self.caught);
        m.reconcile("known", self.known);
        m.reconcile("ignored", self.ignored);
        m.reconcile("permanent", self.permanent);
        m.reconcile("gave_up", self.gave_up);
        m.reconcile("errors", self.errors);
        m.reconcile("rate_limited", self.rate_limited);
        m.set_reconcile_chasing(self.chasing);
    }
}

/// Why a hook's pass stopped.
#[derive(Debug)]
pub(super) enum Stop {
    Api(ApiError),
    Registry(RegistryError),
    /// Another replica holds the lease now.
    LeaseLost,
    /// As many GUIDs are chased as [`MAX_CHASED`](super::shared::MAX_CHASED): a new failed one
    /// is left where it is (the position stays before it) until the chase shrinks.
    ChaseFull,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Api(e) => write!(f, "{e}"),
            Self::Registry(e) => write!(f, "the registry: {e}"),
            Self::LeaseLost => write!(f, "another replica took the reconciling lease"),
            Self::ChaseFull => write!(
                f,
                "{} GUIDs are chased already: the next failed one waits",
                super::shared::MAX_CHASED
            ),
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

/// The reconciler's timing and paging, as its [`Config`](super::Config) sets them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) horizon: Duration,
    pub(super) settle: Duration,
    pub(super) per_page: u8,
    pub(super) chase_backoff: Duration,
    pub(super) lease_ttl: Duration,
}

/// What a pass's steps on one hook work with.
pub(super) struct Step<'a> {
    pub(super) router: &'a super::Router,
    pub(super) shared: &'a Shared,
    pub(super) holder: &'a str,
    pub(super) limits: Limits,
    pub(super) client: &'a mut Client,
    /// The hook's name (its key in the shared state).
    pub(super) hook: String,
    pub(super) pass: &'a mut Pass,
}

impl Step<'_> {
    /// Renews the lease: `Err(LeaseLost)` if another replica holds it now.
    pub(super) async fn renew(&self) -> Result<(), Stop> {
        if self
            .shared
            .lease(self.holder, self.limits.lease_ttl)
            .await?
        {
            Ok(())
        } else {
            Err(Stop::LeaseLost)
        }
    }

    /// `Err(LeaseLost)` unless a write fenced by the lease went through.
    pub(super) fn fenced(written: bool) -> Result<(), Stop> {
        if written {
            Ok(())
        } else {
            Err(Stop::LeaseLost)
        }
    }
}
