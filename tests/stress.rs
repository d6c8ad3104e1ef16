//! Seeded multi-threaded stress run with an invariant checker.
//!
//! Two router threads each run 200 000 mixed operations against one registry: admissions (fresh
//! deliveries, redeliveries of recent ones from either thread, immediate duplicates), heartbeats,
//! completions, loop start/finish, drain, register/deregister, live reads, sweeps and status reads.
//! Time is a `ManualClock` that only thread 0 advances (1 ms every 8 of its operations, plus rare
//! stalls of the registry longer than the heartbeat timeout, which the stall rule credits, and
//! network outages as long, which trip the mass-staleness brake); some workers
//! are "crashed" (nobody heartbeats them) so sweeps kill and release. Nothing sleeps and nothing
//! depends on wall-clock speed: the interleavings vary from run to run, the checked properties
//! may not.
//!
//! Every operation is bracketed by two tickets from one `SeqCst` counter, so for two operations
//! whose ticket intervals do not overlap we know which happened first. From that, the checker proves
//! (as necessary conditions, never false alarms):
//!
//! * a worker observed dead is never observed alive by an operation that started later (Dead is
//!   terminal), all observed death reasons agree, and each worker is killed at most once;
//! * never two live workers for one target, never more live workers than `max_workers`: each
//!   worker is certainly alive from the end of the operation that created it to the start of the
//!   last operation that saw it alive; those intervals never overlap for one target and never
//!   exceed the limit in total (and `live_workers()` never exceeds it at any read);
//! * once a drain has returned, no assignment that started later lands on that worker;
//! * every admission ends as exactly one of assigned, duplicate or rejected: a duplicate always
//!   has an earlier assignment of the same pair, a pair is never assigned twice to the same worker,
//!   every holder of a pair but the last is dead, a rejected pair that was never assigned leaves
//!   no claim, and a redelivery right after an assignment is a duplicate unless its holder died;
//! * every published snapshot's counts equal its list, `brake_engaged` iff it shows suspects;
//! * at the end the registry's counters equal the sums of what the threads observed, and the
//!   live records, the final snapshot, the gauges and the claim map agree with each other.
//!
//! Replay a run with `WORKER_REGISTRY_SEED=<seed> cargo test --all-features --test stress`; scale
//! it with `WORKER_REGISTRY_STRESS_OPS=<ops per thread>`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use worker_registry::{
    memory::Direct, Admission, ClaimState, DeadReason, DeliveryId, HeartbeatAck, ManualClock,
    RegistryConfig, RegistryError, Rejection, Status, StatusCounts, Target, WorkerId,
};

const THREADS: usize = 2;
const DEFAULT_OPS_PER_THREAD: usize = 200_000;
const TARGETS: usize = 12;
const MAX_WORKERS: usize = 6;
const RECENT: usize = 256;
const BELIEVED: usize = 12;

fn config() -> RegistryConfig {
    let ms = Duration::from_millis;
    RegistryConfig::builder()
        .heartbeat_interval(ms(10))
        .missed_heartbeats(3)
        .sweep_interval(ms(10))
        .startup_grace(ms(10))
        .suspect_grace(ms(20))
        .dead_retention(ms(100))
        .max_workers(MAX_WORKERS)
        // Completed claims are kept for the whole run, so a pair is only ever admitted again after
        // its holder died (which is what the per-pair checks rely on).
        .claim_retention(Duration::from_secs(24 * 3600))
        .max_retained_claims(10_000_000)
        .build()
        .unwrap()
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|s| {
        s.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={s:?} is not a u64"))
    })
}

// ---- what the threads record ------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum AdmitRes {
    Assigned {
        worker: u64,
        seq: u64,
        new: bool,
    },
    Duplicate {
        holder: Option<u64>,
        in_flight: bool,
    },
    Capacity,
    Draining(u64),
}

#[derive(Debug, Clone, Copy)]
struct AdmitRec {
    pair: (usize, u64),
    start: u64,
    end: u64,
    res: AdmitRes,
}

#[derive(Debug, Clone, Copy)]
struct SweepRec {
    generation: u64,
    stall_credited: bool,
    died: usize,
    suspected: usize,
    brake: bool,
    released_events: usize,
    purged: usize,
    expired: usize,
    evicted: usize,
}

#[derive(Default)]
struct Log {
    admits: Vec<AdmitRec>,
    /// (worker, start ticket of an operation that saw it alive)
    alive: Vec<(u64, u64)>,
    /// (worker, end ticket of an operation that saw it dead, reason if shown)
    dead: Vec<(u64, u64, Option<DeadReason>)>,
    /// Deaths this thread caused (its call made the transition): (worker, reason)
    kills: Vec<(u64, DeadReason)>,
    /// (worker, end ticket of a drain that returned Ok)
    drained: Vec<(u64, u64)>,
    /// (worker, target, end ticket of the creating operation)
    created: Vec<(u64, Option<usize>, u64)>,
    completed_ok: Vec<(usize, u64)>,
    completes_ok: u64,
    heartbeats_ok: u64,
    heartbeats_refused: u64,
    sweeps: Vec<SweepRec>,
    statuses: u64,
}

// ---- shared state -----------------------------------------------------------------------------------

struct Shared {
    seed: u64,
    registry: Direct<ManualClock>,
    clock: ManualClock,
    targets: Vec<Target>,
    tickets: AtomicU64,
    /// Highest worker id any thread has seen created.
    max_id: AtomicU64,
    /// Every worker id some thread has seen created (ids are not dense: they follow the clock).
    known: std::sync::Mutex<HashSet<u64>>,
    /// Per target, the highest worker id created for it so far.
    last_created: Vec<AtomicU64>,
    /// Recently admitted pairs (target << 48 | event + 1), for cross-thread redeliveries.
    recent: Vec<AtomicU64>,
    stop: AtomicBool,
    /// A network outage: no heartbeat reaches the registry while it is set (it still runs).
    outage: AtomicBool,
    ops_done: AtomicUsize,
}

impl Shared {
    /// Records that worker `id` was created (after the creating call returned).
    fn learn(&self, id: u64) {
        self.max_id.fetch_max(id, Ordering::SeqCst);
        self.known.lock().unwrap().insert(id);
    }

    /// Whether some thread had seen worker `id` created by now.
    fn was_created(&self, id: u64) -> bool {
        self.known.lock().unwrap().contains(&id)
    }

    #[track_caller]
    fn fail(&self, msg: String) -> ! {
        self.stop.store(true, Ordering::SeqCst);
        panic!(
            "stress invariant violated (seed {seed}): {msg}\n  replay: WORKER_REGISTRY_SEED={seed} \
             cargo test --all-features --test stress",
            seed = self.seed
        );
    }

    fn ticket(&self) -> u64 {
        // SeqCst RMWs on one counter: a ticket taken after another operation's closing ticket
        // happens-after that whole operation.
        self.tickets.fetch_add(1, Ordering::SeqCst)
    }

    /// A "crashed" worker: its container never heartbeats (decided by id and seed).
    fn crashed(&self, id: u64) -> bool {
        (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.seed).is_multiple_of(7)
    }

    fn event(n: u64) -> DeliveryId {
        DeliveryId::new(&format!("e{n}")).unwrap()
    }
}

macro_rules! check {
    ($shared:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            $shared.fail(format!($($fmt)+));
        }
    };
}

// ---- one router thread ------------------------------------------------------------------------------

struct Router<'a> {
    s: &'a Shared,
    me: usize,
    rng: StdRng,
    log: Log,
    next_event: u64,
    believed: Vec<u64>,
    mine: Vec<((usize, u64), u64)>,
    last_generation: u64,
}

impl<'a> Router<'a> {
    fn new(s: &'a Shared, me: usize) -> Self {
        Self {
            s,
            me,
            rng: StdRng::seed_from_u64(
                s.seed ^ (me as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F),
            ),
            log: Log::default(),
            next_event: 0,
            believed: Vec::new(),
            mine: Vec::new(),
            last_generation: 0,
        }
    }

    fn believe(&mut self, id: u64) {
        if !self.believed.contains(&id) {
            if self.believed.len() == BELIEVED {
                self.believed.remove(0);
            }
            self.believed.push(id);
        }
    }

