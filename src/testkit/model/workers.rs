//! Workers: creation under the capacity limit, placement, heartbeats, loops, drain, exits.

use std::time::Duration;

use super::{token, wall_origin, MWorker, Model};
use crate::api::error::RegistryError;
use crate::api::events::Event;
use crate::api::ids::{Target, WorkerId};
use crate::api::outcome::{AssignOutcome, Assignment, DrainAll, HeartbeatAck, Rejection};
use crate::api::snapshot::WorkerInfo;
use crate::api::status::{DeadReason, Status};
use crate::clock::millis;

impl Model {
    /// A known (not purged) worker.
    fn known(&self, id: WorkerId) -> Result<&MWorker, RegistryError> {
        self.workers
            .get(&id)
            .filter(|w| !w.purged)
            .ok_or(RegistryError::UnknownWorker { id })
    }

    /// A known, live worker.
    fn alive(&self, id: WorkerId) -> Result<&MWorker, RegistryError> {
        let w = self.known(id)?;
        match w.status {
            Status::Dead(reason) => Err(RegistryError::WorkerDead { id, reason }),
            _ => Ok(w),
        }
    }

    pub(super) fn worker_mut(&mut self, id: WorkerId) -> &mut MWorker {
        self.workers.get_mut(&id).expect("a worker the model knows")
    }

    /// Creates a worker if fewer than `max_workers` are alive.
    fn create(&mut self, target: Option<Target>, busy: bool) -> Result<WorkerId, RegistryError> {
        let limit = self.config.max_workers();
        if target.as_ref().is_some_and(|t| self.owner_full(t)) {
            let cap = self.config.max_workers_per_owner();
            return Err(RegistryError::Rejected(Rejection::CapacityFull {
                limit: cap,
            }));
        }
        if self.live >= limit {
            return Err(RegistryError::Rejected(Rejection::CapacityFull { limit }));
        }
        let raw = self.next_id;
        self.next_id += 1;
        if raw > WorkerId::MAX {
            return Err(RegistryError::IdsExhausted);
        }
        let id = WorkerId::new(raw);
        let now = self.ms();
        self.workers.insert(
            id,
            MWorker {
                id,
                target: target.clone(),
                started_at: wall_origin() + self.now,
                started_ms: now,
                status: Status::Active,
                busy,
                suspect: false,
                beaten: false,
                ts: now,
                suspect_since: None,
                died_at: None,
                drain_deadline: None,
                assignments: u64::from(busy),
                purged: false,
            },
        );
        self.live += 1;
        if let Some(t) = &target {
            self.targets.insert(t.clone(), id);
        }
        self.events
            .send(|| Event::WorkerCreated { worker: id, target });
        Ok(id)
    }

    /// A worker dies: its slot is freed, its target unmapped, the death counted and published.
    /// (Its in-flight claims are released by that: see `standing`.)
    pub(super) fn kill(&mut self, id: WorkerId, reason: DeadReason) {
        let now = self.ms();
        let w = self.worker_mut(id);
        debug_assert!(!w.dead());
        w.status = Status::Dead(reason);
        w.suspect = false;
        w.died_at = Some(now);
        let target = w.target.clone();
        self.live -= 1;
        if let Some(t) = &target {
            if self.targets.get(t) == Some(&id) {
                self.targets.remove(t);
            }
        }
        match reason {
            DeadReason::MissedHeartbeats => self.counts.deaths_missed_heartbeats += 1,
            DeadReason::Exited => self.counts.deaths_exited += 1,
            DeadReason::Deregistered => self.counts.deaths_deregistered += 1,
            DeadReason::DrainTimedOut => self.counts.deaths_drain_timed_out += 1,
        }
        self.events.send(|| Event::WorkerDied {
            worker: id,
            target,
            reason,
        });
        self.after_death(id);
    }

    /// A transition of a live worker; `f` changes it and says whether it dies (and why).
    fn transition(
        &mut self,
        id: WorkerId,
        f: impl FnOnce(&mut MWorker) -> Option<DeadReason>,
    ) -> Result<Status, RegistryError> {
        self.alive(id)?;
        let w = self.worker_mut(id);
        let before = w.status;
        let dies = f(w);
        if before != Status::Draining && w.status == Status::Draining {
            let target = w.target.clone();
            self.events
                .send(|| Event::WorkerDraining { worker: id, target });
        }
        if let Some(reason) = dies {
            self.kill(id, reason);
        }
        Ok(self.workers[&id].status)
    }

