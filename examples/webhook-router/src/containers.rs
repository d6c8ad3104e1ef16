//! The in-process container platform: every simulated container (a tokio task) this process runs,
//! by worker id, with its mailbox, as a container platform keeps containers reachable by id.
//!
//! **One container per worker.** A worker's container is started only by whoever wins its *start
//! claim* (see [`crate::lifecycle`]): with every replica in this process, the claim is taken here
//! ([`Containers::claim`], exclusive per worker id); with replicas in separate processes, it is an
//! owner record next to the shared registry ([`crate::remote`]), and each process has its own
//! `Containers`. Every other path, and every later event, only hands events to the container by
//! id ([`Containers::hand`]). A start the platform refuses after its caller won the claim
//! ([`Containers::start`]) is counted in the [`Ledger`] as a bug; a claim lost to another path is
//! counted apart, as the expected outcome of a race.
//!
//! An event may reach a worker before its container is started (the claim's winner is still on
//! its way): it waits in the worker's mailbox, which the container takes over when it starts
//! ("parked"). If the winner never starts it (its replica died in between), the worker never
//! heartbeats, the sweep declares it dead after the start-up grace, and the registry releases its
//! events for re-dispatch; the parked mailbox is then dropped.
//!
//! Each mailbox is a [`crate::mailbox`]: a bounded channel with a bounded overflow behind it, so
//! that an event handed to a busy worker waits in order instead of being refused.
//!
//! [`Ledger`] counts container starts per worker id and per delivery, releases per delivery, and
//! start claims lost or given up, for the simulator's audit.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use worker_registry::{DeliveryId, ReleasedEvent, Target, WorkerId};

use crate::limits::{MAX_MAILBOX, MAX_OVERFLOW};
use crate::mailbox::{self, Handover, Mailbox, OverflowMetrics};
use crate::runs::Runs;
use crate::telemetry::Traces;
use crate::worker::Job;

/// A router replica's tag on the platform.
pub type ReplicaTag = u32;

/// What a started container is given.
pub struct Started {
    /// Its events (the mailbox's receiving end).
    pub jobs: Mailbox,
}

/// What a claim of a worker's start came to ([`Containers::claim`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This replica holds it: start the container.
    Won,
    /// Another replica of this process claimed or started the container, for the admission of
    /// `cause`.
    Lost {
        /// The delivery whose admission won the claim.
        cause: Option<DeliveryId>,
    },
}

/// What a crash request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashOutcome {
    /// The container runs: it can be told to crash.
    Crashed,
    /// It had stopped already.
    Stopped,
    /// No container of this process has that id.
    NotHere,
}

/// Where a worker's container stands on the platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// No container yet: events wait for one (parked).
    Parked,
    /// A replica of this process won the worker's start claim here and is starting it.
    Claimed(ReplicaTag),
    /// Started by this replica (running, or stopped since).
    Started(ReplicaTag),
}

struct Slot {
    stage: Stage,
    /// The delivery whose admission claimed or started the container (none while parked).
    cause: Option<DeliveryId>,
    jobs: mailbox::Sender,
    /// The receiving end, until a container takes it over.
    parked: Option<Mailbox>,
}

impl Slot {
    fn started_by(&self, owner: ReplicaTag) -> bool {
        self.stage == Stage::Started(owner)
    }

    fn is_started(&self) -> bool {
        matches!(self.stage, Stage::Started(_))
    }

    /// No running container behind the mailbox: none started yet, or the one started has stopped.
    fn without_container(&self) -> bool {
        !self.is_started() || self.jobs.is_closed()
    }
}

/// The platform (see the [module documentation](self)).
pub struct Containers {
    slots: DashMap<WorkerId, Slot>,
    mailbox: usize,
    overflow: usize,
    overflow_metrics: OverflowMetrics,
    next_replica: AtomicU32,
    ledger: Ledger,
    traces: Arc<Traces>,
    runs: Arc<Runs>,
}

