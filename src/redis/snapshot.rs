//! This handle's copy of the published status snapshot: an `ArcSwap`, replaced by this handle's
//! own sweeps (and at connect) when the server holds a newer version, so that `status()` never
//! blocks and does no I/O, and its version never goes backwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::api::snapshot::StatusSnapshot;

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
}
