//! Model-based test: random operation sequences run against the registry and against a plain,
//! sequential re-implementation of its documented semantics (`Model`, below: `Vec`s and `HashMap`s,
//! no atomics, no sharding). After every operation both must give the same answer: admission
//! outcome and worker identity, assignment tokens, heartbeat acks and errors, loop/drain/deregister
//! results, claim results, sweep reports (deaths, suspects, brake, released targets and events,
//! expiries, purges), every field of the published snapshot, every worker's live record, the
//! counters and the gauges. Time moves only through `Advance` steps on a `ManualClock`.
//!
//! The model is written from the documentation (README, rustdoc of `InMemoryRegistry`, `InMemoryRegistry::sweep`,
//! `SweepReport`, `StatusSnapshot`, issue 3's brake), not from the code. Worker ids are whatever the
//! registry hands out: the model learns each new worker's id from the registry's answer and checks
//! that the mapping stays a bijection.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use worker_registry::{
    Activity, Admission, AssignOutcome, ClaimOutcome, ClaimState, DeadReason, DeliveryId,
    FencingToken, HeartbeatAck, InMemoryRegistry, ManualClock, RegistryConfig, RegistryError,
    Rejection, ReleaseReason, Status, Target, WorkerId, WorkerInfo, WorkerKind,
    MANUAL_CLOCK_WALL_ORIGIN_SECS,
};

const TARGETS: usize = 4;
const EVENTS: usize = 3;
const MAX_WORKERS: usize = 4;
const HEARTBEAT_MS: u64 = 100;
const MISSED: u32 = 2;
const TIMEOUT_MS: u64 = HEARTBEAT_MS * MISSED as u64;
const STARTUP_GRACE_MS: u64 = 100;
const SUSPECT_GRACE_MS: u64 = 150;
const CLAIM_RETENTION_MS: u64 = 300;
const DEAD_RETENTION_MS: u64 = 250;
const BRAKE_FRACTION: f64 = 0.5;
const BRAKE_MIN: usize = 3;

fn config() -> RegistryConfig {
    let ms = Duration::from_millis;
    RegistryConfig::builder()
        .heartbeat_interval(ms(HEARTBEAT_MS))
        .missed_heartbeats(MISSED)
        .sweep_interval(ms(50))
        .max_workers(MAX_WORKERS)
        .startup_grace(ms(STARTUP_GRACE_MS))
        .suspect_grace(ms(SUSPECT_GRACE_MS))
        .claim_retention(ms(CLAIM_RETENTION_MS))
        .dead_retention(ms(DEAD_RETENTION_MS))
        .brake_fraction(BRAKE_FRACTION)
        .brake_min_workers(BRAKE_MIN)
        // Eviction order among claims completed in the same millisecond is unspecified, so the
        // model keeps eviction out of reach (the key space is TARGETS x EVENTS).
        .max_retained_claims(1_000)
        .build()
        .unwrap()
}

fn target(t: usize) -> Target {
    Target::new("octo/repo", t as u64 + 1).unwrap()
}

fn event(e: usize) -> DeliveryId {
    DeliveryId::new(&format!("d{e}")).unwrap()
}

fn wall(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH
        + Duration::from_secs(MANUAL_CLOCK_WALL_ORIGIN_SECS)
        + Duration::from_millis(ms)
}

// ---- operations -------------------------------------------------------------------------------

/// A worker named by an operation: one the model knows (index into creation order, modulo), or any
/// raw id at all.
#[derive(Debug, Clone, Copy)]
enum W {
    Known(usize),
    Raw(u64),
}

#[derive(Debug, Clone)]
enum Op {
    Admit(usize, usize),
    Assign(usize),
    Claim(usize, usize),
    Release(usize, usize),
    Complete(usize, usize),
    Heartbeat(W),
    HandleHeartbeat(W),
    LoopStarted(W),
    LoopFinished(W),
    Drain(W),
    Deregister(W),
    DrainAll,
    Register,
    Sweep,
    Advance(u64),
    Inspect,
}