    fn saw_dead(&mut self, id: u64, end: u64, reason: Option<DeadReason>) {
        self.log.dead.push((id, end, reason));
        self.believed.retain(|w| *w != id);
    }

    /// A worker id to act on: usually one this thread believes alive, sometimes any id at all.
    fn pick_worker(&mut self, beat: bool) -> Option<u64> {
        if !self.believed.is_empty() && self.rng.gen_bool(0.9) {
            let id = self.believed[self.rng.gen_range(0..self.believed.len())];
            if beat && self.s.crashed(id) {
                return None;
            }
            return Some(id);
        }
        let max = self.s.max_id.load(Ordering::SeqCst);
        Some(self.rng.gen_range(0..=max + 2))
    }

    fn run(mut self, ops: usize) -> Log {
        for i in 0..ops {
            if self.s.stop.load(Ordering::Relaxed) {
                break;
            }
            if self.me == 0 {
                self.tick(i, ops);
            }
            self.one_op();
            check!(
                self.s,
                self.s.registry.live_workers() <= MAX_WORKERS,
                "live_workers() = {} > {MAX_WORKERS}",
                self.s.registry.live_workers()
            );
            self.s.ops_done.fetch_add(1, Ordering::Relaxed);
        }
        self.log
    }

    /// Thread 0 keeps time: 1 ms every 8 of its operations, and eight times per run a stall longer
    /// than the heartbeat timeout plus start-up grace (the whole router paused), after which the
    /// first thing that runs is a sweep (as the sweeper's overdue timer would), tripping the brake.
    fn tick(&mut self, i: usize, ops: usize) {
        if i.is_multiple_of(8) {
            self.s.clock.advance(Duration::from_millis(1));
            // A sweep at least every sweep interval, as the `Sweeper` runs them (a later one would
            // be a stall of the registry, credited by the stall rule).
            if i.is_multiple_of(80) {
                self.sweep();
            }
        }
        let every = (ops / 8).max(1);
        if i % every == every / 2 {
            if (i / every).is_multiple_of(2) {
                // The registry itself stalls for longer than the heartbeat timeout: the next
                // sweep (this one, or the other thread's) measures the stall and credits it.
                self.s.clock.advance(Duration::from_millis(45));
                self.sweep();
            } else {
                // A network outage: the registry runs (it sweeps every 9 ms) but no heartbeat
                // reaches it for longer than the timeout: the brake, not the stall rule, decides.
                self.s.outage.store(true, Ordering::SeqCst);
                for _ in 0..5 {
                    self.s.clock.advance(Duration::from_millis(9));
                    self.sweep();
                }
                self.s.outage.store(false, Ordering::SeqCst);
            }
        }
    }

    fn one_op(&mut self) {
        match self.rng.gen_range(0..1000) {
            0..=329 => self.admit_some(),
            330..=369 => self.readmit_mine(),
            370..=619 => self.heartbeat(),
            620..=699 => self.complete(),
            700..=719 => self.loop_started(),
            720..=769 => self.loop_finished(),
            770..=789 => self.drain(),
            790..=794 => self.register(),
            795..=799 => self.deregister(),
            800..=839 => self.read_worker(),
            840..=843 => self.sweep(),
            _ => self.status(),
        }
    }

    // -- admissions --

    fn admit_some(&mut self) {
        let pair = if self.rng.gen_bool(0.35) {
            None
        } else {
            let v = self.s.recent[self.rng.gen_range(0..RECENT)].load(Ordering::Relaxed);
            (v != 0).then(|| ((v >> 48) as usize, (v & ((1 << 48) - 1)) - 1))
        };
        let pair = pair.unwrap_or_else(|| {
            self.next_event += 1;
            (
                self.rng.gen_range(0..TARGETS),
                ((self.me as u64) << 40) | self.next_event,
            )
        });
        let rec = self.admit(pair);
        if let AdmitRes::Assigned { worker, .. } = rec.res {
            let slot = self.rng.gen_range(0..RECENT);
            self.s.recent[slot].store(((pair.0 as u64) << 48) | (pair.1 + 1), Ordering::Relaxed);
            self.mine.push((pair, worker));
            if self.mine.len() > 64 {
                self.mine.swap_remove(0);
            }
            if self.rng.gen_bool(0.1) {
                self.redeliver(pair, worker);
            }
        }
    }

    fn readmit_mine(&mut self) {
        if self.mine.is_empty() {
            return self.admit_some();
        }
        let (pair, holder) = self.mine[self.rng.gen_range(0..self.mine.len())];
        self.redeliver(pair, holder);
    }

    /// A redelivery of a pair this thread saw assigned to `holder`: it is a duplicate, unless
    /// `holder` died since (then its claim was released).
    fn redeliver(&mut self, pair: (usize, u64), holder: u64) {
        let rec = self.admit(pair);
        if !matches!(rec.res, AdmitRes::Duplicate { .. }) {
            let info = self.s.registry.worker(WorkerId::new(holder));
            let end = self.s.ticket();
            match info {
                Some(i) if i.status.is_alive() => self.s.fail(format!(
                    "redelivery of {pair:?} (held by live worker {holder}) was {:?}",
                    rec.res
                )),
                Some(i) => {
                    let reason = match i.status {
                        Status::Dead(r) => Some(r),
                        _ => None,
                    };
                    self.saw_dead(holder, end, reason);
                }
                None => self.saw_dead(holder, end, None),
            }
        }
    }

    fn admit(&mut self, pair: (usize, u64)) -> AdmitRec {
        let (t, e) = (&self.s.targets[pair.0], Shared::event(pair.1));
        let start = self.s.ticket();
        let a = self.s.registry.admit(t, &e);
        let end = self.s.ticket();
        let res = match a {
            Admission::Assigned(a) => {
                let id = a.worker.get();
                check!(
                    self.s,
                    a.token.worker() == a.worker && a.token.seq() >= 1,
                    "assignment {a:?} carries a token of another worker"
                );
                if a.new {
                    check!(
                        self.s,
                        a.token.seq() == 1,
                        "a new worker's first token is not 1: {a:?}"
                    );
                    self.log.created.push((id, Some(pair.0), end));
                    self.s.learn(id);
                    let prev = self.s.last_created[pair.0].fetch_max(id, Ordering::SeqCst);
                    if prev != 0 && prev < id {
                        // The target's previous worker must be dead now that it has a new one.
                        let info = self.s.registry.worker(WorkerId::new(prev));
                        let e2 = self.s.ticket();
                        if let Some(i) = &info {
                            check!(
                                self.s,
                                !i.status.is_alive(),
                                "target {t} got worker {id} while its worker {prev} is {}",
                                i.status
                            );
                        }
                        let reason = info.and_then(|i| match i.status {
                            Status::Dead(r) => Some(r),
                            _ => None,
                        });
                        self.saw_dead(prev, e2, reason);
                    }
                } else {
                    self.log.alive.push((id, start));
                }
                self.believe(id);
                AdmitRes::Assigned {
                    worker: id,
                    seq: a.token.seq(),
                    new: a.new,
                }
            }
            Admission::Duplicate(d) => {
                let holder = d.holder.map(WorkerId::get);
                let in_flight = d.state == ClaimState::InFlight;
                check!(
                    self.s,
                    holder.is_some(),
                    "admitted claim without holder: {d:?}"
                );
                if in_flight {
                    // In flight means its holder is alive.
                    self.log.alive.push((holder.unwrap(), start));
                    self.believe(holder.unwrap());
                }
                AdmitRes::Duplicate { holder, in_flight }
            }
            Admission::Rejected(Rejection::CapacityFull { limit }) => {
                check!(self.s, limit == MAX_WORKERS, "wrong limit {limit}");
                AdmitRes::Capacity
            }
            Admission::Rejected(Rejection::TargetDraining { worker }) => {
                // Draining is alive.
                self.log.alive.push((worker.get(), start));
                AdmitRes::Draining(worker.get())
            }
            Admission::Rejected(r) => self.s.fail(format!("unknown rejection {r:?}")),
            // This run's registry has the waiting room off (`waiting_room_stress` below parks).
            Admission::Waiting(w) => self.s.fail(format!("parked with the room off: {w:?}")),
        };
        let rec = AdmitRec {
            pair,
            start,
            end,
            res,
        };
        self.log.admits.push(rec);
        rec
    }