    /// Places `target`: its active worker, not while it drains, else a new one if capacity allows
    /// (and, with `defer`, no target waits for capacity: they come first). Counts admissions;
    /// the caller counts a refusal it answers ([`count_rejection`](Self::count_rejection)).
    pub(super) fn place(&mut self, target: &Target, defer: bool) -> Result<Assignment, Rejection> {
        let r = match self.targets.get(target).copied() {
            Some(id) => {
                let w = self.worker_mut(id);
                if w.status == Status::Active {
                    w.busy = true;
                    w.assignments += 1;
                    Ok(Assignment::new(id, token(id, w.assignments), false))
                } else {
                    Err(Rejection::TargetDraining { worker: id })
                }
            }
            None if defer && self.contended() => Err(Rejection::CapacityFull {
                limit: self.config.max_workers(),
            }),
            None => match self.create(Some(target.clone()), true) {
                Ok(id) => Ok(Assignment::new(id, token(id, 1), true)),
                Err(_) => Err(Rejection::CapacityFull {
                    limit: self.config.max_workers(),
                }),
            },
        };
        let c = &mut self.counts;
        match &r {
            Ok(a) if a.new => c.admitted_new += 1,
            Ok(_) => c.admitted_sticky += 1,
            Err(_) => {}
        }
        r
    }

    /// Counts a refusal answered to the caller.
    pub(super) fn count_rejection(&mut self, r: &Rejection) {
        match r {
            Rejection::CapacityFull { .. } => self.counts.rejected_capacity += 1,
            Rejection::PayloadBudget { .. } => self.counts.rejected_payload_budget += 1,
            _ => self.counts.rejected_draining += 1,
        }
    }

    pub(crate) fn assign(&mut self, target: &Target) -> AssignOutcome {
        match self.place(target, true) {
            Ok(a) => AssignOutcome::Assigned(a),
            Err(r) => {
                self.count_rejection(&r);
                AssignOutcome::Rejected(r)
            }
        }
    }

    pub(crate) fn heartbeat(&mut self, id: WorkerId) -> Result<HeartbeatAck, RegistryError> {
        if let Err(e) = self.alive(id) {
            self.counts.heartbeats_refused += 1;
            return Err(e);
        }
        let now = self.ms();
        let w = self.worker_mut(id);
        w.ts = w.ts.max(now);
        w.beaten = true;
        w.suspect = false;
        let ack = if w.status == Status::Active {
            HeartbeatAck::Active
        } else {
            HeartbeatAck::Draining
        };
        self.counts.heartbeats += 1;
        Ok(ack)
    }

    pub(crate) fn loop_started(&mut self, id: WorkerId) -> Result<Status, RegistryError> {
        self.transition(id, |w| {
            w.busy = true;
            None
        })
    }

    pub(crate) fn loop_finished(&mut self, id: WorkerId) -> Result<Status, RegistryError> {
        self.transition(id, |w| {
            w.busy = false;
            (w.status == Status::Draining).then_some(DeadReason::Exited)
        })
    }

    pub(crate) fn drain_within(
        &mut self,
        id: WorkerId,
        deadline: Duration,
    ) -> Result<Status, RegistryError> {
        let at = self.ms().saturating_add(millis(deadline));
        self.transition(id, |w| match w.status {
            Status::Active if !w.busy => Some(DeadReason::Exited),
            _ => {
                w.status = Status::Draining;
                // Draining again keeps the earlier deadline.
                w.drain_deadline = Some(w.drain_deadline.map_or(at, |d| d.min(at)));
                None
            }
        })
    }

    pub(crate) fn drain_all_within(&mut self, deadline: Duration) -> DrainAll {
        let live: Vec<WorkerId> = self
            .workers
            .values()
            .filter(|w| !w.purged && !w.dead())
            .map(|w| w.id)
            .collect();
        let mut out = DrainAll::default();
        for id in live {
            match self.drain_within(id, deadline) {
                Ok(Status::Draining) => out.draining += 1,
                Ok(Status::Dead(_)) => out.exited += 1,
                _ => {}
            }
        }
        out
    }

    pub(crate) fn register(&mut self) -> Result<WorkerId, RegistryError> {
        self.create(None, false)
    }

    pub(crate) fn deregister(&mut self, id: WorkerId) -> Result<DeadReason, RegistryError> {
        let mut reason = DeadReason::Deregistered;
        self.transition(id, |w| {
            if w.status == Status::Draining {
                reason = DeadReason::Exited;
            }
            w.busy = false;
            Some(reason)
        })?;
        Ok(reason)
    }

    pub(crate) fn worker(&self, id: WorkerId) -> Option<WorkerInfo> {
        self.known(id).ok().map(|w| w.info(self.ms()))
    }
}
