//! A worker's mailbox: a bounded channel, and behind it a bounded overflow.
//!
//! An event handed to a worker whose channel is full is not refused: it stays claimed and is
//! queued in the worker's overflow, in arrival order, and the worker takes it once the channel is
//! empty. Only when the overflow is full too is the event refused ([`Handover::Full`]: the router
//! releases its claim and answers 503).
//!
//! The overflow's bound counts the overflow alone: while it holds events, the channel is not
//! refilled from it (the worker takes from the overflow directly once the channel is empty), so an
//! event finds room again once the worker has taken one from the overflow.
//!
//! **Order.** Every event in the channel arrived before every event in the overflow: an event goes
//! into the channel only while the overflow is empty, and the receiver takes from the overflow
//! only when the channel is empty. Both decisions are taken under the overflow's lock (one per
//! worker, held for a `VecDeque` operation and a `try_send`, never across an await), so the
//! worker sees its events in the order they were handed.
//!
//! **Nothing accepted is lost.** An overflowed event is claimed by the worker in the registry,
//! like one in its channel. When the worker stops (crashed, fenced, exited) the receiving end is
//! dropped and its overflow is emptied and closed (later hands answer [`Handover::Stopped`]); the
//! registry releases the worker's claims when it dies, and the sweeper callback re-dispatches
//! them, as it does for the events left in the channel. At the shutdown deadline the worker hands
//! back its channel's and its overflow's events alike ([`Mailbox::close`], then
//! [`Mailbox::try_recv`] until `None`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc;

use crate::telemetry::TraceParent;
use worker_registry::{DeliveryId, FencingToken, Payload, Target};

/// One event handed to a worker (`crate::worker` names it too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The worker's target.
    pub target: Target,
    /// The delivery.
    pub event: DeliveryId,
    /// The fencing token of this assignment.
    pub token: FencingToken,
    /// The W3C `traceparent` of the span it was dispatched under (its loop's parent).
    pub trace: TraceParent,
    /// What GitHub sent with the delivery (the event name, action, content type, the body as
    /// received and the headers a worker needs), shared with the registry's copy and every other
    /// hop (a reference count, no copy of the body). `None` only when the router does not have it:
    /// a released delivery whose payload the registry no longer holds, or one forwarded by a
    /// replica that sent none.
    pub payload: Option<Payload>,
}

/// Events queued in overflows and overflowed in total, across a platform's workers (the
/// `webhook_router_overflow_queued` gauge and `webhook_router_overflowed_total` counter).
///
/// # Examples
///
/// ```
/// use webhook_router::mailbox::OverflowMetrics;
///
/// let m = OverflowMetrics::default();
/// assert_eq!((m.queued(), m.overflowed()), (0, 0));
/// ```
#[derive(Clone, Debug, Default)]
pub struct OverflowMetrics {
    /// Events in overflows now.
    pub queued: Gauge,
    /// Events ever queued in an overflow.
    pub total: Counter,
}

impl OverflowMetrics {
    /// Events in overflows now.
    ///
    /// # Examples
    ///
    /// ```
    /// # use webhook_router::mailbox::OverflowMetrics;
    /// assert_eq!(OverflowMetrics::default().queued(), 0);
    /// ```
    pub fn queued(&self) -> u64 {
        u64::try_from(self.queued.get()).unwrap_or(0)
    }

    /// Events ever queued in an overflow.
    ///
    /// # Examples
    ///
    /// ```
    /// # use webhook_router::mailbox::OverflowMetrics;
    /// assert_eq!(OverflowMetrics::default().overflowed(), 0);
    /// ```
    pub fn overflowed(&self) -> u64 {
        self.total.get()
    }
}

