//! The read of one hook's delivery log: newest first, back to the horizon or to the position the
//! last complete pass reached; the attempts grouped by GUID; each GUID whose latest attempt
//! failed in a way a retry can help, and that is not chased already, checked against the
//! registry and, if unknown, recorded as chased and redelivered; then the position moved to the
//! newest attempt older than `settle`. Every failed GUID the position moves past is known to the
//! registry, ignored by the router, refused for good, or chased (`chase.rs`).

use std::collections::HashMap;
use std::time::SystemTime;

use super::api::Attempt;
use super::chase;
use super::pass::{Step, Stop};
use super::probe::{self, Claims, Known};
use super::shared::MAX_CHASED;

/// One GUID in view: its latest attempt, how many of its attempts are in view, and when the
/// oldest of them was made.
struct Seen {
    latest: Attempt,
    attempts: usize,
    first_at: Option<SystemTime>,
}

impl Step<'_> {
    /// The pass over the hook's log (see the [module documentation](self)).
    pub(super) async fn scan(&mut self) -> Result<(), Stop> {
        let stop_at = self.shared.position(&self.hook).await?;
        let (seen, position) = self.read(stop_at).await?;
        self.pass.guids += seen.len() as u64;
        let (mut chased, _) = self.shared.chasing(&self.hook, 0).await?;
        // Oldest first: redeliveries go out in the order the events happened.
        for g in seen.iter().rev() {
            self.act(g, &mut chased).await?;
        }
        if let Some(p) = position {
            let written = self.shared.set_position(self.holder, &self.hook, p).await?;
            Self::fenced(written)?;
            tracing::info!(hook = %self.hook, from = ?stop_at, to = p, "reconcile: position moved");
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
        let Some(claims) = Claims::of(self.app, &detail) else {
            self.pass.ignored += 1;
            return Ok(());
        };
        if probe::known(self.app, &claims).await? == Known::Yes {
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