fn worker_ref() -> impl Strategy<Value = W> {
    prop_oneof![
        9 => (0usize..8).prop_map(W::Known),
        1 => prop_oneof![0u64..12, any::<u64>()].prop_map(W::Raw),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let t = 0..TARGETS;
    let e = 0..EVENTS;
    prop_oneof![
        8 => (t.clone(), e.clone()).prop_map(|(t, e)| Op::Admit(t, e)),
        1 => t.clone().prop_map(Op::Assign),
        1 => (t.clone(), e.clone()).prop_map(|(t, e)| Op::Claim(t, e)),
        1 => (t.clone(), e.clone()).prop_map(|(t, e)| Op::Release(t, e)),
        3 => (t, e).prop_map(|(t, e)| Op::Complete(t, e)),
        5 => worker_ref().prop_map(Op::Heartbeat),
        1 => worker_ref().prop_map(Op::HandleHeartbeat),
        1 => worker_ref().prop_map(Op::LoopStarted),
        2 => worker_ref().prop_map(Op::LoopFinished),
        1 => worker_ref().prop_map(Op::Drain),
        1 => worker_ref().prop_map(Op::Deregister),
        1 => Just(Op::DrainAll),
        1 => Just(Op::Register),
        4 => Just(Op::Sweep),
        4 => prop_oneof![1u64..=60, 95u64..=105, 195u64..=205, 240u64..=330].prop_map(Op::Advance),
        2 => Just(Op::Inspect),
    ]
}

// ---- observations (comparable, since the library's structs are non-exhaustive) ----------------

#[derive(Debug, Clone, PartialEq)]
enum AdmitObs {
    Assigned {
        worker: WorkerId,
        generation: FencingToken,
        new: bool,
    },
    Duplicate(DupObs),
    Rejected(Rejection),
}

#[derive(Debug, Clone, PartialEq)]
struct DupObs {
    holder: Option<WorkerId>,
    since: SystemTime,
    state: ClaimState,
}

#[derive(Debug, Clone, PartialEq)]
enum ClaimObs {
    Claimed,
    AlreadyClaimed(DupObs),
}

fn admission_obs(a: Admission) -> AdmitObs {
    match a {
        Admission::Assigned(a) => AdmitObs::Assigned {
            worker: a.worker,
            generation: a.token,
            new: a.new,
        },
        Admission::Duplicate(d) => AdmitObs::Duplicate(DupObs {
            holder: d.holder,
            since: d.since,
            state: d.state,
        }),
        Admission::Rejected(r) => AdmitObs::Rejected(r),
    }
}

/// Everything a `WorkerInfo` shows, as a comparable tuple-struct.
#[derive(Debug, Clone, PartialEq)]
struct InfoObs {
    id: WorkerId,
    target: Option<Target>,
    kind: WorkerKind,
    status: Status,
    activity: Activity,
    suspect: bool,
    started_at: SystemTime,
    last_heartbeat: SystemTime,
    heartbeat_age: Duration,
    has_heartbeated: bool,
    died_at: Option<SystemTime>,
    generation: FencingToken,
    uptime: Duration,
}

fn info_obs(w: &WorkerInfo) -> InfoObs {
    InfoObs {
        id: w.id,
        target: w.target.clone(),
        kind: w.kind,
        status: w.status,
        activity: w.activity,
        suspect: w.suspect,
        started_at: w.started_at,
        last_heartbeat: w.last_heartbeat,
        heartbeat_age: w.heartbeat_age,
        has_heartbeated: w.has_heartbeated,
        died_at: w.died_at,
        generation: w.token,
        uptime: w.uptime,
    }
}

// ---- the model ------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct MWorker {
    id: WorkerId,
    target: Option<usize>,
    started: u64,
    status: Status,
    busy: bool,
    suspect: bool,
    beaten: bool,
    /// Last heartbeat, or creation before the first.
    ts: u64,
    suspect_since: u64,
    died_at: u64,
    assignments: u64,
    purged: bool,
}

impl MWorker {
    fn dead(&self) -> bool {
        !self.status.is_alive()
    }

    fn info(&self, now: u64) -> InfoObs {
        InfoObs {
            id: self.id,
            target: self.target.map(target),
            kind: if self.target.is_some() {
                WorkerKind::Spawned
            } else {
                WorkerKind::Registered
            },
            status: self.status,
            activity: if self.busy {
                Activity::Busy
            } else {
                Activity::Idle
            },
            suspect: self.suspect,
            started_at: wall(self.started),
            last_heartbeat: wall(self.ts),
            heartbeat_age: Duration::from_millis(now - self.ts),
            has_heartbeated: self.beaten,
            died_at: self.dead().then(|| wall(self.died_at)),
            generation: FencingToken::new(self.id, self.assignments).unwrap(),
            uptime: Duration::from_millis(now - self.started),
        }
    }
}