    // -- worker calls --

    /// Records what a worker call observed about worker `id`.
    fn observe(&mut self, id: u64, start: u64, end: u64, r: &Result<Status, RegistryError>) {
        match r {
            Ok(s) if s.is_alive() => self.log.alive.push((id, start)),
            Ok(Status::Dead(reason)) => {
                self.log.kills.push((id, *reason));
                self.saw_dead(id, end, Some(*reason));
            }
            Ok(s) => self.s.fail(format!("unknown status {s:?}")),
            Err(e) => self.observe_err(id, end, e),
        }
    }

    /// Records what a refused worker call observed. The caller has already dropped "unknown"
    /// answers for ids not known to exist when the call started.
    fn observe_err(&mut self, id: u64, end: u64, e: &RegistryError) {
        match e {
            RegistryError::WorkerDead { id: w, reason } => {
                check!(self.s, w.get() == id, "error names {w}, asked {id}");
                self.saw_dead(id, end, Some(*reason));
            }
            RegistryError::UnknownWorker { id: w } => {
                check!(self.s, w.get() == id, "error names {w}, asked {id}");
                // Unknown although created before this call started: purged, so dead.
                if id != 0 {
                    self.saw_dead(id, end, None);
                }
            }
            other => self.s.fail(format!("worker call on {id} gave {other:?}")),
        }
    }

    fn heartbeat(&mut self) {
        if self.s.outage.load(Ordering::SeqCst) {
            return;
        }
        let Some(id) = self.pick_worker(true) else {
            return;
        };
        let known_before = self.s.was_created(id);
        let start = self.s.ticket();
        let r = self.s.registry.heartbeat(WorkerId::new(id));
        let end = self.s.ticket();
        match r {
            Ok(ack) => {
                self.log.heartbeats_ok += 1;
                self.log.alive.push((id, start));
                if ack == HeartbeatAck::Draining {
                    // It must have been drained by someone; checked at the end.
                    self.log.drained.push((id, u64::MAX));
                }
            }
            Err(e) => {
                self.log.heartbeats_refused += 1;
                if matches!(e, RegistryError::UnknownWorker { .. }) && !known_before {
                    return; // not created yet (or never): nothing learnt
                }
                self.observe_err(id, end, &e);
            }
        }
    }

    fn worker_call(
        &mut self,
        f: impl FnOnce(&Direct<ManualClock>, WorkerId) -> Result<Status, RegistryError>,
    ) -> Option<(u64, u64, Result<Status, RegistryError>)> {
        let id = self.pick_worker(false)?;
        let known_before = self.s.was_created(id);
        let start = self.s.ticket();
        let r = f(&self.s.registry, WorkerId::new(id));
        let end = self.s.ticket();
        if matches!(r, Err(RegistryError::UnknownWorker { .. })) && !known_before {
            return None;
        }
        self.observe(id, start, end, &r);
        Some((id, end, r))
    }

    fn loop_started(&mut self) {
        self.worker_call(|r, id| r.loop_started(id));
    }

    fn loop_finished(&mut self) {
        if let Some((id, _, Ok(s))) = self.worker_call(|r, id| r.loop_finished(id)) {
            check!(
                self.s,
                matches!(s, Status::Active | Status::Dead(DeadReason::Exited)),
                "loop_finished on {id} left it {s}"
            );
        }
    }

    fn drain(&mut self) {
        if let Some((id, end, Ok(s))) = self.worker_call(|r, id| r.drain(id)) {
            check!(
                self.s,
                matches!(s, Status::Draining | Status::Dead(DeadReason::Exited)),
                "drain of {id} left it {s}"
            );
            self.log.drained.push((id, end));
        }
    }

    fn deregister(&mut self) {
        let Some(id) = self.pick_worker(false) else {
            return;
        };
        let known_before = self.s.was_created(id);
        let r = self.s.registry.deregister(WorkerId::new(id));
        let end = self.s.ticket();
        match r {
            Ok(reason) => {
                self.log.kills.push((id, reason));
                self.saw_dead(id, end, Some(reason));
            }
            Err(RegistryError::UnknownWorker { .. }) if !known_before => {}
            Err(e) => self.observe_err(id, end, &e),
        }
    }

    fn register(&mut self) {
        let r = self.s.registry.register();
        let end = self.s.ticket();
        match r {
            Ok(h) => {
                let id = h.id().get();
                self.log.created.push((id, None, end));
                self.s.learn(id);
                check!(
                    self.s,
                    h.target().is_none(),
                    "a registered worker has a target"
                );
                self.believe(id);
            }
            Err(RegistryError::Rejected(Rejection::CapacityFull { limit })) => {
                check!(self.s, limit == MAX_WORKERS, "wrong limit {limit}");
            }
            Err(e) => self.s.fail(format!("register gave {e:?}")),
        }
    }

    fn read_worker(&mut self) {
        let Some(id) = self.pick_worker(false) else {
            return;
        };
        let known_before = self.s.was_created(id);
        let start = self.s.ticket();
        let info = self.s.registry.worker(WorkerId::new(id));
        let end = self.s.ticket();
        match info {
            Some(i) => {
                check!(self.s, i.id.get() == id, "worker({id}) returned {}", i.id);
                match i.status {
                    Status::Dead(reason) => self.saw_dead(id, end, Some(reason)),
                    _ => {
                        check!(
                            self.s,
                            !i.suspect || i.status.is_alive(),
                            "dead worker {id} still suspect"
                        );
                        self.log.alive.push((id, start));
                    }
                }
            }
            None if known_before => self.saw_dead(id, end, None),
            None => {}
        }
    }

    // -- claims --

    fn complete(&mut self) {
        if self.mine.is_empty() {
            return self.admit_some();
        }
        let k = self.rng.gen_range(0..self.mine.len());
        let (pair, _) = self.mine.swap_remove(k);
        let r = self
            .s
            .registry
            .complete(&self.s.targets[pair.0], &Shared::event(pair.1));
        let end = self.s.ticket();
        match r {
            Ok(()) => {
                self.log.completes_ok += 1;
                self.log.completed_ok.push(pair);
            }
            Err(RegistryError::ClaimReleased {
                holder: Some(h), ..
            }) => {
                // Released means its holder is dead.
                self.saw_dead(h.get(), end, None);
            }
            // Released and already swept away.
            Err(RegistryError::UnknownClaim { .. }) => {}
            Err(e) => self.s.fail(format!("complete {pair:?} gave {e:?}")),
        }
    }

    // -- maintenance and reads --

    fn sweep(&mut self) {
        let r = self.s.registry.sweep();
        let end = self.s.ticket();
        let mut died = HashSet::new();
        for (id, reason) in &r.died {
            check!(
                self.s,
                *reason == DeadReason::MissedHeartbeats,
                "sweep killed {id} for {reason}"
            );
            check!(self.s, died.insert(*id), "sweep killed {id} twice");
            self.log.kills.push((id.get(), *reason));
            self.saw_dead(id.get(), end, Some(*reason));
        }
        for id in &r.suspected {
            check!(self.s, !died.contains(id), "{id} both suspected and killed");
        }
        check!(
            self.s,
            r.brake_engaged || r.suspected.is_empty(),
            "suspects without the brake: {r:?}"
        );
        check!(
            self.s,
            r.released_targets.len() <= r.died.len(),
            "more targets released than workers died: {r:?}"
        );
        self.log.sweeps.push(SweepRec {
            generation: r.version,
            stall_credited: !r.stall_credited.is_zero(),
            died: r.died.len(),
            suspected: r.suspected.len(),
            brake: r.brake_engaged,
            released_events: r.released.len(),
            purged: r.purged_workers,
            expired: r.expired_claims,
            evicted: r.evicted_claims,
        });
        self.check_snapshot();
    }

    fn status(&mut self) {
        self.log.statuses += 1;
        self.check_snapshot();
    }

