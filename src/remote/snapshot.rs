//! A handle's copy of the published status snapshot, for the networked backends: an `ArcSwap`,
//! replaced by the handle's own sweeps (and at connect) when the server holds a newer version, so
//! that `status()` never blocks and does no I/O, and its version never goes backwards.
//!
//! A new version arrives either whole ([`SnapshotCache::offer`]) or as a [`Change`] against the
//! cached one ([`SnapshotCache::advance`]): the workers written since (upserts, each read as of
//! the change's time), the ones gone (removals), the new header. Workers the change does not
//! name keep their entry, with their ages (`heartbeat_age`, `uptime`) moved on by the time
//! between the two snapshots, so a replica's cost per version is what changed on the server plus
//! one pass over its own copy (no I/O). The Redis backend builds its changes from the change log
//! its publish steps write (`src/redis/publish.rs`), the PostgreSQL backend from the worker rows
//! versioned since the handle's version and the ids purged since (`src/postgres/delta.rs`); a
//! handle with nothing yet, or further behind than either log reaches, starts over from every
//! worker ([`SnapshotCache::replace`], or [`SnapshotCache::offer`] of a whole snapshot).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;

use crate::api::ids::WorkerId;
use crate::api::snapshot::{ClaimCounts, PayloadUsage, StatusSnapshot, WorkerInfo};

/// What changed between the cached snapshot and `version`.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    /// The version it brings the snapshot to.
    pub(crate) version: u64,
    /// When that version was taken (wall clock).
    pub(crate) taken_at: SystemTime,
    /// When that version was taken (the registry's time base).
    pub(crate) taken_at_monotonic: Duration,
    /// Whether the brake held back deaths in the sweep that published it.
    pub(crate) brake_engaged: bool,
    /// The claim counts of that version.
    pub(crate) claims: ClaimCounts,
    /// Deliveries waiting in the waiting room at that version, if the backend publishes it with
    /// the change (PostgreSQL); `None` keeps the cached count until the backend sets it with
    /// [`SnapshotCache::set_waiting`] (Redis, which counts the room after its refresh).
    pub(crate) waiting: Option<usize>,
    /// Workers written since, as of `taken_at_monotonic` (new ones and changed ones).
    pub(crate) upserts: Vec<WorkerInfo>,
    /// Workers no longer in the snapshot (purged).
    pub(crate) removals: Vec<WorkerId>,
}

/// `base` with `change` applied: entries replaced in place, removed ones dropped, new ones
/// appended, the others' ages moved on to the change's time; counts recomputed from the list.
pub(crate) fn apply(base: &StatusSnapshot, change: Change) -> StatusSnapshot {
    let dt = change
        .taken_at_monotonic
        .saturating_sub(base.taken_at_monotonic);
    let mut fresh: HashMap<WorkerId, WorkerInfo> =
        change.upserts.into_iter().map(|w| (w.id, w)).collect();
    let gone: std::collections::HashSet<WorkerId> = change.removals.into_iter().collect();
    let mut workers = Vec::with_capacity(base.workers.len() + fresh.len());
    for w in &base.workers {
        if gone.contains(&w.id) {
            continue;
        }
        match fresh.remove(&w.id) {
            Some(new) => workers.push(new),
            None => {
                let mut w = w.clone();
                w.heartbeat_age = w.heartbeat_age.saturating_add(dt);
                w.uptime = w.uptime.saturating_add(dt);
                workers.push(w);
            }
        }
    }
    let mut added: Vec<WorkerInfo> = fresh
        .into_values()
        .filter(|w| !gone.contains(&w.id))
        .collect();
    added.sort_by_key(|w| w.id);
    workers.extend(added);
    let mut snapshot = StatusSnapshot::new(
        change.version,
        change.taken_at,
        change.taken_at_monotonic,
        workers,
        base.capacity.limit,
        change.brake_engaged,
        change.claims,
    );
    snapshot.waiting = change.waiting.unwrap_or(base.waiting);
    // Kept until the backend sets them (`SnapshotCache::set_payloads`).
    snapshot.payloads = base.payloads;
    snapshot
}

/// The cached snapshot and how old it was when fetched.
struct Cached {
    snapshot: Arc<StatusSnapshot>,
    /// When this handle fetched it (its own monotonic clock).
    fetched: Instant,
    /// The snapshot's age then, on the registry's time base.
    age_at_fetch: Duration,
}

/// The cache.
pub(crate) struct SnapshotCache {
    cell: ArcSwap<Cached>,
}

