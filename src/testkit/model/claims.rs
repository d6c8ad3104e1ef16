//! Claims: duplicates, bare claims, release and completion (fenced or not).

use super::{wall, Key, MClaim, Model, Standing};
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{Admission, AlreadyClaimed, ClaimOutcome, ClaimState};
use crate::api::report::ReleaseReason;
use crate::api::status::Status;
use crate::clock::millis;

impl Model {
    pub(super) fn standing(&self, c: &MClaim) -> Standing {
        let now = self.ms();
        if c.stuck {
            return Standing::Released(ReleaseReason::Stuck);
        }
        if let Some(done) = c.completed_at {
            return if now.saturating_sub(done) > millis(self.config.claim_retention()) {
                Standing::Expired
            } else {
                Standing::Completed
            };
        }
        match c.holder.map(|id| self.workers[&id].status) {
            Some(Status::Dead(reason)) => Standing::Released(ReleaseReason::WorkerDied(reason)),
            Some(_) => Standing::InFlight,
            None if now.saturating_sub(c.claimed_at) > self.timeout_ms() => {
                Standing::Released(ReleaseReason::Unbound)
            }
            None => Standing::InFlight,
        }
    }

    /// The claim that makes this pair a duplicate now, if any.
    fn duplicate(&self, key: &Key) -> Option<AlreadyClaimed> {
        let c = self.claims.get(key)?;
        let state = match self.standing(c) {
            Standing::InFlight => ClaimState::InFlight,
            Standing::Completed => ClaimState::Completed,
            Standing::Released(_) | Standing::Expired => return None,
        };
        // In flight on a live worker that never heartbeated: its start may have been lost.
        let unstarted = state == ClaimState::InFlight
            && c.holder.is_some_and(|id| {
                let w = &self.workers[&id];
                !w.beaten && !matches!(w.status, Status::Dead(_))
            });
        Some(AlreadyClaimed::new(c.holder, wall(c.claimed_at), state).with_unstarted(unstarted))
    }

    /// Records a new claim on `key`, replacing a released or forgotten one.
    fn put_claim(&mut self, key: Key, holder: Option<WorkerId>) {
        let claim = MClaim {
            holder,
            claimed_at: self.ms(),
            completed_at: None,
            stuck: false,
        };
        if let Some(old) = self.claims.insert(key, claim) {
            if old.completed_at.is_some() {
                self.retained -= 1;
            }
        }
    }

    pub(crate) fn admit(&mut self, target: &Target, delivery: &DeliveryId) -> Admission {
        let out = match self.admit_unparked(target, delivery, true) {
            Admission::Rejected(r) => self.park(target, delivery, r),
            other => other,
        };
        // A parked admission is not a rejection.
        if let Admission::Rejected(r) = &out {
            self.count_rejection(r);
        }
        out
    }

    /// `admit` without the waiting room; with `defer`, no worker is created while targets wait
    /// for capacity.
    pub(super) fn admit_unparked(
        &mut self,
        target: &Target,
        delivery: &DeliveryId,
        defer: bool,
    ) -> Admission {
        let key = (target.clone(), delivery.clone());
        if let Some(dup) = self.duplicate(&key) {
            self.counts.duplicates += 1;
            return Admission::Duplicate(dup);
        }
        match self.place(target, defer) {
            Ok(a) => {
                self.put_claim(key, Some(a.worker));
                Admission::Assigned(a)
            }
            // No claim is left behind (a released or forgotten one stays as it was).
            Err(r) => Admission::Rejected(r),
        }
    }

    pub(crate) fn claim(&mut self, target: &Target, delivery: &DeliveryId) -> ClaimOutcome {
        let key = (target.clone(), delivery.clone());
        if let Some(dup) = self.duplicate(&key) {
            self.counts.duplicates += 1;
            return ClaimOutcome::AlreadyClaimed(dup);
        }
        self.put_claim(key, None);
        ClaimOutcome::Claimed
    }

    pub(crate) fn release(
        &mut self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<(), RegistryError> {
        let key = (target.clone(), delivery.clone());
        let unknown = || RegistryError::UnknownClaim {
            target: target.clone(),
            delivery: delivery.clone(),
        };
        let c = self.claims.get(&key).ok_or_else(unknown)?;
        match self.standing(c) {
            Standing::Completed => Err(RegistryError::ClaimCompleted {
                target: target.clone(),
                delivery: delivery.clone(),
            }),
            // Forgotten (its retention ended): there is no claim, whether or not a sweep has
            // counted it yet.
            Standing::Expired => Err(unknown()),
            Standing::InFlight | Standing::Released(_) => {
                self.claims.remove(&key);
                Ok(())
            }
        }
    }

    pub(crate) fn complete(
        &mut self,
        target: &Target,
        delivery: &DeliveryId,
        by: Option<WorkerId>,
    ) -> Result<(), RegistryError> {
        let key = (target.clone(), delivery.clone());
        let unknown = || RegistryError::UnknownClaim {
            target: target.clone(),
            delivery: delivery.clone(),
        };
        let c = self.claims.get(&key).ok_or_else(unknown)?;
        let holder = c.holder;
        if let Some(worker) = by.filter(|w| holder != Some(*w)) {
            return Err(RegistryError::NotHolder {
                target: target.clone(),
                delivery: delivery.clone(),
                holder,
                worker,
            });
        }
        match self.standing(c) {
            Standing::Completed => Ok(()),
            Standing::InFlight => {
                let now = self.ms();
                self.claims.get_mut(&key).expect("looked up").completed_at = Some(now);
                self.retained += 1;
                self.counts.claims_completed += 1;
                Ok(())
            }
            Standing::Released(reason) => Err(RegistryError::ClaimReleased {
                target: target.clone(),
                delivery: delivery.clone(),
                holder,
                reason,
            }),
            Standing::Expired => Err(unknown()),
        }
    }

    /// Claims in the map (in flight, retained, and released or expired but not yet swept).
    pub(crate) fn claim_count(&self) -> usize {
        self.claims.len()
    }
}
