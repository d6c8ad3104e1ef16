//! What each simulated worker ran on: for every loop whose completion the registry recorded, the
//! worker and the SHA-256 of the body its [`Job`](crate::mailbox::Job) carried (or none if the
//! job carried no payload). The simulator's audit and the tests compare it with what was sent, so
//! that a delivery re-dispatched after a death, promoted out of the waiting room or forwarded to
//! another replica is shown to reach its worker with the bytes GitHub sent.
//!
//! Kept only when asked ([`Runs::keep`]): a record per delivery grows with the traffic, which a
//! simulation's audit wants and a long-running router does not.

use std::sync::atomic::{AtomicBool, Ordering};

use dashmap::DashMap;
use sha2::{Digest, Sha256};
use worker_registry::{DeliveryId, Payload, Target, WorkerId};

/// The SHA-256 of a body.
pub type BodyDigest = [u8; 32];

/// One completed loop: the worker that ran it and the digest of the body it ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ran {
    /// The worker.
    pub worker: WorkerId,
    /// The SHA-256 of its job's payload body; `None` if the job carried no payload.
    pub body: Option<BodyDigest>,
}

/// The record (see the [module documentation](self)); off until [`keep`](Self::keep) is called.
///
/// # Examples
///
/// ```
/// use webhook_router::runs::{digest, Runs};
/// use worker_registry::{DeliveryId, Payload, Target, WorkerId};
///
/// let runs = Runs::default();
/// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d-1").unwrap());
/// let p = Payload::builder("pull_request", &b"{}"[..]).build().unwrap();
/// runs.ran(WorkerId::new(1), &t, &d, Some(&p));
/// assert!(runs.of(&t, &d).is_empty(), "not kept until asked");
/// runs.keep();
/// runs.ran(WorkerId::new(1), &t, &d, Some(&p));
/// assert_eq!(runs.of(&t, &d)[0].body, Some(digest(b"{}")));
/// ```
#[derive(Debug, Default)]
pub struct Runs {
    keeping: AtomicBool,
    by_delivery: DashMap<(Target, DeliveryId), Vec<Ran>>,
}

impl Runs {
    /// Starts keeping the record (loops completed before are not in it).
    pub fn keep(&self) {
        // Relaxed: a switch read by later loops; a loop racing with it may go unrecorded, which
        // only a caller that switches it on mid-traffic could see.
        self.keeping.store(true, Ordering::Relaxed);
    }

    /// Records that `worker` completed the loop of `delivery` to `target`, run on `payload`.
    pub fn ran(
        &self,
        worker: WorkerId,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
    ) {
        // Relaxed: see `keep`.
        if !self.keeping.load(Ordering::Relaxed) {
            return;
        }
        let ran = Ran {
            worker,
            body: payload.map(|p| digest(p.body())),
        };
        self.by_delivery
            .entry((target.clone(), delivery.clone()))
            .or_default()
            .push(ran);
    }

    /// The completed loops of `delivery` to `target`, in the order they were recorded.
    pub fn of(&self, target: &Target, delivery: &DeliveryId) -> Vec<Ran> {
        self.by_delivery
            .get(&(target.clone(), delivery.clone()))
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Every delivery's completed loops (a copy).
    pub fn all(&self) -> Vec<(Target, DeliveryId, Vec<Ran>)> {
        self.by_delivery
            .iter()
            .map(|e| (e.key().0.clone(), e.key().1.clone(), e.value().clone()))
            .collect()
    }
}

/// The SHA-256 of `body`.
pub fn digest(body: &[u8]) -> BodyDigest {
    Sha256::digest(body).into()
}