    /// A snapshot is internally consistent whatever is running concurrently.
    fn check_snapshot(&mut self) {
        let s = self.s.registry.status();
        check!(
            self.s,
            s.version >= self.last_generation,
            "snapshot generation went back from {} to {}",
            self.last_generation,
            s.version
        );
        self.last_generation = s.version;
        check!(
            self.s,
            s.counts == StatusCounts::of(&s.workers),
            "snapshot counts {:?} disagree with its list",
            s.counts
        );
        let c = s.counts;
        check!(
            self.s,
            c.active + c.draining + c.dead == s.workers.len()
                && c.idle + c.busy == c.active + c.draining
                && c.suspect <= c.active + c.draining,
            "snapshot counts do not add up: {c:?}"
        );
        check!(
            self.s,
            s.capacity.used == c.active + c.draining && s.capacity.limit == MAX_WORKERS,
            "snapshot capacity {:?} vs counts {c:?}",
            s.capacity
        );
        check!(
            self.s,
            s.brake_engaged == (c.suspect > 0),
            "snapshot brake_engaged = {} with {} suspects",
            s.brake_engaged,
            c.suspect
        );
        let mut ids = HashSet::with_capacity(s.workers.len());
        for w in &s.workers {
            check!(
                self.s,
                ids.insert(w.id),
                "worker {} twice in a snapshot",
                w.id
            );
            check!(
                self.s,
                w.status.is_alive() || !w.suspect,
                "dead worker {} shown suspect",
                w.id
            );
        }
    }
}

// ---- the run and the final checks ------------------------------------------------------------------

#[test]
fn stress_invariants_hold_under_concurrency() {
    let seed = env_u64("WORKER_REGISTRY_SEED").unwrap_or_else(rand::random);
    let ops = env_u64("WORKER_REGISTRY_STRESS_OPS").map_or(DEFAULT_OPS_PER_THREAD, |n| n as usize);
    eprintln!("stress: seed {seed}, {THREADS} threads x {ops} operations");
    let clock = ManualClock::new();
    let shared = Shared {
        seed,
        registry: Direct::with_clock(config(), clock.clone()),
        clock,
        targets: (0..TARGETS)
            .map(|t| Target::new("stress/repo", t as u64 + 1).unwrap())
            .collect(),
        tickets: AtomicU64::new(1),
        max_id: AtomicU64::new(0),
        known: std::sync::Mutex::new(HashSet::new()),
        last_created: (0..TARGETS).map(|_| AtomicU64::new(0)).collect(),
        recent: (0..RECENT).map(|_| AtomicU64::new(0)).collect(),
        stop: AtomicBool::new(false),
        outage: AtomicBool::new(false),
        ops_done: AtomicUsize::new(0),
    };
    let logs: Vec<Log> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|me| {
                let s = &shared;
                scope.spawn(move || Router::new(s, me).run(ops))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(log) => log,
                Err(e) => std::panic::resume_unwind(e),
            })
            .collect()
    });
    assert_eq!(
        shared.ops_done.load(Ordering::SeqCst),
        THREADS * ops,
        "seed {seed}: not every operation ran"
    );
    Final::new(&shared, logs, ops).check();
}

/// Everything the threads observed, merged, checked against the quiescent registry.
struct Final<'a> {
    s: &'a Shared,
    logs: Vec<Log>,
    final_sweep: SweepRec,
    ops: usize,
}

impl<'a> Final<'a> {
    fn new(s: &'a Shared, logs: Vec<Log>, ops: usize) -> Self {
        // Quiescent: one more sweep (no time passes) releases whatever the last deaths held.
        let r = s.registry.sweep();
        let final_sweep = SweepRec {
            generation: r.version,
            stall_credited: !r.stall_credited.is_zero(),
            died: r.died.len(),
            suspected: r.suspected.len(),
            brake: r.brake_engaged,
            released_events: r.released.len(),
            purged: r.purged_workers,
            expired: r.expired_claims,
            evicted: r.evicted_claims,
        };
        let mut f = Self {
            s,
            logs,
            final_sweep,
            ops,
        };
        for (id, _) in &r.died {
            f.logs[0]
                .kills
                .push((id.get(), DeadReason::MissedHeartbeats));
        }
        f
    }

    fn all<T: Copy>(&self, field: impl Fn(&Log) -> &Vec<T>) -> std::vec::IntoIter<T> {
        let v: Vec<T> = self
            .logs
            .iter()
            .flat_map(|l| field(l).iter().copied())
            .collect();
        v.into_iter()
    }

    fn check(&self) {
        let deaths = self.check_deaths();
        self.check_liveness_intervals(&deaths);
        self.check_drains();
        self.check_pairs();
        self.check_counters();
        self.check_quiescent_state(&deaths);
    }

    /// Dead is terminal; death reasons agree; each worker is killed at most once.
    fn check_deaths(&self) -> HashMap<u64, (u64, Option<DeadReason>)> {
        let s = self.s;
        let mut first_dead: HashMap<u64, (u64, Option<DeadReason>)> = HashMap::new();
        for (id, end, reason) in self.all(|l| &l.dead) {
            let e = first_dead.entry(id).or_insert((end, reason));
            e.0 = e.0.min(end);
            match (e.1, reason) {
                (Some(a), Some(b)) => check!(s, a == b, "worker {id} dead as {a} and as {b}"),
                (None, Some(b)) => e.1 = Some(b),
                _ => {}
            }
        }
        for (id, start) in self.all(|l| &l.alive) {
            if let Some((end, _)) = first_dead.get(&id) {
                check!(
                    s,
                    start < *end,
                    "worker {id} seen alive by an operation starting at ticket {start}, after it \
                     was seen dead at ticket {end}"
                );
            }
        }
        let mut kills: HashMap<u64, DeadReason> = HashMap::new();
        for (id, reason) in self.all(|l| &l.kills) {
            check!(
                s,
                kills.insert(id, reason).is_none(),
                "worker {id} was killed twice"
            );
            if let Some((_, Some(seen))) = first_dead.get(&id) {
                check!(
                    s,
                    *seen == reason,
                    "worker {id} killed as {reason}, seen {seen}"
                );
            }
        }
        first_dead
    }

    /// Never two live workers for one target, never more than the limit: the intervals in which
    /// each worker is certainly alive never overlap per target and never exceed the limit.
    fn check_liveness_intervals(&self, deaths: &HashMap<u64, (u64, Option<DeadReason>)>) {
        let s = self.s;
        let mut last_alive: HashMap<u64, u64> = HashMap::new();
        for (id, start) in self.all(|l| &l.alive) {
            let e = last_alive.entry(id).or_insert(start);
            *e = (*e).max(start);
        }
        let created: HashSet<u64> = self.all(|l| &l.created).map(|c| c.0).collect();
        for id in last_alive.keys().chain(deaths.keys()) {
            check!(
                s,
                created.contains(id),
                "worker {id} observed but never created"
            );
        }
        let mut intervals: Vec<(u64, u64, u64, Option<usize>)> = Vec::new();
        for (id, target, created_end) in self.all(|l| &l.created) {
            let alive_until = last_alive.get(&id).copied().unwrap_or(0);
            if alive_until > created_end {
                intervals.push((created_end, alive_until, id, target));
            }
        }
        // Sweep line over interval boundaries.
        let mut events: Vec<(u64, i32, u64, Option<usize>)> = Vec::new();
        for &(from, to, id, t) in &intervals {
            events.push((from, 1, id, t));
            events.push((to, -1, id, t));
        }
        events.sort();
        let mut live = 0i32;
        let mut per_target: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for (at, delta, id, t) in events {
            live += delta;
            check!(
                s,
                live <= MAX_WORKERS as i32,
                "{live} workers certainly alive at ticket {at} (limit {MAX_WORKERS})"
            );
            if let Some(t) = t {
                let on = per_target.entry(t).or_default();
                if delta > 0 {
                    check!(
                        s,
                        on.is_empty(),
                        "target {t}: worker {id} certainly alive at ticket {at} while {on:?} are"
                    );
                    on.push(id);
                } else {
                    on.retain(|w| *w != id);
                }
            }
        }
        check!(
            s,
            !intervals.is_empty(),
            "the run observed no live worker at all"
        );
    }