/// What became of an event handed to a worker: put into its mailbox here
/// ([`Sender::put`], [`Containers::hand`](crate::containers::Containers::hand)), or forwarded to
/// its owner replica ([`Remote::post`](crate::remote::Remote::post), whose answer on the wire is
/// [`ForwardAnswer`](crate::remote::ForwardAnswer)).
///
/// # Examples
///
/// ```
/// use webhook_router::mailbox::Handover;
///
/// assert_ne!(Handover::Queued, Handover::Overflowed { position: 1 });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handover {
    /// In the worker's mailbox (the channel), or parked for the container about to start.
    Queued,
    /// In the overflow behind the worker's full channel, `position` events deep (this one
    /// included, from 1), in arrival order.
    Overflowed {
        /// Its place in the overflow when it was queued.
        position: usize,
    },
    /// The channel and the overflow are both full.
    Full,
    /// Not delivered, and left with the worker in the registry: its container has stopped
    /// (crashed, fenced, exited, or gone with its replica), so the worker will be declared dead
    /// and the event released for re-dispatch.
    Stopped,
    /// Not delivered for this reason (the owner replica could not be found or reached); the
    /// worker may well be alive.
    Unreachable(String),
}

struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
}

struct Overflow {
    queue: Mutex<Queue>,
    bound: usize,
    metrics: OverflowMetrics,
}

impl Overflow {
    /// The queue; a poisoned lock (a panic elsewhere while it was held: none of the sections
    /// below can panic) is taken over as it is, since every section leaves it consistent.
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The sending half (cheap to clone): what the platform keeps per worker.
///
/// # Examples
///
/// ```
/// use webhook_router::mailbox::{self, OverflowMetrics, Handover};
/// # use worker_registry::{DeliveryId, FencingToken, Target};
/// # let job = |n: u32| webhook_router::worker::Job {
/// #     target: Target::new("o/r", 1).unwrap(),
/// #     event: DeliveryId::new(&format!("d{n}")).unwrap(),
/// #     token: FencingToken::from_raw(1),
/// #     trace: Default::default(),
/// #     payload: None,
/// # };
///
/// let (tx, mut rx) = mailbox::channel(1, 1, OverflowMetrics::default());
/// assert_eq!(tx.put(job(1)), Handover::Queued);
/// assert_eq!(tx.put(job(2)), Handover::Overflowed { position: 1 });
/// assert_eq!(tx.put(job(3)), Handover::Full);
/// assert_eq!(rx.try_recv().unwrap().event.as_str(), "d1");
/// assert_eq!(rx.try_recv().unwrap().event.as_str(), "d2");
/// ```
#[derive(Clone)]
pub struct Sender {
    tx: mpsc::Sender<Job>,
    overflow: Arc<Overflow>,
}

/// The receiving half: the worker's.
///
/// # Examples
///
/// See [`Sender`].
pub struct Mailbox {
    rx: mpsc::Receiver<Job>,
    overflow: Arc<Overflow>,
}

/// A mailbox whose channel holds `capacity` events (at least 1) with an overflow of `overflow`
/// events behind it (0: none), counted in `metrics`.
///
/// # Examples
///
/// See [`Sender`].
pub fn channel(capacity: usize, overflow: usize, metrics: OverflowMetrics) -> (Sender, Mailbox) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let overflow = Arc::new(Overflow {
        queue: Mutex::new(Queue {
            jobs: VecDeque::new(),
            closed: false,
        }),
        bound: overflow,
        metrics,
    });
    (
        Sender {
            tx,
            overflow: overflow.clone(),
        },
        Mailbox { rx, overflow },
    )
}

impl Sender {
    /// Puts `job` into the channel, or behind it into the overflow if the channel is full or the
    /// overflow already holds events (so that it never passes them). Never waits.
    ///
    /// # Examples
    ///
    /// See [`Sender`].
    pub fn put(&self, job: Job) -> Handover {
        let mut q = self.overflow.lock();
        if q.closed || self.tx.is_closed() {
            return Handover::Stopped;
        }
        let job = if q.jobs.is_empty() {
            match self.tx.try_send(job) {
                Ok(()) => return Handover::Queued,
                Err(mpsc::error::TrySendError::Closed(_)) => return Handover::Stopped,
                Err(mpsc::error::TrySendError::Full(job)) => job,
            }
        } else {
            job
        };
        if q.jobs.len() >= self.overflow.bound {
            return Handover::Full;
        }
        q.jobs.push_back(job);
        self.overflow.metrics.queued.inc();
        self.overflow.metrics.total.inc();
        Handover::Overflowed {
            position: q.jobs.len(),
        }
    }

