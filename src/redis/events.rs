//! Lifecycle events across replicas: the scripts `PUBLISH` each event on `{name}:events` with a
//! registry-wide sequence number and the id of the replica that caused it. Every handle runs one
//! listener task on its own pub/sub connection that forwards **every** event, its own included,
//! into the handle's [`EventSender`] in the channel's order, which is the sequence order. So every
//! replica's subscribers see every event, and see them in the order the server made them.
//!
//! A script also returns its own events (and the registry's epoch) to the call that ran it, and
//! the call returns only once its listener has passed them ([`Events::settle`]). Redis queues a
//! script's `PUBLISH`es to subscribers before it sends the script's reply, so this wait is short.
//! Thus, as in memory, a subscription made after a call returned never sees that call's events,
//! and one made before sees them once the call returned.
//!
//! If the listener is not subscribed (its connection dropped), or its epoch is not the call's (the
//! server lost the registry's data and numbering restarted), or it has not passed the call's
//! events within the connection timeout, the call hands its events out itself and notes their
//! numbers, so that the listener skips them when they come through. Order is then not promised,
//! but nothing is delivered twice.
//!
//! A dropped connection loses what was published meanwhile: the listener reconnects on its own
//! (with backoff), and counts the events it can tell it missed (the sequence numbers it never
//! saw, less the ones calls handed out) with [`EventSender::record_missed`].

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::link::Link;
use futures_util::StreamExt;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::codec;
use super::error;
use super::scripts::SCRIPTS;
use crate::api::error::RegistryError;
use crate::api::events::{Event, EventSender};

/// The listener's first and longest pause between reconnection attempts.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// The most event numbers remembered as "handed out by a call, not yet passed by the listener" (a
/// listener that is down for long forgets the oldest: they may then be counted missed although
/// they were not).
const DIRECT_MAX: usize = 65_536;

/// Where the listener stands; the calls wait on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Progress {
    /// Whether the listener is subscribed now.
    listening: bool,
    /// The epoch it subscribed in ("" before its first subscription).
    epoch: Arc<str>,
    /// The last sequence number it passed.
    seq: u64,
}

/// A handle's event sender, with the listener's progress and the numbers of the events calls
/// handed out themselves.
pub(crate) struct Events {
    pub(crate) sender: EventSender,
    /// Updated by the listener under `direct`'s lock, so a call deciding under that lock sees
    /// a progress that matches what was delivered.
    progress: watch::Sender<Progress>,
    /// Events numbered above the listener's position that a call handed out itself.
    direct: Mutex<BTreeSet<u64>>,
    /// How long a call waits for the listener to pass its events.
    patience: Duration,
    /// Wakes the listener to subscribe again (the server lost the registry's data: a new epoch).
    again: tokio::sync::Notify,
}

impl Events {
    pub(crate) fn new(patience: Duration) -> Self {
        Self {
            sender: EventSender::new(),
            progress: watch::Sender::new(Progress::default()),
            direct: Mutex::new(BTreeSet::new()),
            patience,
            again: tokio::sync::Notify::new(),
        }
    }

    /// Has the listener subscribe again, so that it picks up the registry's new epoch and
    /// numbering (see `loss.rs`).
    pub(crate) fn resubscribe(&self) {
        self.again.notify_one();
    }

    fn direct(&self) -> MutexGuard<'_, BTreeSet<u64>> {
        // A set of integers: a panic elsewhere cannot leave it inconsistent.
        self.direct.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns once this handle's subscribers have had `own`, the events a call's script
    /// published (in sequence order, under `epoch`, the registry's epoch as the script read it):
    /// normally through the listener; see the module for when the call hands them out itself.
    pub(crate) async fn settle(&self, epoch: Option<&str>, own: Vec<(u64, Event)>) {
        let Some(&(last, _)) = own.last() else {
            return;
        };
        let passed = |p: &Progress| p.listening && Some(&*p.epoch) == epoch && p.seq >= last;
        let mut rx = self.progress.subscribe();
        let waited = rx.wait_for(|p| passed(p) || !p.listening || Some(&*p.epoch) != epoch);
        let _ = tokio::time::timeout(self.patience, waited).await;
        let mut direct = self.direct();
        let p = self.progress.borrow();
        for (seq, event) in own {
            if p.listening && Some(&*p.epoch) == epoch && seq <= p.seq {
                continue; // the listener delivered it (or counted it missed across a reconnection)
            }
            direct.insert(seq);
            if direct.len() > DIRECT_MAX {
                direct.pop_first();
            }
            self.sender.send(|| event);
        }
    }