    /// Once drain has returned, no later assignment lands on the worker; an ack of "draining"
    /// means somebody drained it.
    fn check_drains(&self) {
        let s = self.s;
        let mut drained: HashMap<u64, u64> = HashMap::new();
        let mut acked_draining = HashSet::new();
        for (id, end) in self.all(|l| &l.drained) {
            if end == u64::MAX {
                acked_draining.insert(id);
                continue;
            }
            let e = drained.entry(id).or_insert(end);
            *e = (*e).min(end);
        }
        for id in acked_draining {
            check!(
                s,
                drained.contains_key(&id),
                "worker {id} acked draining but no drain returned Ok for it"
            );
        }
        for a in self.all(|l| &l.admits) {
            if let AdmitRes::Assigned { worker, .. } = a.res {
                if let Some(end) = drained.get(&worker) {
                    check!(
                        s,
                        a.start < *end,
                        "worker {worker} assigned {:?} by an admit starting at ticket {} after \
                         its drain returned at {end}",
                        a.pair,
                        a.start
                    );
                }
            }
            if let AdmitRes::Draining(w) = a.res {
                check!(
                    s,
                    drained.contains_key(&w),
                    "{:?} rejected as draining on worker {w}, which nobody drained",
                    a.pair
                );
            }
        }
    }

    /// Per (target, event): every admission is assigned, duplicate or rejected, consistently.
    fn check_pairs(&self) {
        let s = self.s;
        let mut last_alive: HashMap<u64, u64> = HashMap::new();
        for (id, start) in self.all(|l| &l.alive) {
            let e = last_alive.entry(id).or_insert(start);
            *e = (*e).max(start);
        }
        let alive_now = |w: u64| {
            s.registry
                .worker(WorkerId::new(w))
                .is_some_and(|i| i.status.is_alive())
        };
        let mut target_of: HashMap<u64, Option<usize>> = HashMap::new();
        for (id, t, _) in self.all(|l| &l.created) {
            check!(
                s,
                target_of.insert(id, t).is_none(),
                "worker id {id} created twice"
            );
        }
        let mut seqs: HashMap<u64, HashSet<u64>> = HashMap::new();
        let mut by_pair: HashMap<(usize, u64), Vec<AdmitRec>> = HashMap::new();
        for a in self.all(|l| &l.admits) {
            by_pair.entry(a.pair).or_default().push(a);
            let worker = match a.res {
                AdmitRes::Assigned { worker, seq, .. } => {
                    check!(
                        s,
                        seqs.entry(worker).or_default().insert(seq),
                        "worker {worker} handed token {seq} twice"
                    );
                    Some(worker)
                }
                AdmitRes::Duplicate { holder, .. } => holder,
                AdmitRes::Draining(w) => Some(w),
                AdmitRes::Capacity => None,
            };
            if let Some(w) = worker {
                check!(
                    s,
                    target_of.get(&w) == Some(&Some(a.pair.0)),
                    "{:?} answered with worker {w} of target {:?}",
                    a.pair,
                    target_of.get(&w)
                );
            }
        }
        let mut never_assigned = Vec::new();
        for (pair, admits) in &by_pair {
            let assigned: Vec<&AdmitRec> = admits
                .iter()
                .filter(|a| matches!(a.res, AdmitRes::Assigned { .. }))
                .collect();
            let holders: Vec<u64> = assigned
                .iter()
                .map(|a| match a.res {
                    AdmitRes::Assigned { worker, .. } => worker,
                    _ => unreachable!(),
                })
                .collect();
            let distinct: HashSet<u64> = holders.iter().copied().collect();
            check!(
                s,
                distinct.len() == holders.len(),
                "{pair:?} assigned twice to one worker: {holders:?}"
            );
            let live_holders = holders.iter().filter(|w| alive_now(**w)).count();
            check!(
                s,
                live_holders <= 1,
                "{pair:?} held by {live_holders} live workers: {holders:?}"
            );
            for a in admits {
                if let AdmitRes::Duplicate { .. } = a.res {
                    check!(
                        s,
                        assigned.iter().any(|x| x.start < a.end),
                        "{pair:?} was a duplicate at ticket {} but no assignment started before",
                        a.end
                    );
                }
            }
            // A later assignment of the same pair means the earlier holder was dead by then: it is
            // dead now, and nothing that started after the later assignment ended saw it alive.
            for x in &assigned {
                for y in &assigned {
                    if let (AdmitRes::Assigned { worker: wx, .. }, true) = (x.res, x.end < y.start)
                    {
                        check!(
                            s,
                            !alive_now(wx) && last_alive.get(&wx).is_none_or(|a| *a < y.end),
                            "{pair:?} assigned again at ticket {} while holder {wx} lived",
                            y.start
                        );
                    }
                }
            }
            if assigned.is_empty() {
                never_assigned.push(*pair);
            }
        }
        // A rejected delivery leaves no claim behind.
        for pair in never_assigned {
            let r = s
                .registry
                .release(&s.targets[pair.0], &Shared::event(pair.1));
            check!(
                s,
                matches!(r, Err(RegistryError::UnknownClaim { .. })),
                "{pair:?} was never assigned, yet release found a claim: {r:?}"
            );
        }
        // Each worker's assignment count is the number of assignments the threads received.
        for (w, seqs) in &seqs {
            if let Some(i) = s.registry.worker(WorkerId::new(*w)) {
                check!(
                    s,
                    i.token.seq() == seqs.len() as u64
                        && seqs.iter().max() == Some(&(seqs.len() as u64)),
                    "worker {w}: token {} but the threads saw {} assignments",
                    i.token,
                    seqs.len()
                );
            }
        }
    }

