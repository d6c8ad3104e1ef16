//! The status snapshot as this handle last assembled it. The lease holder's sweep versions the
//! worker rows that changed (`wr_sweep_stamp`) and publishes a version with the gauges
//! (`wr_snapshots`); every handle's sweep then reads only the rows versioned after its own
//! version, and the ids purged since (`wr_snapshot_since`), applies them to its copy of the
//! rows, and caches the snapshot built from them behind an `ArcSwap`, so that `status()` is one
//! pointer load. A handle with nothing yet, or further behind than the purge log reaches, reads
//! every row once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use serde::Deserialize;

use super::error::Failure;
use super::rows::{self, OutboxRow, WorkerRow};
use crate::api::snapshot::{ClaimCounts, StatusSnapshot};
use crate::sync::{self, Mutex};

/// What `wr_snapshot_since` answers.
#[derive(Debug, Deserialize)]
pub(crate) struct SnapshotDelta {
    /// The registry's time when it was read.
    pub(crate) now: i64,
    /// The published version.
    pub(crate) version: i64,
    /// Whether the published version is newer than the one asked about (else nothing below).
    pub(crate) changed: bool,
    /// Every worker row (not only the changed ones): replace, do not merge.
    #[serde(default)]
    pub(crate) full: bool,
    #[serde(default)]
    pub(crate) taken_at_ms: i64,
    #[serde(default)]
    pub(crate) brake_engaged: bool,
    #[serde(default)]
    pub(crate) in_flight: i64,
    #[serde(default)]
    pub(crate) retained: i64,
    /// The rows versioned after the version asked about (or all of them, if `full`).
    #[serde(default)]
    pub(crate) workers: Vec<WorkerRow>,
    /// Ids purged after the version asked about.
    #[serde(default)]
    pub(crate) purged: Vec<i64>,
}

/// What `wr_sweep_collect` returns: this replica's share of the outbox, and the snapshot's changes
/// since the version it asked about.
#[derive(Debug, Deserialize)]
pub(crate) struct Collected {
    /// The registry's time.
    pub(crate) now: i64,
    pub(crate) events: Vec<OutboxRow>,
    pub(crate) snapshot: SnapshotDelta,
}

/// A snapshot and when this handle learned of it.
struct Cached {
    snapshot: Arc<StatusSnapshot>,
    /// How old it was (on the registry's time) when it was fetched.
    age_at_fetch: Duration,
    fetched: Instant,
}

/// This handle's copy of the worker rows, at a version.
#[derive(Default)]
struct Rows {
    version: u64,
    by_id: BTreeMap<i64, WorkerRow>,
}