#[derive(Debug, Clone)]
struct MClaim {
    holder: Option<usize>,
    claimed_at: u64,
    completed_at: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Standing {
    InFlight,
    Completed,
    Released,
    Expired,
}

/// The model's counters, named as `Stats`' fields.
#[derive(Debug, Clone, Default, PartialEq)]
struct Counts {
    admitted_new: u64,
    admitted_sticky: u64,
    duplicates: u64,
    rejected_capacity: u64,
    rejected_draining: u64,
    heartbeats: u64,
    heartbeats_refused: u64,
    deaths_missed_heartbeats: u64,
    deaths_exited: u64,
    deaths_deregistered: u64,
    claims_completed: u64,
    claims_released: u64,
    claims_expired: u64,
    claims_evicted: u64,
    workers_purged: u64,
    sweeps: u64,
    brake_engaged: u64,
    suspected: u64,
    live_workers: usize,
    retained_claims: usize,
}

#[derive(Default)]
struct Model {
    now: u64,
    workers: Vec<MWorker>,
    by_id: HashMap<WorkerId, usize>,
    targets: HashMap<usize, usize>,
    claims: HashMap<(usize, usize), MClaim>,
    counts: Counts,
    /// The last published snapshot's workers (by id) and generation.
    snapshot: Vec<InfoObs>,
}

type Res = Result<(), TestCaseError>;

impl Model {
    fn live(&self) -> usize {
        self.counts.live_workers
    }

    /// The worker an operation names: its id, and the model's record if it is known and not purged.
    fn resolve(&self, w: W) -> (WorkerId, Option<usize>) {
        let id = match w {
            W::Known(_) if self.workers.is_empty() => WorkerId::new(u64::MAX - 1),
            W::Known(i) => self.workers[i % self.workers.len()].id,
            W::Raw(raw) => WorkerId::new(raw),
        };
        let idx = self
            .by_id
            .get(&id)
            .copied()
            .filter(|i| !self.workers[*i].purged);
        (id, idx)
    }

    fn standing(&self, c: &MClaim) -> Standing {
        if let Some(done) = c.completed_at {
            return if self.now - done > CLAIM_RETENTION_MS {
                Standing::Expired
            } else {
                Standing::Completed
            };
        }
        match c.holder {
            Some(w) if self.workers[w].dead() => Standing::Released,
            Some(_) => Standing::InFlight,
            None if self.now - c.claimed_at > TIMEOUT_MS => Standing::Released,
            None => Standing::InFlight,
        }
    }

    fn duplicate(&self, key: (usize, usize)) -> Option<DupObs> {
        let c = self.claims.get(&key)?;
        let state = match self.standing(c) {
            Standing::InFlight => ClaimState::InFlight,
            Standing::Completed => ClaimState::Completed,
            Standing::Released | Standing::Expired => return None,
        };
        Some(DupObs {
            holder: c.holder.map(|w| self.workers[w].id),
            since: wall(c.claimed_at),
            state,
        })
    }

    /// A claim is being replaced: if it was completed it no longer counts as retained.
    fn forget(&mut self, key: (usize, usize)) {
        if let Some(old) = self.claims.get(&key) {
            if old.completed_at.is_some() {
                self.counts.retained_claims -= 1;
            }
        }
    }

    /// Creates a worker if capacity allows. `id` is the id the registry gave, if it created one;
    /// the model checks the registry created one exactly when the model does, and that ids are
    /// never reused.
    fn create(
        &mut self,
        target: Option<usize>,
        busy: bool,
        id: Option<WorkerId>,
    ) -> Result<usize, TestCaseError> {
        let id = id.ok_or_else(|| {
            TestCaseError::fail("the model creates a worker here; the registry did not")
        })?;
        prop_assert!(
            !self.by_id.contains_key(&id),
            "worker id {id} handed out twice"
        );
        let idx = self.workers.len();
        self.workers.push(MWorker {
            id,
            target,
            started: self.now,
            status: Status::Active,
            busy,
            suspect: false,
            beaten: false,
            ts: self.now,
            suspect_since: 0,
            died_at: 0,
            assignments: u64::from(busy),
            purged: false,
        });
        self.by_id.insert(id, idx);
        self.counts.live_workers += 1;
        if let Some(t) = target {
            self.targets.insert(t, idx);
        }
        Ok(idx)
    }

    fn kill(&mut self, w: usize, reason: DeadReason) {
        let rec = &mut self.workers[w];
        assert!(!rec.dead());
        rec.status = Status::Dead(reason);
        rec.suspect = false;
        rec.died_at = self.now;
        self.counts.live_workers -= 1;
        if let Some(t) = rec.target {
            if self.targets.get(&t) == Some(&w) {
                self.targets.remove(&t);
            }
        }
        match reason {
            DeadReason::MissedHeartbeats => self.counts.deaths_missed_heartbeats += 1,
            DeadReason::Exited => self.counts.deaths_exited += 1,
            DeadReason::Deregistered => self.counts.deaths_deregistered += 1,
            _ => unreachable!(),
        }
    }

