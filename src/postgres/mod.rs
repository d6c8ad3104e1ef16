//! [`PostgresRegistry`] (feature `postgres`): the registry kept in PostgreSQL, so that several
//! router replicas share one set of workers, claims and capacity, and its history is durable and
//! queryable. The contract it implements is documented on [`WorkerRegistry`]; this page says how
//! it is kept in SQL.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the handle, its builder, the call path (pool, prepared statement, retries) |
//! | `conn.rs` | one call's connection: cancelled and closed if the call ended early, dropped if unfit; unnamed statements behind a pooler |
//! | `ops.rs` | the contract's per-call methods, each one function call |
//! | `sweep.rs` | `sweep` (the lease, the outbox share, the snapshot) and `acknowledge` |
//! | `maintain.rs` | the lease holder's maintenance, in bounded steps |
//! | `functions.sql` | every current function, re-applied on connect when it changes |
//! | `migrate.rs`, `migrations/*.sql` | the schema (versioned migrations) and the functions file |
//! | `payload.rs` | payloads as the functions take them and hand them back; the lookup |
//! | `rows.rs` | from stored columns to the contract's types |
//! | `delta.rs` | what a sweep reads of the published snapshot, applied to the shared cache (`remote::snapshot`) |
//! | `listen.rs` | lifecycle events: `NOTIFY` in the functions, `LISTEN` per handle |
//! | `poll.rs` | lifecycle events for a handle that cannot `LISTEN`: the event log, polled |
//! | `error.rs` | backend errors, and the bounded retry of lost races |
//!
//! # Design
//!
//! **One function, one transaction, one round trip per call.** Every decision is a PL/pgSQL
//! function (all of them, as they are now, in `functions.sql`; the versioned migrations keep only
//! schema changes, and the function definitions migrations 0002-0004 carried when they were
//! written are replaced by that file on connect) called as one statement in autocommit, so the
//! decision and its writes are one transaction that takes the locks it needs and nothing is
//! decided on the client between two statements (no check-then-act across round trips). The
//! client prepares each call once per connection and runs it with one round trip.
//!
//! **Time** is the server's: `clock_timestamp()` in milliseconds, plus the registry's test
//! offset (`wr_registries.test_offset_ms`, zero unless a `testkit` build moved it), read once at
//! the start of each function. Replicas with skewed clocks therefore agree on who is dead.
//!
//! **Duplicate detection** (`wr_admit`, `wr_claim`): a redelivery is one primary-key lookup
//! without a lock or a write. A new pair is claimed by `INSERT ... ON CONFLICT`: two admits of
//! one new pair serialise on the key; the one that commits second finds a live claim in its
//! upsert, raises a serialization failure that undoes its placement, and its retry answers
//! `Duplicate`. A released or expired claim is replaced by the same upsert.
//!
//! **Sticky assignment** (`wr_place`): the target's row in `wr_targets` is locked `FOR UPDATE`
//! (inserted with `ON CONFLICT DO NOTHING` first if it does not exist) for the rest of the
//! transaction, so two assignments of one target never both create a worker. An active worker is
//! taken with `UPDATE ... WHERE status = 'active'`, which re-checks the status under the worker's
//! row lock: a sweep or a drain that got there first is seen.
//!
//! **Capacity** is one counter row (`wr_capacity`): a new worker reserves its slot and its id
//! with `UPDATE ... SET live = live + 1, next_worker_id = next_worker_id + 1 WHERE live < max`,
//! which cannot exceed the limit under any concurrency (the row lock serialises creators, and each
//! re-checks the condition on the row as the previous one left it); every death gives the slot
//! back in its own transaction. Worker ids come from the same row, so they are per registry,
//! start at 1, never repeat, and a rolled-back creation spends none.
//!
//! **Death** (`wr_kill`): the status, the capacity slot, and the release of the worker's
//! in-flight claims (`release_reason`) happen in the transaction that kills it, whichever call
//! that is (deregister, loop end, drain, or the sweep). A heartbeat racing the sweep either
//! commits first (the sweep's `FOR UPDATE` re-check sees the fresh heartbeat and spares the
//! worker) or waits for the sweep and then finds it dead: never both.
//!
//! **The sweep** runs on every replica; only the holder of the registry's **maintenance lease**
//! maintains. The lease is a row (`wr_leases`: holder, expiry on the registry's time, three
//! `sweep_interval`s and at least 100 ms, `maintain::MIN_LEASE_TTL`), as Oban's peers
//! and River's leader election keep theirs: a sweep takes it if it is free, lapsed or its own
//! (renewing it) with one conditional single-row `UPDATE`; any other replica's sweep finds the
//! condition false, takes no lock, and only collects its share of the outbox and the snapshot.
//! The holder's maintenance (`maintain.rs`) is a sequence of functions, **each one statement in
//! its own short transaction**, so other calls interleave with it and none of them waits for
//! more than one step: `wr_sweep_begin` (the lease, the stall rule, the brake decided once for
//! the sweep), `wr_sweep_retain` (retention, eviction, purge) and `wr_sweep_release` (bare claims
//! past the timeout, claims of workers that died in other calls) in steps of
//! 256 rows (`maintain::MAINTENANCE_STEP`), `wr_sweep_deaths` in steps of
//! 32 workers (`maintain::DEATH_STEP`) (silent ones by a cursor on (last heartbeat, id),
//! then overdue drains; each step moves its dead workers' deliveries to the outbox and claims them
//! for the sweeping replica in the transaction that released them, so no other call sees them
//! released and not yet handed out), then `wr_sweep_finish`: one step of stuck deliveries, the
//! publish (a last step of versioning, the new version) and the holder's own outbox share and
//! snapshot changes, in one transaction, so that the sweep answers one round trip after its last
//! death step (more stuck or changed rows than a step: `wr_sweep_stuck`, `wr_sweep_stamp` and
//! `wr_sweep_publish` again, in steps of 256
//! rows; versioning of what other calls changed runs in such steps before the deaths). Each kind goes
//! on until a step finds less than it could take, or the sweep's bound (the builder's `batch`,
//! [`DEFAULT_BATCH`] rows of each kind) is reached: a mass death of 10 000 is worked off in one
//! `sweep()` of about 300 death steps. Every step re-checks the lease first (one row), so a
//! holder whose lease was taken over stops at its next step; every row a step changes it locks
//! `FOR UPDATE SKIP LOCKED` and re-checks, so two replicas both believing they hold it (a lapse
//! in the middle of a sweep) do no harm. Candidates are found by range scans on partial indexes
//! (live workers by last heartbeat, draining ones by deadline, dead ones by death); a worker
//! whose row is busy (a heartbeat landing) is judged by the next sweep. The mass-staleness
//! brake, suspect grace and start-up grace are those of the in-memory backend, on server time,
//! judged at the instant `wr_sweep_begin` read (every step gets it as a parameter).
//!
//! **Admits never wait on the sweep's work.** A death step locks its (at most 32) workers, then
//! gives their capacity slots back with one `UPDATE` of `wr_capacity`, then kills them (status,
//! claims released, event): the capacity row, which every admit that creates a worker needs, is
//! held for one step's kills, never across the sweep. The snapshot is published in its own
//! transaction, which locks only the snapshot row. The dead workers' target rows are dropped in
//! the death step with `SKIP LOCKED` (a row an admit holds is that admit's to replace; what is
//! left is dropped with the worker's purge), so no step scans every target. Every pooled
//! connection runs with `lock_timeout` [`DEFAULT_LOCK_TIMEOUT`] and `statement_timeout`
//! [`DEFAULT_STATEMENT_TIMEOUT`]; a lock wait past its timeout is retried like a lost race.