impl SnapshotCache {
    pub(crate) fn new(initial: StatusSnapshot) -> Self {
        Self {
            cell: ArcSwap::from_pointee(Cached {
                snapshot: Arc::new(initial),
                fetched: Instant::now(),
                age_at_fetch: Duration::ZERO,
            }),
        }
    }

    /// The cached snapshot. **Locking behaviour:** no lock: one `ArcSwap` load and a
    /// reference-count increment.
    pub(crate) fn load(&self) -> Arc<StatusSnapshot> {
        self.cell.load().snapshot.clone()
    }

    /// The cached version.
    pub(crate) fn version(&self) -> u64 {
        self.cell.load().snapshot.version
    }

    /// How old the cached snapshot is now: its age when fetched plus the time since.
    pub(crate) fn age(&self) -> Duration {
        let c = self.cell.load();
        c.age_at_fetch.saturating_add(c.fetched.elapsed())
    }

    /// Applies `change` to the cached snapshot if it is newer, as of registry time `now`;
    /// returns the snapshot then cached. The caller serialises its changes (a change is against
    /// the version it was read after).
    pub(crate) fn advance(&self, change: Change, now: Duration) -> Arc<StatusSnapshot> {
        let cur = self.load();
        if change.version > cur.version {
            self.offer(apply(&cur, change), now);
        }
        self.load()
    }

