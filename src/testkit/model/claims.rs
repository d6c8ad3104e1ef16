//! Claims: duplicates, bare claims, release and completion (fenced or not).

use super::{wall, Key, MClaim, Model, Standing};
use crate::api::error::RegistryError;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{Admission, AlreadyClaimed, ClaimOutcome, ClaimState, Rejection};
use crate::api::payload::Payload;
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

    /// Records a new claim on `key` (with `payload`), replacing a released or forgotten one (and
    /// whatever payload it held).
    fn put_claim(&mut self, key: Key, holder: Option<WorkerId>, payload: Option<Payload>) {
        let claim = MClaim {
            holder,
            payload,
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

    pub(crate) fn admit_with(
        &mut self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
    ) -> Result<Admission, RegistryError> {
        // Bad input first, duplicate or not.
        if let Some(p) = payload.filter(|p| p.size() > self.config.max_payload_bytes()) {
            self.counts.payloads_too_large += 1;
            return Err(RegistryError::PayloadTooLarge {
                size: p.size(),
                limit: self.config.max_payload_bytes(),
            });
        }
        let out = match self.admit_unparked(target, delivery, true, payload, false) {
            // A refusal for the budget is never parked.
            Admission::Rejected(r) if !matches!(r, Rejection::PayloadBudget { .. }) => {
                self.park(target, delivery, r, payload)
            }
            other => other,
        };
        // A parked admission is not a rejection.
        if let Admission::Rejected(r) = &out {
            self.count_rejection(r);
        }
        Ok(out)
    }

    /// `admit` without the waiting room; with `defer`, no worker is created while targets wait
    /// for capacity. A `payload` not yet counted (`counted` false: a parked one was counted when
    /// it was parked) must fit the budget, the payload of a released claim it replaces counting
    /// as room; a pair that waits is a duplicate even then.
    pub(super) fn admit_unparked(
        &mut self,
        target: &Target,
        delivery: &DeliveryId,
        defer: bool,
        payload: Option<&Payload>,
        counted: bool,
    ) -> Admission {
        let key = (target.clone(), delivery.clone());
        if let Some(dup) = self.duplicate(&key) {
            self.counts.duplicates += 1;
            return Admission::Duplicate(dup);
        }
        let credit = self
            .claims
            .get(&key)
            .and_then(|c| c.payload.as_ref())
            .map_or(0, Payload::size);
        if let Some(refusal) = payload
            .filter(|_| !counted)
            .and_then(|p| self.over_budget(p, credit))
        {
            if let Some(at) = self.waits_since(target, delivery) {
                self.counts.duplicates += 1;
                return Admission::Duplicate(AlreadyClaimed::new(
                    None,
                    wall(at),
                    ClaimState::Waiting,
                ));
            }
            return Admission::Rejected(refusal);
        }
        match self.place(target, defer) {
            Ok(a) => {
                self.put_claim(key, Some(a.worker), payload.cloned());
                Admission::Assigned(a)
            }
            // No claim is left behind (a released or forgotten one stays as it was).
            Err(r) => Admission::Rejected(r),
        }
    }

    /// The refusal for `p` if the payloads held, less `credit` (what the same step frees), plus
    /// its size would pass the budget.
    pub(super) fn over_budget(&self, p: &Payload, credit: u64) -> Option<Rejection> {
        let (_, held) = self.payloads_held();
        let limit = self.config.payload_budget();
        (held + p.size() - credit > limit).then_some(Rejection::PayloadBudget {
            held,
            needed: p.size(),
            limit,
        })
    }

    /// The payload stored with the pair: its claim's while in flight, else the parked
    /// delivery's, else a released claim's not yet handed over.
    pub(crate) fn payload(&self, target: &Target, delivery: &DeliveryId) -> Option<Payload> {
        let key = (target.clone(), delivery.clone());
        let claim = self.claims.get(&key);
        if let Some(c) = claim.filter(|c| self.standing(c) == Standing::InFlight) {
            return c.payload.clone();
        }
        if let Some(waiting) = self.waiting_payload(target, delivery) {
            return waiting;
        }
        claim.and_then(|c| c.payload.clone())
    }

    pub(crate) fn claim(&mut self, target: &Target, delivery: &DeliveryId) -> ClaimOutcome {
        let key = (target.clone(), delivery.clone());
        if let Some(dup) = self.duplicate(&key) {
            self.counts.duplicates += 1;
            return ClaimOutcome::AlreadyClaimed(dup);
        }
        // A parked pair is claimed already (`admit`'s duplicate check): it stays parked.
        if let Some(at) = self.waits_since(target, delivery) {
            self.counts.duplicates += 1;
            return ClaimOutcome::AlreadyClaimed(AlreadyClaimed::new(
                None,
                wall(at),
                ClaimState::Waiting,
            ));
        }
        self.put_claim(key, None, None);
        ClaimOutcome::Claimed
    }

    pub(crate) fn release(
        &mut self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<(), RegistryError> {
        let key = (target.clone(), delivery.clone());
        let unknown = || RegistryError::unknown_claim(target, delivery);
        let c = self.claims.get(&key).ok_or_else(unknown)?;
        match self.standing(c) {
            Standing::Completed => Err(RegistryError::claim_completed(target, delivery)),
            // Forgotten (its retention ended): there is no claim, whether or not a sweep has
            // counted it yet.
            Standing::Expired => Err(unknown()),
            Standing::InFlight | Standing::Released(_) => {
                self.claims.remove(&key);
                Ok(())
            }
        }
    }

    pub(crate) fn complete_as(
        &mut self,
        by: Option<WorkerId>,
        target: &Target,
        delivery: &DeliveryId,
    ) -> Result<(), RegistryError> {
        let key = (target.clone(), delivery.clone());
        let unknown = || RegistryError::unknown_claim(target, delivery);
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
                let c = self.claims.get_mut(&key).expect("looked up");
                c.completed_at = Some(now);
                // The work is done: its payload goes.
                c.payload = None;
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