//! **The retained count** (the snapshot's `retained` gauge, and how many claims eviction removes
//! over `max_retained_claims`) is a counter, not a count (table from migration 0004): the sweep
//! sums the registry's 17 rows of `wr_retained` instead of scanning its completed claims, so its
//! cost follows what changed, not what is kept. Every change to the set of completed claims moves
//! the counter in its own transaction: `wr_complete` adds one, a redelivery (`wr_admit`,
//! `wr_claim`) that replaces a completed claim past its retention takes one away
//! (`wr_replace_claim` locks the old claim first, so it knows what it replaced), and the sweep
//! takes away what it expires and evicts. Releases, deaths and the stuck rule touch only claims
//! not completed. Hot calls add to one of 16 stripes picked at random, so concurrent completions
//! rarely wait for each other; the sweep writes a stripe of its own.
//!
//! **Released events** go through the outbox `wr_released`: each `sweep()` claims rows that are
//! unclaimed, or claimed longer than `release_ack_timeout` ago, with `FOR UPDATE SKIP LOCKED`
//! (setting `claimed_by`, the handle's replica id, and `claimed_at_ms`); `acknowledge` deletes
//! them. The [`Receipt`](crate::Receipt) is the row id. A replica that dies before acknowledging
//! loses nothing: its rows are offered again after the timeout.
//!
//! **The snapshot costs what changed.** Every write to a worker row sets its `dirty` flag; the
//! lease holder's `wr_sweep_stamp` gives dirty rows (in steps, `SKIP LOCKED`) the next snapshot
//! version under a share lock of the snapshot row, and `wr_sweep_publish` then moves the
//! published version (exclusively locking that row, so it waits for the stamps in progress): a
//! replica that sees version v therefore sees every row versioned v. Each replica's sweep asks
//! `wr_snapshot_since(its version)` for the rows versioned after it (an index on
//! `(registry, version)`) and the ids purged since (`wr_purged`, logged by the purge under the
//! next version, trimmed after 1 000 versions, `maintain::PURGE_LOG_VERSIONS`),
//! and hands them to the snapshot cache the Redis backend uses too (`remote::snapshot`: the rows
//! replace their entries, purged ids are dropped, the rest age by the time between the two
//! versions), which keeps the snapshot behind an `ArcSwap`, so
//! [`status`](WorkerRegistry::status) never blocks and does no I/O. A handle with
//! nothing yet, or further behind than the purge log reaches, reads every row once. Rows are read
//! as they are now, so a row changed again after it was versioned shows its newer state; rows
//! changed after the last stamp step show up with the next version. The version moves only when
//! something changed (a row versioned, a purge, a gauge or the brake); otherwise the publish
//! moves only its time, and every handle re-dates its copy (the same version and entries, their
//! ages moved on), so an idle registry's replicas read nothing but the header.

