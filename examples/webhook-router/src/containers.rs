//! The in-process container platform: every simulated container (a tokio task) this process runs,
//! by worker id, with its mailbox, as a container platform keeps containers reachable by id.
//!
//! **One container per worker.** Only the replica whose admission *created* a worker
//! (`new: true`) starts its container ([`Containers::start`]); every other replica, and every
//! later event, only hands events to it by id ([`Containers::hand`]). A second start for a worker
//! id is refused (and counted: it would be a bug). With several router replicas in one process
//! (`--simulate --replicas N`) they share one `Containers`; with replicas in separate processes,
//! each process has its own and reaches the others' containers through [`crate::remote`].
//!
//! An event may reach a worker before its owner has started the container (the owner's
//! admission answer is still on its way): in one process it waits in the worker's mailbox, which
//! the container takes over when it starts ("parked"). If the owner never starts it (its replica
//! died in between), the worker never heartbeats, the sweep declares it dead after the start-up
//! grace, and the registry releases its events for re-dispatch; the parked mailbox is then
//! dropped.
//!
//! Each mailbox is a [`crate::mailbox`]: a bounded channel with a bounded overflow behind it, so
//! that an event handed to a busy worker waits in order instead of being refused.
//!
//! [`Ledger`] counts container starts per worker id and per delivery, and releases per delivery,
//! for the simulator's audit.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use tokio::sync::Notify;
use worker_registry::{DeliveryId, ReleasedEvent, Target, WorkerId};

use crate::limits::{MAX_MAILBOX, MAX_OVERFLOW};
use crate::mailbox::{self, Mailbox, OverflowMetrics, Put};
use crate::telemetry::Traces;
use crate::worker::Job;

/// A router replica's tag on the platform.
pub type ReplicaTag = u32;

/// What a started container is given.
pub struct Started {
    /// Its events (the mailbox's receiving end).
    pub jobs: Mailbox,
    /// Notified to make it crash.
    pub crash: Arc<Notify>,
}

/// What became of an event handed to a worker by id.
#[derive(Debug)]
pub enum Handed {
    /// In its mailbox.
    Queued,
    /// Its mailbox is full: queued in its overflow, `position` deep (from 1), in arrival order.
    Overflowed {
        /// Its place in the overflow.
        position: usize,
    },
    /// Its mailbox and its overflow are both full.
    Full,
    /// Its container has stopped (crashed, fenced, exited or killed with its replica).
    Stopped,
    /// No container of this process has that id (and the event was not parked).
    Absent(Job),
}

/// What a crash request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashOutcome {
    /// The container was told to crash.
    Crashed,
    /// It had stopped already.
    Stopped,
    /// No container of this process has that id.
    NotHere,
}

struct Slot {
    /// The replica that started the container; `None` while events wait for it (parked).
    owner: Option<ReplicaTag>,
    jobs: mailbox::Sender,
    parked: Option<Mailbox>,
    crash: Arc<Notify>,
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

    fn slot(&self, owner: Option<ReplicaTag>) -> (Slot, Mailbox) {
        let (jobs, rx) =
            mailbox::channel(self.mailbox, self.overflow, self.overflow_metrics.clone());
        (
            Slot {
                owner,
                jobs,
                parked: None,
                crash: Arc::new(Notify::new()),
            },
            rx,
        )
    }

