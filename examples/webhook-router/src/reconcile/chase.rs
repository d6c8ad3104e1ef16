//! The chase: a GUID the reconciler redelivered stays recorded in the shared state
//! (`shared/chased.rs`) until the registry knows it, however the redelivery went (GitHub dropped
//! it, it reached a replica that died before claiming it, the router refused it with a 503, or it
//! arrived during a probe and was answered as a duplicate). A chased GUID whose redelivery the
//! router accepted (a 202 in the log) is caught when the log is read (`scan.rs`). Then each pass
//! takes the chased GUIDs that are due, oldest due first, and for each one:
//!
//! * the registry knows it (claimed, waiting or completed): it is **caught**, no longer chased;
//! * else, if its first failure is older than the horizon, or GitHub's log no longer has the
//!   attempt: **given up**, logged as a warning with its pull requests and counted; its record is
//!   kept, not chased, for [`GITHUB_LOG_RETENTION`], so a late failed attempt of it does not start
//!   a new chase;
//! * else it is **redelivered again**, and due again after [`backoff`]: the chase's first backoff
//!   doubled for each redelivery, at most [`MAX_CHASE_BACKOFF`]. With the defaults (a minute, an
//!   hour) a GUID the registry never comes to know is redelivered at most about 75 times over
//!   GitHub's three days, and never more than once a pass.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use worker_registry::{DeliveryId, Target};

use super::api::{ApiError, Attempt, GITHUB_LOG_RETENTION};
use super::pass::{Step, Stop};
use super::probe::{self, Claims, Known};
use super::shared::Chased;

/// The longest wait between two redeliveries of one chased GUID.
pub const MAX_CHASE_BACKOFF: Duration = Duration::from_secs(3600);
/// Due records read at once.
const BATCH: usize = 100;
/// Chased GUIDs a pass's "still chasing" line names at most (the count is always given).
const SHOWN: usize = 20;

/// How long after its `redeliveries`-th redelivery a chased GUID is due again: `first` doubled
/// for each redelivery after the first, at most [`MAX_CHASE_BACKOFF`] (or `first`, if larger).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use webhook_router::reconcile::chase::{backoff, MAX_CHASE_BACKOFF};
///
/// let m = Duration::from_secs(60);
/// assert_eq!(backoff(m, 1), m);
/// assert_eq!(backoff(m, 3), m * 4);
/// assert_eq!(backoff(m, 40), MAX_CHASE_BACKOFF);
/// ```
pub fn backoff(first: Duration, redeliveries: u32) -> Duration {
    let doublings = redeliveries.saturating_sub(1).min(30);
    first
        .saturating_mul(1 << doublings)
        .min(MAX_CHASE_BACKOFF.max(first))
}

/// The record of a GUID redelivered for the first time, from its latest failed attempt and what
/// the router claims for it; `failed_at` is its first failure in view.
pub(super) fn record(a: &Attempt, claims: &Claims, failed_at: Option<SystemTime>) -> Chased {
    Chased {
        guid: a.guid.clone(),
        attempt: a.id,
        key: claims.key.to_string(),
        targets: claims.targets.iter().map(ToString::to_string).collect(),
        failed_at: unix(failed_at.unwrap_or_else(SystemTime::now)),
        redeliveries: 1,
        given_up: false,
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What the record says the router claims, if it still reads.
fn claims_of(c: &Chased) -> Option<Claims> {
    let key = DeliveryId::new(&c.key).ok()?;
    let targets = c
        .targets
        .iter()
        .map(|t| t.parse::<Target>().ok())
        .collect::<Option<Vec<Target>>>()?;
    (!targets.is_empty()).then_some(Claims { key, targets })
}

impl Step<'_> {
    /// The chase of the hook's due GUIDs (see the [module documentation](self)).
    pub(super) async fn chase(&mut self) -> Result<(), Stop> {
        // A GUID due again at once (a zero backoff) is not taken twice in one pass.
        let mut handled = HashSet::new();
        loop {
            let due = self.shared.due(&self.hook, BATCH).await?;
            let fresh: Vec<Chased> = due
                .into_iter()
                .filter(|c| handled.insert(c.guid.clone()))
                .collect();
            if fresh.is_empty() {
                return Ok(());
            }
            for c in fresh {
                self.chase_one(c).await?;
            }
        }
    }

    async fn chase_one(&mut self, mut c: Chased) -> Result<(), Stop> {
        if c.given_up {
            // Its tombstone's time is up: GitHub's log has dropped it.
            return Self::fenced(self.shared.forget(self.holder, &self.hook, &c.guid).await?);
        }
        let Some(claims) = claims_of(&c) else {
            return self.give_up(c, "its record does not read").await;
        };
        if probe::known(&self.router.registry, &claims).await? == Known::Yes {
            Self::fenced(self.shared.forget(self.holder, &self.hook, &c.guid).await?)?;
            self.pass.caught += 1;
            tracing::info!(hook = %self.hook, guid = %c.guid, redeliveries = c.redeliveries, "reconcile: caught up, the registry knows it: no longer chased");
            return Ok(());
        }
        let oldest = SystemTime::now()
            .checked_sub(self.limits.horizon)
            .map_or(0, unix);
        if c.failed_at < oldest {
            return self
                .give_up(c, "its first failure is older than the horizon")
                .await;
        }
        c.redeliveries += 1;
        let after = backoff(self.limits.chase_backoff, c.redeliveries);
        match self.redeliver(&c, after).await? {
            Ok(()) => {}
            Err(ApiError::Status { status: 404, .. }) => {
                return self.give_up(c, "GitHub's log no longer has it").await;
            }
            Err(e) => return Err(e.into()),
        }
        self.pass.redelivered_again += 1;
        tracing::info!(hook = %self.hook, guid = %c.guid, attempt = c.attempt, redeliveries = c.redeliveries, next_in = ?after, "reconcile: redelivered again, the registry does not know it yet");
        Ok(())
    }

    /// Records `c` as chased, due again `after` from now, then asks GitHub to redeliver its
    /// attempt: GitHub's answer. Recorded first, so whatever becomes of the request, of the
    /// redelivery and of this replica, the GUID stays chased.
    pub(super) async fn redeliver(
        &mut self,
        c: &Chased,
        after: Duration,
    ) -> Result<Result<(), ApiError>, Stop> {
        Self::fenced(self.shared.chase(self.holder, &self.hook, c, after).await?)?;
        self.renew().await?;
        Ok(self.client.redeliver(c.attempt).await)
    }

    async fn give_up(&mut self, mut c: Chased, why: &str) -> Result<(), Stop> {
        c.given_up = true;
        let kept = self
            .shared
            .chase(self.holder, &self.hook, &c, GITHUB_LOG_RETENTION)
            .await?;
        Self::fenced(kept)?;
        self.pass.gave_up += 1;
        tracing::warn!(hook = %self.hook, guid = %c.guid, redeliveries = c.redeliveries, targets = ?c.targets, "reconcile: given up ({why}): redeliver it by hand");
        Ok(())
    }

    /// How many GUIDs of the hook are still chased; logs them (the first [`SHOWN`]) if any.
    pub(super) async fn still_chasing(&mut self) -> Result<u64, Stop> {
        let (n, shown) = self.shared.chasing(&self.hook, SHOWN).await?;
        if n > 0 {
            tracing::info!(hook = %self.hook, chasing = n, guids = ?shown, "reconcile: still chasing");
        }
        Ok(n)
    }
}