//! **Lifecycle events**: the functions `NOTIFY` on the registry's channel in the transaction that
//! made the change, so every handle's subscribers see every committed event in commit order; each
//! handle listens on a dedicated connection. A call that published events returns only once they
//! have passed its own listener (an empty query on the listener's connection, answered after every
//! notification committed before it), so a subscription made after a call never sees that call's
//! events, as in memory. Only calls that change a worker's status wait so: duplicate detection,
//! sticky assignment and heartbeats publish nothing and never wait.
//!
//! **Where it differs from the in-memory backend**, within what the contract allows: completed
//! claims beyond `max_retained_claims` are evicted by the sweep only (memory also evicts at once
//! when a burst of completions goes far over the limit: it bounds memory, which a table need not);
//! `stats()` gauges come from the last snapshot, not from live counters; and released events not
//! acknowledged within `release_ack_timeout` are offered again, to any replica including the one
//! that had them (memory hands each over once).
//!
//! **Lock order**, the same everywhere: claim, target, capacity row, worker (a death: worker,
//! capacity row, claims, their payload rows), then one retained-counter stripe (each call takes
//! at most one, in its last statement), then payload rows and last the payload-budget row
//! (`docs::postgres`, "Payloads"). The sweep's steps take worker rows first but only with `SKIP LOCKED`,
//! so they never wait for one, and target rows after them only with `SKIP LOCKED`;
//! `drain_all` locks all its workers in one statement before it changes any. Deadlocks are
//! therefore not expected; if the server detects one anyway, the call is retried like a
//! serialization failure, at most 12 times (`error::MAX_ATTEMPTS`), then reported as
//! a retryable backend error.

