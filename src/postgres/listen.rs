//! Lifecycle events across replicas: the functions `NOTIFY` on the registry's channel in the
//! transaction that made the change (so an event is delivered if and only if the change
//! committed, in commit order); each handle `LISTEN`s on a dedicated connection and forwards what
//! arrives into its [`EventSender`].
//!
//! The listener is started (and its `LISTEN` confirmed) when the handle connects. A call of this
//! handle that published events returns only after they passed through its sender
//! ([`Listener::settle`]): it runs an empty query on the listener's connection, and the server
//! sends every notification committed before that query ahead of the query's answer, which the
//! connection's task reads, and forwards, in order. So, as in memory, events caused by calls that
//! returned before [`subscribe`](crate::Subscribe::subscribe) never reach that subscription, and
//! a subscription made before a call sees its events once the call returned.
//!
//! If the connection drops the task reconnects with a growing pause; notifications sent meanwhile
//! are lost (Postgres keeps none for a listener that is not connected), and how many cannot be
//! told, so they are not counted.

// `Tls` is `NoTls`, a `Copy` type, without `postgres-tls`; `.clone()` serves both builds.
#![cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]

use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tokio_postgres::{AsyncMessage, Client, Config};

use super::error::Failure;
use super::{rows, Tls};
use crate::api::error::RegistryError;
use crate::api::events::{Event, EventSender};
use crate::api::ids::{DeliveryId, Target};

/// The channel a registry's functions notify.
pub(crate) fn channel(registry: i64) -> String {
    format!("wr_events_{registry}")
}

/// The listener task of one handle, and its connection's client while it is connected.
pub(crate) struct Listener {
    task: AbortHandle,
    client: Arc<Mutex<Option<Arc<Client>>>>,
    timeout: Duration,
}

impl Listener {
    /// Starts the listener task and waits until its `LISTEN` is in place.
    pub(crate) async fn start(
        config: Config,
        registry: i64,
        events: Arc<EventSender>,
        timeout: Duration,
        tls: Tls,
    ) -> Result<Self, RegistryError> {
        let client = Arc::new(Mutex::new(None));
        let (ready_tx, ready_rx) = oneshot::channel();
        let task = tokio::spawn(run(
            config,
            tls,
            channel(registry),
            events,
            client.clone(),
            ready_tx,
        ));
        match ready_rx.await {
            Ok(Ok(())) => Ok(Self {
                task: task.abort_handle(),
                client,
                timeout,
            }),
            Ok(Err(f)) => {
                task.abort();
                Err(f.into_registry())
            }
            Err(_) => Err(RegistryError::backend(
                super::error::BACKEND,
                false,
                "the event listener task ended before it listened",
            )),
        }
    }