    /// The registry's counters equal the sums of what the threads observed.
    fn check_counters(&self) {
        let s = self.s;
        let st = s.registry.stats();
        let admits: Vec<AdmitRec> = self.all(|l| &l.admits).collect();
        let count =
            |f: &dyn Fn(&AdmitRes) -> bool| admits.iter().filter(|a| f(&a.res)).count() as u64;
        let new = count(&|r| matches!(r, AdmitRes::Assigned { new: true, .. }));
        let sticky = count(&|r| matches!(r, AdmitRes::Assigned { new: false, .. }));
        let dup = count(&|r| matches!(r, AdmitRes::Duplicate { .. }));
        let cap = count(&|r| matches!(r, AdmitRes::Capacity));
        let drn = count(&|r| matches!(r, AdmitRes::Draining(_)));
        let mut sweeps: Vec<SweepRec> = self.all(|l| &l.sweeps).collect();
        sweeps.push(self.final_sweep);
        let sum = |f: &dyn Fn(&SweepRec) -> usize| sweeps.iter().map(f).sum::<usize>() as u64;
        let kills: Vec<(u64, DeadReason)> = self.all(|l| &l.kills).collect();
        let killed = |r: DeadReason| kills.iter().filter(|k| k.1 == r).count() as u64;
        let hb_ok: u64 = self.logs.iter().map(|l| l.heartbeats_ok).sum();
        let hb_refused: u64 = self.logs.iter().map(|l| l.heartbeats_refused).sum();
        let created = self.all(|l| &l.created).count() as u64;
        let completes_ok: u64 = self.logs.iter().map(|l| l.completes_ok).sum();
        let completed_pairs: HashSet<(usize, u64)> = self.all(|l| &l.completed_ok).collect();

        let table = [
            ("admitted_new", st.admitted_new, new),
            ("admitted_sticky", st.admitted_sticky, sticky),
            ("duplicates", st.duplicates, dup),
            ("rejected_capacity", st.rejected_capacity, cap),
            ("rejected_draining", st.rejected_draining, drn),
            ("heartbeats", st.heartbeats, hb_ok),
            ("heartbeats_refused", st.heartbeats_refused, hb_refused),
            (
                "deaths_missed_heartbeats",
                st.deaths_missed_heartbeats,
                sum(&|r| r.died),
            ),
            (
                "deaths_missed_heartbeats (kills)",
                st.deaths_missed_heartbeats,
                killed(DeadReason::MissedHeartbeats),
            ),
            (
                "deaths_exited",
                st.deaths_exited,
                killed(DeadReason::Exited),
            ),
            (
                "deaths_deregistered",
                st.deaths_deregistered,
                killed(DeadReason::Deregistered),
            ),
            ("sweeps", st.sweeps, sweeps.len() as u64),
            (
                "brake_engaged",
                st.brake_engaged,
                sum(&|r| usize::from(r.brake)),
            ),
            ("suspected", st.suspected, sum(&|r| r.suspected)),
            (
                "claims_released",
                st.claims_released,
                sum(&|r| r.released_events),
            ),
            ("workers_purged", st.workers_purged, sum(&|r| r.purged)),
            ("claims_expired", st.claims_expired, sum(&|r| r.expired)),
            ("claims_evicted", st.claims_evicted, sum(&|r| r.evicted)),
            (
                "live_workers",
                st.live_workers as u64,
                created - kills.len() as u64,
            ),
        ];
        for (name, registry, observed) in table {
            check!(
                s,
                registry == observed,
                "stats().{name} = {registry}, the threads observed {observed}"
            );
        }
        check!(
            s,
            (completed_pairs.len() as u64..=completes_ok).contains(&st.claims_completed),
            "stats().claims_completed = {} outside [{}, {completes_ok}]",
            st.claims_completed,
            completed_pairs.len()
        );
        let mut gens: Vec<u64> = sweeps.iter().map(|r| r.generation).collect();
        gens.sort_unstable();
        check!(
            s,
            gens.iter().copied().eq(1..=sweeps.len() as u64),
            "sweep generations are not 1..={}",
            sweeps.len()
        );
        // Coverage: at full scale the run must have exercised every path it checks (a run that
        // never reached them would prove nothing). Small replays (WORKER_REGISTRY_STRESS_OPS) skip it.
        if self.ops >= DEFAULT_OPS_PER_THREAD / 4 {
            let covered = [
                ("a death by missed heartbeats", st.deaths_missed_heartbeats),
                ("an exit after drain", st.deaths_exited),
                ("a deregistration", st.deaths_deregistered),
                ("a brake engagement", st.brake_engaged),
                (
                    "a credited stall",
                    self.all(|l| &l.sweeps).filter(|r| r.stall_credited).count() as u64,
                ),
                ("a capacity rejection", st.rejected_capacity),
                ("a draining rejection", st.rejected_draining),
                ("a duplicate", st.duplicates),
                ("a sticky admission", st.admitted_sticky),
                ("a released claim", st.claims_released),
                ("a purged record", st.workers_purged),
            ];
            for (what, n) in covered {
                check!(s, n > 0, "the run never produced {what}");
            }
        }
    }

    /// The quiescent registry agrees with itself and with the observations.
    fn check_quiescent_state(&self, deaths: &HashMap<u64, (u64, Option<DeadReason>)>) {
        let s = self.s;
        let reg = &s.registry;
        let snap = reg.status();
        let created: Vec<(u64, Option<usize>, u64)> = self.all(|l| &l.created).collect();
        let mut live = 0;
        let mut live_per_target: HashMap<usize, u64> = HashMap::new();
        let mut kills: HashMap<u64, DeadReason> = HashMap::new();
        for (id, r) in self.all(|l| &l.kills) {
            kills.insert(id, r);
        }
        let mut purged = 0u64;
        for (id, target, _) in &created {
            let info = reg.worker(WorkerId::new(*id));
            let Some(info) = info else {
                purged += 1;
                check!(
                    s,
                    kills.contains_key(id),
                    "worker {id} purged but nobody killed it"
                );
                continue;
            };
            let in_snap = snap.worker(info.id);
            check!(
                s,
                in_snap.map(|w| (w.status, w.activity, w.suspect))
                    == Some((info.status, info.activity, info.suspect)),
                "worker {id}: snapshot {in_snap:?} vs live {info:?}"
            );
            match info.status {
                Status::Dead(reason) => {
                    check!(
                        s,
                        kills.get(id) == Some(&reason),
                        "worker {id} is {} but the threads saw kill {:?}",
                        info.status,
                        kills.get(id)
                    );
                    if let Some((_, Some(seen))) = deaths.get(id) {
                        check!(
                            s,
                            *seen == reason,
                            "worker {id} dead as {reason}, seen {seen}"
                        );
                    }
                }
                _ => {
                    live += 1;
                    check!(s, !kills.contains_key(id), "worker {id} killed yet alive");
                    check!(
                        s,
                        !deaths.contains_key(id),
                        "worker {id} seen dead yet alive"
                    );
                    if let Some(t) = target {
                        let n = live_per_target.entry(*t).or_default();
                        *n += 1;
                        check!(s, *n == 1, "target {t} has two live workers");
                    }
                }
            }
        }
        let st = reg.stats();
        check!(
            s,
            st.workers_purged == purged,
            "{purged} workers are gone, stats say {} purged",
            st.workers_purged
        );
        check!(
            s,
            live == reg.live_workers() && live <= MAX_WORKERS,
            "{live} live records, live_workers() = {}",
            reg.live_workers()
        );
        check!(
            s,
            snap.capacity.used == live
                && snap.workers.len() as u64 == created.len() as u64 - purged,
            "final snapshot: {:?}, {} workers; records: {live} live, {} kept",
            snap.capacity,
            snap.workers.len(),
            created.len() as u64 - purged
        );
        check!(
            s,
            snap.claims.retained == st.retained_claims
                && snap.claims.in_flight + snap.claims.retained == reg.claim_count(),
            "final claims: snapshot {:?}, retained gauge {}, map holds {}",
            snap.claims,
            st.retained_claims,
            reg.claim_count()
        );
        eprintln!(
            "stress: {} admits ({} new, {} sticky, {} duplicate, {} capacity, {} draining), \
             {} heartbeats, deaths {}/{}/{} (missed/exited/deregistered), {} sweeps, brake {} x, \
             {} suspected, {} claims released, {} purged",
            st.admitted_new
                + st.admitted_sticky
                + st.duplicates
                + st.rejected_capacity
                + st.rejected_draining,
            st.admitted_new,
            st.admitted_sticky,
            st.duplicates,
            st.rejected_capacity,
            st.rejected_draining,
            st.heartbeats,
            st.deaths_missed_heartbeats,
            st.deaths_exited,
            st.deaths_deregistered,
            st.sweeps,
            st.brake_engaged,
            st.suspected,
            st.claims_released,
            st.workers_purged
        );
    }
}

// ---- the waiting room ---------------------------------------------------------------------------