//! **Errors**: a lost connection, a pool that cannot connect, a server shutting down, or a call
//! past its timeout is `RegistryError::Backend { backend: "postgres", retryable: true, .. }`; an
//! answer this crate cannot read is the same with `retryable: false`. Nothing panics. After a
//! database restart the pool replaces its dead connections by itself; the handle need not be
//! rebuilt.
//!
//! **The stall rule** (memory's `stall.rs`, on the server's time): the sweeping replica keeps
//! the time of the last sweep and the stalls measured so far in `wr_stalls` (one row per
//! registry, at most 64 spans, older ones forgotten by memory's rule). A sweep more than two
//! `sweep_interval`s after the previous one records a stall and reports it in
//! `SweepReport::stall_credited`; every duration the sweep judges (silence, time in flight, time
//! under suspicion) then leaves out the stalled time it overlaps (`wr_ran`). The candidates are
//! still range scans on the partial indexes: `wr_run_cutoff` turns "ran longer than d" into an
//! exact bound on the base time (running time since a base never grows as the base moves later),
//! so a sweep after a stall reads only what is due. Only the sweep that measures a stall does
//! work proportional to workers: it moves the deadlines of the draining workers out by the
//! stall's length.
//!
//! **Stuck deliveries**: a claim in flight on a live worker for longer than `max_in_flight` of
//! running time (a range on `wr_claims_in_flight`) is released in the sweep: a row in the outbox
//! with reason `stuck`, a `stuck` notification ([`Event::DeliveryStuck`](crate::Event::DeliveryStuck)), and its
//! worker drained with `drain_deadline` (an idle one exits). The claim stays as a tombstone
//! (`release_reason = 'stuck'`) so that the worker's late completion is refused as released;
//! a redelivery replaces it, and once its holder is dead (`wr_kill` marks it) the next sweep
//! deletes it, as memory does.
//!
//! **Connections** (`conn.rs`): a call that ended early (its timeout) has its statement
//! cancelled and its connection closed, never pooled; a connection whose server turned read-only
//! is dropped and the call retried, so a multi-host URL with `target_session_attrs=read-write`
//! follows a failover; a connection idle for 30 s is verified when taken. Behind PgBouncer in
//! transaction mode, `transaction_pooler(true)` makes every call one unnamed statement and
//! `listen_url` puts the listener on a direct connection; without one the handle logs a warning
//! and polls the registry's event log instead (`poll.rs`; see
//! [`docs::postgres`](crate::docs::postgres)).
//!
//! **TLS** (feature `postgres-tls`, `tls.rs`): rustls, the server's certificate verified (chain
//! and host name) against the system's roots or the builder's `tls_root_certificate`;
//! `sslmode=require`, `verify-ca` and `verify-full` all verify. Without the feature a URL that
//! requires TLS is refused at connect.

// `Tls` is `NoTls`, a `Copy` type, without `postgres-tls`; `.clone()` serves both builds.
#![cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]

mod builder;
mod conn;
mod delta;
mod error;
mod listen;
mod loss;
mod maintain;
mod migrate;
mod ops;
mod payload;
mod poll;
mod room;
mod rows;
mod sweep;
#[cfg(feature = "postgres-tls")]
mod tls;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

pub use self::builder::PostgresRegistryBuilder;
use self::conn::Checkout;
use self::error::{retrying, Failure};
use crate::api::connect::ConnectError;
use crate::api::contract::WorkerRegistry;
use crate::api::error::RegistryError;
use crate::api::events::EventSender;
use crate::config::RegistryConfig;
use crate::remote::counters::Counters;
use crate::remote::loss::LossWatch;
use crate::remote::snapshot::SnapshotCache;

/// The TLS connector of every connection: rustls with `postgres-tls`, none without.
#[cfg(feature = "postgres-tls")]
pub(crate) type Tls = tls::MakeRustls;
/// The TLS connector of every connection: rustls with `postgres-tls`, none without.
#[cfg(not(feature = "postgres-tls"))]
pub(crate) type Tls = tokio_postgres::NoTls;

