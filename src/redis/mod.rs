//! [`RedisRegistry`] (feature `redis`): the registry shared by several router replicas through
//! one Redis server, behind the same contract as the in-memory backend and passing the same
//! conformance suite.
//!
//! # Design
//!
//! **Every decision is one Lua function** of one Redis Function library (`FCALL`; the library,
//! named by its checksum, loaded on connect and again when the server answers that a function is
//! missing: see `scripts.rs`): `admit` is dedupe + sticky lookup + capacity + claim in one call, so two
//! replicas racing on one delivery or on the last capacity slot get exactly the answers the
//! in-memory registry gives. No decision reads in one round trip and writes in another. Each
//! script reads (and so validates) everything before its first write: an error aborts it with no
//! partial state.
//!
//! **One time base**: every script takes `TIME` from the server (Redis 7 replicates script
//! effects, so this is allowed) plus the registry's test offset `{name}:test_offset_ms`, which
//! only [`RedisRegistry::advance_time_for_tests`] (feature `testkit`) can set. Times are integer
//! milliseconds on the server's Unix clock; a replica's own clock is never consulted.
//!
//! **Keys** all start with the hash tag `{name}` (the registry name, [`DEFAULT_REGISTRY_NAME`]
//! unless set), so a registry lives on one Redis Cluster slot and a script may touch any of its
//! keys. Several registries (pools) spread over a cluster by name: each name hashes to its own
//! slot.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{n}:w:<id>` | hash | a worker: status, busy, suspect, beaten, reason, last beat, created, assignments, drain deadline, death; and its in-flight claims, one field `@<target>:<delivery>` → claimed at each (written by the placement's own `HSET`, released in the step that kills it) |
//! | `{n}:live` | zset | live workers by a lower bound of their staleness deadline (last beat + timeout, + start-up grace before the first, + the stall credit once re-scored): capacity is `ZCARD`, the stale are one range query. A heartbeat does not touch it (after its first); the sweep re-scores the candidates that beat since or were credited a stall |
//! | `{n}:beat` | zset | the beat index: exactly the workers that are active, have beaten and are not suspect, by their last beat (ms). Their heartbeat is one `ZADD XX GT CH` here and nothing else; a worker's last beat is the later of its hash's and its score (`read_worker` folds it in); a drain, a suspicion or a death takes the worker out and writes its score to the hash |
//! | `{n}:beat_from` | string | the publisher's cursor in `{n}:beat`: a score; the beats at and past it may not be published yet (`publish.lua`) |
//! | `{n}:drain` / `{n}:dead` | zset | draining workers by drain deadline; dead ones by time of death (purge) |
//! | `{n}:t:<target>` | string | the target's live worker (sticky assignment): one key per target, so the lookup is O(1) at any size (a hash of them stays a listpack up to `hash-max-listpack-entries`, and each `HGET` scans it) |
//! | `{n}:next_worker_id` | string | the last worker id handed out; the next is past it and past the server's clock in ms since 2026-01-01, so ids are never reused, not even after the server lost or rewound the data (see `docs::redis`, Failures) |
//! | `{n}:c:<target>:<delivery>` | hash | a claim: holder, claimed at, completed at, release reason; a completed one expires with `PEXPIRE` = `claim_retention` + `sweep_interval` |
//! | `{n}:flight` | zset | every in-flight claim bound to a worker, by its claim time (+ the stall credit once re-scored): a lower bound of when it is stuck, less `max_in_flight`, which the sweep adds to its range's bound rather than every admit to the score; the stuck are one range query |
//! | `{n}:ws:<id>` | set | a worker's stuck claims, kept as tombstones (release reason `Stuck`) so that its late completion is refused; `{n}:stuck_due` (zset, score 0) holds those of dead workers, which the next sweep deletes |
//! | `{n}:unbound` | zset | bare claims by claim time (those past the heartbeat timeout are one range query) |
//! | `{n}:done` | zset | completed claims by completion time (`max_retained_claims` eviction, retention) |
//! | `{n}:released_due` | zset | claims released since the last sweep (score 0: read by rank, a bounded range per step) |
//! | `{n}:released` | stream | released deliveries, consumer group `dispatch` |
//! | `{n}:deliveries` | zset | stream entries by when they were handed out (re-offered after `release_ack_timeout`) |
//! | `{n}:dirty` | zset | workers whose hash was written since the last publish (score 0); the beats of indexed workers are not here but in `{n}:beat`, past `{n}:beat_from` |
//! | `{n}:snap` | hash | worker id → its line as last published (what a rebuilding handle pages through) |
//! | `{n}:changes` | stream | the change log: per version, entries `<version>-<n>` of upserted lines (`u`) and removed ids (`r`), the version's header (`h`) last; the last 1 000 versions (`CHANGE_LOG_VERSIONS`) |
//! | `{n}:snap_head`, `{n}:snapshot_version` | string | the latest published header and its version |
//! | `{n}:events`, `{n}:event_seq`, `{n}:epoch` | channel, strings | lifecycle events, their sequence number, and the registry's incarnation: set when there is none, moved on by the handle that finds the data rewound (a handle or listener that sees it change knows the data was lost, see `loss.rs`) |
//! | `{n}:config` | string | the deciding settings, stored by the first handle (`name=value` lines); a handle configured otherwise is refused |
//! | `{n}:consumers` | zset | replica id → its last sweep (registry ms): consumers of the released stream silent for ten sweep intervals plus `release_ack_timeout` and holding no pending entry are deleted (`XGROUP DELCONSUMER`, 8 per sweep) |
//! | `{n}:sweep_lease` | string | the maintenance lease: owner and expiry |
//! | `{n}:last_sweep`, `{n}:stalls` | string, list | when the latest sweep of any replica ran, and the stall spans (`<start>:<end>`, at most 64) the stall rule still credits |
//! | `{n}:drain_ext` | list | stalls whose drain-deadline walk is not done, oldest first: `<from>:<to>:<len>:<cursor>:<skip>` (the walk's position in `{n}:drain`); popped when done |
//! | `{n}:rescan` | string | after a dropped stall: `<live cursor>\t<flight cursor>`, the scores the rescan walk has re-judged up to (`-inf` at the start, `done` past the end); deleted when both are done |
//! | `{n}:test_offset_ms` | string | the test-only time offset |
//! | `{n}:p:<target>:<delivery>`, `{n}:r:<entry id>`, `{n}:rpi`, `{n}:pay` | hashes | payloads (`payloads.rs`; see `docs::redis`, "Payloads"): the in-flight claim's or the parked delivery's, a released entry's (moved there by `RENAME`), pair → its latest released copy, and the count and bytes held (the budget's counter) |
//! | `{n}:worder`, `{n}:wd:<target>`, `{n}:wt`, `{n}:wo:<owner>`, `{n}:wring`, `{n}:wready`, `{n}:wb:<id>`, `{n}:wpo`, `{n}:olive`, `{n}:room`, `{n}:wseq` | zsets, hashes, sets, string | the waiting room and the per-owner cap (`lib_waiting.lua`; see `docs::redis`, "The waiting room") |
//!
//! **The library** (`src/redis/scripts/`, assembled by `scripts.rs` into one `FUNCTION LOAD`):
//! `lib_base.lua` (key names, the clock, events, the reply words), `lib_claims.lua` (claim
//! standing and removal) and `lib_workers.lua` (placement, death bookkeeping, encoding), run once
//! at load as library-level locals, then one file per decision, each the body of one function
//! `wr_<checksum>_<decision>` (flagged `no-writes`: `worker`, `changes`, `snap_page`, `payload`): `admit` (with a payload for `admit_with`), `assign`, `claim`, `payload` (the lookup), `release`, `complete` (both `complete` and
//! `complete_by`), `heartbeat`, `loop_started`, `loop_finished`, `register`, `deregister`, `drain`
//! (`drain_within`, and each batch of `drain_all_within`'s `ZSCAN` walk), `worker`, `sweep` (one bounded step), `publish` (one
//! bounded step of publishing the snapshot), `changes` and `snap_page` (what a handle reads to bring
//! its copy up to date), `acknowledge`, `listen` (where the event numbering stands, for the
//! listener), `identity` (what a sweep compares to find a data loss, and the forgetting of gone
//! replicas' stream consumers).
//!
//! **Replies** are name/value lists led by an `outcome` word, read by name (`codec::Fields`): a
//! reply without nested values is *packed*, one bulk string of its names and values joined by
//! tabs (`outcome\tduplicate\tholder\t7\tsince\t...\tstate\tin_flight\tunstarted\t0`), and one
//! with nested values (drain's per-worker answers, a sweep step's lists) is a flat array
//! (`{'outcome', ..., 'died', {...}}`); see `docs::redis`, "Replies". The words are PostgreSQL's (`crate::remote::vocab`). A missing field or a
//! word outside the vocabulary is a non-retryable backend error naming the field. The
//! maintenance functions' replies (`sweep`, `publish`, `changes`) follow the same schema.
//!
//! | function | outcome words (fields) |
//! |---|---|
//! | `admit` | `duplicate` (holder, since, state, unstarted), `assigned` (worker, seq, new, live, now), `capacity`, `draining` (worker) |
//! | `assign` | `assigned`, `capacity`, `draining` (as `admit`) |
//! | `claim` | `claimed`, `duplicate` |
//! | `release` | `ok`, `unknown`, `completed` |
//! | `complete` | `completed` (evicted, retained, now), `already`, `unknown`, `not_holder` (holder), `released` (holder, reason, dead_reason) |
//! | `heartbeat`, `loop_started` | `active`, `draining`, `unknown`, `refused_dead` (reason) |
//! | `loop_finished` | `active`, `exited` (live, now), `unknown`, `refused_dead` (reason) |
//! | `register` | `registered` (worker, live, now), `capacity`, `exhausted` |
//! | `deregister` | `dead` (reason, live, now), `unknown`, `refused_dead` (reason) |
//! | `drain` | outcomes (per worker: `draining`, `exited`, `unknown`, `refused_dead`), reasons, live, now |
//! | `worker` | now, line (absent: unknown) |
//!
//! **Maintenance** runs in bounded steps (see `sweep.rs`): every replica's
//! [`sweep`](crate::Maintenance::sweep) runs the sweep script a step at a time, each step its own
//! script call of about 100 commands (`SWEEP_STEP_BUDGET`), so other replicas' calls run between
//! steps; the sweep repeats steps until one answers that nothing more is due and merges their
//! answers into one report, judged at the first step's time. The first step applies the stall
//! rule (a sweep more than two intervals after the previous one,
//! of any replica, records the stall in `{n}:stalls` and queues it in `{n}:drain_ext`, whose walk
//! moves the drain deadlines that had not passed when it began out by its length, a bounded
//! chunk per step, before the steps judge anything else). The one holding the lease (see `lease.rs`) then does
//! the maintenance, every duration judged on registry running time (the clock less the recorded
//! stalls, as in `src/memory/stall.rs`): stale workers from one range query on `{n}:live`, the
//! mass-staleness brake, drain deadlines, stuck deliveries from one range query on `{n}:flight`
//! (released with reason `Stuck`, published as `DeliveryStuck`, their workers drained), release of
//! dead workers' and unbound claims to the stream, retention, eviction and purge, each a range of
//! a sorted set by time with a `LIMIT` from what is left of the step's budget. Live candidates
//! (workers whose score in `{n}:live` is below the sweep's time) too many for one step are first
//! counted over several `judge` steps (the fresh ones re-scored out of the range), so that the
//! brake is decided on all of them, as in memory, then killed or suspected a chunk per step. Every
//! step takes a bounded share of released events for this replica (see `stream.rs`). The lease
//! holder then publishes the snapshot in bounded steps and every handle applies what changed
//! since its version (see `publish.rs`); [`status`](crate::WorkerRegistry::status) returns this
//! handle's cached copy.
//!
//! **Events**: scripts `PUBLISH` lifecycle events; each handle's listener task forwards them to
//! its subscribers (see `events.rs`).
//!
//! **Errors**: a lost connection, a timeout, a server that is loading or failing over is
//! [`RegistryError::Backend`] with `retryable: true`; the connection manager reconnects by
//! itself, and a demoted primary (`READONLY`), a response timeout or, through Sentinel, a lost
//! primary opens a new connection (`link.rs`), so the same handle recovers when the server, or
//! the new primary, is there. A script error or a reply that
//! does not decode is `retryable: false`. Nothing panics.
//!
//! **Operating it.** Run the server with `maxmemory-policy noeviction` (or a `volatile-*`
//! policy): an `allkeys-*` policy may evict workers and in-flight claims. Turn on AOF
//! (`appendonly yes`) for claims to survive a server restart. The primary is found by URL or
//! through Sentinel ([`RedisRegistryBuilder::sentinel`]); `rediss://` needs the `redis-tls`
//! feature. Redis Cluster goes through redis-rs's cluster client (feature `redis-cluster`,
//! `RedisRegistryBuilder::cluster`): every key of a registry shares the hash tag `{name}`, so one
//! registry lives in one slot, on one primary at a time; `MOVED`, `ASK` and failovers are the
//! cluster client's (see [`docs::redis`](crate::docs::redis), "Connections").
//!
//! **Cost.** No function's work grows with the registry. A sweep that measures a stall walks
//! `{n}:drain` down by a score cursor (`{n}:drain_ext`), moving about 50 drain deadlines a step,
//! so the steps of that sweep judge every deadline after its extension; a drain (re)set after the
//! stall was measured (the worker's `ds`) is left as it is. A sweep that has
//! to drop a stall beyond the 64 kept, all still within reach of a judgement, starts the rescan
//! walk (`{n}:rescan`): its steps and the following sweeps' re-score a bounded chunk of `{n}:live`
//! and then of `{n}:flight` per step, by a score cursor, down to the deadline the lost credit
//! leaves, so that the candidates' range query finds them in a later step (a worker held in
//! place by the brake may push one to the next sweep). `drain_all_within` walks `{n}:live`
//! with `ZSCAN` (`COUNT` 128) and drains each batch with one `drain` call, so it is not one
//! atomic step: a worker admitted or registered during the walk may be missed, as the in-memory
//! backend's shard-by-shard collection misses one created behind it. A sweep step is about 100 commands (`SWEEP_STEP_BUDGET`), a publish
//! step 64 workers (`PUBLISH_STEP`), a change-log answer 4 entries (`CHANGES_PAGE`), a rebuild page
//! 256 lines (`SNAP_PAGE`), an acknowledgement 64 receipts, and a completion evicts at most 4. What
//! a sweep costs in total is what is due: the candidates past their score, the queues' due
//! entries, the workers written since the last publish (heartbeats included). A retained claim
//! costs about 400 bytes of server memory (see the README); an in-flight one also has its entry
//! in `{n}:flight`, a worker also its line in `{n}:snap`.
//!
//! # Examples
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use worker_registry::redis::RedisRegistry;
//! use worker_registry::{Admission, DeliveryId, Maintenance, RegistryConfig, Target, WorkerRegistry, WorkerRegistryExt};
//!
//! let registry = RedisRegistry::builder("redis://127.0.0.1:6379/")
//!     .name("pool-a")
//!     .config(RegistryConfig::builder().max_workers(8).build()?)
//!     .connect()
//!     .await?;
//! let (t, d) = (Target::new("octo/repo", 42)?, DeliveryId::new("d-1")?);
//! match registry.admit(&t, &d).await {
//!     Ok(Admission::Assigned(a)) if a.new => { /* start a container for a.worker */ }
//!     Ok(Admission::Assigned(_)) => { /* hand the event to the running worker */ }
//!     Ok(Admission::Duplicate(_)) => { /* redelivery: skip */ }
//!     Ok(Admission::Waiting(_)) => { /* parked (max_waiting > 0): a sweep hands it over later */ }
//!     Ok(Admission::Rejected(_)) => { /* 503 */ }
//!     Err(e) if e.is_retryable() => { /* 503 with Retry-After */ }
//!     Err(e) => return Err(e.into()),
//! }
//! let report = registry.sweep().await?; // every replica, on an interval (a `Sweeper`)
//! # let _ = report;
//! # Ok(())
//! # }
//! ```

