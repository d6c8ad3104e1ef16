//! What a user would otherwise write: the same registry operations on one `Mutex<HashMap>`, and on one
//! `RwLock<HashMap>` (reads under the read lock, heartbeats as an atomic store under it). Same key
//! types, same hasher, same clock as the registry; kept small and honest (no sharding, no tricks, but
//! no pessimisation either: the clock is read outside the lock).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use worker_registry::{Clock, DeliveryId, SystemClock, Target, WorkerId};

use crate::common::Hasher;

const TIMEOUT_MS: u64 = 120_000;

pub struct Worker {
    target: Option<Target>,
    /// Atomic so the RwLock flavour can heartbeat under the read lock.
    last_beat: AtomicU64,
    dead: bool,
}

pub struct Claim {
    holder: WorkerId,
    completed_at: Option<u64>,
}

/// One worker row of a naive status listing (built in full, as a status endpoint would; the bench
/// only counts them).
#[allow(dead_code)]
#[derive(Clone)]
pub struct Info {
    pub id: WorkerId,
    pub target: Option<Target>,
    pub last_beat: u64,
    pub dead: bool,
}

pub struct Tables {
    workers: HashMap<WorkerId, Worker, Hasher>,
    /// Completed claims kept at most (oldest dropped by the sweep), as the registry's default.
    max_retained: usize,
    targets: HashMap<Target, WorkerId, Hasher>,
    claims: HashMap<(Target, DeliveryId), Claim, Hasher>,
    next_id: u64,
    live: usize,
    max: usize,
}

/// What an admit decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    Assigned(WorkerId),
    Duplicate,
    Rejected,
}

impl Tables {
    fn new(max: usize) -> Self {
        Self {
            workers: HashMap::with_hasher(Hasher::new()),
            max_retained: worker_registry::config::DEFAULT_MAX_RETAINED_CLAIMS,
            targets: HashMap::with_hasher(Hasher::new()),
            claims: HashMap::with_hasher(Hasher::new()),
            next_id: 1,
            live: 0,
            max,
        }
    }

