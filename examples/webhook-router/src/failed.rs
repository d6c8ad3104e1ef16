//! The most recent deliveries whose command failed every attempt: a worker speaking the protocol
//! reports them with `POST /worker/v1/complete` and `"outcome": "failed"`, the router completes
//! them, counts `webhook_router_worker_failed_total`, logs an error line, and records them here,
//! where the admin API serves them (`GET /deliveries/failed`, [`crate::http::deliveries`]).
//!
//! A fixed-size ring ([`DEFAULT_FAILED_KEPT`] records, each reason cut to [`MAX_REASON_BYTES`]:
//! at most about 1.3 MB): the oldest record makes room for the newest, and the count of every
//! record since start says how many were pushed out. It is this replica's: with several, each
//! keeps what its own workers reported, and a restart starts it empty (the counter and the log
//! line are what outlive it).

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use worker_registry::{DeliveryId, FencingToken, Target, WorkerId};

/// How many failed deliveries are kept by default.
pub const DEFAULT_FAILED_KEPT: usize = 1_000;

/// The longest reason kept, in bytes (a longer one is cut at a character boundary).
pub const MAX_REASON_BYTES: usize = 1_024;

/// One delivery whose command failed every attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedDelivery {
    /// The delivery (`X-GitHub-Delivery`).
    pub delivery: DeliveryId,
    /// Its pull request.
    pub target: Target,
    /// The worker that ran it.
    pub worker: WorkerId,
    /// The fencing token of the event it was handed.
    pub token: FencingToken,
    /// How many times its command ran, as the worker said.
    pub attempts: u32,
    /// Why it failed, as the worker said, at most [`MAX_REASON_BYTES`]; `None` if it said nothing.
    pub reason: Option<String>,
    /// Whether `reason` was cut.
    pub reason_truncated: bool,
    /// When the router recorded it (wall clock).
    pub at: SystemTime,
}

impl FailedDelivery {
    /// A record made now, `reason` cut to [`MAX_REASON_BYTES`].
    pub fn now(
        delivery: DeliveryId,
        target: Target,
        worker: WorkerId,
        token: FencingToken,
        attempts: u32,
        reason: Option<&str>,
    ) -> Self {
        let (reason, reason_truncated) = match reason {
            Some(r) => {
                let (cut, truncated) = cap(r, MAX_REASON_BYTES);
                (Some(cut.to_owned()), truncated)
            }
            None => (None, false),
        };
        Self {
            delivery,
            target,
            worker,
            token,
            attempts,
            reason,
            reason_truncated,
            at: SystemTime::now(),
        }
    }
}

/// `s` cut to at most `max` bytes at a character boundary, and whether it was cut.
fn cap(s: &str, max: usize) -> (&str, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let end = (0..=max)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    (&s[..end], true)
}

/// The ring (see the [module documentation](self)).
///
/// # Examples
///
/// ```
/// use webhook_router::failed::{FailedDeliveries, FailedDelivery};
/// use worker_registry::{DeliveryId, FencingToken, Target, WorkerId};
///
/// let failed = FailedDeliveries::new(2);
/// for d in ["d-1", "d-2", "d-3"] {
///     let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new(d).unwrap());
///     let token = FencingToken::from_raw(1);
///     failed.record(FailedDelivery::now(d, t, WorkerId::new(1), token, 3, Some("exit status 7")));
/// }
/// let (newest, total) = failed.newest(10);
/// assert_eq!(total, 3, "every record since start");
/// let ids: Vec<_> = newest.iter().map(|f| f.delivery.as_str()).collect();
/// assert_eq!(ids, ["d-3", "d-2"], "newest first, the oldest pushed out");
/// ```
#[derive(Debug)]
pub struct FailedDeliveries {
    kept: usize,
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    records: VecDeque<FailedDelivery>,
    total: u64,
}

impl Default for FailedDeliveries {
    fn default() -> Self {
        Self::new(DEFAULT_FAILED_KEPT)
    }
}

impl FailedDeliveries {
    /// A ring of `kept` records (at least 1).
    pub fn new(kept: usize) -> Self {
        Self {
            kept: kept.max(1),
            ring: Mutex::default(),
        }
    }

    /// How many records it keeps.
    pub fn kept(&self) -> usize {
        self.kept
    }

    /// Records `failed`, pushing the oldest record out when the ring is full.
    ///
    /// **Locking behaviour:** takes the ring's mutex for one push (and one pop), no allocation
    /// once the ring is full; only a failed completion and an admin read take it, never a
    /// delivery's or a heartbeat's path.
    pub fn record(&self, failed: FailedDelivery) {
        let mut ring = self.lock();
        if ring.records.len() == self.kept {
            ring.records.pop_front();
        }
        ring.records.push_back(failed);
        ring.total += 1;
    }

    /// The `limit` newest records, newest first, and how many were recorded since start.
    ///
    /// **Locking behaviour:** takes the ring's mutex while it copies at most `limit` records
    /// (and at most [`kept`](Self::kept)).
    pub fn newest(&self, limit: usize) -> (Vec<FailedDelivery>, u64) {
        let ring = self.lock();
        let newest = ring.records.iter().rev().take(limit).cloned().collect();
        (newest, ring.total)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        // A panic while holding it leaves a consistent ring (a push and a counter).
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_reason_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_REASON_BYTES);
        let (cut, truncated) = cap(&long, MAX_REASON_BYTES);
        assert!(truncated);
        assert_eq!(cut.len(), MAX_REASON_BYTES);
        let (cut, truncated) = cap(&long, 5);
        assert_eq!((cut, truncated), ("éé", true));
        assert_eq!(cap("exit status 7", 1024), ("exit status 7", false));
    }
}
