//! Lifecycle events for a handle that cannot `LISTEN`: behind a pooler in transaction mode
//! without a direct [`listen_url`](super::PostgresRegistryBuilder::listen_url), no connection
//! holds the session a `LISTEN` needs, so the notifications cannot arrive. The handle then polls
//! the registry's event log instead (`wr_events`, which `wr_notify` writes for a
//! registry a polling handle opened), every
//! [`poll_interval`](super::PostgresRegistryBuilder::poll_interval), through the pool like any
//! call, and forwards what it had not seen into its [`EventSender`].
//!
//! Sequence numbers are taken before commit, so a row may become visible after a later one was
//! read; each poll therefore also re-reads the rows of the last [`window`] of the server's clock
//! (longer than a call may keep its transaction open: its timeout, after which it is cancelled)
//! and skips the ones it forwarded already. Events of one worker keep their order: the calls that
//! cause them lock the worker's row, so each commits before the next takes its number.
//!
//! [`Feed::settle`] polls at once, so, as with `LISTEN`, a call that published events returns only
//! once they reached this handle's subscribers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use serde::Deserialize;

use super::conn::Checkout;
use super::error::{decode, Failure};
use super::listen::{self, Listener};
use super::rows::{self, col};
use super::Tls;
use crate::api::events::EventSender;

const SINCE: &str = "SELECT wr_events_since($1, $2, $3)::text AS body";
const ENABLE: &str =
    "UPDATE wr_registries SET poll_events = true WHERE id = $1 AND NOT poll_events";

/// How long after a row's time a poll still looks for it: a call's transaction ends within its
/// timeout (then it is cancelled), plus a margin for the clocks of the statement and the poll.
pub(crate) fn window(call_timeout: Duration) -> Duration {
    call_timeout.saturating_add(Duration::from_secs(5))
}

/// Where a handle's lifecycle events come from.
pub(crate) enum Feed {
    /// Notifications on a dedicated connection (`listen.rs`).
    Listen(Listener),
    /// The event log, polled through the pool.
    Poll(Poller),
}

impl Feed {
    /// Returns once every event committed before this call has been forwarded to the handle's
    /// subscribers (best effort: never fails).
    pub(crate) async fn settle(&self) {
        match self {
            Feed::Listen(l) => l.settle().await,
            Feed::Poll(p) => p.settle().await,
        }
    }
}

#[derive(Debug, Deserialize)]
struct Page {
    now: i64,
    events: Vec<(i64, i64, String)>,
}

/// What a poller has forwarded.
struct Seen {
    /// The highest sequence number forwarded.
    after: i64,
    /// Sequence numbers forwarded whose rows are still inside the window, with their times.
    recent: BTreeMap<i64, i64>,
}

/// One poll's inputs, shared by the task and [`Poller::settle`].
struct Source {
    pool: Pool,
    tls: Tls,
    unnamed: bool,
    registry: i64,
    window_ms: i64,
    events: Arc<EventSender>,
    seen: tokio::sync::Mutex<Seen>,
}

impl Source {
    /// Reads what it has not seen; forwards it unless `prime` (at start: only events after it).
    async fn poll(&self, prime: bool) -> Result<(), Failure> {
        let mut seen = self.seen.lock().await;
        let conn = Checkout::get(&self.pool, &self.tls).await?;
        let row = conn
            .query_one(
                self.unnamed,
                SINCE,
                &[&self.registry, &seen.after, &self.window_ms],
            )
            .await;
        conn.finish(&row);
        let body: String = col(&row?, "body")?;
        let page: Page =
            serde_json::from_str(&body).map_err(|e| decode(format!("event log: {e}")))?;
        for (seq, at_ms, payload) in page.events {
            if seen.recent.contains_key(&seq) {
                continue;
            }
            if !prime {
                match listen::decode(&payload) {
                    Some(event) => self.events.send(|| event),
                    None => self.events.record_missed(1),
                }
            }
            seen.after = seen.after.max(seq);
            seen.recent.insert(seq, at_ms);
        }
        let floor = page.now.saturating_sub(self.window_ms.saturating_mul(2));
        seen.recent.retain(|_, at| *at >= floor);
        Ok(())
    }
}

/// The polling task of one handle.
pub(crate) struct Poller {
    source: Arc<Source>,
    /// Tells the task to stop between two polls. It is never aborted: a poll cut off in its
    /// query would send a cancel request, and PgBouncer 1.18 has been seen to exit on one
    /// (`FATAL ... disconnect_client(): bad client state`).
    stop: Arc<tokio::sync::Notify>,
}

impl Poller {
    /// Marks the registry as polled (so `wr_notify` writes its log from now on), reads where the
    /// log stands, and starts the task that polls every `interval`.
    pub(crate) async fn start(
        pool: Pool,
        tls: Tls,
        unnamed: bool,
        registry: i64,
        events: Arc<EventSender>,
        interval: Duration,
        call_timeout: Duration,
    ) -> Result<Self, Failure> {
        {
            let conn = Checkout::get(&pool, &tls).await?;
            let done = conn.execute(unnamed, ENABLE, &[&registry]).await;
            conn.finish(&done);
            done?;
        }
        let source = Arc::new(Source {
            pool,
            tls,
            unnamed,
            registry,
            window_ms: rows::ms(window(call_timeout)),
            events,
            seen: tokio::sync::Mutex::new(Seen {
                after: 0,
                recent: BTreeMap::new(),
            }),
        });
        source.poll(true).await?;
        let stop = Arc::new(tokio::sync::Notify::new());
        tokio::spawn({
            let (source, stop) = (source.clone(), stop.clone());
            async move {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        // A permit stored before the wait is taken here too.
                        () = stop.notified() => return,
                    }
                    // A failed poll (the server away) is retried at the next tick; what it
                    // would have read is still in the log.
                    let _ = source.poll(false).await;
                }
            }
        });
        Ok(Self { source, stop })
    }

    /// Polls now (see [`Feed::settle`]).
    pub(crate) async fn settle(&self) {
        let _ = self.source.poll(false).await;
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        // The task ends at its next wait (after the poll in progress, if any).
        self.stop.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_outlasts_a_call() {
        assert!(window(Duration::from_secs(10)) > Duration::from_secs(10));
    }
}