    fn dead_error(&self, w: usize) -> RegistryError {
        match self.workers[w].status {
            Status::Dead(reason) => RegistryError::WorkerDead {
                id: self.workers[w].id,
                reason,
            },
            _ => unreachable!(),
        }
    }

    /// AC3: the target's worker while it is active; a new one if there is none and capacity allows.
    fn assign(
        &mut self,
        t: usize,
        new_id: Option<WorkerId>,
    ) -> Result<Result<usize, Rejection>, TestCaseError> {
        let r = match self.targets.get(&t).copied() {
            Some(w) => {
                let rec = &mut self.workers[w];
                prop_assert!(!rec.dead(), "a dead worker stayed mapped");
                if rec.status == Status::Active {
                    rec.busy = true;
                    rec.assignments += 1;
                    self.counts.admitted_sticky += 1;
                    Ok(w)
                } else {
                    self.counts.rejected_draining += 1;
                    Err(Rejection::TargetDraining { worker: rec.id })
                }
            }
            None if self.live() < MAX_WORKERS => {
                self.counts.admitted_new += 1;
                Ok(self.create(Some(t), true, new_id)?)
            }
            None => {
                self.counts.rejected_capacity += 1;
                Err(Rejection::CapacityFull { limit: MAX_WORKERS })
            }
        };
        Ok(r)
    }

    fn assigned_obs(&self, w: usize, new: bool) -> AdmitObs {
        let rec = &self.workers[w];
        AdmitObs::Assigned {
            worker: rec.id,
            generation: FencingToken::new(rec.id, rec.assignments).unwrap(),
            new,
        }
    }

    fn admit(
        &mut self,
        t: usize,
        e: usize,
        new_id: Option<WorkerId>,
    ) -> Result<AdmitObs, TestCaseError> {
        if let Some(d) = self.duplicate((t, e)) {
            self.counts.duplicates += 1;
            return Ok(AdmitObs::Duplicate(d));
        }
        let live_before = self.workers.len();
        Ok(match self.assign(t, new_id)? {
            Ok(w) => {
                self.forget((t, e));
                self.claims.insert(
                    (t, e),
                    MClaim {
                        holder: Some(w),
                        claimed_at: self.now,
                        completed_at: None,
                    },
                );
                self.assigned_obs(w, self.workers.len() > live_before)
            }
            // A rejection leaves any released or expired claim as it was, and adds none.
            Err(r) => AdmitObs::Rejected(r),
        })
    }

    fn claim(&mut self, t: usize, e: usize) -> ClaimObs {
        if let Some(d) = self.duplicate((t, e)) {
            self.counts.duplicates += 1;
            return ClaimObs::AlreadyClaimed(d);
        }
        self.forget((t, e));
        self.claims.insert(
            (t, e),
            MClaim {
                holder: None,
                claimed_at: self.now,
                completed_at: None,
            },
        );
        ClaimObs::Claimed
    }

    fn release(&mut self, t: usize, e: usize) -> Result<(), RegistryError> {
        let (target, event) = (target(t), event(e));
        match self.claims.get(&(t, e)) {
            None => Err(RegistryError::UnknownClaim {
                target,
                delivery: event,
            }),
            Some(c) if c.completed_at.is_some() => Err(RegistryError::ClaimCompleted {
                target,
                delivery: event,
            }),
            Some(_) => {
                self.claims.remove(&(t, e));
                Ok(())
            }
        }
    }

    fn complete(&mut self, t: usize, e: usize) -> Result<(), RegistryError> {
        let (target, event) = (target(t), event(e));
        let Some(c) = self.claims.get(&(t, e)) else {
            return Err(RegistryError::UnknownClaim {
                target,
                delivery: event,
            });
        };
        match self.standing(c) {
            Standing::Completed => Ok(()),
            Standing::InFlight => {
                self.claims.get_mut(&(t, e)).unwrap().completed_at = Some(self.now);
                self.counts.retained_claims += 1;
                self.counts.claims_completed += 1;
                Ok(())
            }
            Standing::Released => Err(RegistryError::ClaimReleased {
                target,
                delivery: event,
                holder: c.holder.map(|w| self.workers[w].id),
                reason: match c.holder.map(|w| self.workers[w].status) {
                    Some(Status::Dead(r)) => ReleaseReason::WorkerDied(r),
                    _ => ReleaseReason::Unbound,
                },
            }),
            Standing::Expired => Err(RegistryError::UnknownClaim {
                target,
                delivery: event,
            }),
        }
    }

