//! A worker's life: heartbeats, loop reports, drain, registration and exit, and the bookkeeping
//! of a death.

use std::time::Duration;

use super::handle::WorkerHandle;
use super::record::{dead_error, WorkerRecord};
use super::Direct;
use crate::api::error::RegistryError;
use crate::api::ids::WorkerId;
use crate::api::outcome::{DrainAll, HeartbeatAck};
use crate::api::snapshot::WorkerInfo;
use crate::api::status::{DeadReason, Status};
use crate::clock::{millis, Clock};
use crate::state::{self, IsDead, Word};
use crate::sync::{Arc, Ordering};

impl<C: Clock> Direct<C> {
    /// Bookkeeping after the CAS that killed `rec` (called exactly once, by that CAS's winner): free
    /// the capacity slot, unmap the target, count the death, let the waiting have the room (at
    /// once with `promote`; a sweep passes `false` and promotes once at its end).
    pub(crate) fn on_death(
        &self,
        rec: &Arc<WorkerRecord>,
        reason: DeadReason,
        now: u64,
        promote: bool,
    ) {
        rec.record_death(now);
        if rec.holds_claims() {
            // Its in-flight claims are released from now on: the next sweep must visit the claims
            // to report them. Release: pairs with the sweep's AcqRel swap.
            self.inner.claims_due.store(1, Ordering::Release);
        }
        // AcqRel: see `create_worker`.
        self.inner.live.fetch_sub(1, Ordering::AcqRel);
        if let Some(t) = &rec.target {
            self.inner
                .targets
                .remove_if(t, |mapped| Arc::ptr_eq(mapped, rec));
            self.owner_leave(t);
        }
        self.inner.counters.death(reason).inc();
        self.inner.events.died(rec, reason);
        // Room appeared: the waiting come first.
        self.after_death(rec, promote);
    }

    /// Records a heartbeat (AC4). Tells a live worker whether it is active or draining; refuses a dead
    /// one (it has been fenced: its target may already be on another worker) and an unknown id.
    ///
    /// **Locking behaviour:** one workers-shard read lock and one CAS; no allocation.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{HeartbeatAck, memory::Direct};
    ///
    /// let registry = Direct::default();
    /// let w = registry.register().unwrap();
    /// assert_eq!(registry.heartbeat(w.id()), Ok(HeartbeatAck::Active));
    /// ```
    #[inline]
    pub fn heartbeat(&self, id: WorkerId) -> Result<HeartbeatAck, RegistryError> {
        let now = self.now_ms();
        // The closure returns a small value (the error, which is large, is built outside, cold).
        match self
            .inner
            .workers
            .get_with(&id, |rec| Self::beat_word(rec, now))
        {
            Some(Ok(ack)) => {
                self.inner.counters.heartbeats.inc();
                Ok(ack)
            }
            Some(Err(w)) => Err(self.refused(dead_error(id, w))),
            None => Err(self.refused(RegistryError::UnknownWorker { id })),
        }
    }

    /// One heartbeat on `rec`'s word: the ack, or the dead word that refused it.
    #[inline]
    pub(super) fn beat_word(rec: &WorkerRecord, now: u64) -> Result<HeartbeatAck, Word> {
        match rec.state.transition(|w| state::beat(w, now)) {
            Ok((_, w)) if w.is_active() => Ok(HeartbeatAck::Active),
            Ok(_) => Ok(HeartbeatAck::Draining),
            Err(IsDead(w)) => Err(w),
        }
    }

    /// Counts a refused heartbeat and passes its error on.
    #[cold]
    pub(super) fn refused(&self, e: RegistryError) -> RegistryError {
        self.inner.counters.heartbeats_refused.inc();
        e
    }

    pub(super) fn record(&self, id: WorkerId) -> Result<Arc<WorkerRecord>, RegistryError> {
        self.inner
            .workers
            .get_with(&id, Arc::clone)
            .ok_or(RegistryError::UnknownWorker { id })
    }

    /// Applies a transition to `rec`, doing the death bookkeeping if it killed the worker.
    pub(super) fn apply(
        &self,
        rec: &Arc<WorkerRecord>,
        f: impl FnMut(Word) -> Result<Word, IsDead>,
    ) -> Result<Status, RegistryError> {
        self.apply_in(rec, f, true)
    }

