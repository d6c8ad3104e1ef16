//! The maintenance pass: liveness and the brake, drain deadlines, claim release, retention and
//! eviction, purge, publication of the snapshot and of `TargetReleased`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{wall, Key, MWorker, Model, Standing};
use crate::api::events::Event;
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::report::{ReleaseReason, ReleasedEvent, SweepReport};
use crate::api::snapshot::{ClaimCounts, StatusSnapshot};
use crate::api::status::{DeadReason, Status};
use crate::clock::millis;

impl Model {
    fn stale(&self, w: &MWorker) -> bool {
        let mut allowed = self.timeout_ms();
        if !w.beaten {
            allowed = allowed.saturating_add(millis(self.config.startup_grace()));
        }
        !w.dead() && self.ran_since(w.ts) > allowed
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
        // Deaths during the pass free room that the pass's end promotes into.
        self.sweeping = true;

        // The stall rule: a sweep more than two intervals after the previous one measures a
        // stall of everything after the first interval; drain deadlines that had not passed when
        // it began move out by its length.
        let interval = millis(cfg.sweep_interval());
        if let Some(prev) = self.last_sweep.replace(now) {
            if now.saturating_sub(prev) > 2 * interval {
                let start = prev + interval;
                self.stalls.push((start, now));
                report.stall_credited = Duration::from_millis(now - start);
                for w in self.workers.values_mut() {
                    if w.status == Status::Draining {
                        if let Some(d) = w.drain_deadline.filter(|d| *d > start) {
                            w.drain_deadline = Some(d + (now - start));
                        }
                    }
                }
            }
        }

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
                if self.ran_since(since) < millis(cfg.suspect_grace()) {
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

        // Claims: release those whose worker is dead (or that nobody bound) and those stuck in
        // flight, forget expired ones.
        let mut counts = ClaimCounts::default();
        let mut stuck: Vec<WorkerId> = Vec::new();
        let keys: Vec<Key> = self.claims.keys().cloned().collect();
        for key in keys {
            let c = &self.claims[&key];
            if c.stuck {
                // Reported already; kept to refuse its holder's late completion until it dies.
                if c.holder.is_none_or(|h| self.workers[&h].dead()) {
                    self.claims.remove(&key);
                }
                continue;
            }
            match self.standing(c) {
                Standing::InFlight
                    if c.holder.is_some()
                        && self.ran_since(c.claimed_at) > millis(cfg.max_in_flight()) =>
                {
                    let holder = c.holder.expect("checked");
                    let claim = self.claims.get_mut(&key).expect("looked up");
                    claim.stuck = true;
                    // Handed over with the event: the tombstone keeps no payload.
                    let payload = claim.payload.take();
                    self.counts.claims_stuck += 1;
                    stuck.push(holder);
                    let (target, delivery) = key;
                    self.events.send(|| Event::DeliveryStuck {
                        worker: holder,
                        target: target.clone(),
                        delivery: delivery.clone(),
                    });
                    report.released.push(
                        ReleasedEvent::new(target, delivery, Some(holder), ReleaseReason::Stuck)
                            .with_payload(payload),
                    );
                }
                Standing::InFlight => counts.in_flight += 1,
                Standing::Completed => counts.retained += 1,
                Standing::Expired => {
                    self.claims.remove(&key);
                    self.retained -= 1;
                    report.expired_claims += 1;
                }
                Standing::Released(reason) => {
                    let holder = c.holder;
                    let payload = self.claims.remove(&key).and_then(|c| c.payload);
                    let (target, delivery) = key;
                    report.released.push(
                        ReleasedEvent::new(target, delivery, holder, reason).with_payload(payload),
                    );
                }
            }
        }
        // A worker holding a stuck delivery is drained (an idle one exits at once).
        stuck.sort();
        stuck.dedup();
        for id in stuck {
            let before = self.workers[&id].status;
            match self.drain_within(id, cfg.drain_deadline()) {
                Ok(Status::Draining) if before == Status::Active => report.drained_stuck.push(id),
                Ok(Status::Dead(reason)) if before.is_alive() => {
                    report.died.push((id, reason));
                    if let Some(t) = &self.workers[&id].target {
                        report.released_targets.push(t.clone());
                    }
                }
                _ => {}
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
        c.claims_released += report
            .released
            .iter()
            .filter(|e| e.reason != ReleaseReason::Stuck)
            .count() as u64;
        c.claims_expired += report.expired_claims as u64;
        c.claims_evicted += report.evicted_claims as u64;
        c.workers_purged += report.purged_workers as u64;
        c.sweeps += 1;

        // The waiting room last, into the room this sweep made; the snapshot shows the registry
        // after it (the workers the promotion created or placed deliveries on, its claims).
        self.sweeping = false;
        counts.in_flight += self.promote(&mut report);

        // Publish.
        self.version += 1;
        report.version = self.version;
        let infos = self
            .workers
            .values()
            .filter(|w| !w.purged)
            .map(|w| w.info(now))
            .collect();
        let mut snapshot = StatusSnapshot::new(
            self.version,
            wall(now),
            self.now,
            infos,
            cfg.max_workers(),
            report.brake_engaged,
            counts,
        );
        snapshot.waiting = report.waiting;
        snapshot.payloads = self.payload_usage();
        self.snapshot = Arc::new(snapshot);
        report.took = started.elapsed();
        self.counts.sweep_durations.observe(report.took);
        self.publish_released(&report);
        self.publish_waiting(&report);
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
        for e in report
            .released
            .iter()
            .filter(|e| e.reason != ReleaseReason::Promoted)
        {
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