mod builder;
mod codec;
mod contract;
mod counters;
mod error;
mod events;
mod keys;
mod lease;
mod link;
mod loss;
mod payloads;
mod publish;
mod scripts;
mod stream;
mod sweep;
mod waiting;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use self::builder::RedisRegistryBuilder;

use self::counters::Counters;
use self::keys::Keys;
use self::link::Link;
use crate::api::connect::ConnectError;
use crate::api::error::RegistryError;
use crate::clock::millis;
use crate::config::RegistryConfig;
use crate::remote::loss::LossWatch;
use crate::remote::snapshot::SnapshotCache;

/// The registry name used unless [`RedisRegistryBuilder::name`] sets one.
pub const DEFAULT_REGISTRY_NAME: &str = "worker-registry";
/// How long one connection attempt may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a call may wait for the server's answer before it fails (retryable).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How many times the connection manager retries a failed reconnection (with exponential
/// backoff) before the call that is waiting fails; the next call tries again.
pub const DEFAULT_RECONNECT_RETRIES: usize = 2;
/// The oldest Redis server supported (script effects replication, `ZADD LT`, `XAUTOCLAIM`-era
/// streams).
pub const MIN_SERVER_VERSION: &str = "7.0";

/// A registry shared through Redis: every router replica connects one (or several) to the same
/// server and registry name, and they behave as one registry.
///
/// Cloning shares the connection, the counters and the snapshot cache (one replica); use
/// [`connect_replica`](Self::connect_replica) for another handle on its own connection.
///
/// **Locking behaviour:** every call is one script on the server, which runs scripts one at a
/// time (so each call is atomic against every replica); the client holds no lock across the call.
/// [`status`](crate::WorkerRegistry::status) and [`stats`](crate::WorkerRegistry::stats) do no
/// I/O and take no lock but a short mutex around two gauges.
///
/// # Examples
///
/// See the [module documentation](self).
#[derive(Clone)]
pub struct RedisRegistry {
    pub(crate) inner: Arc<Inner>,
}