/// The registry name a builder uses unless told otherwise (a row of `wr_registries`; Redis's is
/// `"worker-registry"`, a key prefix in a shared keyspace).
pub const DEFAULT_REGISTRY_NAME: &str = "default";
/// Connections in each handle's pool (the event listener has one more of its own).
pub const DEFAULT_POOL_SIZE: usize = 16;
/// How long one call may take, queueing for a connection and retries included, before it is
/// answered with a retryable backend error.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long opening a connection may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most rows of each kind one sweep releases, deletes or claims (in steps of its own
/// transactions: `maintain::DEATH_STEP`, `maintain::MAINTENANCE_STEP`).
pub const DEFAULT_BATCH: usize = 10_000;
/// How often a handle that cannot `LISTEN` (behind a transaction pooler without a `listen_url`)
/// polls the registry's event log.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How long a statement of this crate waits for a row lock before it gives up (`lock_timeout`,
/// set on every connection of the pool, unless the builder's
/// [`lock_timeout`](PostgresRegistryBuilder::lock_timeout) says otherwise): the call is then
/// retried like a lost race, and answered with a retryable backend error if it keeps timing out.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one statement of this crate may run (`statement_timeout`, set on every connection of
/// the pool, unless the builder's [`statement_timeout`](PostgresRegistryBuilder::statement_timeout)
/// says otherwise); a call cancelled by it is a retryable backend error.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The worker registry in PostgreSQL, shared by every handle (every router replica) connected to
/// the same database under the same registry name. See [`docs::postgres`](crate::docs::postgres)
/// for how it is kept (and `src/postgres/mod.rs` for the design notes: locks, sweep, outbox).
///
/// Each handle has its own connection pool and its own event listener; cloning a handle shares
/// them (it is an `Arc` inside). [`connect_replica`](Self::connect_replica) makes another handle on the same
/// registry with connections of its own, as another router process would have.
///
/// **Locking behaviour:** every call but `status`, `stats` and `config` is one function call in
/// its own transaction, on one pooled connection (waiting for one if all are busy, up to the call
/// timeout); the locks it takes are listed on its function in `functions.sql`.
/// `status` and `stats` take no lock and do no I/O.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), worker_registry::RegistryError> {
/// use worker_registry::postgres::PostgresRegistry;
/// use worker_registry::{Admission, DeliveryId, Target, WorkerRegistry, WorkerRegistryExt};
///
/// let registry = PostgresRegistry::builder("postgres://router@db.internal/registry")
///     .name("webhooks")
///     .connect()
///     .await?;
/// let (t, d) = (Target::new("octo/repo", 42).unwrap(), DeliveryId::new("d-1").unwrap());
/// match registry.admit(&t, &d).await? {
///     Admission::Assigned(a) if a.new => { /* start a container for a.worker */ }
///     Admission::Assigned(_) => { /* hand the delivery to the running worker */ }
///     Admission::Duplicate(_) => { /* a redelivery: skip it */ }
///     Admission::Waiting(_) => { /* parked: handed over by a sweep once promoted */ }
///     Admission::Rejected(_) => { /* answer 503 */ }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresRegistry {
    inner: Arc<Inner>,
}

/// The configuration durations and limits, as the functions take them.
struct Params {
    max_workers: i64,
    timeout: i64,
    grace: i64,
    retention: i64,
    max_retained: i64,
    dead_retention: i64,
    suspect_grace: i64,
    brake_fraction: f64,
    brake_min: i64,
    ack_timeout: i64,
    batch: i32,
    /// The same bound as a count of rows.
    batch_rows: usize,
    /// The maintenance lease's time to live (ms).
    lease_ttl: i64,
    sweep_interval: i64,
    max_in_flight: i64,
    drain_deadline: i64,
    /// The longest any judgement of the sweep waits (memory's `stall_horizon_ms`): stalls
    /// further back than this much running time cannot matter any more.
    stall_horizon: i64,
    /// The waiting room's bounds (`max_waiting` 0: off) and its expiry.
    max_waiting: i64,
    per_owner: i64,
    max_wait: i64,
    /// `max_workers_per_owner` (0: off).
    owner_cap: i64,
    /// `max_payload_bytes` (checked here, before any round trip) and `payload_budget`.
    max_payload_bytes: u64,
    payload_budget: i64,
}

impl Params {
    fn new(c: &RegistryConfig, batch: usize) -> Self {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        Self {
            max_workers: count(c.max_workers()),
            timeout: rows::ms(c.heartbeat_timeout()),
            grace: rows::ms(c.startup_grace()),
            retention: rows::ms(c.claim_retention()),
            max_retained: count(c.max_retained_claims()),
            dead_retention: rows::ms(c.dead_retention()),
            suspect_grace: rows::ms(c.suspect_grace()),
            brake_fraction: c.brake_fraction(),
            brake_min: count(c.brake_min_workers()),
            ack_timeout: rows::ms(c.release_ack_timeout()),
            batch: i32::try_from(batch).unwrap_or(i32::MAX),
            batch_rows: batch.clamp(1, i32::MAX as usize),
            lease_ttl: rows::ms(maintain::lease_ttl(c.sweep_interval())),
            sweep_interval: rows::ms(c.sweep_interval()),
            max_in_flight: rows::ms(c.max_in_flight()),
            drain_deadline: rows::ms(c.drain_deadline()),
            stall_horizon: rows::ms(c.heartbeat_timeout().saturating_add(c.startup_grace()))
                .max(rows::ms(c.max_in_flight()))
                .max(rows::ms(c.suspect_grace())),
            max_waiting: count(c.max_waiting()),
            per_owner: count(c.max_waiting_per_owner()),
            max_wait: rows::ms(c.max_wait()),
            owner_cap: count(c.max_workers_per_owner()),
            max_payload_bytes: c.max_payload_bytes(),
            payload_budget: i64::try_from(c.payload_budget()).unwrap_or(i64::MAX),
        }
    }
}

