//! The read of one hook's delivery log: newest first, back to the horizon or to the position the
//! last complete pass reached, the attempts grouped by GUID ([`Step::read_log`]). A chased GUID
//! whose latest attempt in view the router accepted (a 202: assigned, waiting, queued) is caught:
//! the registry knew it then, and it is not probed again ([`Step::caught_in_log`]). After the
//! chase (`chase.rs`), each GUID whose latest attempt failed in a way a retry can help, and that
//! is not chased already, is checked against the registry and, if unknown, recorded as chased and
//! redelivered; then the position moves to the newest attempt older than `settle`
//! ([`Step::act_on_log`]). Every failed GUID the position moves past is known to the registry,
//! ignored by the router, refused for good, or chased.

use std::collections::HashMap;
use std::time::SystemTime;

use super::api::Attempt;
use super::chase;
use super::pass::{Step, Stop};
use super::probe::{self, Claims, Known};
use super::shared::MAX_CHASED;

/// The router's answer to a delivery it admitted, parked or queued (a duplicate is a 200: that
/// may be an answer to a probe's bare claim, so it proves nothing).
const ACCEPTED: u16 = 202;

/// One GUID in view: its latest attempt, how many of its attempts are in view, and when the
/// oldest of them was made.
struct Seen {
    latest: Attempt,
    attempts: usize,
    first_at: Option<SystemTime>,
}

/// What a read of the log found.
pub(super) struct Log {
    /// Where the read stopped (the position it started from).
    stop_at: Option<u64>,
    /// The GUIDs in view, newest first.
    seen: Vec<Seen>,
    /// Where the position moves once the log is acted on.
    position: Option<u64>,
}

impl Step<'_> {
    /// Reads the hook's log back to its position or the horizon.
    pub(super) async fn read_log(&mut self) -> Result<Log, Stop> {
        let stop_at = self.shared.position(&self.hook).await?;
        let (seen, position) = self.read(stop_at).await?;
        self.pass.guids += seen.len() as u64;
        Ok(Log {
            stop_at,
            seen,
            position,
        })
    }

    /// Stops chasing the GUIDs whose latest attempt in `log` the router accepted.
    pub(super) async fn caught_in_log(&mut self, log: &Log) -> Result<(), Stop> {
        if self.shared.chasing(&self.hook, 0).await?.0 == 0 {
            return Ok(());
        }
        for g in log.seen.iter().filter(|g| g.latest.status_code == ACCEPTED) {
            let guid = &g.latest.guid;
            let chased = self.shared.chased(&self.hook, guid).await?;
            if chased.is_none_or(|c| c.given_up) {
                continue;
            }
            Self::fenced(self.shared.forget(self.holder, &self.hook, guid).await?)?;
            self.pass.caught += 1;
            tracing::info!(hook = %self.hook, %guid, attempt = g.latest.id, "reconcile: caught up, the router accepted its redelivery: no longer chased");
        }
        Ok(())
    }

    /// Acts on each failed GUID of `log`, oldest first (redeliveries go out in the order the events
    /// happened), then moves the position.
    pub(super) async fn act_on_log(&mut self, log: Log) -> Result<(), Stop> {
        let (mut chased, _) = self.shared.chasing(&self.hook, 0).await?;
        for g in log.seen.iter().rev() {
            self.act(g, &mut chased).await?;
        }
        if let Some(p) = log.position {
            let written = self.shared.set_position(self.holder, &self.hook, p).await?;
            Self::fenced(written)?;
            tracing::info!(hook = %self.hook, from = ?log.stop_at, to = p, "reconcile: position moved");
        }
        Ok(())
    }

    /// Reads the log back to `stop_at` or the horizon: the GUIDs in view, newest first, and the
    /// position to move to.
    async fn read(&mut self, stop_at: Option<u64>) -> Result<(Vec<Seen>, Option<u64>), Stop> {
        let now = SystemTime::now();
        let oldest = now.checked_sub(self.limits.horizon).unwrap_or(now);
        let settled = now.checked_sub(self.limits.settle).unwrap_or(now);
        let mut seen: Vec<Seen> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut position = None;
        let mut cursor: Option<String> = None;
        'pages: loop {
            let page = self
                .client
                .page(self.limits.per_page, cursor.as_deref())
                .await?;
            self.pass.pages += 1;
            for a in page.attempts {
                let at = a.at();
                if stop_at.is_some_and(|p| a.id <= p) || at.is_some_and(|t| t < oldest) {
                    break 'pages;
                }
                if position.is_none() && at.is_some_and(|t| t <= settled) {
                    position = Some(a.id);
                }
                match index.get(&a.guid) {
                    Some(&k) => {
                        seen[k].attempts += 1;
                        seen[k].first_at = at.or(seen[k].first_at);
                    }
                    None => {
                        index.insert(a.guid.clone(), seen.len());
                        seen.push(Seen {
                            latest: a,
                            attempts: 1,
                            first_at: at,
                        });
                    }
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
            self.renew().await?;
        }
        Ok((seen, position))
    }

    /// What one GUID in view needs; `chased` counts the hook's chased GUIDs.
    async fn act(&mut self, g: &Seen, chased: &mut u64) -> Result<(), Stop> {
        let a = &g.latest;
        if a.succeeded() {
            return Ok(());
        }
        if !a.retryable() {
            self.pass.permanent += 1;
            tracing::info!(hook = %self.hook, guid = %a.guid, status = a.status_code, "reconcile: not redelivered, the router refused it for good");
            return Ok(());
        }
        if self.shared.chased(&self.hook, &a.guid).await?.is_some() {
            // Its chase redelivers it when it is due, if the registry does not know it by then.
            tracing::debug!(hook = %self.hook, guid = %a.guid, "reconcile: failed again, already chased");
            return Ok(());
        }
        tracing::info!(hook = %self.hook, guid = %a.guid, attempt = a.id, status = a.status_code, attempts = g.attempts, "reconcile: a failed delivery");
        let detail = self.client.detail(a.id).await?;
        let Some(claims) = Claims::of(&self.router.policy, &detail) else {
            self.pass.ignored += 1;
            return Ok(());
        };
        if probe::known(&self.router.registry, &claims).await? == Known::Yes {
            self.pass.known += 1;
            tracing::info!(hook = %self.hook, guid = %a.guid, "reconcile: known to the registry, not redelivered");
            return Ok(());
        }
        if *chased >= MAX_CHASED as u64 {
            return Err(Stop::ChaseFull);
        }
        let c = chase::record(a, &claims, g.first_at);
        let after = chase::backoff(self.limits.chase_backoff, c.redeliveries);
        *chased += 1;
        self.redeliver(&c, after).await??;
        self.pass.redelivered += 1;
        tracing::info!(hook = %self.hook, guid = %a.guid, attempt = a.id, event = %a.event, targets = ?c.targets, "reconcile: redelivered, chased until the registry knows it");
        Ok(())
    }
}
