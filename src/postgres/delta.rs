//! What a handle reads of the published snapshot, and how it reaches the shared cache
//! ([`remote::snapshot`](crate::remote::snapshot), the one Redis uses). The lease holder's sweep
//! versions the worker rows that changed (`wr_sweep_stamp`) and publishes a version with the
//! gauges (`wr_snapshots`); every handle's sweep then reads only the rows versioned after its own
//! version and the ids purged since (`wr_snapshot_since`), and hands them to the cache as a
//! [`Change`]: the rows as upserts, the purged ids as removals. A handle with nothing yet, or
//! further behind than the purge log reaches, reads every row once, and the cache starts from
//! those alone.

use std::time::SystemTime;

use serde::Deserialize;

use super::error::Failure;
use super::rows::{self, OutboxRow, WorkerRow};

use crate::api::snapshot::{ClaimCounts, PayloadUsage, StatusSnapshot};
use crate::remote::snapshot::{Change, SnapshotCache};

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
    /// Deliveries waiting in the waiting room.
    #[serde(default)]
    pub(crate) waiting: i64,
    /// Payloads held, and their bytes.
    #[serde(default)]
    pub(crate) payloads: i64,
    #[serde(default)]
    pub(crate) payload_bytes: i64,
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

impl SnapshotDelta {
    /// The cache's [`Change`]: every row read as of the version's time (a row changed again
    /// after it was versioned shows its newer state), the purged ids as removals; `None` if
    /// nothing was published since. Every row is read before the cache is touched, so an
    /// unreadable one leaves it as it was.
    fn change(self) -> Result<Option<(Change, bool)>, Failure> {
        if !self.changed {
            return Ok(None);
        }
        let at = self.taken_at_ms;
        let upserts = self
            .workers
            .iter()
            .map(|w| w.info(at))
            .collect::<Result<Vec<_>, _>>()?;
        let removals = self
            .purged
            .iter()
            .map(|id| rows::worker_id(*id))
            .collect::<Result<Vec<_>, _>>()?;
        let change = Change {
            version: u64::try_from(self.version).unwrap_or(0),
            taken_at: rows::wall(at),
            taken_at_monotonic: rows::since_epoch(at),
            brake_engaged: self.brake_engaged,
            claims: ClaimCounts {
                in_flight: usize::try_from(self.in_flight).unwrap_or(0),
                retained: usize::try_from(self.retained).unwrap_or(0),
            },
            waiting: Some(usize::try_from(self.waiting).unwrap_or(0)),
            upserts,
            removals,
        };
        Ok(Some((change, self.full)))
    }

    /// Brings `cache` to this delta's version, unless it holds that version or a newer one
    /// already (two sweeps of one handle may finish out of order). Rows are current values and
    /// ids never repeat, so a delta read for an older version applies to a newer copy as well.
    pub(crate) fn apply_to(self, cache: &SnapshotCache) -> Result<(), Failure> {
        let now = rows::since_epoch(self.now);
        let payloads = self.changed.then(|| {
            PayloadUsage::new(
                usize::try_from(self.payloads).unwrap_or(0),
                u64::try_from(self.payload_bytes).unwrap_or(0),
                cache.load().payloads.budget,
            )
        });
        if !self.changed {
            // The published version's time moved on without a change (or this handle is ahead:
            // then nothing happens).
            let version = u64::try_from(self.version).unwrap_or(0);
            let at = self.taken_at_ms;
            cache.restamp(version, rows::wall(at), rows::since_epoch(at), now);
            return Ok(());
        }
        match self.change()? {
            None => {}
            Some((change, true)) => cache.replace(change, now),
            Some((change, false)) => {
                cache.advance(change, now);
            }
        }
        if let Some(usage) = payloads {
            cache.set_payloads(usage);
        }
        Ok(())
    }
}

/// A handle's snapshot before it read one: no workers, nothing held against `budget`.
pub(crate) fn empty_snapshot(max_workers: usize, budget: u64) -> StatusSnapshot {
    let mut s = StatusSnapshot::empty(max_workers, SystemTime::now());
    s.payloads = PayloadUsage::new(0, 0, budget);
    s
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::api::snapshot::StatusSnapshot;

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
            waiting: 0,
            payloads: 0,
            payload_bytes: 0,
            workers,
            purged,
        }
    }

    fn cache() -> SnapshotCache {
        SnapshotCache::new(StatusSnapshot::empty(4, SystemTime::now()))
    }

    fn ids(cache: &SnapshotCache) -> Vec<u64> {
        cache.load().workers.iter().map(|w| w.id.get()).collect()
    }

    #[test]
    fn the_version_never_goes_backwards() {
        let cache = cache();
        assert_eq!(cache.version(), 0);
        delta(3, true, vec![worker(1, "active")], vec![])
            .apply_to(&cache)
            .unwrap();
        delta(2, true, vec![], vec![]).apply_to(&cache).unwrap();
        assert_eq!(cache.version(), 3);
        assert_eq!(ids(&cache), [1]);
        let s = cache.load();
        assert_eq!(
            (s.claims.in_flight, s.claims.retained, s.capacity.limit),
            (2, 1, 4)
        );
        assert_eq!(s.workers[0].heartbeat_age, Duration::from_millis(100));
        assert!(cache.age() >= Duration::from_millis(500));
    }

    #[test]
    fn a_delta_updates_adds_and_purges_rows_and_a_full_read_replaces_them() {
        let cache = cache();
        let rows = vec![
            worker(1, "active"),
            worker(2, "active"),
            worker(3, "active"),
        ];
        delta(1, true, rows, vec![]).apply_to(&cache).unwrap();
        delta(
            2,
            false,
            vec![worker(2, "dead"), worker(4, "active")],
            vec![3],
        )
        .apply_to(&cache)
        .unwrap();
        assert_eq!(ids(&cache), [1, 2, 4]);
        assert!(matches!(
            cache.load().workers[1].status,
            crate::api::status::Status::Dead(_)
        ));
        delta(5, true, vec![worker(4, "active")], vec![])
            .apply_to(&cache)
            .unwrap();
        assert_eq!(ids(&cache), [4]);
        let unchanged = SnapshotDelta {
            changed: false,
            ..delta(9, false, vec![], vec![4])
        };
        unchanged.apply_to(&cache).unwrap();
        assert_eq!((cache.version(), ids(&cache)), (5, vec![4]));
        // The same version, later: re-dated, not rebuilt.
        let later = SnapshotDelta {
            changed: false,
            taken_at_ms: 3_000,
            ..delta(5, false, vec![], vec![])
        };
        later.apply_to(&cache).unwrap();
        let s = cache.load();
        assert_eq!(
            (s.version, s.taken_at_monotonic),
            (5, Duration::from_secs(3))
        );
        assert_eq!(s.workers[0].heartbeat_age, Duration::from_millis(2_100));
    }

    #[test]
    fn an_unreadable_row_leaves_the_cache_as_it_was() {
        let cache = cache();
        delta(1, true, vec![worker(1, "active")], vec![])
            .apply_to(&cache)
            .unwrap();
        let bad = delta(2, false, vec![worker(2, "asleep")], vec![1]);
        assert!(bad.apply_to(&cache).is_err());
        assert_eq!((cache.version(), ids(&cache)), (1, vec![1]));
    }
}
