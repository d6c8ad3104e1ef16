//! LOOM TWINS ONLY: deliberately broken variants of the registry's atomic steps.
//!
//! Compiled only under `--cfg worker_registry_loom`; a normal build contains neither this module nor
//! the hooks that consult it. Each [`Fault`] removes one guard (a CAS, an entry-API critical
//! section, a single publication), and the loom model that checks the invariant that guard protects
//! has a must-fail twin that injects the fault and expects loom to find a violation (see
//! `loom-tests/`). A model that cannot fail is not a model.
//!
//! Faults are per registry and injected before the model's threads start, so models running on
//! parallel test threads never see each other's faults.

use std::sync::atomic::{AtomicU32, Ordering as StdOrdering};

use super::claims::{Claim, ClaimKey, ClaimKeyRef, Standing};
use super::record::WorkerRecord;
use super::InMemoryRegistry;
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target};
use crate::api::outcome::{Admission, Assignment, ClaimOutcome, Rejection};
use crate::api::snapshot::{StatusCounts, StatusSnapshot};
use crate::clock::Clock;
use crate::sync::{Arc, Op, Ordering};

/// A deliberate bug that a loom twin injects into one registry (loom builds only).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// `admit`/`claim`: look the claim up, then insert it under a second lock (no entry API).
    ClaimCheckThenInsert,
    /// `assign`: a target with no worker gets one created and inserted outside the shard lock that
    /// looked it up (no entry API).
    TargetCheckThenInsert,
    /// Capacity: load the live count and compare, then increment (no single `fetch_update`).
    CapacityCheckThenIncrement,
    /// `StateCell::transition`: load, apply, store (no compare-and-swap). Applies to the workers
    /// created after it is injected.
    TransitionLoadStore,
    /// `complete`: decide under one claims-shard lock, write the completion under a second one.
    CompleteCheckThenWrite,
    /// `sweep`: the snapshot's counts come from a second pass over the workers, not from its list.
    SnapshotCountsSecondPass,
    /// `sweep`: publish the snapshot after releasing the sweep mutex.
    PublishOutsideSweepLock,
}

impl Fault {
    fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// The faults injected into one registry.
#[derive(Default)]
pub(crate) struct Faults(AtomicU32);

impl Faults {
    /// Whether `fault` is injected. Relaxed on a std atomic: faults are set before the model's
    /// threads are spawned (loom's spawn orders it) and never change after; it adds no loom state.
    #[inline]
    pub(crate) fn on(&self, fault: Fault) -> bool {
        self.0.load(StdOrdering::Relaxed) & fault.bit() != 0
    }
}

impl<C: Clock> InMemoryRegistry<C> {
    /// LOOM TWINS ONLY: break this registry on purpose (see [`Fault`]). Call before starting threads.
    #[doc(hidden)]
    pub fn inject_fault(&self, fault: Fault) {
        // Relaxed: see `Faults::on`.
        self.inner
            .faults
            .0
            .fetch_or(fault.bit(), StdOrdering::Relaxed);
    }

    /// LOOM MODELS ONLY: the claims-map shard of this (target, event), so a model can pick keys in
    /// distinct shards (keys in one shard serialise on its lock and cannot race).
    #[doc(hidden)]
    pub fn claims_shard_of(&self, target: &Target, event: &DeliveryId) -> usize {
        let key: &dyn ClaimKeyRef = &(target, event);
        self.inner.claims.shard_of(key)
    }

    /// LOOM MODELS ONLY: the targets-map shard of this target (see `claims_shard_of`).
    #[doc(hidden)]
    pub fn targets_shard_of(&self, target: &Target) -> usize {
        self.inner.targets.shard_of(target)
    }

    /// BROKEN ON PURPOSE (`ClaimCheckThenInsert`): the caller looked the claim up and found none;
    /// assign and insert without looking again, so a concurrent delivery of the same pair also wins.
    pub(super) fn admit_check_then_insert(
        &self,
        target: &Target,
        event: &DeliveryId,
        now: u64,
    ) -> Admission {
        match self.assign_at(target, now, true) {
            Ok((assignment, holder)) => {
                let claim = Claim {
                    holder,
                    claimed_at: now,
                    completed_at: None,
                };
                self.inner.claims.insert(key(target, event), claim);
                Admission::Assigned(assignment)
            }
            Err(rejection) => Admission::Rejected(rejection),
        }
    }

    /// BROKEN ON PURPOSE (`ClaimCheckThenInsert`): as `admit_check_then_insert`, for a bare claim.
    pub(super) fn claim_check_then_insert(
        &self,
        target: &Target,
        event: &DeliveryId,
        now: u64,
    ) -> ClaimOutcome {
        let claim = Claim {
            holder: None,
            claimed_at: now,
            completed_at: None,
        };
        self.inner.claims.insert(key(target, event), claim);
        ClaimOutcome::Claimed
    }