    /// Whether the receiving end is closed or gone (the worker has stopped).
    ///
    /// # Examples
    ///
    /// ```
    /// # use webhook_router::mailbox::{self, OverflowMetrics};
    /// let (tx, rx) = mailbox::channel(1, 0, OverflowMetrics::default());
    /// drop(rx);
    /// assert!(tx.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Events in the overflow now.
    ///
    /// # Examples
    ///
    /// ```
    /// # use webhook_router::mailbox::{self, OverflowMetrics};
    /// let (tx, _rx) = mailbox::channel(1, 4, OverflowMetrics::default());
    /// assert_eq!(tx.overflowed(), 0);
    /// ```
    pub fn overflowed(&self) -> usize {
        self.overflow.lock().jobs.len()
    }
}

impl Mailbox {
    /// The oldest event: the channel's, or once the channel is empty the overflow's; `None` when
    /// both are empty and the mailbox is closed (every sender gone, or [`close`](Self::close)).
    /// Cancel safe: nothing is taken until it returns.
    ///
    /// # Examples
    ///
    /// ```
    /// # use webhook_router::mailbox::{self, OverflowMetrics};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let (tx, mut rx) = mailbox::channel(1, 1, OverflowMetrics::default());
    /// drop(tx);
    /// assert!(rx.recv().await.is_none());
    /// # });
    /// ```
    pub async fn recv(&mut self) -> Option<Job> {
        match self.take() {
            Taken::Job(job) => Some(job),
            Taken::Ended => None,
            // Both empty: the next event goes into the channel (the overflow fills only while the
            // channel is full), so waiting on the channel misses none.
            Taken::Empty => match self.rx.recv().await {
                Some(job) => Some(job),
                None => self.pop(),
            },
        }
    }

    /// The oldest event if one is queued, without waiting.
    ///
    /// # Examples
    ///
    /// See [`Sender`].
    pub fn try_recv(&mut self) -> Option<Job> {
        match self.take() {
            Taken::Job(job) => Some(job),
            Taken::Empty | Taken::Ended => None,
        }
    }

    /// Closes the mailbox: hands are refused from now on ([`Handover::Stopped`]); what is queued can
    /// still be taken.
    ///
    /// # Examples
    ///
    /// ```
    /// # use webhook_router::mailbox::{self, OverflowMetrics, Handover};
    /// # use worker_registry::{DeliveryId, FencingToken, Target};
    /// let (tx, mut rx) = mailbox::channel(1, 1, OverflowMetrics::default());
    /// rx.close();
    /// # let job = webhook_router::worker::Job {
    /// #     target: Target::new("o/r", 1).unwrap(),
    /// #     event: DeliveryId::new("d").unwrap(),
    /// #     token: FencingToken::from_raw(1),
    /// #     trace: Default::default(),
    /// #     payload: None,
    /// # };
    /// assert_eq!(tx.put(job), Handover::Stopped);
    /// ```
    pub fn close(&mut self) {
        self.overflow.lock().closed = true;
        self.rx.close();
    }

    fn take(&mut self) -> Taken {
        let mut q = self.overflow.lock();
        match self.rx.try_recv() {
            Ok(job) => Taken::Job(job),
            Err(e) => match q.jobs.pop_front() {
                Some(job) => {
                    self.overflow.metrics.queued.dec();
                    Taken::Job(job)
                }
                None if e == mpsc::error::TryRecvError::Disconnected => Taken::Ended,
                None => Taken::Empty,
            },
        }
    }

