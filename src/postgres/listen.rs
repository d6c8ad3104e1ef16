//! Lifecycle events across replicas: the functions `NOTIFY` on the registry's channel in the
//! transaction that made the change (so an event is delivered if and only if the change
//! committed, in commit order); each handle `LISTEN`s on a dedicated connection and forwards what
//! arrives into its [`EventSender`].
//!
//! The listener is started (and its `LISTEN` confirmed) when the handle connects, so a
//! subscription made afterwards misses nothing committed afterwards. If the connection drops the
//! task reconnects with a growing pause; notifications sent meanwhile are lost (Postgres keeps none
//! for a listener that is not connected), and how many cannot be told, so they are not counted.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio_postgres::{AsyncMessage, Config, NoTls, Notification};

use super::error::Failure;
use super::rows;
use crate::api::error::RegistryError;
use crate::api::events::{Event, EventSender};
use crate::api::ids::{DeliveryId, Target};

/// The channel a registry's functions notify.
pub(crate) fn channel(registry: i64) -> String {
    format!("wr_events_{registry}")
}

/// Starts the listener task and waits until its `LISTEN` is in place.
pub(crate) async fn start(
    config: Config,
    registry: i64,
    events: Arc<EventSender>,
) -> Result<AbortHandle, RegistryError> {
    let channel = channel(registry);
    let (ready_tx, ready_rx) = oneshot::channel();
    let task = tokio::spawn(run(config, channel, events, ready_tx));
    match ready_rx.await {
        Ok(Ok(())) => Ok(task.abort_handle()),
        Ok(Err(f)) => Err(f.into_registry()),
        Err(_) => Err(RegistryError::backend(
            super::error::BACKEND,
            false,
            "the event listener task ended before it listened",
        )),
    }
}

async fn run(
    config: Config,
    channel: String,
    events: Arc<EventSender>,
    ready: oneshot::Sender<Result<(), Failure>>,
) {
    let mut ready = Some(ready);
    let mut pause = Duration::from_millis(50);
    loop {
        match listen(&config, &channel).await {
            Ok((client, mut rx)) => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Ok(()));
                }
                pause = Duration::from_millis(50);
                while let Some(n) = rx.recv().await {
                    match decode(n.payload()) {
                        Some(event) => events.send(|| event),
                        // Written by a newer version of the functions, or damaged: not ours to
                        // guess at; counted as missed.
                        None => events.record_missed(1),
                    }
                }
                drop(client);
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

/// Connects, issues `LISTEN`, and returns the client (keep it: dropping it closes the connection)
/// and the notifications, which end when the connection does.
async fn listen(
    config: &Config,
    channel: &str,
) -> Result<
    (
        tokio_postgres::Client,
        mpsc::UnboundedReceiver<Notification>,
    ),
    Failure,
> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    Ok((client, rx))
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
