//! The reference model: the contract's semantics as a plain sequential program (ordered maps, no
//! atomics, no sharding, no concurrency at all: [`ReferenceRegistry`](super::ReferenceRegistry)
//! puts one lock around it).
//!
//! It is written from the documentation of the contract traits (`WorkerRegistry`, `Maintenance`,
//! `Subscribe`), of `SweepReport`, `StatusSnapshot`, `Stats` and `Event`, not from the in-memory
//! backend's code, so that a property test comparing the two (`tests/model.rs`) finds where either
//! one strays from the text. Where the text leaves a choice open the model makes the in-memory
//! backend's choice and says so: time is kept in whole milliseconds for liveness; a worker killed
//! for missed heartbeats keeps the activity it had; eviction beyond `max_retained_claims` happens
//! in the sweep only (the in-memory backend may also evict earlier, between sweeps, when far over
//! the limit; the property test keeps eviction out of reach).
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the state, a worker's and a claim's record, `status`, `stats` |
//! | `workers.rs` | creation under the limit, placement, heartbeats, loops, drain, exits |
//! | `claims.rs` | duplicates, bare claims, release, completion |
//! | `sweep.rs` | the maintenance pass |
//! | `waiting.rs` | the waiting room: parking, promotion, expiry, the per-owner cap |
//!
//! Payloads are modelled as `WorkerRegistry::admit_with` states them: kept with a claim in flight
//! (and a released one until the sweep hands it over), with a parked delivery, never with a
//! completed claim; the bytes held are summed over what is kept, not counted, so the model's
//! budget cannot drift. The stall rule and stuck deliveries are modelled as the contract states them (durations judged
//! on registry running time; a stuck delivery released, its worker drained). Worker ids count from
//! 1 (a backend may start higher, as the in-memory one does from its start time; the property test
//! starts both at the same instant).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::api::events::EventSender;
use crate::api::ids::{DeliveryId, FencingToken, Target, WorkerId};
use crate::api::payload::Payload;
use crate::api::report::ReleaseReason;
use crate::api::snapshot::{PayloadUsage, StatusSnapshot, WorkerInfo};
use crate::api::stats::Stats;
use crate::api::status::{Activity, Status, WorkerKind};
use crate::clock::{millis, MANUAL_CLOCK_WALL_ORIGIN_SECS};
use crate::config::RegistryConfig;

mod claims;
mod sweep;
mod waiting;
mod workers;

type Key = (Target, DeliveryId);

/// The wall clock at time zero: a [`ManualClock`](crate::ManualClock)'s, so that the reference
/// and an in-memory registry on a manual clock show the same wall times.
fn wall_origin() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(MANUAL_CLOCK_WALL_ORIGIN_SECS)
}

fn wall(ms: u64) -> SystemTime {
    wall_origin() + Duration::from_millis(ms)
}

/// The `seq`-th assignment's token of `id` (saturating, as [`FencingToken::new`] documents).
fn token(id: WorkerId, seq: u64) -> FencingToken {
    FencingToken::new(id, seq).unwrap_or(FencingToken::from_raw(0))
}

struct MWorker {
    id: WorkerId,
    target: Option<Target>,
    started_at: SystemTime,
    started_ms: u64,
    status: Status,
    busy: bool,
    suspect: bool,
    beaten: bool,
    /// The last heartbeat, or the creation before the first, in ms.
    ts: u64,
    suspect_since: Option<u64>,
    died_at: Option<u64>,
    drain_deadline: Option<u64>,
    assignments: u64,
    /// Purged after `dead_retention`: unknown from then on (its id is never handed out again).
    purged: bool,
}

impl MWorker {
    fn dead(&self) -> bool {
        !self.status.is_alive()
    }

    fn info(&self, now_ms: u64) -> WorkerInfo {
        let kind = if self.target.is_some() {
            WorkerKind::Spawned
        } else {
            WorkerKind::Registered
        };
        let mut i = WorkerInfo::new(self.id, self.target.clone(), kind, self.started_at);
        i.status = self.status;
        i.activity = if self.busy {
            Activity::Busy
        } else {
            Activity::Idle
        };
        i.suspect = self.suspect;
        i.last_heartbeat = wall(self.ts);
        i.heartbeat_age = Duration::from_millis(now_ms.saturating_sub(self.ts));
        i.has_heartbeated = self.beaten;
        i.died_at = if self.dead() {
            self.died_at.map(wall)
        } else {
            None
        };
        i.drain_deadline = if self.status == Status::Draining {
            self.drain_deadline.map(wall)
        } else {
            None
        };
        i.token = token(self.id, self.assignments);
        i.uptime = Duration::from_millis(now_ms.saturating_sub(self.started_ms));
        i
    }
}

