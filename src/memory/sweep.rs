//! The in-memory maintenance pass: liveness, the mass-staleness brake, claim retention and
//! release, dead-record purge, and publication of the status snapshot.

use std::time::Instant;

use super::claims::Standing;
use super::record::WorkerRecord;
use super::InMemoryRegistry;
use crate::api::ids::WorkerId;
use crate::api::report::{ReleasedEvent, SweepReport};
use crate::api::snapshot::{ClaimCounts, StatusSnapshot};
use crate::api::status::{DeadReason, Status};
use crate::clock::Clock;
use crate::state;
use crate::sync::{self, Arc, Ordering};

impl<C: Clock> InMemoryRegistry<C> {
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
    /// use worker_registry::{AssignOutcome, ManualClock, InMemoryRegistry, RegistryConfig, Target};
    ///
    /// let clock = ManualClock::new();
    /// let config = RegistryConfig::builder().startup_grace(Duration::ZERO).build().unwrap();
    /// let registry = InMemoryRegistry::with_clock(config, clock.clone());
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
        let mut version = self.lock_sweep();
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

        // Pass 1: read every worker once; collect the stale and the purgeable.
        let mut infos = Vec::with_capacity(self.status().workers.len() + 16);
        let mut stale: Vec<(usize, Arc<WorkerRecord>)> = Vec::new();
        let mut overdue: Vec<(usize, Arc<WorkerRecord>)> = Vec::new();
        let mut purge: Vec<WorkerId> = Vec::new();
        let mut live = 0usize;
        inner.workers.for_each(|id, rec| {
            let w = rec.state.load();
            if w.is_dead() {
                if rec
                    .died_at()
                    .is_some_and(|d| now.saturating_sub(d) > l.dead_retention_ms)
                {
                    purge.push(*id);
                    return;
                }
            } else {
                live += 1;
                if w.status() == Status::Draining && rec.drain_deadline().is_some_and(|d| now > d) {
                    overdue.push((infos.len(), rec.clone()));
                } else if state::is_stale(w, now, l.timeout_ms, l.startup_grace_ms) {
                    stale.push((infos.len(), rec.clone()));
                }
            }
            infos.push(rec.info(w, now, origin));
        });

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
                    Some(since) if now.saturating_sub(since) < l.suspect_grace_ms => {
                        held = true;
                        continue;
                    }
                    _ => self.expire_stale(rec, now, &mut report),
                }
            } else if brake {
                match rec
                    .state
                    .transition(|w| state::suspect(w, now, l.timeout_ms, l.startup_grace_ms))
                {
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
                self.expire_stale(rec, now, &mut report)
            };
            infos[*idx] = rec.info(result, now, origin);
        }
        // Draining workers past their drain deadline die whatever the brake says: the deadline is
        // theirs, not a judgement on silence.
        for (idx, rec) in &overdue {
            let result = match rec.state.transition(state::drain_timed_out) {
                Ok((_, new)) => {
                    self.on_death(rec, DeadReason::DrainTimedOut, now);
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

        // Pass 2: claims. Release those whose worker is dead, forget expired ones, count the rest.
        let mut counts = ClaimCounts::default();
        let mut expired = 0usize;
        inner.claims.retain(|key, claim| {
            match claim.standing(now, l.claim_retention_ms, l.timeout_ms) {
                Standing::InFlight => counts.in_flight += 1,
                Standing::Completed => counts.retained += 1,
                Standing::Expired => {
                    expired += 1;
                    return false;
                }
                Standing::Released(reason) => {
                    report.released.push(ReleasedEvent::new(
                        key.target.clone(),
                        key.event.clone(),
                        claim.holder.as_ref().map(|h| h.id),
                        reason,
                    ));
                    return false;
                }
            }
            true
        });
        if expired > 0 {
            // AcqRel: see `InMemoryRegistry::complete`.
            inner.retained.fetch_sub(expired, Ordering::AcqRel);
        }
        report.expired_claims = expired;
        inner.counters.claims_expired.add(expired as u64);
        inner
            .counters
            .claims_released
            .add(report.released.len() as u64);
        report.evicted_claims = self.evict_over_limit();
        counts.retained = counts.retained.saturating_sub(report.evicted_claims);

        // Pass 3: purge dead records past retention (re-checked under the shard lock).
        for id in &purge {
            if inner
                .workers
                .remove_if(id, |rec| rec.state.load().is_dead())
                .is_some()
            {
                report.purged_workers += 1;
            }
        }
        inner
            .counters
            .workers_purged
            .add(report.purged_workers as u64);

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
        // LOOM TWINS ONLY: counts from a second pass / publish unlocked, see `registry::faults`.
        #[cfg(worker_registry_loom)]
        let (snapshot, _version) = (
            self.fault_recount(snapshot),
            self.fault_unlock_before_publish(version),
        );
        inner.snapshot.store(std::sync::Arc::new(snapshot));
        inner.counters.sweeps.inc();
        report.took = started.elapsed();
        inner.counters.sweep_time.observe(report.took);
        inner.events.released(&report);
        report
    }

    /// The sweeper's kill: by CAS, only if the worker is still stale on the word the CAS sees (a
    /// heartbeat that lands first spares it). Returns the word now in the cell.
    fn expire_stale(
        &self,
        rec: &Arc<WorkerRecord>,
        now: u64,
        report: &mut SweepReport,
    ) -> state::Word {
        let l = &self.inner.limits;
        match rec
            .state
            .transition(|w| state::expire(w, now, l.timeout_ms, l.startup_grace_ms))
        {
            Ok((_, new)) => {
                self.on_death(rec, DeadReason::MissedHeartbeats, now);
                report.died.push((rec.id, DeadReason::MissedHeartbeats));
                if let Some(t) = &rec.target {
                    report.released_targets.push(t.clone());
                }
                new
            }
            Err(seen) => seen,
        }
    }

    /// Evicts the oldest completed claims beyond `max_retained_claims`. Caller holds the sweep lock.
    fn evict_over_limit(&self) -> usize {
        let inner = &*self.inner;
        let max = inner.config.max_retained_claims();
        // Acquire: pairs with the AcqRel updates in `complete`.
        let retained = inner.retained.load(Ordering::Acquire);
        if retained <= max {
            return 0;
        }
        let excess = retained - max;
        let mut times = Vec::with_capacity(retained);
        inner.claims.for_each(|_, c| {
            if let Some(t) = c.completed_at {
                times.push(t);
            }
        });
        if times.is_empty() {
            return 0;
        }
        let k = excess.min(times.len());
        let (_, cutoff, _) = times.select_nth_unstable(k - 1);
        let cutoff = *cutoff;
        // Everything strictly older than the cutoff goes; of those completed exactly at it, only as
        // many as needed to reach `k`.
        let older = times.iter().filter(|t| **t < cutoff).count();
        let mut ties = k - older;
        let mut evicted = 0usize;
        inner.claims.retain(|_, c| match c.completed_at {
            Some(t) if t < cutoff => {
                evicted += 1;
                false
            }
            Some(t) if t == cutoff && ties > 0 => {
                ties -= 1;
                evicted += 1;
                false
            }
            _ => true,
        });
        // AcqRel: see `InMemoryRegistry::complete`.
        inner.retained.fetch_sub(evicted, Ordering::AcqRel);
        inner.counters.claims_evicted.add(evicted as u64);
        evicted
    }

    /// Called after a completion: if the retained claims are far over the limit (a burst between
    /// sweeps), evict now rather than wait, unless a sweep is running (it will).
    pub(crate) fn evict_if_far_over_limit(&self, _now: u64) {
        let max = self.inner.config.max_retained_claims();
        // Relaxed: a heuristic trigger; the eviction itself re-reads with Acquire under the lock.
        if self.inner.retained.load(Ordering::Relaxed) <= max + max / 16 {
            return;
        }
        if let Some(_guard) = sync::try_lock(&self.inner.sweep_lock) {
            self.evict_over_limit();
        }
    }
}
