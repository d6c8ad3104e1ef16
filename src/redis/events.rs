//! Lifecycle events across replicas: the scripts `PUBLISH` each event on `{name}:events` with a
//! registry-wide sequence number and the id of the replica that caused it, and return it to that
//! replica too, which hands it to its own subscribers before the call returns (so that, as in
//! memory, a subscription made after a call never sees that call's events). Every handle runs one
//! listener task on its own pub/sub connection that forwards the other replicas' events into the
//! handle's [`EventSender`], so every replica's subscribers see every event.
//!
//! A dropped connection loses what was published meanwhile: the listener reconnects on its own
//! (with backoff), and counts the events it can tell it missed (the sequence numbers it never
//! saw) with [`EventSender::record_missed`].

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::codec;
use super::error;
use super::scripts::SCRIPTS;
use crate::api::error::RegistryError;
use crate::api::events::{Event, EventSender};

/// The listener's first and longest pause between reconnection attempts.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// The most own events remembered as "delivered, not yet seen on the channel" (a listener that is
/// down for long forgets the oldest: they may then be counted missed although they were not).
const OWN_PENDING_MAX: usize = 65_536;

/// A handle's event sender, and the bookkeeping that keeps the missed count honest: events this
/// handle delivered itself are not missed when its listener never sees them on the channel.
pub(crate) struct Events {
    pub(crate) sender: EventSender,
    own: Mutex<Own>,
}

#[derive(Default)]
struct Own {
    /// Sequence numbers of own events delivered locally that the listener has not passed yet.
    pending: BTreeSet<u64>,
}

impl Events {
    pub(crate) fn new() -> Self {
        Self {
            sender: EventSender::new(),
            own: Mutex::new(Own::default()),
        }
    }

    fn own(&self) -> std::sync::MutexGuard<'_, Own> {
        // Two integers and a set: a panic elsewhere cannot leave them inconsistent.
        self.own.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands an event this handle's call published to its subscribers.
    pub(crate) fn deliver_own(&self, seq: u64, event: Event) {
        {
            let mut own = self.own();
            own.pending.insert(seq);
            if own.pending.len() > OWN_PENDING_MAX {
                own.pending.pop_first();
            }
        }
        self.sender.send(|| event);
    }

    /// The listener passed from `from` to `to` without seeing the events strictly in between on
    /// the channel (none, normally; all since `from` after a reconnection, `from` = 0 after a data
    /// loss): how many of those none of this handle's subscribers got. Own events up to `to` are
    /// settled either way. (An own event the listener passed before the call's reply arrived
    /// stays below `to` and is settled by the next pass.)
    fn pass(&self, from: u64, to: u64, seen_to: bool) -> u64 {
        let mut own = self.own();
        let end = if seen_to { to } else { to + 1 };
        let delivered = own.pending.range(from + 1..end.max(from + 1)).count() as u64;
        own.pending = own.pending.split_off(&(to + 1));
        end.saturating_sub(from + 1).saturating_sub(delivered)
    }
}

