//! The JSON bodies of the admin API, and their OpenAPI schemas (derived, so they cannot drift).

use std::time::{Duration, SystemTime};

use serde::Serialize;
use utoipa::ToSchema;

use crate::api::snapshot::{StatusSnapshot, WorkerInfo};
use crate::api::status::{Activity, DeadReason, PoolStatus, Status, WorkerKind};

/// A wall-clock time as RFC 3339 UTC with milliseconds (`2026-01-01T00:00:00.000Z`), clamped to
/// the range RFC 3339 can express (1970 to 9999) so that a strange clock can never make it panic.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    // 9999-12-31T23:59:59.999Z, the last millisecond humantime formats.
    let last = SystemTime::UNIX_EPOCH + Duration::from_millis(253_402_300_799_999);
    let t = t.clamp(SystemTime::UNIX_EPOCH, last);
    humantime::format_rfc3339_millis(t).to_string()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A worker's status.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[schema(as = Status)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StatusName {
    Active,
    Draining,
    Dead,
}

/// How a dead worker died.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[schema(as = DeadReason)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ReasonName {
    MissedHeartbeats,
    Exited,
    Deregistered,
    DrainTimedOut,
}

/// Whether a worker is running a loop.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[schema(as = Activity)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ActivityName {
    Idle,
    Busy,
}

/// The worker-pool document's view: idle, busy, draining, offline.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[schema(as = PoolStatus)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PoolStatusName {
    Idle,
    Busy,
    Draining,
    Offline,
}

/// Spawned for a target, or registered by itself.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[schema(as = WorkerKind)]
#[serde(rename_all = "snake_case")]
pub(crate) enum KindName {
    Spawned,
    Registered,
}

/// One worker.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Worker)]
pub(crate) struct WorkerBody {
    /// The worker's id.
    #[schema(example = 7, minimum = 0, maximum = 17592186044415_u64)]
    id: u64,
    /// `owner/repo#number`, or null for a self-registered pool worker.
    #[schema(example = "octo/repo#42")]
    target: Option<String>,
    kind: KindName,
    status: StatusName,
    /// How it died (null unless dead).
    reason: Option<ReasonName>,
    activity: ActivityName,
    pool_status: PoolStatusName,
    /// Marked suspect by the mass-staleness brake (silent, not yet declared dead).
    suspect: bool,
    /// When it was created (RFC 3339).
    #[schema(format = DateTime, example = "2026-01-01T00:00:00.000Z")]
    started_at: String,
    /// Its last heartbeat, or its creation if it has not beaten yet (RFC 3339).
    #[schema(format = DateTime, example = "2026-01-01T00:00:30.000Z")]
    last_heartbeat: String,
    /// Milliseconds since then, on the registry's monotonic clock.
    heartbeat_age_ms: u64,
    /// Whether it has heartbeated at all.
    has_heartbeated: bool,
    /// When it died (RFC 3339), null unless dead.
    #[schema(format = DateTime)]
    died_at: Option<String>,
    /// The latest fencing token it was given (worker id in the high 44 bits, the assignment count
    /// in the low 20).
    #[schema(minimum = 0)]
    token: u64,
    /// Milliseconds since it was created.
    uptime_ms: u64,
}

impl From<&WorkerInfo> for WorkerBody {
    fn from(w: &WorkerInfo) -> Self {
        let (status, reason) = match w.status {
            Status::Active => (StatusName::Active, None),
            Status::Draining => (StatusName::Draining, None),
            Status::Dead(r) => (
                StatusName::Dead,
                Some(match r {
                    DeadReason::MissedHeartbeats => ReasonName::MissedHeartbeats,
                    DeadReason::Exited => ReasonName::Exited,
                    DeadReason::Deregistered => ReasonName::Deregistered,
                    DeadReason::DrainTimedOut => ReasonName::DrainTimedOut,
                }),
            ),
        };
        Self {
            id: w.id.get(),
            target: w.target.as_ref().map(ToString::to_string),
            kind: match w.kind {
                WorkerKind::Spawned => KindName::Spawned,
                WorkerKind::Registered => KindName::Registered,
            },
            status,
            reason,
            activity: match w.activity {
                Activity::Idle => ActivityName::Idle,
                Activity::Busy => ActivityName::Busy,
            },
            pool_status: match w.pool_status() {
                PoolStatus::Idle => PoolStatusName::Idle,
                PoolStatus::Busy => PoolStatusName::Busy,
                PoolStatus::Draining => PoolStatusName::Draining,
                PoolStatus::Offline => PoolStatusName::Offline,
            },
            suspect: w.suspect,
            started_at: rfc3339(w.started_at),
            last_heartbeat: rfc3339(w.last_heartbeat),
            heartbeat_age_ms: millis(w.heartbeat_age),
            has_heartbeated: w.has_heartbeated,
            died_at: w.died_at.map(rfc3339),
            token: w.token.get(),
            uptime_ms: millis(w.uptime),
        }
    }
}

