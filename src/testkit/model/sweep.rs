//! The maintenance pass: liveness and the brake, drain deadlines, claim release, retention and
//! eviction, purge, publication of the snapshot and of `TargetReleased`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::{wall, Key, MWorker, Model, Standing};
use crate::api::events::Event;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::snapshot::{ClaimCounts, StatusSnapshot};
use crate::api::status::{DeadReason, Status};
use crate::clock::millis;

impl Model {
    fn stale(&self, w: &MWorker) -> bool {
        let mut allowed = self.timeout_ms();
        if !w.beaten {
            allowed = allowed.saturating_add(millis(self.config.startup_grace()));
        }
        !w.dead() && self.ms().saturating_sub(w.ts) > allowed
    }

    pub(crate) fn sweep(&mut self) -> SweepReport {
        let started = Instant::now();
        let now = self.ms();
        let cfg = self.config.clone();
        let mut report = SweepReport {
            swept: true,
            at: self.now,
            ..SweepReport::default()
        };

        // Who is live, who is silent, who is past a drain deadline, who is to be purged.
        let (mut live, mut stale, mut overdue, mut purge) = (0usize, vec![], vec![], vec![]);
        for w in self.workers.values().filter(|w| !w.purged) {
            if w.dead() {
                if w.died_at
                    .is_some_and(|d| now.saturating_sub(d) > millis(cfg.dead_retention()))
                {
                    purge.push(w.id);
                }
                continue;
            }
            live += 1;
            if w.status == Status::Draining && w.drain_deadline.is_some_and(|d| now > d) {
                overdue.push(w.id);
            } else if self.stale(w) {
                stale.push(w.id);
            }
        }

        // The brake: more than `brake_fraction` of at least `brake_min_workers` live workers
        // silent at once suspects the registry, not them. A worker already suspect is judged by
        // its own suspect grace only.
        let brake = live >= cfg.brake_min_workers()
            && stale.len() as f64 > cfg.brake_fraction() * live as f64;
        let mut held = false;
        for id in stale {
            let w = &self.workers[&id];
            if w.suspect {
                let since = w.suspect_since.unwrap_or(now);
                if now.saturating_sub(since) < millis(cfg.suspect_grace()) {
                    held = true;
                    continue;
                }
            } else if brake {
                let w = self.worker_mut(id);
                w.suspect = true;
                w.suspect_since = Some(now);
                let target = w.target.clone();
                self.counts.suspected += 1;
                report.suspected.push(id);
                self.events
                    .send(|| Event::WorkerSuspect { worker: id, target });
                continue;
            }
            self.sweep_kill(id, DeadReason::MissedHeartbeats, &mut report);
        }
        // A drain deadline is the worker's own, whatever the brake says.
        for id in overdue {
            self.worker_mut(id).busy = false;
            self.sweep_kill(id, DeadReason::DrainTimedOut, &mut report);
        }
        report.brake_engaged = held || !report.suspected.is_empty();
        if report.brake_engaged {
            self.counts.brake_engaged += 1;
        }

        // Claims: release those whose worker is dead (or that nobody bound), forget expired ones.
        let mut counts = ClaimCounts::default();
        let keys: Vec<Key> = self.claims.keys().cloned().collect();
        for key in keys {
            let c = &self.claims[&key];
            match self.standing(c) {
                Standing::InFlight => counts.in_flight += 1,
                Standing::Completed => counts.retained += 1,
                Standing::Expired => {
                    self.claims.remove(&key);
                    self.retained -= 1;
                    report.expired_claims += 1;
                }
                Standing::Released(reason) => {
                    let holder = c.holder;
                    self.claims.remove(&key);
                    let (target, delivery) = key;
                    report
                        .released
                        .push(ReleasedEvent::new(target, delivery, holder, reason));
                }
            }
        }
        // The oldest completed claims beyond `max_retained_claims` are evicted.
        if self.retained > cfg.max_retained_claims() {
            let mut done: Vec<(u64, Key)> = self
                .claims
                .iter()
                .filter_map(|(k, c)| c.completed_at.map(|t| (t, k.clone())))
                .collect();
            done.sort();
            for (_, key) in done
                .into_iter()
                .take(self.retained - cfg.max_retained_claims())
            {
                self.claims.remove(&key);
                report.evicted_claims += 1;
            }
            self.retained -= report.evicted_claims;
            counts.retained -= report.evicted_claims;
        }
        for id in &purge {
            self.worker_mut(*id).purged = true;
        }
        report.purged_workers = purge.len();

        let c = &mut self.counts;
        c.claims_released += report.released.len() as u64;
        c.claims_expired += report.expired_claims as u64;
        c.claims_evicted += report.evicted_claims as u64;
        c.workers_purged += report.purged_workers as u64;
        c.sweeps += 1;

        // Publish.
        self.version += 1;
        report.version = self.version;
        let infos = self
            .workers
            .values()
            .filter(|w| !w.purged)
            .map(|w| w.info(now))
            .collect();
        self.snapshot = Arc::new(StatusSnapshot::new(
            self.version,
            wall(now),
            self.now,
            infos,
            cfg.max_workers(),
            report.brake_engaged,
            counts,
        ));
        report.took = started.elapsed();
        self.counts.sweep_durations.observe(report.took);
        self.publish_released(&report);
        report
    }

    fn sweep_kill(&mut self, id: WorkerId, reason: DeadReason, report: &mut SweepReport) {
        self.kill(id, reason);
        report.died.push((id, reason));
        if let Some(t) = &self.workers[&id].target {
            report.released_targets.push(t.clone());
        }
    }

    /// One `TargetReleased` per target the sweep released work on, in target order.
    fn publish_released(&self, report: &SweepReport) {
        if !self.events.has_subscribers() {
            return;
        }
        let mut by_target: BTreeMap<&Target, Vec<DeliveryId>> = BTreeMap::new();
        for t in &report.released_targets {
            by_target.entry(t).or_default();
        }
        for e in &report.released {
            by_target
                .entry(&e.target)
                .or_default()
                .push(e.delivery.clone());
        }
        for (target, deliveries) in by_target {
            self.events.send(|| Event::TargetReleased {
                target: target.clone(),
                deliveries,
            });
        }
    }
}
