//! [`PostgresRegistry`] (feature `postgres`): the registry kept in PostgreSQL, so that several
//! router replicas share one set of workers, claims and capacity, and its history is durable and
//! queryable. The contract it implements is documented on [`WorkerRegistry`]; how it is kept in
//! SQL (schema, functions, locks, the sweep's steps, events, errors, measured cost) is in
//! [`docs::postgres`](crate::docs::postgres).
//!
//! In short: every decision is one PL/pgSQL function called as one statement (one transaction,
//! one round trip), on the server's clock; one replica at a time holds the maintenance lease
//! and sweeps in bounded steps; the snapshot is cached per handle and read without I/O.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the handle, its builder, the call path (pool, prepared statement, retries) |
//! | `builder.rs` | [`PostgresRegistryBuilder`]: the URL, the name, the pool, the timeouts, connect |
//! | `conn.rs` | one call's connection: cancelled and closed if the call ended early, dropped if unfit; unnamed statements behind a pooler |
//! | `ops.rs` | [`PostgresRegistry`] and the contract's per-call methods, each one function call |
//! | `placement.rs` | what an admission or an assignment answers (placed, parked, duplicate, refused), decoded and counted |
//! | `sweep.rs` | `sweep` (the lease, the outbox share, the snapshot) and `acknowledge` |
//! | `maintain.rs` | the lease holder's maintenance, in bounded steps |
//! | `room.rs` | the waiting room's settings, written by every connect |
//! | `migrate.rs`, `migrations/0001_baseline.sql` | the schema (the baseline and later migrations), the upgrade from the old history, the function files applied on connect |
//! | `functions/*.sql` | every current function, by concern (base, payloads, waiting, workers, claims, sweep, snapshot, outbox), re-applied on connect when they change |
//! | `payload.rs` | payloads as the functions take them and hand them back; the lookup |
//! | `rows.rs` | from stored columns to the contract's types |
//! | `delta.rs` | what a sweep reads of the published snapshot, applied to the shared cache (`remote::snapshot`) |
//! | `listen.rs` | lifecycle events: `NOTIFY` in the functions, `LISTEN` per handle |
//! | `poll.rs` | lifecycle events for a handle that cannot `LISTEN`: the event log, polled |
//! | `loss.rs` | the registry's incarnation: data lost or rewound on the server, found and reported |
//! | `tls.rs` | TLS with rustls (feature `postgres-tls`) |
//! | `error.rs` | backend errors, [`SchemaTooOld`], and the bounded retry of lost races |

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
mod placement;
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
pub use self::error::SchemaTooOld;
use self::error::{retrying, Failure};
pub use self::ops::PostgresRegistry;
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
    /// ```
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("host=db.internal user=router dbname=registry").name("webhooks");
    /// ```
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
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let registry = PostgresRegistry::builder("postgres://router@localhost/registry")
    ///     .name("webhooks")
    ///     .connect()
    ///     .await?;
    /// assert_eq!(registry.name(), "webhooks");
    /// # Ok(())
    /// # }
    /// ```
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

/// The contract's view of a handle: [`PostgresRegistry`] and its [`WorkerRegistry`] are in `ops.rs`.
const _: fn() = || {
    fn is_registry<R: WorkerRegistry + crate::Maintenance + crate::Subscribe + Clone>() {}
    is_registry::<PostgresRegistry>();
};