/// The cache.
pub(crate) struct SnapshotCache {
    current: ArcSwap<Cached>,
    /// Held only while a delta is applied and the snapshot built from it (by this handle's
    /// sweeps; `status()` never takes it).
    rows: Mutex<Rows>,
    limit: usize,
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
            rows: Mutex::new(Rows::default()),
            limit,
        }
    }

    /// Starts over from the empty snapshot (version 0), whatever the cached version: after the
    /// database lost or rewound the registry's data, the one time a handle's version goes back.
    /// The next refresh reads every worker row.
    pub(crate) fn reset(&self) {
        let mut rows = sync::lock(&self.rows);
        *rows = Rows::default();
        self.current.store(Arc::new(Cached {
            snapshot: Arc::new(StatusSnapshot::empty(self.limit, SystemTime::now())),
            age_at_fetch: Duration::ZERO,
            fetched: Instant::now(),
        }));
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

    /// Applies `delta` (read for this cache's version or an older one) unless the cache holds its
    /// version or a newer one already (two sweeps of one handle may finish out of order). Rows
    /// are current values, and ids never repeat, so a delta read for an older version applies
    /// to a newer copy as well.
    pub(crate) fn apply(&self, delta: SnapshotDelta) -> Result<(), Failure> {
        if !delta.changed {
            return Ok(());
        }
        let version = u64::try_from(delta.version).unwrap_or(0);
        // A poisoned lock is still usable: the rows it guards were each read from the database.
        let mut rows = sync::lock(&self.rows);
        if version <= rows.version {
            return Ok(());
        }
        // Every new row is read before any is stored, so that an unreadable one leaves the copy
        // as it was.
        for w in &delta.workers {
            w.info(delta.taken_at_ms)?;
        }
        if delta.full {
            rows.by_id.clear();
        }
        for id in &delta.purged {
            rows.by_id.remove(id);
        }
        for w in delta.workers {
            rows.by_id.insert(w.id, w);
        }
        let workers = rows
            .by_id
            .values()
            .map(|w| w.info(delta.taken_at_ms))
            .collect::<Result<Vec<_>, _>>()?;
        let claims = ClaimCounts {
            in_flight: usize::try_from(delta.in_flight).unwrap_or(0),
            retained: usize::try_from(delta.retained).unwrap_or(0),
        };
        let snapshot = StatusSnapshot::new(
            version,
            rows::wall(delta.taken_at_ms),
            rows::since_epoch(delta.taken_at_ms),
            workers,
            self.limit,
            delta.brake_engaged,
            claims,
        );
        rows.version = version;
        self.current.store(Arc::new(Cached {
            snapshot: Arc::new(snapshot),
            age_at_fetch: rows::between(delta.taken_at_ms, delta.now),
            fetched: Instant::now(),
        }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(id: i64, status: &str) -> WorkerRow {
        serde_json::from_value(serde_json::json!({
            "id": id, "repo": "o/r", "number": id, "status": status,
            "dead_reason": if status == "dead" { Some("exited") } else { None },
            "busy": false, "suspect": false, "beaten": true, "last_beat_ms": 900,
            "started_ms": 500, "died_at_ms": null, "drain_deadline_ms": null, "assignments": 1,
            "version": 1, "dirty": false
        }))
        .unwrap()
    }

    fn delta(version: i64, full: bool, workers: Vec<WorkerRow>, purged: Vec<i64>) -> SnapshotDelta {
        SnapshotDelta {
            now: 1_500,
            version,
            changed: true,
            full,
            taken_at_ms: 1_000,
            brake_engaged: false,
            in_flight: 2,
            retained: 1,
            workers,
            purged,
        }
    }

    fn ids(cache: &SnapshotCache) -> Vec<u64> {
        cache.load().workers.iter().map(|w| w.id.get()).collect()
    }

    #[test]
    fn the_version_never_goes_backwards() {
        let cache = SnapshotCache::new(4);
        assert_eq!(cache.version(), 0);
        cache
            .apply(delta(3, true, vec![worker(1, "active")], vec![]))
            .unwrap();
        cache.apply(delta(2, true, vec![], vec![])).unwrap();
        assert_eq!(cache.version(), 3);
        assert_eq!(ids(&cache), [1]);
        let s = cache.load();
        assert_eq!(
            (s.claims.in_flight, s.claims.retained, s.capacity.limit),
            (2, 1, 4)
        );
        assert!(cache.age() >= Duration::from_millis(500));
    }

    #[test]
    fn a_delta_updates_adds_and_purges_rows_and_a_full_read_replaces_them() {
        let cache = SnapshotCache::new(4);
        let rows = vec![
            worker(1, "active"),
            worker(2, "active"),
            worker(3, "active"),
        ];
        cache.apply(delta(1, true, rows, vec![])).unwrap();
        cache
            .apply(delta(
                2,
                false,
                vec![worker(2, "dead"), worker(4, "active")],
                vec![3],
            ))
            .unwrap();
        assert_eq!(ids(&cache), [1, 2, 4]);
        assert!(matches!(
            cache.load().workers[1].status,
            crate::api::status::Status::Dead(_)
        ));
        cache
            .apply(delta(5, true, vec![worker(4, "active")], vec![]))
            .unwrap();
        assert_eq!(ids(&cache), [4]);
        let unchanged = SnapshotDelta {
            changed: false,
            ..delta(9, false, vec![], vec![4])
        };
        cache.apply(unchanged).unwrap();
        assert_eq!((cache.version(), ids(&cache)), (5, vec![4]));
    }
}
