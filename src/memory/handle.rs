//! [`WorkerHandle`]: a worker's own handle on its record, so that its heartbeats skip the map
//! lookup.

use std::fmt;

use super::record::{dead_error, WorkerRecord};
use super::Direct;
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::HeartbeatAck;
use crate::api::snapshot::WorkerInfo;
use crate::api::status::{DeadReason, Status};
use crate::clock::{Clock, SystemClock};
use crate::state;
use crate::sync::Arc;

/// A worker's own handle on its record: heartbeats through it skip the map lookup (one CAS).
///
/// # Examples
///
/// ```
/// use worker_registry::{HeartbeatAck, memory::Direct};
///
/// let registry = Direct::default();
/// let me = registry.register().unwrap();
/// assert_eq!(me.heartbeat(), Ok(HeartbeatAck::Active));
/// registry.drain(me.id()).unwrap(); // idle: exits at once
/// assert!(me.heartbeat().is_err());
/// ```
pub struct WorkerHandle<C: Clock = SystemClock> {
    pub(super) rec: Arc<WorkerRecord>,
    pub(super) registry: Direct<C>,
}

impl<C: Clock> Clone for WorkerHandle<C> {
    fn clone(&self) -> Self {
        Self {
            rec: self.rec.clone(),
            registry: self.registry.clone(),
        }
    }
}

impl<C: Clock> fmt::Debug for WorkerHandle<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("id", &self.rec.id)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> WorkerHandle<C> {
    /// The worker's id.
    pub fn id(&self) -> WorkerId {
        self.rec.id
    }

    /// The worker's target, if it was spawned for one.
    pub fn target(&self) -> Option<&Target> {
        self.rec.target.as_ref()
    }

    /// Heartbeats (see [`Direct::heartbeat`]).
    ///
    /// **Locking behaviour:** no lock: one clock read and one CAS.
    #[inline]
    pub fn heartbeat(&self) -> Result<HeartbeatAck, RegistryError> {
        match Direct::<C>::beat_word(&self.rec, self.registry.now_ms()) {
            Ok(ack) => {
                self.registry.inner.counters.heartbeats.inc();
                Ok(ack)
            }
            Err(w) => Err(self.registry.refused(dead_error(self.rec.id, w))),
        }
    }

    /// See [`Direct::loop_started`].
    pub fn loop_started(&self) -> Result<Status, RegistryError> {
        self.registry.apply(&self.rec, state::loop_started)
    }

    /// See [`Direct::loop_finished`].
    pub fn loop_finished(&self) -> Result<Status, RegistryError> {
        self.registry.apply(&self.rec, state::loop_finished)
    }

    /// Completes a claim this worker holds (see [`Direct::complete_by`]): refused with
    /// [`RegistryError::NotHolder`] if the claim now belongs to another worker.
    pub fn complete(&self, target: &Target, event: &DeliveryId) -> Result<(), RegistryError> {
        self.registry.complete_by(self.rec.id, target, event)
    }

    /// See [`Direct::deregister`].
    pub fn deregister(&self) -> Result<DeadReason, RegistryError> {
        match self.registry.apply(&self.rec, state::deregister)? {
            Status::Dead(reason) => Ok(reason),
            _ => Err(RegistryError::UnknownWorker { id: self.rec.id }),
        }
    }

    /// This worker's current state.
    pub fn info(&self) -> WorkerInfo {
        self.rec.info(
            self.rec.state.load(),
            self.registry.now_ms(),
            self.registry.inner.wall_origin,
        )
    }
}