/// Durations and limits of the configuration, in the integers the scripts take.
pub(crate) struct Limits {
    pub(crate) timeout_ms: u64,
    pub(crate) startup_grace_ms: u64,
    pub(crate) retention_ms: u64,
    pub(crate) dead_retention_ms: u64,
    pub(crate) suspect_grace_ms: u64,
    pub(crate) claim_key_ttl_ms: u64,
    pub(crate) lease_ttl_ms: u64,
    pub(crate) ack_timeout_ms: u64,
    pub(crate) sweep_interval_ms: u64,
    pub(crate) max_in_flight_ms: u64,
    pub(crate) drain_deadline_ms: u64,
    /// The longest any judgement of the sweep waits: older stalls cannot matter any more (as
    /// the in-memory backend's).
    pub(crate) stall_horizon_ms: u64,
    pub(crate) max_workers: u64,
    pub(crate) max_retained: u64,
    pub(crate) brake_min_workers: u64,
    pub(crate) brake_fraction: String,
    /// How long a replica's consumer of the released stream may be silent (no sweep) before it
    /// is forgotten, once it holds no pending entry: ten sweep intervals plus the
    /// acknowledgement timeout (a live replica sweeps every interval).
    pub(crate) forget_consumer_ms: u64,
    /// The waiting room (`docs::redis`, "The waiting room"): on if either bound of it is set.
    pub(crate) room: Option<RoomLimits>,
}

