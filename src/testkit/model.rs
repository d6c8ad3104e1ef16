//! The reference model: the contract's semantics as a plain sequential program (ordered maps, no
//! atomics, no sharding, no concurrency at all: [`ReferenceRegistry`](super::ReferenceRegistry)
//! puts one lock around it).
//!
//! It is written from the documentation of the contract traits (`WorkerRegistry`, `Maintenance`,
//! `Subscribe`), of `SweepReport`, `StatusSnapshot`, `Stats` and `Event`, not from the in-memory
//! backend's code, so that a property test comparing the two (`tests/model.rs`) finds where either
//! one strays from the text. Where the text leaves a choice open the model makes the in-memory
//! backend's choice and says so: time is kept in whole milliseconds for liveness; a worker killed
//! for missed heartbeats keeps the activity it had; eviction beyond `max_retained_claims` happens
//! in the sweep only (the in-memory backend may also evict earlier, between sweeps, when far over
//! the limit; the property test keeps eviction out of reach).
//!
//! Not modelled yet (not implemented by any backend yet): claims stuck in flight longer than
//! `max_in_flight`, the stall rule, worker identity across restarts. A backend that implements
//! one implements it here too, and adds its conformance case.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::api::error::RegistryError;
use crate::api::events::{Event, EventSender};
use crate::api::ids::{DeliveryId, FencingToken, Target, WorkerId};
use crate::api::outcome::{
    Admission, AlreadyClaimed, AssignOutcome, Assignment, ClaimOutcome, ClaimState, DrainAll,
    HeartbeatAck, Rejection,
};
use crate::api::report::{ReleaseReason, ReleasedEvent, SweepReport};
use crate::api::snapshot::{ClaimCounts, StatusSnapshot, WorkerInfo};
use crate::api::stats::Stats;
use crate::api::status::{Activity, DeadReason, Status, WorkerKind};
use crate::clock::{millis, MANUAL_CLOCK_WALL_ORIGIN_SECS};
use crate::config::RegistryConfig;

type Key = (Target, DeliveryId);

/// The wall clock at time zero: a [`ManualClock`](crate::ManualClock)'s, so that the reference
/// and an in-memory registry on a manual clock show the same wall times.
fn wall_origin() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(MANUAL_CLOCK_WALL_ORIGIN_SECS)
}

fn wall(ms: u64) -> SystemTime {
    wall_origin() + Duration::from_millis(ms)
}

/// The `seq`-th assignment's token of `id` (saturating, as [`FencingToken::new`] documents).
fn token(id: WorkerId, seq: u64) -> FencingToken {
    FencingToken::new(id, seq).unwrap_or(FencingToken::from_raw(0))
}

struct MWorker {
    id: WorkerId,
    target: Option<Target>,
    started_at: SystemTime,
    started_ms: u64,
    status: Status,
    busy: bool,
    suspect: bool,
    beaten: bool,
    /// The last heartbeat, or the creation before the first, in ms.
    ts: u64,
    suspect_since: Option<u64>,
    died_at: Option<u64>,
    drain_deadline: Option<u64>,
    assignments: u64,
    /// Purged after `dead_retention`: unknown from then on (its id is never handed out again).
    purged: bool,
}

impl MWorker {
    fn dead(&self) -> bool {
        !self.status.is_alive()
    }

    fn info(&self, now_ms: u64) -> WorkerInfo {
        let kind = if self.target.is_some() {
            WorkerKind::Spawned
        } else {
            WorkerKind::Registered
        };
        let mut i = WorkerInfo::new(self.id, self.target.clone(), kind, self.started_at);
        i.status = self.status;
        i.activity = if self.busy {
            Activity::Busy
        } else {
            Activity::Idle
        };
        i.suspect = self.suspect;
        i.last_heartbeat = wall(self.ts);
        i.heartbeat_age = Duration::from_millis(now_ms.saturating_sub(self.ts));
        i.has_heartbeated = self.beaten;
        i.died_at = if self.dead() {
            self.died_at.map(wall)
        } else {
            None
        };
        i.drain_deadline = if self.status == Status::Draining {
            self.drain_deadline.map(wall)
        } else {
            None
        };
        i.token = token(self.id, self.assignments);
        i.uptime = Duration::from_millis(now_ms.saturating_sub(self.started_ms));
        i
    }
}