    fn heartbeat(&mut self, w: W, count_unknown: bool) -> Result<HeartbeatAck, RegistryError> {
        let (id, idx) = self.resolve(w);
        let r = match idx {
            None => Err(RegistryError::UnknownWorker { id }),
            Some(i) if self.workers[i].dead() => Err(self.dead_error(i)),
            Some(i) => {
                let now = self.now;
                let rec = &mut self.workers[i];
                rec.ts = rec.ts.max(now);
                rec.beaten = true;
                rec.suspect = false;
                Ok(if rec.status == Status::Active {
                    HeartbeatAck::Active
                } else {
                    HeartbeatAck::Draining
                })
            }
        };
        match &r {
            Ok(_) => self.counts.heartbeats += 1,
            Err(RegistryError::UnknownWorker { .. }) if !count_unknown => {}
            Err(_) => self.counts.heartbeats_refused += 1,
        }
        r
    }

    /// A transition named by the docs, applied to a live worker; `None` from `f` means "dies".
    fn transition(
        &mut self,
        w: W,
        f: impl FnOnce(&mut MWorker) -> Option<DeadReason>,
    ) -> Result<Status, RegistryError> {
        let (id, idx) = self.resolve(w);
        let i = idx.ok_or(RegistryError::UnknownWorker { id })?;
        if self.workers[i].dead() {
            return Err(self.dead_error(i));
        }
        if let Some(reason) = f(&mut self.workers[i]) {
            self.kill(i, reason);
        }
        Ok(self.workers[i].status)
    }

    fn loop_started(&mut self, w: W) -> Result<Status, RegistryError> {
        self.transition(w, |r| {
            r.busy = true;
            None
        })
    }

    /// AC5: a loop ends; a draining worker exits.
    fn loop_finished(&mut self, w: W) -> Result<Status, RegistryError> {
        self.transition(w, |r| {
            r.busy = false;
            (r.status == Status::Draining).then_some(DeadReason::Exited)
        })
    }

    /// AC5: busy -> draining, idle -> exits at once, draining -> unchanged.
    fn drain(&mut self, w: W) -> Result<Status, RegistryError> {
        self.transition(w, |r| match r.status {
            Status::Active if r.busy => {
                r.status = Status::Draining;
                None
            }
            Status::Active => Some(DeadReason::Exited),
            _ => None,
        })
    }

    fn deregister(&mut self, w: W) -> Result<DeadReason, RegistryError> {
        let s = self.transition(w, |r| {
            r.busy = false;
            Some(if r.status == Status::Draining {
                DeadReason::Exited
            } else {
                DeadReason::Deregistered
            })
        })?;
        match s {
            Status::Dead(reason) => Ok(reason),
            _ => unreachable!(),
        }
    }

    fn drain_all(&mut self) -> (usize, usize) {
        let (mut draining, mut exited) = (0, 0);
        for i in 0..self.workers.len() {
            if self.workers[i].purged || self.workers[i].dead() {
                continue;
            }
            match self.drain(W::Raw(self.workers[i].id.get())) {
                Ok(Status::Draining) => draining += 1,
                Ok(Status::Dead(_)) => exited += 1,
                other => unreachable!("{other:?}"),
            }
        }
        (draining, exited)
    }

    fn stale(&self, w: &MWorker) -> bool {
        let allowed = if w.beaten {
            TIMEOUT_MS
        } else {
            TIMEOUT_MS + STARTUP_GRACE_MS
        };
        !w.dead() && self.now - w.ts > allowed
    }