impl Containers {
    /// An empty platform whose mailboxes hold `mailbox` events (1 ..= [`MAX_MAILBOX`]), each with
    /// an overflow of `overflow` more (0 ..= [`MAX_OVERFLOW`]; 0: a full mailbox refuses).
    pub fn new(mailbox: usize, overflow: usize) -> Self {
        Self {
            slots: DashMap::new(),
            mailbox: mailbox.clamp(1, MAX_MAILBOX),
            overflow: overflow.min(MAX_OVERFLOW),
            overflow_metrics: OverflowMetrics::default(),
            next_replica: AtomicU32::new(1),
            ledger: Ledger::default(),
            traces: Arc::default(),
            runs: Arc::default(),
        }
    }

    /// A tag for one more replica on this platform.
    pub fn join(&self) -> ReplicaTag {
        // Relaxed: only uniqueness matters, which the read-modify-write gives.
        self.next_replica.fetch_add(1, Ordering::Relaxed)
    }

    /// The overflows' gauge and counter (for `/metrics` and the simulator's summary).
    pub fn overflow_metrics(&self) -> &OverflowMetrics {
        &self.overflow_metrics
    }

    /// The audit ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The trace contexts of the events queued here and not completed yet (what a re-dispatched
    /// event's trace links to).
    pub fn traces(&self) -> &Arc<Traces> {
        &self.traces
    }

    /// What the workers ran on (kept only when asked: see [`crate::runs`]).
    pub fn runs(&self) -> &Arc<Runs> {
        &self.runs
    }

    /// A slot at `stage` whose mailbox waits, parked, for a container to take it over.
    fn slot(&self, stage: Stage) -> Slot {
        let (jobs, rx) =
            mailbox::channel(self.mailbox, self.overflow, self.overflow_metrics.clone());
        Slot {
            stage,
            cause: None,
            jobs,
            parked: Some(rx),
        }
    }

    /// Claims the start of `worker`'s container for `owner`, whose admission of `cause` placed an
    /// event on the worker, when every replica that could start it shares this platform:
    /// [`Claim::Won`] if no replica had claimed or started it (the caller then starts it, or
    /// [`unclaim`](Self::unclaim)s it), else [`Claim::Lost`] with the delivery the holder claimed
    /// it for (the caller hands its event to that container, unless it is the same delivery,
    /// which the holder hands). Events handed meanwhile are parked for the container.
    ///
    /// **Locking behaviour:** holds the worker's map shard for the check and insert only.
    pub fn claim(&self, worker: WorkerId, owner: ReplicaTag, cause: &DeliveryId) -> Claim {
        let mut slot = self
            .slots
            .entry(worker)
            .or_insert_with(|| self.slot(Stage::Parked));
        if slot.stage != Stage::Parked {
            return Claim::Lost {
                cause: slot.cause.clone(),
            };
        }
        slot.stage = Stage::Claimed(owner);
        slot.cause = Some(cause.clone());
        Claim::Won
    }

    /// Gives up `owner`'s claim on `worker`'s start (the worker is no longer one to start): the
    /// mailbox stays parked, to be forgotten once the registry no longer counts the worker alive.
    ///
    /// **Locking behaviour:** holds the worker's map shard for the update only.
    pub fn unclaim(&self, worker: WorkerId, owner: ReplicaTag) {
        if let Some(mut slot) = self.slots.get_mut(&worker) {
            if slot.stage == Stage::Claimed(owner) {
                slot.stage = Stage::Parked;
                slot.cause = None;
            }
        }
    }

