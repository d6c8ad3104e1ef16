//! The status snapshot as this handle last fetched it: published by the sweeping replica as one
//! row (`wr_snapshots`), cached here behind an `ArcSwap` so that `status()` is one pointer load,
//! replaced only by a newer version.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use serde::Deserialize;

use super::error::Failure;
use super::rows::{self, WorkerRow};
use crate::api::snapshot::{ClaimCounts, StatusSnapshot};

/// A published snapshot as the database holds it.
#[derive(Debug, Deserialize)]
pub(crate) struct SnapshotRow {
    pub(crate) version: i64,
    pub(crate) taken_at_ms: i64,
    pub(crate) brake_engaged: bool,
    pub(crate) in_flight: i64,
    pub(crate) retained: i64,
    pub(crate) workers: Vec<WorkerRow>,
}

impl SnapshotRow {
    /// The contract's snapshot, for a registry of `limit` workers.
    pub(crate) fn into_snapshot(self, limit: usize) -> Result<StatusSnapshot, Failure> {
        let workers = self
            .workers
            .iter()
            .map(|w| w.info(self.taken_at_ms))
            .collect::<Result<Vec<_>, _>>()?;
        let claims = ClaimCounts {
            in_flight: usize::try_from(self.in_flight).unwrap_or(0),
            retained: usize::try_from(self.retained).unwrap_or(0),
        };
        Ok(StatusSnapshot::new(
            u64::try_from(self.version).unwrap_or(0),
            rows::wall(self.taken_at_ms),
            rows::since_epoch(self.taken_at_ms),
            workers,
            limit,
            self.brake_engaged,
            claims,
        ))
    }
}

/// A snapshot and when this handle learned of it.
struct Cached {
    snapshot: Arc<StatusSnapshot>,
    /// How old it was (on the registry's time) when it was fetched.
    age_at_fetch: Duration,
    fetched: Instant,
}

/// The cache.
pub(crate) struct SnapshotCache {
    current: ArcSwap<Cached>,
}

impl SnapshotCache {
    /// The empty snapshot (version 0) of a registry of `limit` workers.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            current: ArcSwap::from_pointee(Cached {
                snapshot: Arc::new(StatusSnapshot::empty(limit, SystemTime::now())),
                age_at_fetch: Duration::ZERO,
                fetched: Instant::now(),
            }),
        }
    }

    /// The cached snapshot.
    pub(crate) fn load(&self) -> Arc<StatusSnapshot> {
        self.current.load().snapshot.clone()
    }

    /// The cached snapshot's version.
    pub(crate) fn version(&self) -> u64 {
        self.current.load().snapshot.version
    }

    /// How old the cached snapshot is now: its age when fetched plus the time since.
    pub(crate) fn age(&self) -> Duration {
        let c = self.current.load();
        c.age_at_fetch.saturating_add(c.fetched.elapsed())
    }

    /// Stores `snapshot`, fetched at registry time `now_ms`, unless the cache already holds this
    /// version or a newer one (two sweeps of one handle may finish out of order).
    pub(crate) fn offer(&self, snapshot: StatusSnapshot, now_ms: i64) {
        let age_at_fetch = rows::between(
            i64::try_from(snapshot.taken_at_monotonic.as_millis()).unwrap_or(i64::MAX),
            now_ms,
        );
        let new = Arc::new(Cached {
            snapshot: Arc::new(snapshot),
            age_at_fetch,
            fetched: Instant::now(),
        });
        self.current.rcu(|cur| {
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

    fn row(version: i64) -> SnapshotRow {
        SnapshotRow {
            version,
            taken_at_ms: 1_000,
            brake_engaged: false,
            in_flight: 2,
            retained: 1,
            workers: vec![],
        }
    }

    #[test]
    fn the_version_never_goes_backwards() {
        let cache = SnapshotCache::new(4);
        assert_eq!(cache.version(), 0);
        cache.offer(row(3).into_snapshot(4).unwrap(), 1_500);
        cache.offer(row(2).into_snapshot(4).unwrap(), 1_500);
        assert_eq!(cache.version(), 3);
        let s = cache.load();
        assert_eq!(
            (s.claims.in_flight, s.claims.retained, s.capacity.limit),
            (2, 1, 4)
        );
        assert!(cache.age() >= Duration::from_millis(500));
    }
}