    /// Starts `worker`'s container for `owner`, whose admission of `cause` created the worker:
    /// its mailbox (with whatever was parked in it), or `None` if a container for that id was
    /// started already (refused and counted: never two containers for one worker).
    ///
    /// **Locking behaviour:** holds the worker's map shard for the insert only.
    pub fn start(
        &self,
        worker: WorkerId,
        owner: ReplicaTag,
        cause: (&Target, &DeliveryId),
    ) -> Option<Started> {
        let started = match self.slots.entry(worker) {
            Entry::Vacant(v) => {
                let (slot, jobs) = self.slot(Some(owner));
                let crash = slot.crash.clone();
                v.insert(slot);
                Started { jobs, crash }
            }
            Entry::Occupied(mut o) => {
                let slot = o.get_mut();
                match (slot.owner, slot.parked.take()) {
                    (None, Some(jobs)) => {
                        slot.owner = Some(owner);
                        Started {
                            jobs,
                            crash: slot.crash.clone(),
                        }
                    }
                    (_, parked) => {
                        slot.parked = parked;
                        // Relaxed: a statistic.
                        self.ledger.refused.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                }
            }
        };
        self.ledger.started(worker, cause);
        Some(started)
    }

    /// Hands `job` to `worker`'s container. Without one here: parks it in a new mailbox for the
    /// container to come if `park`, else gives it back ([`Handed::Absent`]).
    ///
    /// **Locking behaviour:** reads the worker's map shard to find the mailbox (write-locks it to
    /// park one), never while queueing; queueing never waits: it takes the worker's overflow lock
    /// for one queue operation (a full mailbox and overflow answer [`Handed::Full`]).
    pub fn hand(&self, worker: WorkerId, job: Job, park: bool) -> Handed {
        let found = self.slots.get(&worker).map(|s| s.jobs.clone());
        let jobs = match found {
            Some(jobs) => jobs,
            None => match self.slots.entry(worker) {
                Entry::Occupied(o) => o.get().jobs.clone(),
                Entry::Vacant(v) if park => {
                    let (mut slot, rx) = self.slot(None);
                    slot.parked = Some(rx);
                    let jobs = slot.jobs.clone();
                    v.insert(slot);
                    jobs
                }
                Entry::Vacant(_) => return Handed::Absent(job),
            },
        };
        let key = (!job.trace.is_none()).then(|| (job.target.clone(), job.event.clone()));
        let trace = key.as_ref().map(|_| job.trace.clone());
        let handed = match jobs.put(job) {
            Put::Queued => Handed::Queued,
            Put::Overflowed { position } => Handed::Overflowed { position },
            Put::Full => return Handed::Full,
            Put::Closed => return Handed::Stopped,
        };
        if let (Some((target, delivery)), Some(trace)) = (key, trace) {
            self.traces.handed(&target, &delivery, &trace);
        }
        handed
    }

    /// Tells `worker`'s container to crash.
    pub fn crash(&self, worker: WorkerId) -> CrashOutcome {
        match self.slots.get(&worker) {
            Some(slot) if slot.owner.is_some() => {
                if slot.jobs.is_closed() {
                    CrashOutcome::Stopped
                } else {
                    slot.crash.notify_one();
                    CrashOutcome::Crashed
                }
            }
            _ => CrashOutcome::NotHere,
        }
    }

    /// Whether a container for `worker` was started here (running or stopped since).
    pub fn knows(&self, worker: WorkerId) -> bool {
        self.slots.get(&worker).is_some_and(|s| s.owner.is_some())
    }

    /// Whether `worker` has a container here that has not stopped.
    pub fn is_running(&self, worker: WorkerId) -> bool {
        self.slots
            .get(&worker)
            .is_some_and(|s| s.owner.is_some() && !s.jobs.is_closed())
    }

    /// The workers whose containers `owner` started (running or not).
    pub fn owned_by(&self, owner: ReplicaTag) -> Vec<WorkerId> {
        self.slots
            .iter()
            .filter(|s| s.owner == Some(owner))
            .map(|s| *s.key())
            .collect()
    }

    /// Closes the mailboxes of `owner`'s containers (shutdown): each finishes what is queued, then
    /// leaves. Returns how many there were.
    pub fn close_owned_by(&self, owner: ReplicaTag) -> usize {
        let before = self.slots.len();
        self.slots.retain(|_, s| s.owner != Some(owner));
        before - self.slots.len()
    }

    /// Workers whose mailbox has no running container behind it (stopped, or parked): the ones to
    /// forget once the registry no longer counts them alive.
    pub fn without_container(&self) -> Vec<WorkerId> {
        self.slots
            .iter()
            .filter(|s| s.owner.is_none() || s.jobs.is_closed())
            .map(|s| *s.key())
            .collect()
    }

    /// Forgets `worker`'s mailbox if it still has no running container behind it.
    pub fn forget(&self, worker: WorkerId) {
        self.slots
            .remove_if(&worker, |_, s| s.owner.is_none() || s.jobs.is_closed());
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
    /// Second starts the platform refused.
    pub refused: u64,
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

    /// Records the released events a sweeper callback was handed.
    pub fn released(&self, events: &[ReleasedEvent]) {
        for e in events {
            self.releases
                .entry((e.target.clone(), e.delivery.clone()))
                .or_default()
                .push(e.receipt().map(|r| r.as_str().to_owned()));
        }
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
        assert!(matches!(c.hand(w, job(1), true), Handed::Queued));
        assert!(!c.is_running(w));
        assert_eq!(c.crash(w), CrashOutcome::NotHere);
        let mut started = c.start(w, a, (&t, &d)).expect("the owner starts it");
        assert_eq!(started.jobs.try_recv().unwrap().event.as_str(), "d1");
        assert!(
            c.start(w, b, (&t, &d)).is_none(),
            "a second start is refused"
        );
        assert!(matches!(c.hand(w, job(2), false), Handed::Queued));
        assert_eq!(c.owned_by(a), vec![w]);
        assert!(c.owned_by(b).is_empty());
        assert_eq!(c.crash(w), CrashOutcome::Crashed);
        drop(started);
        assert!(matches!(c.hand(w, job(3), false), Handed::Stopped));
        assert_eq!(c.crash(w), CrashOutcome::Stopped);
        assert_eq!(c.without_container(), vec![w]);
        c.forget(w);
        assert!(matches!(
            c.hand(w, job(4), false),
            Handed::Absent(j) if j.event.as_str() == "d4"
        ));
        let audit = c.ledger().audit();
        assert_eq!(
            (audit.started, audit.workers, audit.max_per_worker),
            (1, 1, 1)
        );
        assert_eq!(audit.refused, 1);
        assert!(audit.unexplained.is_empty());
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
            Handed::Queued
        ));
        assert!(matches!(
            c.hand(WorkerId::new(1), job(2), false),
            Handed::Overflowed { position: 1 }
        ));
        assert_eq!(c.overflow_metrics().queued(), 1);
        assert!(matches!(
            c.hand(WorkerId::new(1), job(3), false),
            Handed::Full
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