    /// AC4 and issue 3's brake, as documented on `InMemoryRegistry::sweep`.
    fn sweep(&mut self) -> SweepObs {
        let now = self.now;
        let mut r = SweepObs::default();
        let mut purge = Vec::new();
        let mut stale = Vec::new();
        let mut live = 0;
        for (i, w) in self.workers.iter().enumerate() {
            if w.purged {
                continue;
            }
            if w.dead() {
                if now - w.died_at > DEAD_RETENTION_MS {
                    purge.push(i);
                }
                continue;
            }
            live += 1;
            if self.stale(w) {
                stale.push(i);
            }
        }
        // More than `brake_fraction` of at least `brake_min_workers` live workers silent at once:
        // suspect ourselves, not them.
        let brake = live >= BRAKE_MIN && stale.len() as f64 > BRAKE_FRACTION * live as f64;
        let mut held = false;
        for i in stale {
            let w = &mut self.workers[i];
            if w.suspect {
                if now - w.suspect_since < SUSPECT_GRACE_MS {
                    held = true;
                    continue;
                }
            } else if brake {
                w.suspect = true;
                w.suspect_since = now;
                r.suspected.push(w.id);
                continue;
            }
            let id = w.id;
            let t = w.target;
            self.kill(i, DeadReason::MissedHeartbeats);
            r.died.push(id);
            if let Some(t) = t {
                r.released_targets.push(target(t));
            }
        }
        r.brake_engaged = held || !r.suspected.is_empty();
        let mut keys: Vec<(usize, usize)> = self.claims.keys().copied().collect();
        keys.sort();
        let (mut in_flight, mut retained) = (0, 0);
        for key in keys {
            match self.standing(&self.claims[&key]) {
                Standing::InFlight => in_flight += 1,
                Standing::Completed => retained += 1,
                Standing::Expired => {
                    self.claims.remove(&key);
                    self.counts.retained_claims -= 1;
                    r.expired_claims += 1;
                }
                Standing::Released => {
                    self.claims.remove(&key);
                    r.released_events.push((target(key.0), event(key.1)));
                }
            }
        }
        for &i in &purge {
            self.workers[i].purged = true;
        }
        r.purged_workers = purge.len();
        self.counts.sweeps += 1;
        self.counts.brake_engaged += u64::from(r.brake_engaged);
        self.counts.suspected += r.suspected.len() as u64;
        self.counts.claims_released += r.released_events.len() as u64;
        self.counts.claims_expired += r.expired_claims as u64;
        self.counts.workers_purged += r.purged_workers as u64;
        r.generation = self.counts.sweeps;
        r.in_flight = in_flight;
        r.retained = retained;
        self.snapshot = self
            .workers
            .iter()
            .filter(|w| !w.purged)
            .map(|w| w.info(now))
            .collect();
        r.normalise();
        r
    }
}

/// A sweep report plus the claim counts of its snapshot, in a canonical order.
#[derive(Debug, Clone, Default, PartialEq)]
struct SweepObs {
    generation: u64,
    died: Vec<WorkerId>,
    suspected: Vec<WorkerId>,
    brake_engaged: bool,
    released_targets: Vec<Target>,
    released_events: Vec<(Target, DeliveryId)>,
    expired_claims: usize,
    evicted_claims: usize,
    purged_workers: usize,
    in_flight: usize,
    retained: usize,
}

impl SweepObs {
    fn normalise(&mut self) {
        self.died.sort();
        self.suspected.sort();
        self.released_targets.sort();
        self.released_events.sort();
    }
}

// ---- running a sequence ----------------------------------------------------------------------------

struct Run {
    clock: ManualClock,
    registry: InMemoryRegistry<ManualClock>,
    model: Model,
}

impl Run {
    fn new() -> Self {
        let clock = ManualClock::new();
        Self {
            registry: InMemoryRegistry::with_clock(config(), clock.clone()),
            clock,
            model: Model::default(),
        }
    }

    fn id(&self, w: W) -> WorkerId {
        self.model.resolve(w).0
    }