/// The waiting room's settings, as the scripts take them.
pub(crate) struct RoomLimits {
    pub(crate) max_waiting: u64,
    pub(crate) max_waiting_per_owner: u64,
    pub(crate) max_workers_per_owner: u64,
    pub(crate) max_wait_ms: u64,
}

impl Limits {
    fn of(c: &RegistryConfig) -> Self {
        Self {
            timeout_ms: millis(c.heartbeat_timeout()),
            startup_grace_ms: millis(c.startup_grace()),
            retention_ms: millis(c.claim_retention()),
            dead_retention_ms: millis(c.dead_retention()),
            suspect_grace_ms: millis(c.suspect_grace()),
            claim_key_ttl_ms: millis(c.claim_retention().saturating_add(c.sweep_interval())),
            lease_ttl_ms: millis(lease::ttl(c)),
            ack_timeout_ms: millis(c.release_ack_timeout()),
            sweep_interval_ms: millis(c.sweep_interval()),
            max_in_flight_ms: millis(c.max_in_flight()),
            drain_deadline_ms: millis(c.drain_deadline()),
            stall_horizon_ms: millis(c.heartbeat_timeout().saturating_add(c.startup_grace()))
                .max(millis(c.max_in_flight()))
                .max(millis(c.suspect_grace())),
            max_workers: c.max_workers() as u64,
            max_retained: c.max_retained_claims() as u64,
            brake_min_workers: c.brake_min_workers() as u64,
            brake_fraction: c.brake_fraction().to_string(),
            forget_consumer_ms: millis(c.sweep_interval())
                .saturating_mul(10)
                .saturating_add(millis(c.release_ack_timeout())),
            room: (c.max_waiting() > 0 || c.max_workers_per_owner() > 0).then(|| RoomLimits {
                max_waiting: c.max_waiting() as u64,
                max_waiting_per_owner: c.max_waiting_per_owner() as u64,
                max_workers_per_owner: c.max_workers_per_owner() as u64,
                max_wait_ms: millis(c.max_wait()),
            }),
        }
    }
}