/// The waiting room under concurrency: two router threads admit fresh deliveries and redeliveries
/// of earlier ones for a few targets of three owners on a registry with 4 slots and a small room,
/// a worker thread drains, finishes, deregisters and heartbeats the workers they create, and a
/// sweeper thread sweeps (promoting and dropping). At the end the rest of the room is worked off
/// (workers exit, then time passes `max_wait`). Checked:
///
/// * every parking of a delivery (an answer `Waiting`) ends in exactly one promotion or one
///   expiry (or, if a redelivery of it was assigned in the instant between its refusal and its
///   parking, is left to that redelivery); a delivery is parked again only after its claim was
///   let go (released from its worker by a death, an exit or a deregistration, or expired), as
///   a released delivery's redelivery is admitted again;
/// * a promoted delivery carries an assignment onto a worker of its own target, and never more
///   live workers than the limit at any read;
/// * the registry's `parked`, `promoted` and `waiting_expired` counters equal what was observed,
///   and the room is empty at the end.
#[test]
fn waiting_room_parks_and_promotes_each_delivery_exactly_once() {
    use std::sync::Mutex;
    use worker_registry::{ReleaseReason, SweepReport};

    let seed = env_u64("WORKER_REGISTRY_SEED").unwrap_or_else(rand::random);
    let ops = env_u64("WORKER_REGISTRY_STRESS_OPS").map_or(20_000, |n| n as usize / 10 + 1);
    eprintln!("waiting room stress: seed {seed}, {ops} admissions per router thread");
    const SLOTS: usize = 4;
    let ms = Duration::from_millis;
    let clock = ManualClock::new();
    let config = RegistryConfig::builder()
        .heartbeat_interval(ms(1000))
        .missed_heartbeats(3)
        .sweep_interval(ms(10))
        .startup_grace(ms(1000))
        .max_workers(SLOTS)
        .max_waiting(24)
        .max_waiting_per_owner(12)
        .max_workers_per_owner(3)
        .max_wait(Duration::from_secs(3600))
        .claim_retention(Duration::from_secs(24 * 3600))
        .max_retained_claims(10_000_000)
        .build()
        .unwrap();
    let reg = Direct::with_clock(config, clock.clone());
    let targets: Vec<Target> = (0..9)
        .map(|i| Target::new(&format!("owner{}/repo", i % 3), 1 + i as u64).unwrap())
        .collect();
    // Router threads finished; the helpers stop when both are.
    let finished = AtomicUsize::new(0);
    // What the threads saw: per delivery, parked (answered Waiting first), assigned by admission.
    let parked: Mutex<HashMap<String, usize>> = Mutex::new(HashMap::new());
    let assigned: Mutex<HashSet<String>> = Mutex::new(HashSet::new());
    let handed: Mutex<HashMap<String, usize>> = Mutex::new(HashMap::new());
    let expired: Mutex<HashMap<String, usize>> = Mutex::new(HashMap::new());
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let fail = |m: String| failures.lock().unwrap().push(m);
    let reopened: Mutex<HashMap<String, usize>> = Mutex::new(HashMap::new());
    let record = |report: &SweepReport| {
        for e in &report.released {
            if e.reason != ReleaseReason::Promoted {
                // Released from its worker (a death, an exit, a deregistration): a redelivery
                // of it may be admitted, and so parked, again.
                *reopened
                    .lock()
                    .unwrap()
                    .entry(e.delivery.as_str().to_owned())
                    .or_default() += 1;
                continue;
            }
            match e.assignment {
                Some(a) if Some(a.worker) == e.holder => {
                    match reg.worker(a.worker).and_then(|w| w.target) {
                        Some(t) if t == e.target => {}
                        other => fail(format!("{e}: its worker serves {other:?}")),
                    }
                }
                other => fail(format!("{e}: assignment {other:?}")),
            }
            *handed
                .lock()
                .unwrap()
                .entry(e.delivery.as_str().to_owned())
                .or_default() += 1;
        }
        for e in &report.expired_waiting {
            *expired
                .lock()
                .unwrap()
                .entry(e.delivery.as_str().to_owned())
                .or_default() += 1;
        }
    };

    std::thread::scope(|s| {
        for thread in 0..2u64 {
            let (reg, targets, parked, assigned) = (&reg, &targets, &parked, &assigned);
            let (fail, finished) = (&fail, &finished);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (thread + 1));
                let mut sent: Vec<(usize, String)> = Vec::new();
                for i in 0..ops {
                    let (t, id) = if !sent.is_empty() && rng.gen_bool(0.2) {
                        sent[rng.gen_range(0..sent.len())].clone()
                    } else {
                        let t = rng.gen_range(0..targets.len());
                        let id = format!("t{thread}-{i}");
                        sent.push((t, id.clone()));
                        if sent.len() > 64 {
                            sent.remove(0);
                        }
                        (t, id)
                    };
                    let d = DeliveryId::new(&id).unwrap();
                    match reg.admit(&targets[t], &d) {
                        Admission::Waiting(_) => {
                            *parked.lock().unwrap().entry(id).or_default() += 1;
                        }
                        Admission::Assigned(_) => {
                            assigned.lock().unwrap().insert(id);
                        }
                        Admission::Duplicate(_) | Admission::Rejected(_) => {}
                    }
                    if reg.live_workers() > SLOTS {
                        fail(format!("{} live workers", reg.live_workers()));
                    }
                }
                finished.fetch_add(1, Ordering::SeqCst);
            });
        }
        // The workers: finish loops (an exit when drained), drain some, deregister some, beat.
        {
            let (reg, finished, clock) = (&reg, &finished, &clock);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ 0xfeed);
                while finished.load(Ordering::SeqCst) < 2 {
                    for w in reg.status().workers.iter().filter(|w| w.status.is_alive()) {
                        let _ = reg.heartbeat(w.id);
                        match rng.gen_range(0..4) {
                            0 => {
                                let _ = reg.drain(w.id);
                            }
                            1 => {
                                let _ = reg.loop_finished(w.id);
                            }
                            2 => {
                                let _ = reg.deregister(w.id);
                            }
                            _ => {}
                        }
                    }
                    clock.advance(ms(1));
                    std::thread::yield_now();
                }
            });
        }
        {
            let (reg, finished, record) = (&reg, &finished, &record);
            s.spawn(move || {
                while finished.load(Ordering::SeqCst) < 2 {
                    record(&reg.sweep());
                    std::thread::yield_now();
                }
            });
        }
    });
    // Work off the rest: every live worker exits, sweeps promote what fits; then time passes
    // max_wait and the rest is dropped.
    for _ in 0..200 {
        for w in reg.status().workers.iter().filter(|w| w.status.is_alive()) {
            let _ = reg.deregister(w.id);
        }
        let report = reg.sweep();
        record(&report);
        if report.waiting == 0 {
            break;
        }
    }
    clock.advance(Duration::from_secs(3601));
    record(&reg.sweep());

    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "seed {seed}: {failures:?}");
    let (parked, assigned) = (parked.into_inner().unwrap(), assigned.into_inner().unwrap());
    let (handed, expired) = (handed.into_inner().unwrap(), expired.into_inner().unwrap());
    assert!(
        parked.len() > 100,
        "seed {seed}: only {} parked",
        parked.len()
    );
    let reopened = reopened.into_inner().unwrap();
    for (id, n) in &parked {
        let (h, e) = (
            handed.get(id).copied().unwrap_or(0),
            expired.get(id).copied().unwrap_or(0),
        );
        let r = reopened.get(id).copied().unwrap_or(0);
        // Each parking ends in exactly one promotion or expiry, except one that a redelivery's
        // assignment overtook (between its refusal and its parking).
        let answered = h + e == *n || (h + e + 1 == *n && assigned.contains(id));
        // A delivery is parked again only after its claim was let go: released from the worker
        // it was promoted or assigned to (a death, an exit, a deregistration), or expired.
        let reopened_between = *n <= 1 + r + e;
        assert!(
            answered && reopened_between,
            "seed {seed}: {id} parked {n}x, promoted {h}x, expired {e}x, released {r}x"
        );
    }
    for id in handed.keys().chain(expired.keys()) {
        assert!(
            parked.contains_key(id),
            "seed {seed}: {id} handed over but never parked"
        );
    }
    let s = reg.stats();
    let total = |m: &HashMap<String, usize>| m.values().sum::<usize>() as u64;
    assert_eq!(
        (s.parked, s.promoted, s.waiting_expired, s.waiting),
        (total(&parked), total(&handed), total(&expired), 0),
        "seed {seed}"
    );
    assert_eq!(reg.status().waiting, 0);
}

// ---- payloads ------------------------------------------------------------------------------------