/// Workers by status (`active + draining + dead` = the number of workers listed), with activity
/// and suspicion among the live ones.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Counts)]
pub(crate) struct CountsBody {
    active: usize,
    draining: usize,
    dead: usize,
    idle: usize,
    busy: usize,
    suspect: usize,
}

/// Live (active + draining) workers against the configured limit.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Capacity)]
pub(crate) struct CapacityBody {
    used: usize,
    limit: usize,
}

/// Claims counted by the sweep that took the snapshot.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Claims)]
pub(crate) struct ClaimsBody {
    /// Held by live workers, not completed.
    in_flight: usize,
    /// Completed, remembered for redelivery detection.
    retained: usize,
}

/// Payloads (what GitHub sent with deliveries) held with deliveries that still have work left,
/// against the budget.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Payloads)]
pub(crate) struct PayloadsBody {
    /// Payloads held.
    held: usize,
    /// Their bytes (body plus metadata).
    bytes: u64,
    /// The configured `payload_budget`, in bytes.
    budget: u64,
}

/// Every tracked worker, as of the last sweep's snapshot.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = WorkerList)]
pub(crate) struct WorkersBody {
    workers: Vec<WorkerBody>,
    counts: CountsBody,
    capacity: CapacityBody,
    claims: ClaimsBody,
    /// Increases with every published snapshot (0: no sweep has run yet).
    version: u64,
    /// When the snapshot was taken (RFC 3339).
    #[schema(format = DateTime, example = "2026-01-01T00:00:05.000Z")]
    taken_at: String,
    /// Whether the mass-staleness brake held back deaths in that sweep.
    brake_engaged: bool,
    /// Deliveries parked in the waiting room when the snapshot was taken (0 with the room off).
    waiting: usize,
    payloads: PayloadsBody,
}

impl From<&StatusSnapshot> for WorkersBody {
    fn from(s: &StatusSnapshot) -> Self {
        let mut workers: Vec<WorkerBody> = s.workers.iter().map(WorkerBody::from).collect();
        workers.sort_unstable_by_key(|w| w.id);
        let c = s.counts;
        Self {
            workers,
            counts: CountsBody {
                active: c.active,
                draining: c.draining,
                dead: c.dead,
                idle: c.idle,
                busy: c.busy,
                suspect: c.suspect,
            },
            capacity: CapacityBody {
                used: s.capacity.used,
                limit: s.capacity.limit,
            },
            claims: ClaimsBody {
                in_flight: s.claims.in_flight,
                retained: s.claims.retained,
            },
            version: s.version,
            taken_at: rfc3339(s.taken_at),
            brake_engaged: s.brake_engaged,
            waiting: s.waiting,
            payloads: PayloadsBody {
                held: s.payloads.held,
                bytes: s.payloads.bytes,
                budget: s.payloads.budget,
            },
        }
    }
}

/// An error: what was refused and why.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Error)]
pub(crate) struct ErrorBody {
    #[schema(example = "unknown worker 7")]
    pub(crate) error: String,
}

/// Liveness of the process serving the API.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Health)]
pub(crate) struct HealthBody {
    #[schema(example = "ok")]
    pub(crate) status: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_and_clamps_instead_of_panicking() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_767_225_600_123);
        assert_eq!(rfc3339(t), "2026-01-01T00:00:00.123Z");
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH - Duration::from_secs(1)),
            "1970-01-01T00:00:00.000Z"
        );
        let far = SystemTime::UNIX_EPOCH + Duration::from_secs(400_000_000_000);
        assert_eq!(rfc3339(far), "9999-12-31T23:59:59.999Z");
    }
}