struct Inner {
    pool: Pool,
    settings: PostgresRegistryBuilder,
    /// The registry's id (`wr_registries.id`).
    id: i64,
    /// This handle's name in the outbox's `claimed_by`.
    replica: String,
    params: Params,
    counters: Counters,
    snapshot: SnapshotCache,
    events: Arc<EventSender>,
    listener: Option<poll::Feed>,
    /// What this handle saw of the registry's identity (data-loss detection, `loss.rs`).
    loss: LossWatch,
    /// For cancel requests of calls that ended early.
    tls: Tls,
    /// Whether the pool is this handle's (not the application's, which outlives it).
    owns_pool: bool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The listener stops itself when dropped.
        if self.owns_pool {
            self.pool.close();
        }
    }
}

impl fmt::Debug for PostgresRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresRegistry")
            .field("name", &self.inner.settings.name)
            .field("id", &self.inner.id)
            .field("replica", &self.inner.replica)
            .finish_non_exhaustive()
    }
}

impl PostgresRegistry {
    /// A builder for a handle on the database at `url` (a `postgres://` URL or a libpq
    /// key-value string).
    ///
    /// # Examples
    ///
    /// See [`PostgresRegistryBuilder`].
    pub fn builder(url: impl Into<String>) -> PostgresRegistryBuilder {
        PostgresRegistryBuilder {
            url: url.into(),
            name: DEFAULT_REGISTRY_NAME.to_owned(),
            config: RegistryConfig::default(),
            pool_size: DEFAULT_POOL_SIZE,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            batch: DEFAULT_BATCH,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            listen: true,
            migrate: true,
            transaction_pooler: false,
            listen_url: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            tls_roots: None,
            pool: None,
        }
    }

