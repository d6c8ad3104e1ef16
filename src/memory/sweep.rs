//! The in-memory maintenance pass: liveness, the mass-staleness brake, claim retention and
//! release, dead-record purge, and publication of the status snapshot.

use std::time::Instant;

use std::time::{Duration, SystemTime};

use super::claims::Standing;
use super::record::WorkerRecord;
use super::roster::Roster;
use super::stall::{StallWatch, Stalls};
use super::table::Verdict;
use super::Direct;
use crate::api::ids::WorkerId;
use crate::api::payload::Payload;
use crate::api::report::{ReleaseReason, ReleasedEvent, SweepReport};
use crate::api::snapshot::{ClaimCounts, PayloadUsage, StatusSnapshot, WorkerInfo};
use crate::api::status::{DeadReason, Status};
use crate::clock::Clock;
use crate::state;
use crate::sync::{Arc, Ordering};

/// What sweeps keep between them; guarded by the sweep mutex (sweeps run one at a time).
pub(crate) struct SweepState {
    /// The version of the last published snapshot.
    pub(crate) version: u64,
    /// The stall rule's memory.
    pub(crate) stall: StallWatch,
    /// The workers, in the order the snapshot lists them.
    pub(crate) roster: Roster,
}

impl<C: Clock> Direct<C> {
    /// Runs one maintenance pass (AC4) and publishes a new [`status`](Self::status) snapshot.
    ///
    /// * A live worker whose last heartbeat (or, before its first, its creation plus the start-up
    ///   grace) is older than `heartbeat_interval x missed_heartbeats` is declared dead by CAS: its
    ///   target is unassigned and its capacity slot freed. A heartbeat that wins the race keeps it
    ///   alive; one that loses is refused.
    /// * **Mass-staleness brake:** if more than `brake_fraction` of at least `brake_min_workers` live
    ///   workers are silent at once, the registry suspects itself (a stalled router, a paused VM, a
    ///   clock anomaly) rather than all of them: they are marked suspect, not dead. A suspect that
    ///   heartbeats recovers; one still silent `suspect_grace` after it was first suspected dies. A
    ///   suspect is judged only by that grace, even once the silent workers are no longer a
    ///   majority, so stragglers whose next heartbeat is not due yet survive a stall.
    /// * In-flight claims whose worker is dead are released and reported for re-dispatch; completed
    ///   claims past `claim_retention` are forgotten, and the oldest are evicted beyond
    ///   `max_retained_claims`; dead records past `dead_retention` are purged.
    ///
    /// Synchronous and callable by anyone; the [`Sweeper`](crate::Sweeper) calls it on an interval.
    /// The released events are handed to whoever ran the sweep (in the report) and to event
    /// subscribers (`TargetReleased`), once: a caller that sweeps by hand beside a `Sweeper` must
    /// re-dispatch its own report's events. The snapshot is published before the caller sees the
    /// report, so a snapshot may show released events as no longer in flight before they have been
    /// dispatched again.
    ///
    /// **Locking behaviour:** takes the sweep mutex (sweeps run one at a time), then visits each map
    /// shard by shard, never holding two map locks at once. Hot-path calls proceed meanwhile, blocked
    /// at most for one shard visit.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::{AssignOutcome, ManualClock, memory::Direct, RegistryConfig, Target};
    ///
    /// let clock = ManualClock::new();
    /// let config = RegistryConfig::builder().startup_grace(Duration::ZERO).build().unwrap();
    /// let registry = Direct::with_clock(config, clock.clone());
    /// let t = Target::new("o/r", 1).unwrap();
    /// let AssignOutcome::Assigned(a) = registry.assign(&t) else { panic!() };
    ///
    /// clock.advance(registry.config().heartbeat_timeout() + Duration::from_millis(1));
    /// let report = registry.sweep();
    /// assert_eq!(report.died.len(), 1);
    /// assert_eq!(report.released_targets, vec![t]);
    /// assert!(registry.heartbeat(a.worker).is_err());
    /// ```
    pub fn sweep(&self) -> SweepReport {
        let mut state = self.lock_sweep();
        let started = Instant::now();
        let inner = &*self.inner;
        let l = &inner.limits;
        let now = self.now_ms();
        let origin = inner.wall_origin;
        let mut report = SweepReport {
            swept: true,
            at: inner.clock.now(),
            ..SweepReport::default()
        };

        // The stall rule: a sweep far later than its interval measures how long the registry
        // itself did not run; from now on that time is not counted against anyone.
        let SweepState {
            version,
            stall: watch,
            roster,
        } = &mut *state;
        let stall = watch.begin(now, l.sweep_interval_ms, l.stall_horizon_ms);
        if let Some(span) = stall {
            report.stall_credited = Duration::from_millis(span.len());
        }
        let stalls = &watch.stalls;

        // Pass 1: read every worker once, in the roster's stable order, bringing its entry in the
        // recycled snapshot buffer up to date; collect the stale, the overdue and the purgeable.
        roster.take_newborns();
        let mut infos = roster.buffer();
        let mut stale: Vec<(usize, Arc<WorkerRecord>)> = Vec::new();
        let mut overdue: Vec<(usize, Arc<WorkerRecord>)> = Vec::new();
        let mut purge: Vec<usize> = Vec::new();
        let mut live = 0usize;
        for (i, rec) in roster.records().iter().enumerate() {
            let w = rec.state.load();
            if w.is_dead() {
                if rec
                    .died_at()
                    .is_some_and(|d| now.saturating_sub(d) > l.dead_retention_ms)
                {
                    purge.push(i);
                }
            } else {
                live += 1;
                if w.status() == Status::Draining {
                    if let Some(span) = stall {
                        // Its loop could not report its end while the registry did not run.
                        rec.extend_drain_deadline(span);
                    }
                }
                if w.status() == Status::Draining && rec.drain_deadline().is_some_and(|d| now > d) {
                    overdue.push((i, rec.clone()));
                } else if state::is_stale(
                    w,
                    stalls.judge(w.ts(), now),
                    l.timeout_ms,
                    l.startup_grace_ms,
                ) {
                    stale.push((i, rec.clone()));
                }
            }
            match infos.get_mut(i) {
                Some(entry) if entry.id == rec.id => rec.write_info(entry, w, now, origin),
                Some(entry) => *entry = rec.info(w, now, origin),
                None => infos.push(rec.info(w, now, origin)),
            }
        }
        infos.truncate(roster.records().len());
        // Deaths in worker id order, whatever the roster's order (a purge reorders it): the
        // targets parked behind draining workers that die in one sweep get their successors in
        // that order, as the reference model's.
        stale.sort_unstable_by_key(|(_, rec)| rec.id);
        overdue.sort_unstable_by_key(|(_, rec)| rec.id);

        // The brake: too many silent at once means suspect ourselves, not them. The condition
        // decides what happens to workers newly found silent; a worker already suspect is judged
        // only by its own suspect grace, whatever the condition is now (otherwise, as soon as
        // enough workers recover after a stall, the ones whose heartbeat is simply not due yet
        // would be killed).
        let cfg = &inner.config;
        let brake = live >= cfg.brake_min_workers()
            && stale.len() as f64 > cfg.brake_fraction() * live as f64;
        let mut held = false;

        for (idx, rec) in &stale {
            let w = rec.state.load();
            let result = if w.is_suspect() {
                match rec.suspect_since() {
                    Some(since)
                        if stalls.judge(since, now).saturating_sub(since) < l.suspect_grace_ms =>
                    {
                        held = true;
                        continue;
                    }
                    _ => self.expire_stale(rec, now, stalls, &mut report),
                }
            } else if brake {
                match rec.state.transition(|w| {
                    state::suspect(
                        w,
                        stalls.judge(w.ts(), now),
                        l.timeout_ms,
                        l.startup_grace_ms,
                    )
                }) {
                    Ok((_, new)) => {
                        rec.mark_suspect_since(now);
                        inner.counters.suspected.inc();
                        report.suspected.push(rec.id);
                        inner.events.suspect(rec);
                        new
                    }
                    Err(seen) => seen,
                }
            } else {
                self.expire_stale(rec, now, stalls, &mut report)
            };
            infos[*idx] = rec.info(result, now, origin);
        }
        // Draining workers past their drain deadline die whatever the brake says: the deadline is
        // theirs, not a judgement on silence.
        for (idx, rec) in &overdue {
            let result = match rec.state.transition(state::drain_timed_out) {
                Ok((_, new)) => {
                    self.on_death(rec, DeadReason::DrainTimedOut, now, false);
                    report.died.push((rec.id, DeadReason::DrainTimedOut));
                    if let Some(t) = &rec.target {
                        report.released_targets.push(t.clone());
                    }
                    new
                }
                Err(seen) => seen,
            };
            infos[*idx] = rec.info(result, now, origin);
        }
        report.brake_engaged = held || !report.suspected.is_empty();
        if report.brake_engaged {
            inner.counters.brake_engaged.inc();
        }

        // Pass 2: claims. Expire retained claims from the front of each shard's ring (never
        // visiting the rest); visit the in-flight claims only when something can have changed
        // for them: a worker holding some died, or one can have become stuck (or, unbound,
        // released) by now.
        let mut stuck: Vec<Arc<WorkerRecord>> = Vec::new();
        let expired = inner.claims.expire(now, l.claim_retention_ms);
        // AcqRel: pairs with the Release in `on_death`; a death after this swap sets it again.
        let died_holding = inner.claims_due.swap(0, Ordering::AcqRel) != 0;
        // Relaxed: a deadline hint (see `claim`).
        let due = now >= inner.claims_next_check.load(Ordering::Relaxed);
        if died_holding || due {
            // Relaxed: a deadline hint. Cleared first, so a bare claim made during the visit
            // (whose deadline it lowers) is not forgotten; one made before is visited.
            inner.claims_next_check.store(u64::MAX, Ordering::Relaxed);
            let mut next = now.saturating_add(l.max_in_flight_ms).saturating_add(1);
            inner.claims.each(|shard| {
                shard.sweep_in_flight(|claim| {
                    if claim.stuck {
                        // Released and reported already; kept only to refuse the stuck worker's
                        // late completion, which is moot once that worker is dead.
                        let dead = claim
                            .holder
                            .as_ref()
                            .is_none_or(|h| h.state.load().is_dead());
                        return if dead { Verdict::Remove } else { Verdict::Keep };
                    }
                    match claim.standing(now, l.timeout_ms) {
                        Standing::Released(reason) => {
                            // Its payload goes with the event: this registry keeps nothing of
                            // a released delivery once it is handed over.
                            let payload = self.hand_over(&mut claim.payload);
                            report.released.push(
                                ReleasedEvent::new(
                                    claim.target.clone(),
                                    claim.delivery.to_id(),
                                    claim.holder.as_ref().map(|h| h.id),
                                    reason,
                                )
                                .with_payload(payload),
                            );
                            inner.counters.claims_released.inc();
                            Verdict::Remove
                        }
                        _ => {
                            let ran = stalls
                                .judge(claim.claimed_at, now)
                                .saturating_sub(claim.claimed_at);
                            let Some(holder) = &claim.holder else {
                                // Unbound: released once the heartbeat timeout has passed (on
                                // the clock: a bare claim is nobody's work to credit).
                                next = next.min(claim.claimed_at.saturating_add(l.timeout_ms + 1));
                                return Verdict::Keep;
                            };
                            if ran <= l.max_in_flight_ms {
                                let left = (l.max_in_flight_ms + 1).saturating_sub(ran);
                                next = next.min(now.saturating_add(left));
                                return Verdict::Keep;
                            }
                            let delivery = claim.delivery.to_id();
                            let payload = self.hand_over(&mut claim.payload);
                            report.released.push(
                                ReleasedEvent::new(
                                    claim.target.clone(),
                                    delivery.clone(),
                                    Some(holder.id),
                                    ReleaseReason::Stuck,
                                )
                                .with_payload(payload),
                            );
                            inner.events.stuck(holder, &claim.target, &delivery);
                            stuck.push(holder.clone());
                            Verdict::Stuck
                        }
                    }
                });
            });
            // Relaxed: see above.
            inner.claims_next_check.fetch_min(next, Ordering::Relaxed);
        }
        report.expired_claims = expired;
        inner.counters.claims_expired.add(expired as u64);
        inner.counters.claims_stuck.add(stuck.len() as u64);
        // A worker holding a stuck delivery is drained: it takes nothing new and is replaced once
        // its loop ends (or its drain deadline passes). An idle one exits at once.
        stuck.sort_by_key(|rec| rec.id);
        stuck.dedup_by_key(|rec| rec.id);
        let at: std::collections::HashMap<WorkerId, usize> = if stuck.is_empty() {
            std::collections::HashMap::new()
        } else {
            roster
                .records()
                .iter()
                .enumerate()
                .map(|(i, r)| (r.id, i))
                .collect()
        };
        for rec in &stuck {
            let before = rec.state.load();
            match self.drain_record_in(rec, cfg.drain_deadline(), false) {
                Ok(Status::Draining) if before.is_active() => report.drained_stuck.push(rec.id),
                Ok(Status::Dead(reason)) if !before.is_dead() => {
                    report.died.push((rec.id, reason));
                    if let Some(t) = &rec.target {
                        report.released_targets.push(t.clone());
                    }
                }
                _ => {}
            }
            if let Some(&i) = at.get(&rec.id) {
                rec.write_info(&mut infos[i], rec.state.load(), now, origin);
            }
        }
        // Completions evict as they go; this only catches up after a burst that raced them.
        while inner.claims.retained() > cfg.max_retained_claims() && inner.claims.evict_oldest() {
            report.evicted_claims += 1;
        }
        inner
            .counters
            .claims_evicted
            .add(report.evicted_claims as u64);

        // Pass 3: purge dead records past retention: out of the workers map (re-checked under
        // its shard lock), the roster and the snapshot.
        purge.retain(|&i| {
            let id = roster.records()[i].id;
            inner
                .workers
                .remove_if(&id, |rec| rec.state.load().is_dead())
                .is_some()
        });
        report.purged_workers = purge.len();
        roster.remove(&purge, &mut infos);
        inner
            .counters
            .workers_purged
            .add(report.purged_workers as u64);

        // The waiting room: expiry, then promotion into the room this sweep made. The snapshot
        // shows the registry after it: the workers it placed deliveries on, and its claims.
        self.promote(now, &mut report);
        Self::list_promoted(roster, &mut infos, &report, now, origin);
        let counts = ClaimCounts {
            in_flight: inner.claims.counts().0,
            retained: inner.claims.retained(),
        };

        // Publish.
        *version += 1;
        report.version = *version;
        let snapshot = StatusSnapshot::new(
            *version,
            self.wall_at(now),
            report.at,
            infos,
            cfg.max_workers(),
            report.brake_engaged,
            counts,
        );
        let mut snapshot = snapshot;
        snapshot.waiting = report.waiting;
        let budget = &inner.payloads;
        snapshot.payloads = PayloadUsage::new(budget.count(), budget.bytes(), budget.limit());
        let old = inner.snapshot.swap(std::sync::Arc::new(snapshot));
        roster.keep_spare(old);
        inner.counters.sweeps.inc();
        report.took = started.elapsed();
        inner.counters.sweep_time.observe(report.took);
        inner.events.released(&report);
        inner.events.waiting(&report);
        report
    }