struct MClaim {
    holder: Option<WorkerId>,
    claimed_at: u64,
    completed_at: Option<u64>,
}

/// Where a claim stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    InFlight,
    Completed,
    Released(ReleaseReason),
    Expired,
}

/// The registry's whole state.
pub(crate) struct Model {
    config: RegistryConfig,
    now: Duration,
    next_id: u64,
    workers: BTreeMap<WorkerId, MWorker>,
    targets: HashMap<Target, WorkerId>,
    claims: BTreeMap<Key, MClaim>,
    live: usize,
    retained: usize,
    /// The counters (the gauges are filled in by `stats`).
    counts: Stats,
    version: u64,
    snapshot: Arc<StatusSnapshot>,
    pub(crate) events: EventSender,
}

impl Model {
    pub(crate) fn new(config: RegistryConfig) -> Self {
        let snapshot = Arc::new(StatusSnapshot::empty(config.max_workers(), wall(0)));
        Self {
            config,
            now: Duration::ZERO,
            next_id: 1,
            workers: BTreeMap::new(),
            targets: HashMap::new(),
            claims: BTreeMap::new(),
            live: 0,
            retained: 0,
            counts: Stats::default(),
            version: 0,
            snapshot,
            events: EventSender::new(),
        }
    }

    pub(crate) fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
    }

    fn ms(&self) -> u64 {
        millis(self.now)
    }

    fn timeout_ms(&self) -> u64 {
        millis(self.config.heartbeat_timeout())
    }

    // ---- workers ----------------------------------------------------------------------------

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

    fn worker_mut(&mut self, id: WorkerId) -> &mut MWorker {
        self.workers.get_mut(&id).expect("a worker the model knows")
    }

    /// Creates a worker if fewer than `max_workers` are alive.
    fn create(&mut self, target: Option<Target>, busy: bool) -> Result<WorkerId, RegistryError> {
        let limit = self.config.max_workers();
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
    fn kill(&mut self, id: WorkerId, reason: DeadReason) {
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

    /// Places `target`: its active worker, not while it drains, else a new one if capacity allows.
    fn place(&mut self, target: &Target) -> Result<Assignment, Rejection> {
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
            Err(Rejection::CapacityFull { .. }) => c.rejected_capacity += 1,
            Err(_) => c.rejected_draining += 1,
        }
        r
    }

    pub(crate) fn assign(&mut self, target: &Target) -> AssignOutcome {
        match self.place(target) {
            Ok(a) => AssignOutcome::Assigned(a),
            Err(r) => AssignOutcome::Rejected(r),
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

    // ---- claims -----------------------------------------------------------------------------

    fn standing(&self, c: &MClaim) -> Standing {
        let now = self.ms();
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
        Some(AlreadyClaimed::new(c.holder, wall(c.claimed_at), state))
    }

    /// Records a new claim on `key`, replacing a released or forgotten one.
    fn put_claim(&mut self, key: Key, holder: Option<WorkerId>) {
        let claim = MClaim {
            holder,
            claimed_at: self.ms(),
            completed_at: None,
        };
        if let Some(old) = self.claims.insert(key, claim) {
            if old.completed_at.is_some() {
                self.retained -= 1;
            }
        }
    }

    pub(crate) fn admit(&mut self, target: &Target, delivery: &DeliveryId) -> Admission {
        let key = (target.clone(), delivery.clone());
        if let Some(dup) = self.duplicate(&key) {
            self.counts.duplicates += 1;
            return Admission::Duplicate(dup);
        }
        match self.place(target) {
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

    // ---- maintenance ------------------------------------------------------------------------

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

    pub(crate) fn status(&self) -> Arc<StatusSnapshot> {
        self.snapshot.clone()
    }

    pub(crate) fn stats(&self) -> Stats {
        let mut s = self.counts;
        s.live_workers = self.live;
        s.retained_claims = self.retained;
        s.events_missed = self.events.missed();
        s.snapshot_age = self.now.saturating_sub(self.snapshot.taken_at_monotonic);
        s
    }
}