    /// Installs the snapshot `change` makes from nothing (its upserts are every worker), if it
    /// is newer than the cached one, as of registry time `now`: for a handle with nothing yet,
    /// or further behind than the server's change log reaches, which reads every worker once.
    // Only the PostgreSQL backend installs whole snapshots and restamps unchanged ones.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn replace(&self, change: Change, now: Duration) {
        if change.version > self.version() {
            let cur = self.load();
            let base = StatusSnapshot::empty(cur.capacity.limit, change.taken_at);
            self.offer(apply(&base, change), now);
        }
    }

    /// The server's snapshot is still `version`, as of `taken_at` (registry time
    /// `taken_at_monotonic`): nothing changed since, only time passed. Re-dates the cached one
    /// (the same version and entries, their ages moved on to then) if it is that version and
    /// older, as of registry time `now`. A backend whose version moves only when something
    /// changed calls this when told it did not.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn restamp(
        &self,
        version: u64,
        taken_at: SystemTime,
        taken_at_monotonic: Duration,
        now: Duration,
    ) {
        let cur = self.load();
        if cur.version != version || taken_at_monotonic <= cur.taken_at_monotonic {
            return;
        }
        let later = apply(
            &cur,
            Change {
                version,
                taken_at,
                taken_at_monotonic,
                brake_engaged: cur.brake_engaged,
                claims: cur.claims,
                waiting: None,
                upserts: Vec::new(),
                removals: Vec::new(),
            },
        );
        let new = Arc::new(Cached {
            age_at_fetch: now.saturating_sub(taken_at_monotonic),
            snapshot: Arc::new(later),
            fetched: Instant::now(),
        });
        self.cell.rcu(|c| {
            let s = &c.snapshot;
            if s.version == version && s.taken_at_monotonic < taken_at_monotonic {
                new.clone()
            } else {
                c.clone()
            }
        });
    }

    /// Sets the waiting room's size in the cached snapshot (the same version: the room is not
    /// part of the published snapshot; a sweep reads it and sets it here).
    pub(crate) fn set_waiting(&self, waiting: usize) {
        self.cell.rcu(|c| {
            if c.snapshot.waiting == waiting {
                return c.clone();
            }
            let mut s = (*c.snapshot).clone();
            s.waiting = waiting;
            Arc::new(Cached {
                snapshot: Arc::new(s),
                fetched: c.fetched,
                age_at_fetch: c.age_at_fetch,
            })
        });
    }

    /// Sets the payloads held in the cached snapshot (the same version: Redis's sweep reads them
    /// and sets them here; PostgreSQL publishes them beside the change and sets them after
    /// applying it).
    pub(crate) fn set_payloads(&self, usage: PayloadUsage) {
        self.cell.rcu(|c| {
            if c.snapshot.payloads == usage {
                return c.clone();
            }
            let mut s = (*c.snapshot).clone();
            s.payloads = usage;
            Arc::new(Cached {
                snapshot: Arc::new(s),
                fetched: c.fetched,
                age_at_fetch: c.age_at_fetch,
            })
        });
    }

    /// Starts over from `initial` whatever the cached version: after the server lost the
    /// registry's data (its versions started over), the one time a handle's version goes back.
    pub(crate) fn reset(&self, initial: StatusSnapshot) {
        self.cell.store(Arc::new(Cached {
            snapshot: Arc::new(initial),
            fetched: Instant::now(),
            age_at_fetch: Duration::ZERO,
        }));
    }

    /// Installs `snapshot`, fetched when the registry's time was `now`, if it is newer than the
    /// cached one (a concurrent sweep of this handle may have installed a newer one already).
    pub(crate) fn offer(&self, snapshot: StatusSnapshot, now: Duration) {
        let age_at_fetch = now.saturating_sub(snapshot.taken_at_monotonic);
        let new = Arc::new(Cached {
            snapshot: Arc::new(snapshot),
            fetched: Instant::now(),
            age_at_fetch,
        });
        self.cell.rcu(|cur| {
            if new.snapshot.version > cur.snapshot.version {
                new.clone()
            } else {
                cur.clone()
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn at(version: u64) -> StatusSnapshot {
        let mut s = StatusSnapshot::empty(4, SystemTime::UNIX_EPOCH);
        s.version = version;
        s
    }

    #[test]
    fn versions_never_go_backwards() {
        let c = SnapshotCache::new(at(0));
        c.offer(at(3), Duration::ZERO);
        c.offer(at(2), Duration::ZERO);
        assert_eq!(c.version(), 3);
        assert_eq!(c.load().version, 3);
    }

    fn worker(id: u64, age_ms: u64) -> WorkerInfo {
        let mut w = WorkerInfo::new(
            WorkerId::new(id),
            None,
            crate::WorkerKind::Registered,
            SystemTime::UNIX_EPOCH,
        );
        w.heartbeat_age = Duration::from_millis(age_ms);
        w.uptime = Duration::from_millis(age_ms);
        w
    }

    fn change(version: u64, at_ms: u64, upserts: Vec<WorkerInfo>, removals: Vec<u64>) -> Change {
        Change {
            version,
            taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(at_ms),
            taken_at_monotonic: Duration::from_millis(at_ms),
            brake_engaged: false,
            claims: ClaimCounts::default(),
            waiting: None,
            upserts,
            removals: removals.into_iter().map(WorkerId::new).collect(),
        }
    }

    #[test]
    fn a_change_replaces_removes_appends_and_ages_the_rest() {
        let c = SnapshotCache::new(at(0));
        c.advance(
            change(
                1,
                1_000,
                vec![worker(1, 0), worker(2, 0), worker(3, 0)],
                vec![],
            ),
            Duration::ZERO,
        );
        let mut busy = worker(2, 0);
        busy.activity = crate::Activity::Busy;
        let s = c.advance(
            change(2, 1_500, vec![busy, worker(4, 0)], vec![3]),
            Duration::ZERO,
        );
        let ids: Vec<u64> = s.workers.iter().map(|w| w.id.get()).collect();
        assert_eq!(ids, [1, 2, 4]);
        assert_eq!(
            s.workers[0].heartbeat_age,
            Duration::from_millis(500),
            "aged by 500 ms"
        );
        assert_eq!(s.workers[1].activity, crate::Activity::Busy);
        assert_eq!(
            s.workers[1].heartbeat_age,
            Duration::ZERO,
            "read as of the change"
        );
        assert_eq!((s.version, s.counts.active, s.capacity.used), (2, 3, 3));
        // Nothing changed by 2 000 ms: the same version and entries, aged.
        c.restamp(
            2,
            SystemTime::UNIX_EPOCH + Duration::from_millis(2_000),
            Duration::from_millis(2_000),
            Duration::ZERO,
        );
        let later = c.load();
        assert_eq!((later.version, later.workers.len()), (2, 3));
        assert_eq!(later.workers[0].heartbeat_age, Duration::from_millis(1_000));
        assert_eq!(later.taken_at_monotonic, Duration::from_millis(2_000));
        // Not for another version, nor an older time.
        c.restamp(
            1,
            SystemTime::UNIX_EPOCH,
            Duration::from_millis(9_000),
            Duration::ZERO,
        );
        c.restamp(
            2,
            SystemTime::UNIX_EPOCH,
            Duration::from_millis(1_800),
            Duration::ZERO,
        );
        assert_eq!(c.load().taken_at_monotonic, Duration::from_millis(2_000));
        // An older change is ignored.
        assert_eq!(
            c.advance(change(2, 9_000, vec![], vec![1]), Duration::ZERO)
                .workers
                .len(),
            3
        );
    }
}