    fn step(&mut self, op: &Op) -> Res {
        let (reg, m) = (&self.registry, &mut self.model);
        match *op {
            Op::Admit(t, e) => {
                let real = admission_obs(reg.admit(&target(t), &event(e)));
                let new_id = match &real {
                    AdmitObs::Assigned {
                        worker, new: true, ..
                    } => Some(*worker),
                    _ => None,
                };
                let expected = m.admit(t, e, new_id)?;
                prop_assert_eq!(real, expected);
            }
            Op::Assign(t) => {
                let real = reg.assign(&target(t));
                let new_id = match real {
                    AssignOutcome::Assigned(a) if a.new => Some(a.worker),
                    _ => None,
                };
                let before = m.workers.len();
                let expected = match m.assign(t, new_id)? {
                    Ok(w) => m.assigned_obs(w, m.workers.len() > before),
                    Err(r) => AdmitObs::Rejected(r),
                };
                let real = match real {
                    AssignOutcome::Assigned(a) => admission_obs(Admission::Assigned(a)),
                    AssignOutcome::Rejected(r) => AdmitObs::Rejected(r),
                };
                prop_assert_eq!(real, expected);
            }
            Op::Claim(t, e) => {
                let real = match reg.claim(&target(t), &event(e)) {
                    ClaimOutcome::Claimed => ClaimObs::Claimed,
                    ClaimOutcome::AlreadyClaimed(d) => ClaimObs::AlreadyClaimed(DupObs {
                        holder: d.holder,
                        since: d.since,
                        state: d.state,
                    }),
                };
                prop_assert_eq!(real, m.claim(t, e));
            }
            Op::Release(t, e) => {
                prop_assert_eq!(reg.release(&target(t), &event(e)), m.release(t, e));
            }
            Op::Complete(t, e) => {
                prop_assert_eq!(reg.complete(&target(t), &event(e)), m.complete(t, e));
            }
            Op::Heartbeat(w) => {
                prop_assert_eq!(reg.heartbeat(self.id(w)), self.model.heartbeat(w, true));
            }
            Op::HandleHeartbeat(w) => {
                let real = reg.handle(self.id(w)).and_then(|h| h.heartbeat());
                prop_assert_eq!(real, self.model.heartbeat(w, false));
            }
            Op::LoopStarted(w) => {
                prop_assert_eq!(reg.loop_started(self.id(w)), self.model.loop_started(w));
            }
            Op::LoopFinished(w) => {
                prop_assert_eq!(reg.loop_finished(self.id(w)), self.model.loop_finished(w));
            }
            Op::Drain(w) => {
                prop_assert_eq!(reg.drain(self.id(w)), self.model.drain(w));
            }
            Op::Deregister(w) => {
                prop_assert_eq!(reg.deregister(self.id(w)), self.model.deregister(w));
            }
            Op::DrainAll => {
                let real = reg.drain_all();
                prop_assert_eq!((real.draining, real.exited), m.drain_all());
            }
            Op::Register => {
                let real = reg.register().map(|h| h.id());
                let expected = if m.live() < MAX_WORKERS {
                    let idx = m.create(None, false, real.clone().ok())?;
                    Ok(m.workers[idx].id)
                } else {
                    Err(RegistryError::Rejected(Rejection::CapacityFull {
                        limit: MAX_WORKERS,
                    }))
                };
                prop_assert_eq!(real, expected);
            }
            Op::Sweep => {
                let report = reg.sweep();
                let snapshot = reg.status();
                let mut real = SweepObs {
                    generation: report.version,
                    died: report
                        .died
                        .iter()
                        .map(|(id, reason)| {
                            assert_eq!(*reason, DeadReason::MissedHeartbeats);
                            *id
                        })
                        .collect(),
                    suspected: report.suspected.clone(),
                    brake_engaged: report.brake_engaged,
                    released_targets: report.released_targets.clone(),
                    released_events: report.released_pairs(),
                    expired_claims: report.expired_claims,
                    evicted_claims: report.evicted_claims,
                    purged_workers: report.purged_workers,
                    in_flight: snapshot.claims.in_flight,
                    retained: snapshot.claims.retained,
                };
                real.normalise();
                let expected = m.sweep();
                prop_assert_eq!(real, expected);
                prop_assert_eq!(report.at, Duration::from_millis(m.now));
                self.check_snapshot()?;
            }
            Op::Advance(ms) => {
                self.clock.advance(Duration::from_millis(ms));
                m.now += ms;
            }
            Op::Inspect => self.inspect()?,
        }
        Ok(())
    }

    /// The published snapshot is the model's last one, and its derived fields agree with its list.
    fn check_snapshot(&self) -> Res {
        let s = self.registry.status();
        let m = &self.model;
        prop_assert_eq!(s.version, m.counts.sweeps);
        prop_assert_eq!(s.taken_at_monotonic, Duration::from_millis(m.now));
        prop_assert_eq!(s.taken_at, wall(m.now));
        let mut real: Vec<InfoObs> = s.workers.iter().map(info_obs).collect();
        real.sort_by_key(|w| w.id);
        let mut expected = m.snapshot.clone();
        expected.sort_by_key(|w| w.id);
        prop_assert_eq!(real, expected.clone());
        let live: Vec<&InfoObs> = expected.iter().filter(|w| w.status.is_alive()).collect();
        let c = s.counts;
        prop_assert_eq!(
            (c.active, c.draining, c.dead),
            (
                live.iter().filter(|w| w.status == Status::Active).count(),
                live.iter().filter(|w| w.status == Status::Draining).count(),
                expected.len() - live.len()
            )
        );
        prop_assert_eq!(
            (c.idle, c.busy, c.suspect),
            (
                live.iter().filter(|w| w.activity == Activity::Idle).count(),
                live.iter().filter(|w| w.activity == Activity::Busy).count(),
                live.iter().filter(|w| w.suspect).count()
            )
        );
        prop_assert_eq!(
            (s.capacity.used, s.capacity.limit),
            (live.len(), MAX_WORKERS)
        );
        Ok(())
    }

