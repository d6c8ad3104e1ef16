//! The workers this router serves over the protocol: for each, the mailbox the router hands its
//! events to (served by `GET /worker/v1/next`), the events it was handed and has not completed
//! (what `complete` names, and what is left unfinished if it is stopped), and when the registry
//! last showed it active (what the lease of a `draining` answer is counted from).
//!
//! **Locking behaviour.** One `DashMap` shard lock per lookup; per worker, a tokio mutex around
//! the mailbox, held by one `next` at a time for its long poll (a worker polls one event at a
//! time), and a std mutex around its small state, never held across an await.

use crate::mailbox::{Job, Mailbox};

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;
use worker_registry::WorkerId;

/// The served workers (see the [module documentation](self)).
#[derive(Default)]
pub struct Hub {
    workers: DashMap<WorkerId, Arc<Served>>,
}

/// One served worker.
pub struct Served {
    jobs: tokio::sync::Mutex<Mailbox>,
    state: Mutex<State>,
}

struct State {
    /// The start of the last registry call that showed the worker active.
    active_at: Instant,
    /// Until when (on this router's clock, from the heartbeat's arrival) its last lease runs.
    lease_until: Option<Instant>,
    /// Handed by `next`, not completed yet, oldest first.
    handed: VecDeque<Job>,
}

impl Hub {
    /// Serves worker `id`'s `jobs`; `active_at` is the start of the registry call that showed it
    /// active before its launch.
    pub fn serve(&self, id: WorkerId, jobs: Mailbox, active_at: Instant) {
        let served = Served {
            jobs: tokio::sync::Mutex::new(jobs),
            state: Mutex::new(State {
                active_at,
                lease_until: None,
                handed: VecDeque::new(),
            }),
        };
        self.workers.insert(id, Arc::new(served));
    }

    /// Worker `id`, if this router serves it.
    pub fn get(&self, id: WorkerId) -> Option<Arc<Served>> {
        self.workers.get(&id).map(|s| s.clone())
    }

    /// Stops serving worker `id` (it has exited): the events it was handed and did not complete,
    /// then those still queued for it. Its mailbox is closed and dropped once no `next` holds it.
    pub async fn remove(&self, id: WorkerId) -> Vec<Job> {
        let Some((_, served)) = self.workers.remove(&id) else {
            return Vec::new();
        };
        let mut left: Vec<Job> = served.lock().handed.drain(..).collect();
        let mut jobs = served.jobs.lock().await;
        jobs.close();
        while let Some(job) = jobs.try_recv() {
            left.push(job);
        }
        left
    }

    /// How many workers are served.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }
}

/// Whether `delivery`, as the worker names it, is `job`'s: its registry id, or the GUID GitHub
/// sent it with.
fn names(job: &Job, delivery: &str) -> bool {
    job.event.as_str() == delivery
        || job
            .payload
            .as_ref()
            .and_then(|p| p.header("x-github-delivery"))
            == Some(delivery)
}

impl Served {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every section leaves the state consistent; a poisoned lock is taken over as it is.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The registry showed the worker active in a call started at `at`.
    pub fn seen_active(&self, at: Instant) {
        let mut s = self.lock();
        s.active_at = s.active_at.max(at);
    }

    /// How long ago (at `now`) the last call that showed it active started.
    pub fn since_active(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.lock().active_at)
    }

    /// A lease of `lease` was granted at `now` (never shortens a later one).
    pub fn leased(&self, now: Instant, lease: Duration) {
        let until = now.checked_add(lease).unwrap_or(now);
        let mut s = self.lock();
        s.lease_until = Some(s.lease_until.map_or(until, |u| u.max(until)));
    }

    /// What is left of its lease at `now` (zero before its first heartbeat).
    pub fn lease_left(&self, now: Instant) -> Duration {
        self.lock()
            .lease_until
            .map_or(Duration::ZERO, |u| u.saturating_duration_since(now))
    }

    /// Waits up to `wait` for its next event, and records it as handed. `None`: nothing came
    /// (or its mailbox is closed and empty: the router is stopping).
    pub async fn next(&self, wait: Duration) -> Option<Job> {
        let mut jobs = self.jobs.lock().await;
        let job = if wait.is_zero() {
            jobs.try_recv()
        } else {
            tokio::time::timeout(wait, jobs.recv()).await.ok().flatten()
        }?;
        self.lock().handed.push_back(job.clone());
        Some(job)
    }

    /// The handed event `delivery`, taken off the handed list (it is being completed).
    /// `delivery` is what the worker was given as `X-GitHub-Delivery`: GitHub's GUID, which is
    /// the registry's delivery id or, for a router keying claims by hook too, its first part.
    pub fn take_handed(&self, delivery: &str) -> Option<Job> {
        let mut s = self.lock();
        let at = s.handed.iter().position(|j| names(j, delivery))?;
        s.handed.remove(at)
    }

    /// Whether event `delivery` (as [`take_handed`](Self::take_handed) names it) was handed to
    /// it and is not completed.
    pub fn is_handed(&self, delivery: &str) -> bool {
        self.lock().handed.iter().any(|j| names(j, delivery))
    }

    /// Puts back an event taken by [`take_handed`](Self::take_handed) whose completion could not
    /// be recorded (the backend was away): the worker may try again.
    pub fn hand_back(&self, job: Job) {
        self.lock().handed.push_front(job);
    }
}