    fn pop(&mut self) -> Option<Job> {
        let job = self.overflow.lock().jobs.pop_front();
        if job.is_some() {
            self.overflow.metrics.queued.dec();
        }
        job
    }
}

impl Drop for Mailbox {
    /// The worker is gone: its overflow is closed and emptied (those events stay claimed by the
    /// worker in the registry, which releases them when it declares the worker dead).
    fn drop(&mut self) {
        let mut q = self.overflow.lock();
        q.closed = true;
        let n = q.jobs.len();
        q.jobs.clear();
        self.overflow
            .metrics
            .queued
            .dec_by(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

enum Taken {
    Job(Job),
    Empty,
    Ended,
}

#[cfg(test)]
mod tests {
    use super::*;
    use worker_registry::{DeliveryId, FencingToken, Target};

    fn job(n: u64) -> Job {
        Job {
            target: Target::new("o/r", 1).unwrap(),
            event: DeliveryId::new(&format!("d{n}")).unwrap(),
            token: FencingToken::from_raw(n),
            trace: Default::default(),
            payload: None,
        }
    }

    #[test]
    fn events_come_out_in_the_order_they_went_in() {
        let m = OverflowMetrics::default();
        let (tx, mut rx) = channel(2, 8, m.clone());
        assert_eq!(tx.put(job(0)), Handover::Queued);
        assert_eq!(tx.put(job(1)), Handover::Queued);
        for n in 2..10 {
            assert_eq!(
                tx.put(job(n)),
                Handover::Overflowed {
                    position: n as usize - 1
                }
            );
        }
        assert_eq!(tx.put(job(10)), Handover::Full);
        assert_eq!(m.queued(), 8);
        // The channel has room again, but the overflow is not empty: a later event must not pass
        // it.
        let mut out = vec![rx.try_recv().unwrap()];
        assert_eq!(
            tx.put(job(10)),
            Handover::Full,
            "the overflow is still full"
        );
        out.push(rx.try_recv().unwrap());
        out.push(rx.try_recv().unwrap());
        assert_eq!(tx.put(job(10)), Handover::Overflowed { position: 8 });
        while let Some(j) = rx.try_recv() {
            out.push(j);
        }
        let order: Vec<u64> = out.iter().map(|j| j.token.get()).collect();
        assert_eq!(order, (0..=10).collect::<Vec<_>>());
        assert_eq!((m.queued(), m.overflowed()), (0, 9));
        // Empty again: the next one goes into the channel.
        assert_eq!(tx.put(job(11)), Handover::Queued);
    }

    #[test]
    fn a_full_overflow_refuses_and_a_dropped_mailbox_empties_it() {
        let m = OverflowMetrics::default();
        let (tx, rx) = channel(1, 2, m.clone());
        assert_eq!(tx.put(job(0)), Handover::Queued);
        assert_eq!(tx.put(job(1)), Handover::Overflowed { position: 1 });
        assert_eq!(tx.put(job(2)), Handover::Overflowed { position: 2 });
        assert_eq!(tx.put(job(3)), Handover::Full);
        assert_eq!(m.queued(), 2);
        drop(rx);
        assert_eq!(m.queued(), 0);
        assert_eq!(tx.put(job(4)), Handover::Stopped);
    }

    #[test]
    fn no_overflow_is_todays_full_mailbox() {
        let (tx, _rx) = channel(1, 0, OverflowMetrics::default());
        assert_eq!(tx.put(job(0)), Handover::Queued);
        assert_eq!(tx.put(job(1)), Handover::Full);
    }

    #[tokio::test]
    async fn a_closed_mailbox_still_gives_what_it_holds() {
        let (tx, mut rx) = channel(1, 2, OverflowMetrics::default());
        tx.put(job(0));
        tx.put(job(1));
        drop(tx);
        assert_eq!(rx.recv().await.unwrap().token.get(), 0);
        assert_eq!(rx.recv().await.unwrap().token.get(), 1);
        assert!(rx.recv().await.is_none());
    }
}