pub(crate) struct Inner {
    pub(crate) settings: RedisRegistryBuilder,
    pub(crate) config: RegistryConfig,
    pub(crate) limits: Limits,
    pub(crate) keys: Keys,
    pub(crate) conn: Link,
    pub(crate) replica: String,
    pub(crate) snapshot: SnapshotCache,
    /// Serialises this handle's snapshot refreshes (each applies changes to the version it read).
    pub(crate) refresh: tokio::sync::Mutex<()>,
    /// Woken when a call of this handle (not its sweep) promoted waiting deliveries: its sweeper
    /// hands them over at once ([`Maintenance::wake`](crate::Maintenance::wake)).
    pub(crate) wake: crate::sync::Wake,
    pub(crate) counters: Counters,
    /// What this handle saw of the registry's identity (data-loss detection, `loss.rs`).
    pub(crate) loss: LossWatch,
    pub(crate) events: Arc<events::Events>,
    /// Forwards the server's lifecycle events into `events`; stopped when this is dropped.
    _listener: events::Listener,
}

impl fmt::Debug for RedisRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRegistry")
            .field("name", &self.inner.settings.name)
            .field("replica", &self.inner.replica)
            .field("max_workers", &self.inner.config.max_workers())
            .field("reconnections", &self.inner.conn.renewals())
            .finish_non_exhaustive()
    }
}

