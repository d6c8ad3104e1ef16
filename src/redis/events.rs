//! Lifecycle events across replicas: the scripts `PUBLISH` each event on `{name}:events` with a
//! registry-wide sequence number; every handle runs one listener task on its own pub/sub
//! connection that forwards them into the handle's [`EventSender`], so every replica's
//! subscribers see every event, whichever replica caused it.
//!
//! A dropped connection loses what was published meanwhile: the listener reconnects on its own
//! (with backoff), and counts the events it can tell it missed (the sequence numbers it never
//! saw) with [`EventSender::record_missed`].

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::codec;
use super::error;
use super::scripts::SCRIPTS;
use crate::api::error::RegistryError;
use crate::api::events::EventSender;

/// The listener's first and longest pause between reconnection attempts.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

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
    pub(crate) async fn start(
        ch: Channel,
        sender: Arc<EventSender>,
    ) -> Result<Self, RegistryError> {
        let (ready, subscribed) = oneshot::channel();
        let task = tokio::spawn(run(ch, sender, ready));
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

async fn run(
    ch: Channel,
    sender: Arc<EventSender>,
    ready: oneshot::Sender<Result<(), RegistryError>>,
) {
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
        if let Some(seen) = last {
            let missed = if at.epoch == epoch {
                at.seq.saturating_sub(seen)
            } else {
                at.seq
            };
            sender.record_missed(missed);
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
            let Ok((seq, event)) = codec::decode_event(text) else {
                sender.record_missed(1);
                continue;
            };
            let seen = last.unwrap_or(0);
            if seq <= seen {
                continue; // published before we subscribed
            }
            if seq > seen + 1 {
                sender.record_missed(seq - seen - 1);
            }
            last = Some(seq);
            sender.send(|| event);
        }
        // The connection dropped: reconnect.
    }
}
