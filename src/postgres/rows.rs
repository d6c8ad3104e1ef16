//! From what the database stores to the contract's types: times, statuses, targets, worker rows
//! (as a query row or as an element of a published snapshot), and the other way round for the
//! parameters.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

use super::error::{decode, Failure};
use super::payload::PayloadJson;
use crate::api::ids::{DeliveryId, FencingToken, Target, WorkerId};
use crate::api::outcome::Assignment;
use crate::api::report::{Receipt, ReleaseReason, ReleasedEvent};
use crate::api::snapshot::WorkerInfo;
use crate::api::status::{Activity, DeadReason, Status, WorkerKind};

/// A worker id as the database stores it.
pub(crate) fn worker_param(id: WorkerId) -> i64 {
    // Ids are at most WorkerId::MAX (2^44 - 1), far inside i64.
    id.get() as i64
}

/// A target's number as the database stores it: the same 64 bits, so that every `u64` the
/// contract accepts round-trips (numbers above `i64::MAX` are stored negative).
pub(crate) fn number_param(target: &Target) -> i64 {
    target.number() as i64
}

/// A duration as the milliseconds the functions take (config durations are at most a year).
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The wall-clock time of a registry timestamp (ms since the epoch, test offset included).
pub(crate) fn wall(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// `later - earlier`, never negative.
pub(crate) fn between(earlier: i64, later: i64) -> Duration {
    Duration::from_millis(u64::try_from(later.saturating_sub(earlier)).unwrap_or(0))
}

/// A registry timestamp as the contract's monotonic reading (time since the epoch).
pub(crate) fn since_epoch(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A worker id read back.
pub(crate) fn worker_id(raw: i64) -> Result<WorkerId, Failure> {
    u64::try_from(raw)
        .ok()
        .filter(|id| *id <= WorkerId::MAX)
        .map(WorkerId::new)
        .ok_or_else(|| decode(format!("worker id {raw}")))
}

/// A target read back from its two columns.
pub(crate) fn target(repo: &str, number: i64) -> Result<Target, Failure> {
    Target::new(repo, number as u64).map_err(|e| decode(format!("target {repo}#{number}: {e}")))
}

/// A target read back from its two nullable columns (a registered worker has none).
pub(crate) fn opt_target(
    repo: Option<&str>,
    number: Option<i64>,
) -> Result<Option<Target>, Failure> {
    match (repo, number) {
        (Some(r), Some(n)) => target(r, n).map(Some),
        (None, None) => Ok(None),
        _ => Err(decode("a target with only one of repo and number")),
    }
}

/// A death reason read back.
pub(crate) fn dead_reason(s: Option<&str>) -> Result<DeadReason, Failure> {
    s.and_then(DeadReason::parse)
        .ok_or_else(|| decode(format!("dead reason {s:?}")))
}

/// A status read back from the status and reason columns.
pub(crate) fn status(s: &str, reason: Option<&str>) -> Result<Status, Failure> {
    match s {
        "active" => Ok(Status::Active),
        "draining" => Ok(Status::Draining),
        "dead" => dead_reason(reason).map(Status::Dead),
        other => Err(decode(format!("worker status {other:?}"))),
    }
}

/// One column of a row, or a decode failure naming it.
pub(crate) fn col<'a, T: FromSql<'a>>(row: &'a Row, name: &str) -> Result<T, Failure> {
    row.try_get(name)
        .map_err(|e| decode(format!("column {name}: {e}")))
}

/// A worker as the database stores it (a `wr_workers` row, or an element of a snapshot).
#[derive(Debug, Deserialize)]
pub(crate) struct WorkerRow {
    pub(crate) id: i64,
    pub(crate) repo: Option<String>,
    pub(crate) number: Option<i64>,
    pub(crate) status: String,
    pub(crate) dead_reason: Option<String>,
    pub(crate) busy: bool,
    pub(crate) suspect: bool,
    pub(crate) beaten: bool,
    pub(crate) last_beat_ms: i64,
    pub(crate) started_ms: i64,
    pub(crate) died_at_ms: Option<i64>,
    pub(crate) drain_deadline_ms: Option<i64>,
    pub(crate) assignments: i64,
}

impl WorkerRow {
    /// Reads the columns of a `wr_workers` row.
    pub(crate) fn from_row(row: &Row) -> Result<Self, Failure> {
        Ok(Self {
            id: col(row, "id")?,
            repo: col(row, "repo")?,
            number: col(row, "number")?,
            status: col(row, "status")?,
            dead_reason: col(row, "dead_reason")?,
            busy: col(row, "busy")?,
            suspect: col(row, "suspect")?,
            beaten: col(row, "beaten")?,
            last_beat_ms: col(row, "last_beat_ms")?,
            started_ms: col(row, "started_ms")?,
            died_at_ms: col(row, "died_at_ms")?,
            drain_deadline_ms: col(row, "drain_deadline_ms")?,
            assignments: col(row, "assignments")?,
        })
    }

    /// The contract's view of this worker at registry time `now_ms`.
    pub(crate) fn info(&self, now_ms: i64) -> Result<WorkerInfo, Failure> {
        let id = worker_id(self.id)?;
        let target = opt_target(self.repo.as_deref(), self.number)?;
        let kind = if target.is_some() {
            WorkerKind::Spawned
        } else {
            WorkerKind::Registered
        };
        let status = status(&self.status, self.dead_reason.as_deref())?;
        let mut info = WorkerInfo::new(id, target, kind, wall(self.started_ms));
        info.status = status;
        info.activity = if self.busy {
            Activity::Busy
        } else {
            Activity::Idle
        };
        info.suspect = self.suspect;
        info.last_heartbeat = wall(self.last_beat_ms);
        info.heartbeat_age = between(self.last_beat_ms, now_ms);
        info.has_heartbeated = self.beaten;
        info.died_at = match status {
            Status::Dead(_) => self.died_at_ms.map(wall),
            _ => None,
        };
        info.drain_deadline = match status {
            Status::Draining => self.drain_deadline_ms.map(wall),
            _ => None,
        };
        info.token = token(id, self.assignments)?;
        info.uptime = between(self.started_ms, now_ms);
        Ok(info)
    }
}

/// The fencing token of the `seq`-th assignment of `id`.
pub(crate) fn token(id: WorkerId, seq: i64) -> Result<FencingToken, Failure> {
    FencingToken::new(id, u64::try_from(seq).unwrap_or(0))
        .map_err(|e| decode(format!("fencing token of worker {id}: {e}")))
}

/// A claimed outbox row.
#[derive(Debug, Deserialize)]
pub(crate) struct OutboxRow {
    id: i64,
    pub(crate) repo: String,
    pub(crate) number: i64,
    pub(crate) delivery: String,
    holder: Option<i64>,
    reason: String,
    dead_reason: Option<String>,
    /// A promoted delivery's assignment: its token's sequence, and whether its worker is new.
    #[serde(default)]
    assign_seq: Option<i64>,
    #[serde(default)]
    assign_new: Option<bool>,
    /// Whether this collect is the first to hand the row out (not a re-offer).
    #[serde(default)]
    pub(crate) first: bool,
    /// The delivery's payload, if it has one (`wr_payload_json`).
    #[serde(default)]
    payload: Option<PayloadJson>,
}

impl OutboxRow {
    /// Whether this row is a promoted delivery (not a release).
    pub(crate) fn is_promoted(&self) -> bool {
        self.reason == "promoted"
    }

    /// The contract's event for this row, its receipt the row id.
    pub(crate) fn event(&self) -> Result<ReleasedEvent, Failure> {
        let payload = self
            .payload
            .as_ref()
            .map(PayloadJson::payload)
            .transpose()?;
        Ok(self.bare_event()?.with_payload(payload))
    }

    /// The event without its payload.
    fn bare_event(&self) -> Result<ReleasedEvent, Failure> {
        if self.is_promoted() {
            return self.promoted();
        }
        let reason = match self.reason.as_str() {
            "worker_died" => ReleaseReason::WorkerDied(dead_reason(self.dead_reason.as_deref())?),
            "stuck" => ReleaseReason::Stuck,
            "unbound" => ReleaseReason::Unbound,
            other => return Err(decode(format!("release reason {other:?}"))),
        };
        let delivery = DeliveryId::new(&self.delivery)
            .map_err(|e| decode(format!("delivery {:?}: {e}", self.delivery)))?;
        Ok(ReleasedEvent::new(
            target(&self.repo, self.number)?,
            delivery,
            self.holder.map(worker_id).transpose()?,
            reason,
        )
        .with_receipt(Receipt::new(self.id.to_string())))
    }

    /// A promoted delivery's event: placed on its holder, with the promotion's assignment.
    fn promoted(&self) -> Result<ReleasedEvent, Failure> {
        let worker = worker_id(
            self.holder
                .ok_or_else(|| decode("promoted delivery without a holder"))?,
        )?;
        let seq = self
            .assign_seq
            .ok_or_else(|| decode("promoted delivery without its assignment"))?;
        let assignment = Assignment::new(
            worker,
            token(worker, seq)?,
            self.assign_new.unwrap_or(false),
        );
        let delivery = DeliveryId::new(&self.delivery)
            .map_err(|e| decode(format!("delivery {:?}: {e}", self.delivery)))?;
        Ok(
            ReleasedEvent::promoted(target(&self.repo, self.number)?, delivery, assignment)
                .with_receipt(Receipt::new(self.id.to_string())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_above_i64_max_round_trip() {
        let t = Target::new("o/r", u64::MAX).unwrap();
        assert_eq!(target("o/r", number_param(&t)).ok(), Some(t));
    }

    #[test]
    fn a_snapshot_element_reads_into_worker_info() {
        let json = r#"{"id": 7, "repo": "o/r", "number": 3, "status": "draining",
            "dead_reason": null, "busy": true, "suspect": false, "suspect_since_ms": null,
            "beaten": true, "last_beat_ms": 1000, "started_ms": 500, "died_at_ms": null,
            "drain_deadline_ms": 9000, "assignments": 2}"#;
        let row: WorkerRow = serde_json::from_str(json).unwrap();
        let info = row.info(1500).unwrap();
        assert_eq!(info.id, WorkerId::new(7));
        assert_eq!(info.status, Status::Draining);
        assert_eq!(info.heartbeat_age, Duration::from_millis(500));
        assert_eq!(info.uptime, Duration::from_millis(1000));
        assert_eq!(info.token.seq(), 2);
        assert_eq!(info.drain_deadline, Some(wall(9000)));
    }

    #[test]
    fn unknown_words_are_decode_errors() {
        assert!(status("asleep", None).is_err());
        assert!(status("dead", Some("bored")).is_err());
        assert!(opt_target(Some("o/r"), None).is_err());
        assert!(worker_id(-1).is_err());
    }
}