/// The listener task; aborted when the handle's last clone is dropped.
pub(crate) struct Listener {
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the listener needs.
pub(crate) struct Channel {
    pub(crate) client: ::redis::Client,
    /// For reading the sequence number after each (re)subscription.
    pub(crate) conn: ConnectionManager,
    pub(crate) channel: String,
    /// KEYS[1] and ARGV[1] of the scripts.
    pub(crate) offset_key: String,
    pub(crate) prefix: String,
    /// Makes each epoch value this listener proposes unique.
    pub(crate) replica: String,
    pub(crate) connect_timeout: Duration,
}

/// Where the event numbering stood when a subscription began.
struct Position {
    epoch: String,
    seq: u64,
}

impl Listener {
    /// Starts the listener and waits until it is subscribed, so that every event published after
    /// this returns reaches the handle's subscribers.
    pub(crate) async fn start(ch: Channel, events: Arc<Events>) -> Result<Self, RegistryError> {
        let (ready, subscribed) = oneshot::channel();
        let task = tokio::spawn(run(ch, events, ready));
        let listener = Self { task };
        match subscribed.await {
            Ok(Ok(())) => Ok(listener),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(codec::bad("the event listener stopped before subscribing")),
        }
    }
}

/// Subscribes, then reads where the numbering stands (events up to it were published before).
async fn subscribe(ch: &Channel) -> Result<(::redis::aio::PubSub, Position), RegistryError> {
    let attempt = async {
        let mut pubsub = ch.client.get_async_pubsub().await?;
        pubsub.subscribe(&ch.channel).await?;
        let mut conn = ch.conn.clone();
        // Unique per listener and attempt; kept only by the first to propose one.
        let proposal = format!(
            "{}-{}",
            ch.replica,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let (epoch, seq): (String, u64) = SCRIPTS
            .listen
            .key(&ch.offset_key)
            .arg(&ch.prefix)
            .arg(&ch.replica)
            .arg(proposal)
            .invoke_async(&mut conn)
            .await?;
        Ok::<_, ::redis::RedisError>((pubsub, Position { epoch, seq }))
    };
    match tokio::time::timeout(ch.connect_timeout * 2, attempt).await {
        Ok(r) => r.map_err(error::backend),
        Err(_) => Err(RegistryError::backend(
            error::BACKEND,
            true,
            "timed out subscribing to lifecycle events",
        )),
    }
}

async fn run(ch: Channel, events: Arc<Events>, ready: oneshot::Sender<Result<(), RegistryError>>) {
    let sender = &events.sender;
    let mut ready = Some(ready);
    let mut last: Option<u64> = None;
    let mut epoch = String::new();
    let mut pause = BACKOFF.0;
    loop {
        let (pubsub, at) = match subscribe(&ch).await {
            Ok(ok) => ok,
            Err(e) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Err(e));
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(BACKOFF.1);
                continue;
            }
        };
        pause = BACKOFF.0;
        // Events numbered up to `at.seq` were published before we (re)subscribed: the ones we
        // had not seen are lost. A new epoch means the server lost the registry's data (a
        // restart without persistence) and numbering started over: all of them are lost.
        match last {
            Some(seen) if at.epoch == epoch => {
                sender.record_missed(events.pass(seen, at.seq, false));
            }
            Some(_) => sender.record_missed(events.pass(0, at.seq, false)),
            None => {
                events.pass(at.seq, at.seq, false);
            }
        }
        epoch = at.epoch;
        last = Some(at.seq);
        if let Some(ready) = ready.take() {
            let _ = ready.send(Ok(()));
        }
        let mut messages = pubsub.into_on_message();
        while let Some(msg) = messages.next().await {
            let Ok(text) = std::str::from_utf8(msg.get_payload_bytes()) else {
                sender.record_missed(1);
                continue;
            };
            // `<seq>\t<origin replica>\t<event>`.
            let mut parts = text.splitn(3, '\t');
            let (Some(seq), Some(origin), Some(body)) = (parts.next(), parts.next(), parts.next())
            else {
                sender.record_missed(1);
                continue;
            };
            let Ok(seq) = seq.parse::<u64>() else {
                sender.record_missed(1);
                continue;
            };
            let seen = last.unwrap_or(0);
            if seq <= seen {
                continue; // published before we subscribed
            }
            sender.record_missed(events.pass(seen, seq, true));
            last = Some(seq);
            if origin == ch.replica {
                continue; // ours: handed to our subscribers when the call returned
            }
            match codec::decode_event(&format!("{seq}\t{body}")) {
                Ok((_, event)) => sender.send(|| event),
                Err(_) => sender.record_missed(1),
            }
        }
        // The connection dropped: reconnect.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ids::WorkerId;

    fn ev() -> Event {
        Event::WorkerCreated {
            worker: WorkerId::new(1),
            target: None,
        }
    }

    #[test]
    fn own_events_are_never_counted_missed() {
        let e = Events::new();
        assert_eq!(e.pass(5, 5, false), 0, "first subscription at 5");
        e.deliver_own(6, ev());
        // The channel shows 8 after 5: 6 was ours (delivered), 7 was lost.
        assert_eq!(e.pass(5, 8, true), 1);
        // An own event the listener passed before its reply arrived is settled later.
        e.deliver_own(8, ev());
        e.deliver_own(9, ev());
        // Reconnected at 12 after 8: 9 ours, 10-12 lost.
        assert_eq!(e.pass(8, 12, false), 3);
        assert!(e.own().pending.is_empty());
        // A data loss: numbering restarts; own 1 and 2 delivered, 3 lost.
        e.deliver_own(1, ev());
        e.deliver_own(2, ev());
        assert_eq!(e.pass(0, 3, false), 1);
    }
}