    fn beat(&self, id: WorkerId, now: u64) -> bool {
        match self.workers.get(&id) {
            Some(w) if !w.dead => {
                w.last_beat.store(now, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    fn is_duplicate(&self, key: &(Target, DeliveryId)) -> bool {
        self.claims.get(key).is_some_and(|c| {
            c.completed_at.is_some() || self.workers.get(&c.holder).is_some_and(|w| !w.dead)
        })
    }

    fn admit(&mut self, key: (Target, DeliveryId), now: u64) -> Admit {
        if self.is_duplicate(&key) {
            return Admit::Duplicate;
        }
        let sticky = self
            .targets
            .get(&key.0)
            .copied()
            .filter(|id| self.workers.get(id).is_some_and(|w| !w.dead));
        let id = match sticky {
            Some(id) => id,
            None if self.live < self.max => {
                let id = WorkerId::new(self.next_id);
                self.next_id += 1;
                self.live += 1;
                self.workers.insert(
                    id,
                    Worker {
                        target: Some(key.0.clone()),
                        last_beat: AtomicU64::new(now),
                        dead: false,
                    },
                );
                self.targets.insert(key.0.clone(), id);
                id
            }
            None => return Admit::Rejected,
        };
        self.claims.insert(
            key,
            Claim {
                holder: id,
                completed_at: None,
            },
        );
        Admit::Assigned(id)
    }

    fn complete(&mut self, key: &(Target, DeliveryId), now: u64) -> bool {
        match self.claims.get_mut(key) {
            Some(c) if c.completed_at.is_none() => {
                c.completed_at = Some(now);
                true
            }
            _ => false,
        }
    }

    fn release(&mut self, key: &(Target, DeliveryId)) {
        self.claims.remove(key);
    }

    fn sweep(&mut self, now: u64) -> usize {
        let mut died = 0;
        let Self {
            workers,
            targets,
            live,
            ..
        } = self;
        for w in workers.values_mut() {
            if !w.dead && now.saturating_sub(w.last_beat.load(Ordering::Relaxed)) > TIMEOUT_MS {
                w.dead = true;
                *live -= 1;
                died += 1;
                if let Some(t) = &w.target {
                    targets.remove(t);
                }
            }
        }
        let workers = &self.workers;
        self.claims.retain(|_, c| {
            c.completed_at.is_some() || workers.get(&c.holder).is_some_and(|w| !w.dead)
        });
        // Keep at most `max_retained` completed claims: drop the oldest (what a user would write).
        let mut done: Vec<u64> = self
            .claims
            .values()
            .filter_map(|c| c.completed_at)
            .collect();
        if done.len() > self.max_retained {
            let excess = done.len() - self.max_retained;
            let (_, cutoff, _) = done.select_nth_unstable(excess - 1);
            let cutoff = *cutoff;
            self.claims
                .retain(|_, c| c.completed_at.is_none_or(|t| t > cutoff));
        }
        died
    }

    fn status(&self) -> Vec<Info> {
        self.workers
            .iter()
            .map(|(id, w)| Info {
                id: *id,
                target: w.target.clone(),
                last_beat: w.last_beat.load(Ordering::Relaxed),
                dead: w.dead,
            })
            .collect()
    }
}

fn now(clock: &SystemClock) -> u64 {
    let d: Duration = clock.now();
    d.as_millis() as u64
}

/// Everything under one `Mutex`.
pub struct MutexRegistry {
    clock: SystemClock,
    t: Mutex<Tables>,
}

/// Reads (heartbeat, duplicate check, status) under the read lock; changes under the write lock.
pub struct RwLockRegistry {
    clock: SystemClock,
    t: RwLock<Tables>,
}

/// The operations the benches drive on every registry flavour.
pub trait Router: Sync {
    fn heartbeat(&self, id: WorkerId) -> bool;
    fn admit(&self, target: &Target, event: &DeliveryId) -> Admit;
    fn complete(&self, target: &Target, event: &DeliveryId) -> bool;
    fn release(&self, target: &Target, event: &DeliveryId);
    fn sweep(&self) -> usize;
    /// A status listing; returns how many workers it shows.
    fn status(&self) -> usize;
}

impl MutexRegistry {
    pub fn new(max: usize) -> Self {
        Self {
            clock: SystemClock::new(),
            t: Mutex::new(Tables::new(max)),
        }
    }
}

impl RwLockRegistry {
    pub fn new(max: usize) -> Self {
        Self {
            clock: SystemClock::new(),
            t: RwLock::new(Tables::new(max)),
        }
    }
}

impl Router for MutexRegistry {
    fn heartbeat(&self, id: WorkerId) -> bool {
        let now = now(&self.clock);
        self.t.lock().unwrap().beat(id, now)
    }
    fn admit(&self, target: &Target, event: &DeliveryId) -> Admit {
        let now = now(&self.clock);
        let key = (target.clone(), event.clone());
        self.t.lock().unwrap().admit(key, now)
    }
    fn complete(&self, target: &Target, event: &DeliveryId) -> bool {
        let now = now(&self.clock);
        let key = (target.clone(), event.clone());
        self.t.lock().unwrap().complete(&key, now)
    }
    fn release(&self, target: &Target, event: &DeliveryId) {
        let key = (target.clone(), event.clone());
        self.t.lock().unwrap().release(&key)
    }
    fn sweep(&self) -> usize {
        let now = now(&self.clock);
        self.t.lock().unwrap().sweep(now)
    }
    fn status(&self) -> usize {
        self.t.lock().unwrap().status().len()
    }
}

impl Router for RwLockRegistry {
    fn heartbeat(&self, id: WorkerId) -> bool {
        let now = now(&self.clock);
        self.t.read().unwrap().beat(id, now)
    }
    fn admit(&self, target: &Target, event: &DeliveryId) -> Admit {
        let now = now(&self.clock);
        let key = (target.clone(), event.clone());
        if self.t.read().unwrap().is_duplicate(&key) {
            return Admit::Duplicate;
        }
        self.t.write().unwrap().admit(key, now)
    }
    fn complete(&self, target: &Target, event: &DeliveryId) -> bool {
        let now = now(&self.clock);
        let key = (target.clone(), event.clone());
        self.t.write().unwrap().complete(&key, now)
    }
    fn release(&self, target: &Target, event: &DeliveryId) {
        let key = (target.clone(), event.clone());
        self.t.write().unwrap().release(&key)
    }
    fn sweep(&self) -> usize {
        let now = now(&self.clock);
        self.t.write().unwrap().sweep(now)
    }
    fn status(&self) -> usize {
        self.t.read().unwrap().status().len()
    }
}

/// A naive registry holding one worker per target, each admitted for `events[i]`.
pub fn populate<R: Router>(r: &R, targets: &[Target], events: &[DeliveryId]) -> Vec<WorkerId> {
    targets
        .iter()
        .zip(events)
        .map(|(t, e)| match r.admit(t, e) {
            Admit::Assigned(id) => id,
            other => panic!("naive populate: {other:?}"),
        })
        .collect()
}