    /// [`apply`](Self::apply); a death promotes waiting deliveries at once only with `promote`.
    pub(super) fn apply_in(
        &self,
        rec: &Arc<WorkerRecord>,
        f: impl FnMut(Word) -> Result<Word, IsDead>,
        promote: bool,
    ) -> Result<Status, RegistryError> {
        let now = self.now_ms();
        match rec.state.transition(f) {
            Ok((old, new)) => {
                self.inner.events.transition(rec, old, new);
                if let (false, Status::Dead(reason)) = (old.is_dead(), new.status()) {
                    self.on_death(rec, reason, now, promote);
                }
                Ok(new.status())
            }
            Err(IsDead(w)) => Err(dead_error(rec.id, w)),
        }
    }

    /// The worker reports that it started a loop (it is busy).
    ///
    /// **Locking behaviour:** one workers-shard read lock and one CAS.
    pub fn loop_started(&self, id: WorkerId) -> Result<Status, RegistryError> {
        self.apply(&self.record(id)?, state::loop_started)
    }

    /// The worker reports that its loop finished: it becomes idle, or, if it was draining, dead with
    /// reason [`DeadReason::Exited`] (AC5), releasing its target and capacity slot.
    ///
    /// **Locking behaviour:** one workers-shard read lock and one CAS; on exit, one targets-shard
    /// write lock and, while deliveries wait, the waiting room's mutex (to promote into the slot).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{AssignOutcome, DeadReason, memory::Direct, Status, Target};
    ///
    /// let registry = Direct::default();
    /// let AssignOutcome::Assigned(a) = registry.assign(&Target::new("o/r", 1).unwrap()) else { panic!() };
    /// assert_eq!(registry.drain(a.worker), Ok(Status::Draining));
    /// assert_eq!(registry.loop_finished(a.worker), Ok(Status::Dead(DeadReason::Exited)));
    /// ```
    pub fn loop_finished(&self, id: WorkerId) -> Result<Status, RegistryError> {
        self.apply(&self.record(id)?, state::loop_finished)
    }

    /// Sets a worker draining with the configured
    /// [`drain_deadline`](crate::RegistryConfig::drain_deadline) (see
    /// [`WorkerRegistry::drain_within`](crate::WorkerRegistry::drain_within)).
    ///
    /// **Locking behaviour:** one workers-shard read lock and one CAS (and, to record the deadline,
    /// one more atomic read-modify-write on the record).
    pub fn drain(&self, id: WorkerId) -> Result<Status, RegistryError> {
        self.drain_within(id, self.inner.config.drain_deadline())
    }

    /// Sets a worker draining, giving its current loop until `deadline` from now (see
    /// [`WorkerRegistry::drain_within`](crate::WorkerRegistry::drain_within)).
    ///
    /// **Locking behaviour:** as [`drain`](Self::drain).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::{AssignOutcome, memory::Direct, Status, Target};
    ///
    /// let registry = Direct::default();
    /// let AssignOutcome::Assigned(a) = registry.assign(&Target::new("o/r", 1).unwrap()) else { panic!() };
    /// assert_eq!(registry.drain_within(a.worker, Duration::from_secs(5)), Ok(Status::Draining));
    /// assert!(registry.worker(a.worker).unwrap().drain_deadline.is_some());
    /// ```
    pub fn drain_within(&self, id: WorkerId, deadline: Duration) -> Result<Status, RegistryError> {
        self.drain_record(&self.record(id)?, deadline)
    }

    pub(super) fn drain_record(
        &self,
        rec: &Arc<WorkerRecord>,
        deadline: Duration,
    ) -> Result<Status, RegistryError> {
        self.drain_record_in(rec, deadline, true)
    }

    /// [`drain_record`](Self::drain_record); an idle worker's exit promotes at once only with
    /// `promote` (the sweep's drains promote at its end).
    pub(super) fn drain_record_in(
        &self,
        rec: &Arc<WorkerRecord>,
        deadline: Duration,
        promote: bool,
    ) -> Result<Status, RegistryError> {
        let status = self.apply_in(rec, state::drain, promote)?;
        if status == Status::Draining {
            rec.set_drain_deadline(self.now_ms().saturating_add(millis(deadline)));
        }
        Ok(status)
    }