    /// A builder for a handle on an existing deadpool-postgres [`Pool`], the application's: the
    /// registry's calls take their connections from it, and dropping the registry leaves it
    /// open. The pool's connections are used as configured: the builder's
    /// [`pool_size`](PostgresRegistryBuilder::pool_size),
    /// [`connect_timeout`](PostgresRegistryBuilder::connect_timeout),
    /// [`lock_timeout`](PostgresRegistryBuilder::lock_timeout) and
    /// [`statement_timeout`](PostgresRegistryBuilder::statement_timeout) do not apply (give the
    /// connections `lock_timeout` and `statement_timeout` in their options or the role's
    /// settings; `connect` warns if they are off). The pool holds no URL to `LISTEN` on: lifecycle
    /// events from other replicas are polled through the pool every
    /// [`poll_interval`](PostgresRegistryBuilder::poll_interval), unless
    /// [`listen_url`](PostgresRegistryBuilder::listen_url) names the database to listen on.
    /// [`connect_replica`](Self::connect_replica) shares the pool. A pool behind PgBouncer in
    /// transaction mode needs [`transaction_pooler`](PostgresRegistryBuilder::transaction_pooler)
    /// as a URL would.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use deadpool_postgres::{Manager, Pool};
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let url = "postgres://router@db/registry?options=-c%20lock_timeout%3D2s%20-c%20statement_timeout%3D5s";
    /// let manager = Manager::new(url.parse()?, tokio_postgres::NoTls);
    /// let pool = Pool::builder(manager).max_size(16).build()?; // the application's
    /// let registry = PostgresRegistry::builder_with_pool(pool.clone())
    ///     .name("webhooks")
    ///     .listen_url(url)
    ///     .connect()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder_with_pool(pool: Pool) -> PostgresRegistryBuilder {
        PostgresRegistryBuilder {
            pool: Some(pool),
            ..Self::builder(String::new())
        }
    }

    /// Applies the embedded migrations to the database at `url` without opening a registry;
    /// returns the versions applied now (empty if it was up to date). [`connect`] does the same
    /// unless told not to.
    ///
    /// [`connect`]: PostgresRegistryBuilder::connect
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), worker_registry::RegistryError> {
    /// let applied = worker_registry::postgres::PostgresRegistry::migrate("postgres://localhost/registry").await?;
    /// println!("applied {applied:?}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn migrate(url: &str) -> Result<Vec<i32>, RegistryError> {
        let (pg, tls) = builder::parse(url, None).map_err(RegistryError::from)?;
        retrying(DEFAULT_CALL_TIMEOUT, || async {
            let (mut client, connection) = pg.connect(tls.clone()).await?;
            let driver = tokio::spawn(connection);
            let done = migrate::apply(&mut client).await;
            drop(client);
            let _ = driver.await;
            done
        })
        .await
    }

    /// Another handle on the same registry with its own pool and listener, as a second router
    /// replica would have (same URL, name, configuration and settings). A handle
    /// [built on the application's pool](Self::builder_with_pool) shares that pool.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(registry: worker_registry::postgres::PostgresRegistry) -> Result<(), worker_registry::RegistryError> {
    /// let other = registry.connect_replica().await?;
    /// assert_eq!(other.name(), registry.name());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_replica(&self) -> Result<Self, ConnectError> {
        self.inner.settings.clone().migrate(false).connect().await
    }

    /// The registry's name.
    ///
    /// # Examples
    ///
    /// See [`connect_replica`](Self::connect_replica).
    pub fn name(&self) -> &str {
        &self.inner.settings.name
    }

    /// This handle's replica id: what it writes into the outbox rows it claims.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(registry: worker_registry::postgres::PostgresRegistry) -> Result<(), worker_registry::RegistryError> {
    /// assert_ne!(registry.replica_id(), registry.connect_replica().await?.replica_id());
    /// # Ok(())
    /// # }
    /// ```
    pub fn replica_id(&self) -> &str {
        &self.inner.replica
    }

    /// Moves the registry's time forward by `by`, for every handle on it (the test-only offset
    /// added to the server clock). Only in builds with the `testkit` feature.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(registry: worker_registry::postgres::PostgresRegistry) -> Result<(), worker_registry::RegistryError> {
    /// use std::time::Duration;
    /// use worker_registry::Maintenance;
    ///
    /// registry.advance_time_for_tests(Duration::from_secs(600)).await?;
    /// let report = registry.sweep().await?; // workers silent for ten minutes are dead now
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "testkit")]
    pub async fn advance_time_for_tests(&self, by: Duration) -> Result<(), RegistryError> {
        let ms = rows::ms(by);
        self.execute(
            "UPDATE wr_registries SET test_offset_ms = test_offset_ms + $2 WHERE id = $1",
            &[&self.inner.id, &ms],
        )
        .await
    }

    /// One bare prepared `SELECT 1` through the same path as every call (a pooled connection,
    /// the statement cache, the timeout): a health check, and the floor under every call's
    /// latency (the benchmarks compare against it).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(registry: worker_registry::postgres::PostgresRegistry) {
    /// if let Err(e) = registry.ping().await {
    ///     eprintln!("registry database unreachable: {e}");
    /// }
    /// # }
    /// ```
    pub async fn ping(&self) -> Result<(), RegistryError> {
        self.call("SELECT 1", &[], |_| Ok(())).await
    }

    /// Runs one prepared statement that returns one row, with the bounded retry of lost races,
    /// and decodes the row.
    async fn call<T>(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        decode: impl Fn(&Row) -> Result<T, Failure>,
    ) -> Result<T, RegistryError> {
        let inner = &*self.inner;
        let unnamed = inner.settings.transaction_pooler;
        retrying(inner.settings.call_timeout, || async {
            let conn = Checkout::get(&inner.pool, &inner.tls).await?;
            let row = conn.query_one(unnamed, sql, params).await;
            conn.finish(&row);
            decode(&row?)
        })
        .await
    }

    /// Runs one prepared statement for its effect.
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    async fn execute(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        let unnamed = inner.settings.transaction_pooler;
        retrying(inner.settings.call_timeout, || async {
            let conn = Checkout::get(&inner.pool, &inner.tls).await?;
            let done = conn.execute(unnamed, sql, params).await;
            conn.finish(&done);
            done
        })
        .await
    }

    /// After a call that published lifecycle events: returns once they reached this handle's
    /// subscribers (see `listen.rs`), so that a subscription made after the call never sees them.
    async fn settle(&self) {
        if let Some(l) = &self.inner.listener {
            l.settle().await;
        }
    }

    fn config_ref(&self) -> &RegistryConfig {
        &self.inner.settings.config
    }
}

/// The contract's view of a handle: [`WorkerRegistry`] is implemented in `ops.rs`.
const _: fn() = || {
    fn is_registry<R: WorkerRegistry + crate::Maintenance + crate::Subscribe + Clone>() {}
    is_registry::<PostgresRegistry>();
};