/// Payloads under concurrency: two router threads admit deliveries with payloads of random sizes
/// (fresh ones, and redeliveries of recent ones with a different payload) on a registry whose
/// budget holds a few dozen, a worker thread completes, releases, deregisters and heartbeats,
/// and a sweeper thread re-dispatches every released delivery with the payload its event
/// carries, as a router does. At the end every worker leaves and the room is dropped. Checked:
///
/// * a payload found by `payload()`, and every payload a released or promoted event carries, is
///   one that was admitted for that very pair (never another pair's, never a redelivery's that
///   was answered `Duplicate`);
/// * the bytes held never pass the budget by more than the replacements under way (each counts
///   a released copy and its successor for an instant), and a budget refusal's `held` is above
///   what its payload fits under;
/// * at the end, with nothing in flight or waiting, the registry holds no payload: every byte
///   reserved was given back (none leaked, none given back twice).
#[test]
fn payload_bytes_are_accounted_exactly_under_concurrency() {
    use std::sync::Mutex;
    use worker_registry::{Payload, ReleasedEvent};

    let seed = env_u64("WORKER_REGISTRY_SEED").unwrap_or_else(rand::random);
    let ops = env_u64("WORKER_REGISTRY_STRESS_OPS").map_or(20_000, |n| n as usize / 10 + 1);
    eprintln!("payload stress: seed {seed}, {ops} admissions per router thread");
    const MAX_BODY: usize = 2_000;
    let payload = |tag: u64, body: usize| {
        Payload::builder("push", vec![(tag % 251) as u8; body])
            .header("x-tag", tag.to_string())
            .build()
            .unwrap()
    };
    let max = payload(u64::MAX, MAX_BODY).size();
    let budget = 24 * max;
    let ms = Duration::from_millis;
    let clock = ManualClock::new();
    let config = RegistryConfig::builder()
        .heartbeat_interval(ms(1000))
        .missed_heartbeats(3)
        .sweep_interval(ms(10))
        .startup_grace(ms(1000))
        .max_workers(6)
        .max_waiting(16)
        .max_waiting_per_owner(16)
        .max_wait(Duration::from_secs(3600))
        .claim_retention(Duration::from_secs(24 * 3600))
        .max_retained_claims(10_000_000)
        .max_payload_bytes(max)
        .payload_budget(budget)
        .build()
        .unwrap();
    let reg = Direct::with_clock(config, clock.clone());
    let targets: Vec<Target> = (0..10)
        .map(|i| Target::new(&format!("owner{}/repo", i % 2), 1 + i as u64).unwrap())
        .collect();
    // Every payload admitted (answered Assigned or Waiting) per pair; a pair may be admitted
    // again after its claim was let go, with another payload.
    let admitted: Mutex<HashMap<(Target, DeliveryId), Vec<Payload>>> = Mutex::new(HashMap::new());
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let fail = |m: String| failures.lock().unwrap().push(m);
    let finished = AtomicUsize::new(0);
    let known = |t: &Target, d: &DeliveryId, p: &Payload| {
        admitted
            .lock()
            .unwrap()
            .get(&(t.clone(), d.clone()))
            .is_some_and(|ps| ps.contains(p))
    };
    let check_held = |reg: &Direct<ManualClock>| {
        let held = reg.stats().payload_bytes_held;
        if held > budget + 4 * max {
            fail(format!("{held} bytes held, budget {budget}"));
        }
    };
    // Re-dispatches released deliveries as a router does (promoted ones are placed already).
    let redispatch = |reg: &Direct<ManualClock>, released: &[ReleasedEvent]| {
        for e in released {
            if let Some(p) = &e.payload {
                if !known(&e.target, &e.delivery, p) {
                    fail(format!("{e} carries a payload never admitted for it"));
                }
            }
            if e.reason == worker_registry::ReleaseReason::Promoted {
                continue;
            }
            match reg.admit_with(&e.target, &e.delivery, e.payload.as_ref()) {
                Ok(Admission::Assigned(_) | Admission::Waiting(_)) => {}
                Ok(Admission::Duplicate(_) | Admission::Rejected(_)) => {}
                Err(err) => fail(format!("re-dispatch of {e}: {err}")),
            }
        }
    };

    std::thread::scope(|s| {
        for thread in 0..2u64 {
            let (reg, targets, admitted) = (&reg, &targets, &admitted);
            let (fail, finished, known, check_held) = (&fail, &finished, &known, &check_held);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (thread + 1));
                let mut sent: Vec<(usize, DeliveryId)> = Vec::new();
                for i in 0..ops {
                    let (t, d) = if !sent.is_empty() && rng.gen_bool(0.2) {
                        sent[rng.gen_range(0..sent.len())].clone()
                    } else {
                        let d = DeliveryId::new(&format!("t{thread}-{i}")).unwrap();
                        sent.push((rng.gen_range(0..targets.len()), d.clone()));
                        if sent.len() > 64 {
                            sent.remove(0);
                        }
                        (sent[sent.len() - 1].0, d)
                    };
                    let p = payload(rng.gen(), rng.gen_range(0..=MAX_BODY));
                    let target = &targets[t];
                    // Recorded before the call: a sweep may hand it over before this returns.
                    admitted
                        .lock()
                        .unwrap()
                        .entry((target.clone(), d.clone()))
                        .or_default()
                        .push(p.clone());
                    let stored = match reg.admit_with(target, &d, Some(&p)) {
                        Ok(Admission::Assigned(_) | Admission::Waiting(_)) => true,
                        Ok(Admission::Rejected(Rejection::PayloadBudget {
                            held,
                            needed,
                            limit,
                        })) => {
                            if (limit, needed) != (budget, p.size()) || held + needed <= limit {
                                fail(format!("budget refusal {held}+{needed} of {limit}"));
                            }
                            false
                        }
                        Ok(Admission::Duplicate(_) | Admission::Rejected(_)) => false,
                        Err(e) => {
                            fail(format!("{e}"));
                            false
                        }
                    };
                    if !stored {
                        // Not stored: from now on, finding it is a failure.
                        if let Some(ps) = admitted
                            .lock()
                            .unwrap()
                            .get_mut(&(target.clone(), d.clone()))
                        {
                            ps.retain(|q| *q != p);
                        }
                    }
                    if let Some(found) = reg.payload(target, &d) {
                        if !known(target, &d, &found) {
                            fail(format!("{d} on {target}: a payload never admitted for it"));
                        }
                    }
                    check_held(reg);
                }
                finished.fetch_add(1, Ordering::SeqCst);
            });
        }
        // The workers: complete or give back some of what they hold, finish loops, deregister.
        {
            let (reg, finished, clock, targets) = (&reg, &finished, &clock, &targets);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ 0xfeed);
                while finished.load(Ordering::SeqCst) < 2 {
                    for w in reg.status().workers.iter().filter(|w| w.status.is_alive()) {
                        let _ = reg.heartbeat(w.id);
                        match rng.gen_range(0..8) {
                            0 => {
                                let _ = reg.deregister(w.id);
                            }
                            1 => {
                                let _ = reg.loop_finished(w.id);
                            }
                            _ => {}
                        }
                    }
                    // Complete or release recent deliveries of both routers.
                    for _ in 0..8 {
                        let t = &targets[rng.gen_range(0..targets.len())];
                        let thread = rng.gen_range(0..2);
                        let i = rng.gen_range(0..ops);
                        let d = DeliveryId::new(&format!("t{thread}-{i}")).unwrap();
                        if rng.gen_bool(0.8) {
                            let _ = reg.complete(t, &d);
                        } else {
                            let _ = reg.release(t, &d);
                        }
                    }
                    clock.advance(ms(1));
                    std::thread::yield_now();
                }
            });
        }
        {
            let (reg, finished, redispatch, check_held) =
                (&reg, &finished, &redispatch, &check_held);
            s.spawn(move || {
                while finished.load(Ordering::SeqCst) < 2 {
                    let report = reg.sweep();
                    redispatch(reg, &report.released);
                    check_held(reg);
                    std::thread::yield_now();
                }
            });
        }
    });
    // Nothing more is admitted: every worker leaves, what they held is handed over (and not
    // re-dispatched), the room is dropped. Then nothing may be held.
    let mut handed = 0usize;
    for _ in 0..200 {
        for w in reg.status().workers.iter().filter(|w| w.status.is_alive()) {
            let _ = reg.deregister(w.id);
        }
        let report = reg.sweep();
        for e in &report.released {
            if let Some(p) = &e.payload {
                handed += 1;
                if !known(&e.target, &e.delivery, p) {
                    fail(format!("{e} carries a payload never admitted for it"));
                }
            }
        }
        if report.waiting == 0 && report.released.is_empty() {
            break;
        }
    }
    clock.advance(Duration::from_secs(3601));
    reg.sweep();
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "seed {seed}: {failures:?}");
    let s = reg.stats();
    assert!(
        s.rejected_payload_budget > 0 && handed > 0,
        "seed {seed}: the run reached the budget and released payloads: {s:?}"
    );
    assert_eq!(
        (s.payloads_held, s.payload_bytes_held, s.waiting),
        (0, 0, 0),
        "seed {seed}: every byte reserved was given back"
    );
    assert_eq!(reg.status().payloads.bytes, 0);
}