    /// Live reads: every worker ever created, the counters, the gauges and the claims map's size.
    fn inspect(&self) -> Res {
        let (reg, m) = (&self.registry, &self.model);
        for w in &m.workers {
            let real = reg.worker(w.id).map(|i| info_obs(&i));
            let expected = (!w.purged).then(|| w.info(m.now));
            prop_assert_eq!(real, expected);
        }
        let s = reg.stats();
        let real = Counts {
            admitted_new: s.admitted_new,
            admitted_sticky: s.admitted_sticky,
            duplicates: s.duplicates,
            rejected_capacity: s.rejected_capacity,
            rejected_draining: s.rejected_draining,
            heartbeats: s.heartbeats,
            heartbeats_refused: s.heartbeats_refused,
            deaths_missed_heartbeats: s.deaths_missed_heartbeats,
            deaths_exited: s.deaths_exited,
            deaths_deregistered: s.deaths_deregistered,
            claims_completed: s.claims_completed,
            claims_released: s.claims_released,
            claims_expired: s.claims_expired,
            claims_evicted: s.claims_evicted,
            workers_purged: s.workers_purged,
            sweeps: s.sweeps,
            brake_engaged: s.brake_engaged,
            suspected: s.suspected,
            live_workers: s.live_workers,
            retained_claims: s.retained_claims,
        };
        prop_assert_eq!(real, m.counts.clone());
        prop_assert_eq!(reg.live_workers(), m.live());
        prop_assert_eq!(reg.claim_count(), m.claims.len());
        prop_assert_eq!(reg.status().version, m.counts.sweeps);
        // Never two live workers for one target; never more live workers than the limit.
        let mut per_target: BTreeMap<usize, usize> = BTreeMap::new();
        for w in m.workers.iter().filter(|w| !w.dead()) {
            if let Some(t) = w.target {
                *per_target.entry(t).or_default() += 1;
            }
        }
        prop_assert!(per_target.values().all(|n| *n == 1));
        prop_assert!(m.live() <= MAX_WORKERS);
        Ok(())
    }
}

fn run(ops: &[Op]) -> Res {
    let mut run = Run::new();
    for (i, op) in ops.iter().enumerate() {
        run.step(op)
            .map_err(|e| TestCaseError::fail(format!("at op #{i} {op:?}: {e}")))?;
    }
    run.step(&Op::Sweep)?;
    run.inspect()
}

mod proptest_support;
use proptest_support::proptest_config;

proptest! {
    #![proptest_config(proptest_config(256))]

    /// Any sequence of operations: the registry and the model agree after every one.
    #[test]
    fn registry_matches_the_sequential_model(ops in proptest::collection::vec(op(), 1..150)) {
        run(&ops)?;
    }
}

// ---- fixed sequences (the shapes the random search found worth keeping) ---------------------------

fn fixed(ops: &[Op]) {
    if let Err(e) = run(ops) {
        panic!("{e}");
    }
}

/// The router stalls with four workers; they are suspected; two beat again; the brake's condition
/// no longer holds (two of four silent is not more than half), yet the other two are within their
/// suspect grace and must be held, not killed.
#[test]
fn staggered_recovery_after_a_stall_kills_nobody() {
    use Op::*;
    let mut ops: Vec<Op> = (0..4).map(|t| Admit(t, 0)).collect();
    ops.extend((0..4).map(|i| Heartbeat(W::Known(i))));
    ops.extend([Advance(TIMEOUT_MS + 1), Sweep, Inspect]);
    ops.extend([
        Heartbeat(W::Known(0)),
        Heartbeat(W::Known(1)),
        Advance(50),
        Sweep,
    ]);
    ops.extend([
        Heartbeat(W::Known(2)),
        Heartbeat(W::Known(3)),
        Advance(50),
        Sweep,
        Inspect,
    ]);
    fixed(&ops);
    let mut run = Run::new();
    for op in &ops {
        run.step(op).unwrap();
    }
    assert_eq!(run.registry.live_workers(), 4);
    assert_eq!(run.registry.stats().deaths_missed_heartbeats, 0);
}

/// Released, completed, expired and replaced claims all keep the retained-claims gauge exact.
#[test]
fn claim_life_cycle_keeps_the_gauges_exact() {
    use Op::*;
    fixed(&[
        Admit(0, 0),
        Complete(0, 0),
        Admit(0, 0),
        Advance(CLAIM_RETENTION_MS + 1),
        Inspect,
        Admit(0, 0),
        Inspect,
        Claim(1, 1),
        Advance(TIMEOUT_MS + 1),
        Complete(1, 1),
        Sweep,
        Claim(1, 1),
        Complete(1, 1),
        Release(1, 1),
        Advance(CLAIM_RETENTION_MS + 1),
        Sweep,
        Inspect,
    ]);
}