    /// Drains every live worker with the configured drain deadline (router shutdown).
    ///
    /// **Locking behaviour:** as [`drain_all_within`](Self::drain_all_within).
    pub fn drain_all(&self) -> DrainAll {
        self.drain_all_within(self.inner.config.drain_deadline())
    }

    /// Drains every live worker with the given deadline (see
    /// [`WorkerRegistry::drain_all_within`](crate::WorkerRegistry::drain_all_within)): busy ones
    /// drain, idle ones exit at once.
    ///
    /// **Locking behaviour:** visits the workers shard by shard (read locks) to collect them, then
    /// drains each as [`drain`](Self::drain) does, in id order, holding no map lock.
    pub fn drain_all_within(&self, deadline: Duration) -> DrainAll {
        let mut recs = Vec::new();
        self.inner.workers.for_each(|_, rec| {
            if !rec.state.load().is_dead() {
                recs.push(rec.clone());
            }
        });
        // In id order, not the map's: idle workers exit, and each exit promotes waiting
        // deliveries, in this order (as the reference model's).
        recs.sort_unstable_by_key(|rec| rec.id);
        let mut out = DrainAll::default();
        for rec in &recs {
            match self.drain_record(rec, deadline) {
                Ok(Status::Draining) => out.draining += 1,
                Ok(Status::Dead(_)) => out.exited += 1,
                _ => {}
            }
        }
        out
    }

    /// Registers a worker that started by itself and pulls work elsewhere (the worker-pool model).
    /// It has no target and counts against `max_workers`; it shares heartbeats, drain, sweep and
    /// status with spawned workers. Its deadline starts now, with the start-up grace.
    ///
    /// **Locking behaviour:** one CAS on the capacity counter and one workers-shard write lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeadReason, memory::Direct};
    ///
    /// let registry = Direct::default();
    /// let worker = registry.register().unwrap();
    /// worker.heartbeat().unwrap();
    /// assert_eq!(worker.deregister(), Ok(DeadReason::Deregistered));
    /// ```
    pub fn register(&self) -> Result<WorkerHandle<C>, RegistryError> {
        let rec = self.create_worker(None, self.now_ms(), false, false)?;
        Ok(WorkerHandle {
            rec,
            registry: self.clone(),
        })
    }

    /// A clean exit: the worker is dead with reason [`DeadReason::Exited`] if it was draining,
    /// [`DeadReason::Deregistered`] if it was active. Its in-flight claims are released.
    ///
    /// **Locking behaviour:** one workers-shard read lock, one CAS, one targets-shard write lock
    /// and, while deliveries wait, the waiting room's mutex (to promote into the slot).
    pub fn deregister(&self, id: WorkerId) -> Result<DeadReason, RegistryError> {
        match self.apply(&self.record(id)?, state::deregister)? {
            Status::Dead(reason) => Ok(reason),
            // `state::deregister` only returns dead words.
            _ => Err(RegistryError::UnknownWorker { id }),
        }
    }

    /// A handle on a worker for the worker's own calls (heartbeat without a map lookup).
    ///
    /// **Locking behaviour:** one workers-shard read lock.
    pub fn handle(&self, id: WorkerId) -> Result<WorkerHandle<C>, RegistryError> {
        Ok(WorkerHandle {
            rec: self.record(id)?,
            registry: self.clone(),
        })
    }

    /// The current state of one worker, read now (not from the snapshot).
    ///
    /// **Locking behaviour:** one workers-shard read lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{memory::Direct, Status};
    ///
    /// let registry = Direct::default();
    /// let w = registry.register().unwrap();
    /// assert_eq!(registry.worker(w.id()).unwrap().status, Status::Active);
    /// ```
    pub fn worker(&self, id: WorkerId) -> Option<WorkerInfo> {
        let now = self.now_ms();
        let origin = self.inner.wall_origin;
        self.inner
            .workers
            .get_with(&id, |rec| rec.info(rec.state.load(), now, origin))
    }
}