struct MClaim {
    holder: Option<WorkerId>,
    /// What it was admitted with, while the registry holds it: in flight, and released until a
    /// sweep hands it over (never once completed, nor on a stuck tombstone).
    payload: Option<Payload>,
    claimed_at: u64,
    completed_at: Option<u64>,
    /// Released by a sweep as stuck in flight; kept to refuse its holder's late completion.
    stuck: bool,
}

/// Where a claim stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    InFlight,
    Completed,
    Released(ReleaseReason),
    Expired,
}

/// The registry's whole state.
pub(crate) struct Model {
    config: RegistryConfig,
    now: Duration,
    next_id: u64,
    workers: BTreeMap<WorkerId, MWorker>,
    targets: HashMap<Target, WorkerId>,
    claims: BTreeMap<Key, MClaim>,
    live: usize,
    retained: usize,
    /// The counters (the gauges are filled in by `stats`).
    counts: Stats,
    version: u64,
    snapshot: Arc<StatusSnapshot>,
    pub(crate) events: EventSender,
    /// When the previous sweep ran, in ms.
    last_sweep: Option<u64>,
    /// The stall rule: spans `[start, end]` (ms) during which the registry did not run.
    stalls: Vec<(u64, u64)>,
    /// The waiting room (`max_waiting` above 0).
    room: Option<waiting::Room>,
    /// In a sweep: a death unblocks its waiters but promotes nothing until the sweep's end.
    sweeping: bool,
}

impl Model {
    pub(crate) fn new(config: RegistryConfig) -> Self {
        let snapshot = Arc::new(StatusSnapshot::empty(config.max_workers(), wall(0)));
        let room = (config.max_waiting() > 0).then(waiting::Room::default);
        Self {
            config,
            now: Duration::ZERO,
            next_id: 1,
            workers: BTreeMap::new(),
            targets: HashMap::new(),
            claims: BTreeMap::new(),
            live: 0,
            retained: 0,
            counts: Stats::default(),
            version: 0,
            snapshot,
            events: EventSender::new(),
            last_sweep: None,
            stalls: Vec::new(),
            room,
            sweeping: false,
        }
    }

    /// How long the registry ran since `from` (ms): now minus `from`, minus the stalled time in
    /// between. Every duration the sweep judges a worker or a delivery by is measured so.
    fn ran_since(&self, from: u64) -> u64 {
        let now = self.ms();
        let stalled: u64 = self
            .stalls
            .iter()
            .map(|&(start, end)| end.saturating_sub(start.max(from)))
            .sum();
        now.saturating_sub(from).saturating_sub(stalled)
    }

    pub(crate) fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
    }

    fn ms(&self) -> u64 {
        millis(self.now)
    }

    fn timeout_ms(&self) -> u64 {
        millis(self.config.heartbeat_timeout())
    }

    pub(crate) fn status(&self) -> Arc<StatusSnapshot> {
        self.snapshot.clone()
    }

    /// What the registry holds unfinished (see [`WorkerRegistry::audit`]): a claim neither
    /// completed nor stuck is in flight, or released once its holder is dead (until the sweep
    /// hands it over); promoted deliveries wait in the room's hand-over.
    ///
    /// [`WorkerRegistry::audit`]: crate::WorkerRegistry::audit
    pub(crate) fn audit(&self) -> crate::Audit {
        let (mut in_flight, mut released) = (0, 0);
        for c in self.claims.values() {
            if c.stuck || c.completed_at.is_some() {
                continue;
            }
            let dead = c.holder.is_some_and(|id| {
                self.workers
                    .get(&id)
                    .is_none_or(|w| matches!(w.status, Status::Dead(_)))
            });
            if dead {
                released += 1;
            } else {
                in_flight += 1;
            }
        }
        let handover = self.room.as_ref().map_or(0, waiting::Room::handed_over);
        crate::Audit {
            live_workers: self.live as u64,
            in_flight,
            released: released + handover,
            waiting: self.waiting() as u64,
        }
    }

    /// Payloads held (with claims, released ones not yet handed over included, and with parked
    /// deliveries) and their bytes.
    fn payloads_held(&self) -> (usize, u64) {
        let room = self
            .room
            .as_ref()
            .into_iter()
            .flat_map(waiting::Room::payloads);
        self.claims
            .values()
            .filter_map(|c| c.payload.as_ref())
            .chain(room)
            .fold((0, 0), |(n, b), p| (n + 1, b + p.size()))
    }

    /// What the snapshot says of the payloads held.
    fn payload_usage(&self) -> PayloadUsage {
        let (held, bytes) = self.payloads_held();
        PayloadUsage::new(held, bytes, self.config.payload_budget())
    }

    pub(crate) fn stats(&self) -> Stats {
        let mut s = self.counts;
        s.live_workers = self.live;
        s.retained_claims = self.retained;
        s.waiting = self.waiting();
        (s.payloads_held, s.payload_bytes_held) = self.payloads_held();
        s.events_missed = self.events.missed();
        s.snapshot_age = self.now.saturating_sub(self.snapshot.taken_at_monotonic);
        s
    }
}