    /// Starts `worker`'s container for `owner`, which won its start claim (here with
    /// [`claim`](Self::claim), or in the owner records of a shared registry); `cause` is the
    /// delivery whose admission led to the start. Returns its mailbox, with whatever was parked in
    /// it; `None` if another replica of this process has claimed or started a container for that
    /// id: refused, and counted as a bug in the [`Ledger`], since a claim's winner is unique.
    ///
    /// **Locking behaviour:** holds the worker's map shard for the insert only.
    pub fn start(
        &self,
        worker: WorkerId,
        owner: ReplicaTag,
        cause: (&Target, &DeliveryId),
    ) -> Option<Started> {
        let mut slot = self
            .slots
            .entry(worker)
            .or_insert_with(|| self.slot(Stage::Parked));
        let jobs = match slot.stage {
            Stage::Parked => slot.parked.take(),
            Stage::Claimed(by) if by == owner => slot.parked.take(),
            Stage::Claimed(_) | Stage::Started(_) => None,
        };
        let Some(jobs) = jobs else {
            // Relaxed: a statistic.
            self.ledger.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        slot.stage = Stage::Started(owner);
        slot.cause = Some(cause.1.clone());
        drop(slot);
        self.ledger.started(worker, cause);
        Some(Started { jobs })
    }

    /// Hands `job` to `worker`'s container. Without one here: parks it in a new mailbox for the
    /// container to come if `park`, else gives it back (`Err(job)`: no container of this process
    /// has that id). Never [`Handover::Unreachable`].
    ///
    /// **Locking behaviour:** reads the worker's map shard to find the mailbox (write-locks it to
    /// park one), never while queueing; queueing never waits: it takes the worker's overflow lock
    /// for one queue operation (a full mailbox and overflow answer [`Handover::Full`]).
    pub fn hand(&self, worker: WorkerId, job: Job, park: bool) -> Result<Handover, Job> {
        let found = self.slots.get(&worker).map(|s| s.jobs.clone());
        let jobs = match found {
            Some(jobs) => jobs,
            None => match self.slots.entry(worker) {
                Entry::Occupied(o) => o.get().jobs.clone(),
                Entry::Vacant(v) if park => v.insert(self.slot(Stage::Parked)).jobs.clone(),
                Entry::Vacant(_) => return Err(job),
            },
        };
        let key = (!job.trace.is_none()).then(|| (job.target.clone(), job.event.clone()));
        let trace = key.as_ref().map(|_| job.trace.clone());
        let handed = jobs.put(job);
        let queued = matches!(handed, Handover::Queued | Handover::Overflowed { .. });
        if let (true, Some((target, delivery)), Some(trace)) = (queued, key, trace) {
            self.traces.handed(&target, &delivery, &trace);
        }
        Ok(handed)
    }

    /// Whether `worker`'s container can be crashed: started here and not stopped
    /// ([`CrashOutcome::Crashed`]; the caller then kills it through its launcher), stopped
    /// already, or not here.
    pub fn can_crash(&self, worker: WorkerId) -> CrashOutcome {
        match self.slots.get(&worker) {
            Some(slot) if slot.is_started() => {
                if slot.jobs.is_closed() {
                    CrashOutcome::Stopped
                } else {
                    CrashOutcome::Crashed
                }
            }
            _ => CrashOutcome::NotHere,
        }
    }

    /// Whether a container for `worker` was started here (running or stopped since).
    pub fn knows(&self, worker: WorkerId) -> bool {
        self.slots.get(&worker).is_some_and(|s| s.is_started())
    }

    /// Whether `worker` has a container here that has not stopped.
    pub fn is_running(&self, worker: WorkerId) -> bool {
        self.slots
            .get(&worker)
            .is_some_and(|s| !s.without_container())
    }

    /// The workers whose containers `owner` started (running or not).
    pub fn owned_by(&self, owner: ReplicaTag) -> Vec<WorkerId> {
        self.slots
            .iter()
            .filter(|s| s.started_by(owner))
            .map(|s| *s.key())
            .collect()
    }

    /// Closes the mailboxes of `owner`'s containers (shutdown): each finishes what is queued, then
    /// leaves. Returns how many there were. A container `owner` has claimed and not started yet
    /// keeps its mailbox: its start is on its way, and the admission that started it drains it.
    pub fn close_owned_by(&self, owner: ReplicaTag) -> usize {
        let before = self.slots.len();
        self.slots.retain(|_, s| !s.started_by(owner));
        before - self.slots.len()
    }

    /// Workers whose mailbox has no running container behind it (stopped, parked, or claimed by
    /// a start that never came): the ones to forget once the registry no longer counts them
    /// alive.
    pub fn without_container(&self) -> Vec<WorkerId> {
        self.slots
            .iter()
            .filter(|s| s.without_container())
            .map(|s| *s.key())
            .collect()
    }

    /// Forgets `worker`'s mailbox if it still has no running container behind it.
    pub fn forget(&self, worker: WorkerId) {
        self.slots.remove_if(&worker, |_, s| s.without_container());
    }

    /// Mailboxes on the platform (running, stopped or parked).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// Container starts and releases, for the simulator's audit (every replica of a process shares
/// it through their [`Containers`]).
#[derive(Default)]
pub struct Ledger {
    by_worker: DashMap<WorkerId, u32>,
    by_delivery: DashMap<(Target, DeliveryId), u32>,
    /// Released events seen by sweeper callbacks, by delivery: their receipts (a released event
    /// offered again has the same one; the in-memory backend gives none, and hands each over once).
    releases: DashMap<(Target, DeliveryId), Vec<Option<String>>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
    refused: AtomicU64,
    lost: AtomicU64,
    abandoned: AtomicU64,
}

/// What the [`Ledger`] shows.
#[derive(Debug, Clone, Default)]
pub struct Audit {
    /// Containers started.
    pub started: u64,
    /// Distinct worker ids they were started for.
    pub workers: usize,
    /// The most containers started for one worker id (1 when all is well).
    pub max_per_worker: u32,
    /// Starts the platform refused although their caller had won the worker's start claim: a
    /// bug (0 when all is well).
    pub refused: u64,
    /// Start claims lost to another path that was starting the same worker (the loser handed its
    /// event to the winner's container instead): the expected outcome of a race, not a refusal.
    pub lost_claims: u64,
    /// Start claims won and then given up, the registry no longer counting the worker as one to
    /// start (it died, or started elsewhere, while the claim's winner was on its way).
    pub abandoned_claims: u64,
    /// The most containers one delivery started (more than one only after it was released).
    pub max_per_delivery: u32,
    /// Deliveries that started more containers than 1 + the times they were released.
    pub unexplained: Vec<(Target, DeliveryId, u32, usize)>,
    /// The most containers running at once, across the process.
    pub max_running: usize,
}

impl Ledger {
    fn started(&self, worker: WorkerId, cause: (&Target, &DeliveryId)) {
        *self.by_worker.entry(worker).or_default() += 1;
        *self
            .by_delivery
            .entry((cause.0.clone(), cause.1.clone()))
            .or_default() += 1;
    }

    /// A start claim was lost to another path starting the same worker: the loser hands its event
    /// over instead.
    pub(crate) fn claim_lost(&self) {
        // Relaxed: a statistic.
        self.lost.fetch_add(1, Ordering::Relaxed);
    }

    /// A start claim was won and then given up (the worker is no longer one to start).
    pub(crate) fn claim_abandoned(&self) {
        // Relaxed: a statistic.
        self.abandoned.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the released events a sweeper callback was handed.
    pub fn released(&self, events: &[ReleasedEvent]) {
        for e in events {
            self.releases
                .entry((e.target.clone(), e.delivery.clone()))
                .or_default()
                .push(e.receipt().map(|r| r.as_str().to_owned()));
        }
    }

    /// Whether a sweeper callback of this process was handed `delivery` to `target` released
    /// (its worker died, or it was promoted out of the waiting room).
    pub fn was_released(&self, target: &Target, delivery: &DeliveryId) -> bool {
        self.releases
            .contains_key(&(target.clone(), delivery.clone()))
    }

    /// A container task began.
    pub fn running_up(&self) {
        // Relaxed: statistics; the maximum is approximate under races by at most the racers.
        let now = self.running.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_running.fetch_max(now, Ordering::Relaxed);
    }

    /// A container task ended.
    pub fn running_down(&self) {
        // Relaxed: a statistic.
        let _ = self
            .running
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    /// Container tasks running now.
    pub fn running(&self) -> usize {
        // Relaxed: a statistic.
        self.running.load(Ordering::Relaxed)
    }

    /// The audit figures.
    pub fn audit(&self) -> Audit {
        let mut a = Audit {
            workers: self.by_worker.len(),
            // Relaxed: statistics, read once the run is over.
            refused: self.refused.load(Ordering::Relaxed),
            lost_claims: self.lost.load(Ordering::Relaxed),
            abandoned_claims: self.abandoned.load(Ordering::Relaxed),
            max_running: self.max_running.load(Ordering::Relaxed),
            ..Audit::default()
        };
        for w in self.by_worker.iter() {
            a.started += u64::from(*w);
            a.max_per_worker = a.max_per_worker.max(*w);
        }
        for d in self.by_delivery.iter() {
            let starts = *d.value();
            a.max_per_delivery = a.max_per_delivery.max(starts);
            let releases = self.releases.get(d.key()).map_or(0, |r| {
                let distinct: HashSet<&String> = r.iter().flatten().collect();
                distinct.len() + r.iter().filter(|x| x.is_none()).count()
            });
            if starts as usize > 1 + releases {
                let (t, del) = d.key().clone();
                a.unexplained.push((t, del, starts, releases));
            }
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use worker_registry::FencingToken;

    fn job(n: u64) -> Job {
        Job {
            target: Target::new("o/r", 1).unwrap(),
            event: DeliveryId::new(&format!("d{n}")).unwrap(),
            token: FencingToken::from_raw(n),
            trace: Default::default(),
            payload: None,
        }
    }

    #[test]
    fn one_container_per_worker_and_parked_events_reach_it() {
        let c = Containers::new(4, 0);
        let (a, b) = (c.join(), c.join());
        let w = WorkerId::new(7);
        let (t, d) = (
            Target::new("o/r", 1).unwrap(),
            DeliveryId::new("d").unwrap(),
        );
        // Another replica's event arrives first: parked, not absent.
        assert!(matches!(c.hand(w, job(1), true), Ok(Handover::Queued)));
        assert!(!c.is_running(w));
        assert_eq!(c.can_crash(w), CrashOutcome::NotHere);
        let mut started = c.start(w, a, (&t, &d)).expect("the owner starts it");
        assert_eq!(started.jobs.try_recv().unwrap().event.as_str(), "d1");
        assert!(
            c.start(w, b, (&t, &d)).is_none(),
            "a second start is refused"
        );
        assert!(matches!(c.hand(w, job(2), false), Ok(Handover::Queued)));
        assert_eq!(c.owned_by(a), vec![w]);
        assert!(c.owned_by(b).is_empty());
        assert_eq!(c.can_crash(w), CrashOutcome::Crashed);
        drop(started);
        assert!(matches!(c.hand(w, job(3), false), Ok(Handover::Stopped)));
        assert_eq!(c.can_crash(w), CrashOutcome::Stopped);
        assert_eq!(c.without_container(), vec![w]);
        c.forget(w);
        assert!(matches!(
            c.hand(w, job(4), false),
            Err(j) if j.event.as_str() == "d4"
        ));
        let audit = c.ledger().audit();
        assert_eq!(
            (audit.started, audit.workers, audit.max_per_worker),
            (1, 1, 1)
        );
        assert_eq!(audit.refused, 1);
        assert!(audit.unexplained.is_empty());
    }

    /// A start claim: one replica of the process wins it, the others lose it and learn which
    /// delivery it was won for; events handed meanwhile wait for the container; the winner starts
    /// it (another replica's start is refused and counted), or gives the claim up and another may
    /// claim it.
    #[test]
    fn one_start_claim_per_worker() {
        let c = Containers::new(4, 0);
        let (a, b) = (c.join(), c.join());
        let (w, v) = (WorkerId::new(7), WorkerId::new(8));
        let t = Target::new("o/r", 1).unwrap();
        let (d, e) = (DeliveryId::new("d").unwrap(), DeliveryId::new("e").unwrap());
        let lost_to = |cause: &DeliveryId| Claim::Lost {
            cause: Some(cause.clone()),
        };
        assert_eq!(c.claim(w, a, &d), Claim::Won, "a wins");
        assert_eq!(c.claim(w, b, &e), lost_to(&d), "b loses, to d's claim");
        assert_eq!(c.claim(w, a, &d), lost_to(&d), "not a again");
        // Claimed, not started: events wait for it; it cannot crash, it is not running, a
        // shutdown leaves it for its start, and it is forgotten if the registry drops the worker.
        assert!(matches!(c.hand(w, job(1), false), Ok(Handover::Queued)));
        assert_eq!(c.can_crash(w), CrashOutcome::NotHere);
        assert!(!c.is_running(w) && !c.knows(w));
        assert_eq!(c.close_owned_by(a), 0);
        assert!(c.owned_by(a).is_empty());
        assert_eq!(c.without_container(), vec![w]);
        assert!(c.start(w, b, (&t, &e)).is_none(), "b holds no claim");
        assert_eq!(c.ledger().audit().refused, 1);
        let mut started = c.start(w, a, (&t, &d)).expect("a starts it");
        assert_eq!(started.jobs.try_recv().unwrap().event.as_str(), "d1");
        assert!(c.is_running(w) && c.knows(w));
        assert_eq!(c.claim(w, b, &e), lost_to(&d), "started: no claim");
        // Given up: the mailbox stays parked, and the next claim wins.
        assert_eq!(c.claim(v, a, &d), Claim::Won);
        assert!(matches!(c.hand(v, job(2), false), Ok(Handover::Queued)));
        c.unclaim(v, b);
        assert_eq!(c.claim(v, b, &e), lost_to(&d), "only a's unclaim counts");
        c.unclaim(v, a);
        assert_eq!(c.claim(v, b, &e), Claim::Won);
        let mut later = c.start(v, b, (&t, &e)).expect("b starts it");
        assert_eq!(later.jobs.try_recv().unwrap().event.as_str(), "d2");
        let audit = c.ledger().audit();
        assert_eq!(
            (audit.started, audit.max_per_worker, audit.refused),
            (2, 1, 1)
        );
    }

    #[test]
    fn full_mailboxes_and_closing_an_owners_containers() {
        let c = Containers::new(1, 1);
        let a = c.join();
        let (t, d) = (
            Target::new("o/r", 1).unwrap(),
            DeliveryId::new("d").unwrap(),
        );
        let _s1 = c.start(WorkerId::new(1), a, (&t, &d)).unwrap();
        let _s2 = c.start(WorkerId::new(2), a, (&t, &d)).unwrap();
        assert!(matches!(
            c.hand(WorkerId::new(1), job(1), false),
            Ok(Handover::Queued)
        ));
        assert!(matches!(
            c.hand(WorkerId::new(1), job(2), false),
            Ok(Handover::Overflowed { position: 1 })
        ));
        assert_eq!(c.overflow_metrics().queued(), 1);
        assert!(matches!(
            c.hand(WorkerId::new(1), job(3), false),
            Ok(Handover::Full)
        ));
        assert_eq!(c.close_owned_by(a), 2);
        assert!(c.is_empty());
        // One delivery started two containers without a release in between: reported.
        let audit = c.ledger().audit();
        assert_eq!(audit.max_per_delivery, 2);
        assert_eq!(audit.unexplained.len(), 1);
        c.ledger().released(&[ReleasedEvent::new(
            t,
            d,
            Some(WorkerId::new(1)),
            worker_registry::ReleaseReason::Unbound,
        )]);
        assert!(c.ledger().audit().unexplained.is_empty());
    }
}