    /// Takes a released claim's payload out of the table, for its released event: the registry
    /// no longer holds it (its bytes leave the budget), the event's copy is the only one.
    fn hand_over(&self, stored: &mut Option<Payload>) -> Option<Payload> {
        let payload = stored.take();
        if let Some(p) = &payload {
            self.inner.payloads.release(p.size());
        }
        payload
    }

    /// Brings the snapshot's entries up to date after the sweep's promotion: the workers it
    /// created (announced to the roster since pass 1) are added, and a live worker it placed a
    /// delivery on is read again (it is busy now). Bounded by what the promotion placed.
    fn list_promoted(
        roster: &mut Roster,
        infos: &mut Vec<WorkerInfo>,
        report: &SweepReport,
        now: u64,
        origin: SystemTime,
    ) {
        let listed = roster.records().len();
        roster.take_newborns();
        for rec in &roster.records()[listed..] {
            infos.push(rec.info(rec.state.load(), now, origin));
        }
        let onto: std::collections::HashSet<WorkerId> = report
            .released
            .iter()
            .filter_map(|e| e.assignment.filter(|a| !a.new).map(|a| a.worker))
            .collect();
        if onto.is_empty() {
            return;
        }
        for (rec, entry) in roster.records()[..listed].iter().zip(infos.iter_mut()) {
            if onto.contains(&rec.id) {
                rec.write_info(entry, rec.state.load(), now, origin);
            }
        }
    }

    /// The sweeper's kill: by CAS, only if the worker is still stale on the word the CAS sees (a
    /// heartbeat that lands first spares it). Returns the word now in the cell.
    fn expire_stale(
        &self,
        rec: &Arc<WorkerRecord>,
        now: u64,
        stalls: &Stalls,
        report: &mut SweepReport,
    ) -> state::Word {
        let l = &self.inner.limits;
        match rec.state.transition(|w| {
            state::expire(
                w,
                stalls.judge(w.ts(), now),
                l.timeout_ms,
                l.startup_grace_ms,
            )
        }) {
            Ok((_, new)) => {
                self.on_death(rec, DeadReason::MissedHeartbeats, now, false);
                report.died.push((rec.id, DeadReason::MissedHeartbeats));
                if let Some(t) = &rec.target {
                    report.released_targets.push(t.clone());
                }
                new
            }
            Err(seen) => seen,
        }
    }
}
