//! Claims: which (target, delivery) pairs are being handled or were handled recently.
//!
//! The claims map is keyed by `(Target, EventId)`. Looking a pair up must not allocate (the
//! redelivery path is hot), yet the map owns its keys, so lookups borrow the key as
//! `dyn ClaimKeyRef`: a pair of references hashes and compares exactly like the owned key.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::time::SystemTime;

use crate::ids::{EventId, Target, WorkerId};
use crate::sync::Arc;
use crate::worker::WorkerRecord;

/// The owned key of a claim.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ClaimKey {
    pub(crate) target: Target,
    pub(crate) event: EventId,
}

/// Anything that can stand for a claim key in a lookup.
pub(crate) trait ClaimKeyRef {
    fn target(&self) -> &Target;
    fn event(&self) -> &EventId;
}

impl ClaimKeyRef for ClaimKey {
    fn target(&self) -> &Target {
        &self.target
    }
    fn event(&self) -> &EventId {
        &self.event
    }
}

impl ClaimKeyRef for (&Target, &EventId) {
    fn target(&self) -> &Target {
        self.0
    }
    fn event(&self) -> &EventId {
        self.1
    }
}

impl<'a> Borrow<dyn ClaimKeyRef + 'a> for ClaimKey {
    fn borrow(&self) -> &(dyn ClaimKeyRef + 'a) {
        self
    }
}

impl Hash for dyn ClaimKeyRef + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.target().hash(state);
        self.event().hash(state);
    }
}

impl PartialEq for dyn ClaimKeyRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.target() == other.target() && self.event() == other.event()
    }
}

impl Eq for dyn ClaimKeyRef + '_ {}

impl Hash for ClaimKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Must hash exactly as the borrowed form does.
        (self as &dyn ClaimKeyRef).hash(state);
    }
}

/// One claim. Mutated only under its map shard's write lock, so its fields are plain.
pub(crate) struct Claim {
    /// The worker handling it; `None` for a bare [`claim`](crate::Registry::claim) not yet bound.
    pub(crate) holder: Option<Arc<WorkerRecord>>,
    pub(crate) claimed_at: u64,
    pub(crate) completed_at: Option<u64>,
}

/// Where a claim stands at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Its worker is alive and it is not completed: a redelivery is a duplicate.
    InFlight,
    /// Completed within the retention window: a redelivery is a duplicate.
    Completed,
    /// Its worker died (or an unbound claim was never picked up): a redelivery runs again.
    Released,
    /// Completed longer ago than the retention window: forgotten.
    Expired,
}

impl Claim {
    pub(crate) fn standing(&self, now_ms: u64, retention_ms: u64, unbound_ms: u64) -> Standing {
        if let Some(done) = self.completed_at {
            return if now_ms.saturating_sub(done) > retention_ms {
                Standing::Expired
            } else {
                Standing::Completed
            };
        }
        match &self.holder {
            Some(rec) if rec.state.load().is_dead() => Standing::Released,
            Some(_) => Standing::InFlight,
            None if now_ms.saturating_sub(self.claimed_at) > unbound_ms => Standing::Released,
            None => Standing::InFlight,
        }
    }
}

/// Whether a claim that blocked a delivery is still running or already done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClaimState {
    /// Being handled by a live worker.
    InFlight,
    /// Completed; remembered so redeliveries are recognised.
    Completed,
}

/// The answer to a delivery that is already being handled, or was handled recently.
///
/// # Examples
///
/// ```
/// use worker_registry::{Admission, ClaimState, EventId, Registry, Target};
///
/// let registry = Registry::default();
/// let (t, e) = (Target::new("o/r", 1).unwrap(), EventId::new("d-1").unwrap());
/// registry.admit(&t, &e);
/// let Admission::Duplicate(dup) = registry.admit(&t, &e) else { panic!() };
/// assert_eq!(dup.state, ClaimState::InFlight);
/// assert!(dup.holder.is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AlreadyClaimed {
    /// The worker handling it (none for a bare claim not yet bound to a worker).
    pub holder: Option<WorkerId>,
    /// When the first delivery was claimed (wall clock, display only).
    pub since: SystemTime,
    /// In flight or completed.
    pub state: ClaimState,
}