    /// BROKEN ON PURPOSE (`TargetCheckThenInsert`): the caller's lookup found no usable worker;
    /// create one and map it without looking again, so two callers may each create one.
    pub(super) fn assign_check_then_insert(
        &self,
        target: &Target,
        now: u64,
        want_holder: bool,
    ) -> Result<(Assignment, Option<Arc<WorkerRecord>>), Rejection> {
        let rec = self
            .create_worker(Some(target.clone()), now, true)
            .map_err(|_| Rejection::CapacityFull {
                limit: self.inner.config.max_workers(),
            })?;
        self.inner.targets.insert(target.clone(), rec.clone());
        let a = Assignment {
            worker: rec.id,
            token: rec.token(),
            new: true,
        };
        Ok((a, want_holder.then_some(rec)))
    }

    /// BROKEN ON PURPOSE (`CapacityCheckThenIncrement`): checks the live count with a plain load.
    /// Returns `Ok(true)` when the caller must then increment unconditionally, `Ok(false)` when the
    /// fault is off (the caller reserves with its single `fetch_update`).
    pub(super) fn capacity_check_only(&self, limit: usize) -> Result<bool, RegistryError> {
        if !self.inner.faults.on(Fault::CapacityCheckThenIncrement) {
            return Ok(false);
        }
        // Acquire: as the real reservation's load; only atomicity is removed.
        if self.inner.live.load(Ordering::Acquire) >= limit {
            return Err(RegistryError::Rejected(Rejection::CapacityFull { limit }));
        }
        Ok(true)
    }

    /// Marks a new record's state cell racy if `TransitionLoadStore` is injected.
    pub(super) fn fault_prepare_record(&self, rec: &WorkerRecord) {
        if self.inner.faults.on(Fault::TransitionLoadStore) {
            rec.state.make_racy();
        }
    }

    /// BROKEN ON PURPOSE (`CompleteCheckThenWrite`): decides from a read-locked look at the claim,
    /// then writes the completion under a second lock without deciding again; if the claim was
    /// released (and reported for re-dispatch) in between, it still answers `Ok`.
    pub(super) fn complete_check_then_write(
        &self,
        target: &Target,
        event: &DeliveryId,
        now: u64,
    ) -> Result<(), RegistryError> {
        let l = &self.inner.limits;
        let k: &dyn ClaimKeyRef = &(target, event);
        let seen = self.inner.claims.get_with(k, |c| {
            (
                c.standing(now, l.claim_retention_ms, l.timeout_ms),
                c.holder.clone(),
            )
        });
        match seen {
            Some((Standing::InFlight, _)) => {
                self.inner.claims.update(key(target, event), |slot| {
                    if let Some(c) = slot {
                        c.completed_at = Some(now);
                        // AcqRel: as in `complete`.
                        self.inner.retained.fetch_add(1, Ordering::AcqRel);
                    }
                    (Op::Keep, ())
                });
                Ok(())
            }
            Some((Standing::Completed, _)) => Ok(()),
            Some((Standing::Released(reason), holder)) => Err(RegistryError::ClaimReleased {
                target: target.clone(),
                delivery: event.clone(),
                holder: holder.map(|h| h.id),
                reason,
            }),
            Some((Standing::Expired, _)) | None => Err(RegistryError::UnknownClaim {
                target: target.clone(),
                delivery: event.clone(),
            }),
        }
    }

    /// BROKEN ON PURPOSE (`SnapshotCountsSecondPass`): recounts the snapshot from a second read of
    /// every worker's state, so the counts can disagree with the list they are published with.
    pub(crate) fn fault_recount(&self, mut s: StatusSnapshot) -> StatusSnapshot {
        if !self.inner.faults.on(Fault::SnapshotCountsSecondPass) {
            return s;
        }
        let (now, origin) = (self.now_ms(), self.inner.wall_origin);
        let mut again = Vec::new();
        self.inner
            .workers
            .for_each(|_, rec| again.push(rec.info(rec.state.load(), now, origin)));
        s.counts = StatusCounts::of(&again);
        s.capacity.used = s.counts.active + s.counts.draining;
        s
    }

    /// BROKEN ON PURPOSE (`PublishOutsideSweepLock`): drops the sweep mutex before the snapshot is
    /// published, so two sweeps may publish their generations out of order.
    pub(crate) fn fault_unlock_before_publish<G>(&self, guard: G) -> Option<G> {
        if self.inner.faults.on(Fault::PublishOutsideSweepLock) {
            drop(guard);
            return None;
        }
        Some(guard)
    }
}

fn key(target: &Target, event: &DeliveryId) -> ClaimKey {
    ClaimKey {
        target: target.clone(),
        event: event.clone(),
    }
}