impl RedisRegistry {
    /// A builder for a registry on the server at `url` (`redis://[user:password@]host:port/db`,
    /// or `rediss://` for TLS when redis-rs is built with it).
    ///
    /// # Examples
    ///
    /// See [`RedisRegistryBuilder`].
    pub fn builder(url: impl Into<String>) -> RedisRegistryBuilder {
        RedisRegistryBuilder {
            url: url.into(),
            name: DEFAULT_REGISTRY_NAME.to_owned(),
            config: RegistryConfig::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            reconnect_retries: DEFAULT_RECONNECT_RETRIES,
            wait_on_create: None,
            // Only a `testkit` build can set an offset, so only it reads one.
            test_offset: cfg!(feature = "testkit"),
            sentinel: None,
            cluster: None,
            tls_roots: None,
            given: None,
        }
    }

    /// Another handle on the same registry, with the same settings, on its own connections: what
    /// another router replica would hold.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let a = RedisRegistry::builder("redis://127.0.0.1/").connect().await?;
    /// let b = a.connect_replica().await?;
    /// assert_ne!(a.replica_id(), b.replica_id());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_replica(&self) -> Result<RedisRegistry, ConnectError> {
        let mut settings = self.inner.settings.clone();
        // Its own connection, even if this handle's is the application's.
        settings.given = None;
        settings.connect().await
    }

    /// The registry's name (the hash tag of its keys).
    ///
    /// # Examples
    ///
    /// See [`RedisRegistryBuilder`].
    pub fn name(&self) -> &str {
        &self.inner.settings.name
    }

    /// This handle's replica id (the consumer name in the released stream, the lease owner).
    ///
    /// # Examples
    ///
    /// See [`connect_replica`](Self::connect_replica).
    pub fn replica_id(&self) -> &str {
        &self.inner.replica
    }

    /// The replica that holds the maintenance lease now, if any (for diagnostics).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use worker_registry::redis::RedisRegistry;
    /// use worker_registry::Maintenance;
    ///
    /// let r = RedisRegistry::builder("redis://127.0.0.1/").connect().await?;
    /// r.sweep().await?;
    /// assert_eq!(r.lease_holder().await?.as_deref(), Some(r.replica_id()));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lease_holder(&self) -> Result<Option<String>, RegistryError> {
        let mut conn = self.inner.conn.clone();
        let v: Option<String> = ::redis::cmd("GET")
            .arg(&self.inner.keys.lease)
            .query_async(&mut conn)
            .await
            .map_err(error::backend)?;
        Ok(v.map(|v| lease::owner(&v).to_owned()))
    }

    /// The glob pattern every key of this registry matches (`{name}:*`), for tools that inspect
    /// or delete a registry.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let r = RedisRegistry::builder("redis://127.0.0.1/").name("pool-a").connect().await?;
    /// assert_eq!(r.key_pattern(), "{pool-a}:*");
    /// # Ok(())
    /// # }
    /// ```
    pub fn key_pattern(&self) -> String {
        self.inner.keys.pattern()
    }

    /// The key of the claim on a (target, delivery) pair (for measuring and inspecting).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use worker_registry::redis::RedisRegistry;
    /// use worker_registry::{DeliveryId, Target};
    ///
    /// let r = RedisRegistry::builder("redis://127.0.0.1/").name("p").connect().await?;
    /// let key = r.claim_key(&Target::new("o/r", 1)?, &DeliveryId::new("d")?);
    /// assert_eq!(key, "{p}:c:o/r#1:d");
    /// # Ok(())
    /// # }
    /// ```
    pub fn claim_key(&self, target: &crate::Target, delivery: &crate::DeliveryId) -> String {
        self.inner.keys.claim(&codec::member(target, delivery))
    }

    /// Moves this registry's time forward by `by`, for every handle on it (the conformance
    /// fixture's `advance`): the offset is stored on the server and added to its clock by every
    /// script. Only with the `testkit` feature; production builds cannot set it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let r = RedisRegistry::builder("redis://127.0.0.1/").connect().await?;
    /// r.advance_time_for_tests(Duration::from_secs(60)).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "testkit")]
    pub async fn advance_time_for_tests(&self, by: Duration) -> Result<(), RegistryError> {
        let mut conn = self.inner.conn.clone();
        let _: i64 = ::redis::cmd("INCRBY")
            .arg(&self.inner.keys.offset)
            .arg(millis(by))
            .query_async(&mut conn)
            .await
            .map_err(error::backend)?;
        Ok(())
    }
}