    /// The listener subscribed (again) and the numbering stands at `seq` in `epoch`: events it
    /// had not passed up to there are lost, unless a call handed them out. Returns how many.
    fn subscribed(&self, epoch: &str, seq: u64) -> u64 {
        let mut direct = self.direct();
        let mut missed = 0;
        self.progress.send_modify(|p| {
            let from = match (&*p.epoch, p.seq) {
                ("", _) => seq, // the first subscription: nothing before it is owed
                (e, at) if e == epoch => at.min(seq),
                _ => 0, // a new epoch: numbering restarted
            };
            let handed = direct.range(from + 1..=seq).count() as u64;
            missed = (seq - from).saturating_sub(handed);
            *direct = direct.split_off(&(seq + 1));
            *p = Progress {
                listening: true,
                epoch: epoch.into(),
                seq,
            };
        });
        missed
    }

    /// The listener's connection dropped.
    fn unsubscribed(&self) {
        let _guard = self.direct();
        self.progress.send_modify(|p| p.listening = false);
    }

    /// The listener read event number `seq` from the channel (`event` decodes it): delivers it
    /// unless a call already did, and returns how many numbers it skipped (lost on the channel,
    /// less those calls handed out). Events numbered at or below the position came before the
    /// subscription, and are ignored.
    fn pass(&self, seq: u64, event: impl FnOnce() -> Option<Event>) -> u64 {
        let mut direct = self.direct();
        let mut missed = 0;
        self.progress.send_if_modified(|p| {
            if seq <= p.seq {
                return false;
            }
            let handed = direct.range(p.seq + 1..seq).count() as u64;
            missed = (seq - p.seq - 1).saturating_sub(handed);
            let mine = direct.contains(&seq);
            *direct = direct.split_off(&(seq + 1));
            if !mine {
                match event() {
                    Some(e) => self.sender.send(|| e),
                    None => missed += 1,
                }
            }
            p.seq = seq;
            true
        });
        missed
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
    /// For reading the sequence number after each (re)subscription, and the current primary's
    /// client for the pub/sub connection.
    pub(crate) conn: Link,
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
        let mut pubsub = ch.conn.client().get_async_pubsub().await?;
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
        sender.record_missed(events.subscribed(&at.epoch, at.seq));
        if let Some(ready) = ready.take() {
            let _ = ready.send(Ok(()));
        }
        let mut messages = pubsub.into_on_message();
        loop {
            let msg = tokio::select! {
                m = messages.next() => m,
                () = events.again.notified() => None,
            };
            let Some(msg) = msg else { break };
            // `<seq>\t<origin replica>\t<event>`.
            let parsed = std::str::from_utf8(msg.get_payload_bytes())
                .ok()
                .and_then(|text| {
                    let mut parts = text.splitn(3, '\t');
                    let seq = parts.next()?.parse::<u64>().ok()?;
                    let _origin = parts.next()?;
                    Some((seq, parts.next()?))
                });
            let Some((seq, body)) = parsed else {
                sender.record_missed(1);
                continue;
            };
            let decode = || {
                codec::decode_event(&format!("{seq}\t{body}"))
                    .ok()
                    .map(|(_, e)| e)
            };
            sender.record_missed(events.pass(seq, decode));
        }
        // The connection dropped: reconnect.
        events.unsubscribed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::events::Subscription;
    use crate::api::ids::WorkerId;

    const PATIENCE: Duration = Duration::from_secs(2);

    fn ev(n: u64) -> Event {
        Event::WorkerCreated {
            worker: WorkerId::new(n),
            target: None,
        }
    }

    fn drain(sub: &mut Subscription) -> Vec<u64> {
        let mut got = Vec::new();
        while let Ok(Some(Event::WorkerCreated { worker, .. })) = sub.try_recv() {
            got.push(worker.get());
        }
        got
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_ahead_of_the_listener_waits_so_events_keep_their_order() {
        let e = Arc::new(Events::new(PATIENCE));
        let mut sub = e.sender.subscribe();
        assert_eq!(
            e.subscribed("E", 5),
            0,
            "the first subscription owes nothing"
        );
        // Our call published 7; the listener has not yet read 6 (another replica's) or 7.
        let call = tokio::spawn({
            let e = e.clone();
            async move { e.settle(Some("E"), vec![(7, ev(7))]).await }
        });
        tokio::task::yield_now().await;
        assert!(!call.is_finished(), "the call waits for its listener");
        assert_eq!(drain(&mut sub), Vec::<u64>::new());
        assert_eq!(e.pass(6, || Some(ev(6))), 0);
        assert_eq!(e.pass(7, || Some(ev(7))), 0);
        call.await.unwrap();
        assert_eq!(drain(&mut sub), vec![6, 7], "sequence order, once each");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_the_listener_already_passed_returns_at_once() {
        let e = Events::new(PATIENCE);
        let mut sub = e.sender.subscribe();
        e.subscribed("E", 0);
        assert_eq!(e.pass(1, || Some(ev(1))), 0);
        e.settle(Some("E"), vec![(1, ev(1))]).await;
        assert_eq!(drain(&mut sub), vec![1]);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_listener_a_call_hands_out_its_events_and_they_are_not_counted_missed() {
        let e = Events::new(PATIENCE);
        let mut sub = e.sender.subscribe();
        e.subscribed("E", 5);
        e.unsubscribed();
        e.settle(Some("E"), vec![(6, ev(6))]).await;
        e.settle(Some("E"), vec![(8, ev(8)), (9, ev(9))]).await;
        assert_eq!(drain(&mut sub), vec![6, 8, 9]);
        // Resubscribed at 8: 7 was lost; 6 and 8 were handed out; 9 comes through and is skipped.
        assert_eq!(e.subscribed("E", 8), 1);
        assert_eq!(e.pass(9, || Some(ev(9))), 0);
        assert_eq!(e.pass(10, || Some(ev(10))), 0);
        assert_eq!(drain(&mut sub), vec![10]);
        // A gap on the channel is counted.
        assert_eq!(e.pass(13, || Some(ev(13))), 2);
        // An event that does not decode is counted, and numbers before the position ignored.
        assert_eq!(e.pass(14, || None), 1);
        assert_eq!(e.pass(12, || Some(ev(12))), 0);
        assert_eq!(drain(&mut sub), vec![13]);
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_data_loss_numbering_restarts_and_own_events_still_arrive() {
        let e = Events::new(PATIENCE);
        let mut sub = e.sender.subscribe();
        e.subscribed("E", 40);
        // The server restarted empty; a call got numbers 1 and 2 before the listener noticed,
        // and no epoch (the new one is set when a listener subscribes).
        e.settle(None, vec![(1, ev(1)), (2, ev(2))]).await;
        assert_eq!(drain(&mut sub), vec![1, 2], "not mistaken for old numbers");
        e.unsubscribed();
        // Resubscribed in a new epoch at 3: 1 and 2 were ours, 3 was lost.
        assert_eq!(e.subscribed("F", 3), 1);
        assert_eq!(e.pass(4, || Some(ev(4))), 0);
        assert_eq!(drain(&mut sub), vec![4]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_listener_that_never_passes_the_events_delays_the_call_by_its_patience_only() {
        let e = Events::new(PATIENCE);
        let mut sub = e.sender.subscribe();
        e.subscribed("E", 0);
        let t0 = tokio::time::Instant::now();
        e.settle(Some("E"), vec![(2, ev(2))]).await;
        assert_eq!(t0.elapsed(), PATIENCE);
        assert_eq!(drain(&mut sub), vec![2]);
        // The listener catches up later: 1 is delivered, 2 is not delivered twice.
        assert_eq!(e.pass(1, || Some(ev(1))), 0);
        assert_eq!(e.pass(2, || Some(ev(2))), 0);
        assert_eq!(drain(&mut sub), vec![1]);
        assert!(e.direct().is_empty());
    }
}