    /// Returns once every notification committed before this call has been forwarded to the
    /// handle's subscribers (or at once while the listener is reconnecting: those events are
    /// lost anyway). Never fails: events are best effort.
    pub(crate) async fn settle(&self) {
        let client = self.client.lock().map(|c| c.clone()).unwrap_or(None);
        if let Some(c) = client {
            let _ = tokio::time::timeout(self.timeout, c.batch_execute("")).await;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
        // Dropping the client ends its connection, and with it the forwarding task.
        if let Ok(mut c) = self.client.lock() {
            c.take();
        }
    }
}

async fn run(
    config: Config,
    tls: Tls,
    channel: String,
    events: Arc<EventSender>,
    slot: Arc<Mutex<Option<Arc<Client>>>>,
    ready: oneshot::Sender<Result<(), Failure>>,
) {
    let mut ready = Some(ready);
    let mut pause = Duration::from_millis(50);
    loop {
        match listen(&config, &tls, &channel, &events).await {
            Ok((client, forwarding)) => {
                if let Ok(mut s) = slot.lock() {
                    *s = Some(Arc::new(client));
                }
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Ok(()));
                }
                pause = Duration::from_millis(50);
                let _ = forwarding.await;
                if let Ok(mut s) = slot.lock() {
                    s.take();
                }
            }
            Err(f) => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Err(f));
                    return;
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// Connects and issues `LISTEN`; returns the client and the task that drives the connection and
/// forwards its notifications, which ends when the connection does.
async fn listen(
    config: &Config,
    tls: &Tls,
    channel: &str,
    events: &Arc<EventSender>,
) -> Result<(Client, tokio::task::JoinHandle<()>), Failure> {
    let (client, mut connection) = config.connect(tls.clone()).await?;
    let events = events.clone();
    let forwarding = tokio::spawn(async move {
        // Forwarding here, in the task that reads the connection, keeps events and query answers
        // in the order the server sent them (what `settle` relies on).
        while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => match decode(n.payload()) {
                    Some(event) => events.send(|| event),
                    // Written by a newer version of the functions, or damaged: not ours to guess
                    // at; counted as missed.
                    None => events.record_missed(1),
                },
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    Ok((client, forwarding))
}

/// An event from its notification payload (the format is documented in the migration that
/// defines `wr_notify`).
pub(crate) fn decode(payload: &str) -> Option<Event> {
    let mut words = payload.split(' ');
    let kind = words.next()?;
    let event = match kind {
        "created" | "draining" | "suspect" => {
            let worker = worker(words.next()?)?;
            let target = opt_target(words.next()?)?;
            match kind {
                "created" => Event::WorkerCreated { worker, target },
                "draining" => Event::WorkerDraining { worker, target },
                _ => Event::WorkerSuspect { worker, target },
            }
        }
        "died" => Event::WorkerDied {
            worker: worker(words.next()?)?,
            target: opt_target(words.next()?)?,
            reason: rows::dead_reason(Some(words.next()?)).ok()?,
        },
        "stuck" => Event::DeliveryStuck {
            worker: worker(words.next()?)?,
            target: target(words.next()?)?,
            delivery: DeliveryId::new(words.next()?).ok()?,
        },
        "promoted" => Event::DeliveryPromoted {
            worker: worker(words.next()?)?,
            target: target(words.next()?)?,
            delivery: DeliveryId::new(words.next()?).ok()?,
        },
        "waiting_expired" => Event::WaitingExpired {
            target: target(words.next()?)?,
            delivery: DeliveryId::new(words.next()?).ok()?,
            reason: crate::ExpireReason::WaitedTooLong {
                limit: std::time::Duration::from_millis(words.next()?.parse().ok()?),
            },
        },
        "released" => Event::TargetReleased {
            target: target(words.next()?)?,
            deliveries: words
                .by_ref()
                .map(|d| DeliveryId::new(d).ok())
                .collect::<Option<Vec<_>>>()?,
        },
        _ => return None,
    };
    words.next().is_none().then_some(event)
}

fn worker(s: &str) -> Option<crate::api::ids::WorkerId> {
    rows::worker_id(s.parse().ok()?).ok()
}

fn target(s: &str) -> Option<Target> {
    let (repo, number) = s.rsplit_once('#')?;
    rows::target(repo, number.parse().ok()?).ok()
}

fn opt_target(s: &str) -> Option<Option<Target>> {
    if s == "-" {
        Some(None)
    } else {
        target(s).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ids::WorkerId;
    use crate::api::status::DeadReason;

    #[test]
    fn every_payload_kind_decodes() {
        let t = Target::new("o/r", 3).unwrap();
        let w = WorkerId::new(9);
        assert_eq!(
            decode("created 9 o/r#3"),
            Some(Event::WorkerCreated {
                worker: w,
                target: Some(t.clone())
            })
        );
        assert_eq!(
            decode("draining 9 -"),
            Some(Event::WorkerDraining {
                worker: w,
                target: None
            })
        );
        assert_eq!(
            decode("suspect 9 -"),
            Some(Event::WorkerSuspect {
                worker: w,
                target: None
            })
        );
        assert_eq!(
            decode("died 9 o/r#3 drain_timed_out"),
            Some(Event::WorkerDied {
                worker: w,
                target: Some(t.clone()),
                reason: DeadReason::DrainTimedOut
            })
        );
        assert_eq!(
            decode("stuck 9 o/r#3 d-1"),
            Some(Event::DeliveryStuck {
                worker: w,
                target: t.clone(),
                delivery: DeliveryId::new("d-1").unwrap()
            })
        );
        assert_eq!(
            decode("released o/r#3"),
            Some(Event::TargetReleased {
                target: t.clone(),
                deliveries: vec![]
            })
        );
        assert_eq!(
            decode("promoted 9 o/r#3 d-1"),
            Some(Event::DeliveryPromoted {
                worker: w,
                target: t.clone(),
                delivery: DeliveryId::new("d-1").unwrap()
            })
        );
        assert_eq!(
            decode("waiting_expired o/r#3 d-1 20000"),
            Some(Event::WaitingExpired {
                target: t.clone(),
                delivery: DeliveryId::new("d-1").unwrap(),
                reason: crate::ExpireReason::WaitedTooLong {
                    limit: std::time::Duration::from_secs(20)
                }
            })
        );
        assert_eq!(
            decode("released o/r#3 a b"),
            Some(Event::TargetReleased {
                target: t,
                deliveries: vec![DeliveryId::new("a").unwrap(), DeliveryId::new("b").unwrap()]
            })
        );
    }

    #[test]
    fn damaged_payloads_decode_to_nothing() {
        for p in [
            "",
            "created",
            "created x -",
            "died 9 - bored",
            "created 9 - extra",
            "born 1 -",
        ] {
            assert_eq!(decode(p), None, "{p:?}");
        }
    }
}
