//! [`PostgresRegistryBuilder`]: the URL, the registry's name and configuration, the pool and its
//! timeouts; `connect` builds the pool, migrates, opens the registry and starts the listener.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use super::counters::Counters;
use super::error::{retrying, BACKEND};
use super::snapshot::SnapshotCache;
use super::{listen, migrate, rows, Inner, Params, PostgresRegistry};
use crate::api::connect::ConnectError;
use crate::api::events::EventSender;
use crate::config::RegistryConfig;

/// Builds a [`PostgresRegistry`]: the database URL, the registry's name and configuration, and
/// the handle's pool size and timeouts.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), worker_registry::ConnectError> {
/// use std::time::Duration;
/// use worker_registry::postgres::PostgresRegistry;
/// use worker_registry::RegistryConfig;
///
/// let registry = PostgresRegistry::builder("postgres://router@localhost/registry")
///     .name("pool-a")
///     .config(RegistryConfig::builder().max_workers(8).build().unwrap())
///     .pool_size(8)
///     .call_timeout(Duration::from_secs(2))
///     .connect()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `connect()` is called"]
pub struct PostgresRegistryBuilder {
    pub(super) url: String,
    pub(super) name: String,
    pub(super) config: RegistryConfig,
    pub(super) pool_size: usize,
    pub(super) call_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) batch: usize,
    pub(super) listen: bool,
    pub(super) migrate: bool,
}

impl PostgresRegistryBuilder {
    /// The registry's name: handles with the same name on the same database share one registry
    /// ([`DEFAULT_REGISTRY_NAME`](super::DEFAULT_REGISTRY_NAME) unless set).
    ///
    /// # Examples
    ///
    /// See [`PostgresRegistryBuilder`].
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The registry's configuration (the defaults unless set). Give every replica of one
    /// registry the same one: each handle decides with its own.
    ///
    /// # Examples
    ///
    /// See [`PostgresRegistryBuilder`].
    pub fn config(mut self, config: RegistryConfig) -> Self {
        self.config = config;
        self
    }

    /// Connections in the handle's pool ([`DEFAULT_POOL_SIZE`](super::DEFAULT_POOL_SIZE) unless set; at least 1).
    ///
    /// # Examples
    ///
    /// See [`PostgresRegistryBuilder`].
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n.max(1);
        self
    }

    /// How long one call may take in all ([`DEFAULT_CALL_TIMEOUT`](super::DEFAULT_CALL_TIMEOUT) unless set).
    ///
    /// # Examples
    ///
    /// See [`PostgresRegistryBuilder`].
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = d;
        self
    }

    /// How long opening a connection may take ([`DEFAULT_CONNECT_TIMEOUT`](super::DEFAULT_CONNECT_TIMEOUT) unless set).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://localhost/db").connect_timeout(Duration::from_secs(1));
    /// ```
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// The most rows of each kind one sweep handles ([`DEFAULT_BATCH`](super::DEFAULT_BATCH) unless set; at least 1).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://localhost/db").batch(500);
    /// ```
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// Whether the handle listens for lifecycle events (on by default; a handle that never
    /// subscribes can save the listener's connection).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://localhost/db").listen(false);
    /// ```
    pub fn listen(mut self, on: bool) -> Self {
        self.listen = on;
        self
    }

    /// Whether `connect` applies the embedded migrations (on by default; off, the schema must
    /// have been migrated already, by [`PostgresRegistry::migrate`] or another handle).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://localhost/db").migrate(false);
    /// ```
    pub fn migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// Connects: parses the URL, builds the pool, applies the migrations, creates the registry's
    /// rows if they do not exist, fetches its latest snapshot and starts the event listener.
    ///
    /// Refused with a [`ConnectError`]: `InvalidUrl` for a URL that does not parse, `Backend` for
    /// a database that cannot be reached (retryable) or one that refuses the migrations.
    ///
    /// # Examples
    ///
    /// See [`PostgresRegistryBuilder`].
    pub async fn connect(self) -> Result<PostgresRegistry, ConnectError> {
        let mut pg: tokio_postgres::Config =
            self.url
                .parse()
                .map_err(|e: tokio_postgres::Error| ConnectError::InvalidUrl {
                    backend: BACKEND,
                    reason: e.to_string(),
                })?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(self.connect_timeout);
        }
        if pg.get_application_name().is_none() {
            pg.application_name("worker-registry");
        }
        // Every call's statements wait at most this long for a lock and run at most this long
        // (the migration transaction sets its own, longer, limits).
        let limits = format!(
            "-c lock_timeout={}ms -c statement_timeout={}ms",
            rows::ms(super::DEFAULT_LOCK_TIMEOUT),
            rows::ms(super::DEFAULT_STATEMENT_TIMEOUT)
        );
        let options = match pg.get_options() {
            Some(o) if !o.is_empty() => format!("{o} {limits}"),
            _ => limits,
        };
        pg.options(&options);
        let manager = Manager::from_config(
            pg.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(self.call_timeout))
            .create_timeout(Some(self.connect_timeout))
            .recycle_timeout(Some(self.connect_timeout))
            .build()
            .map_err(|e| ConnectError::InvalidUrl {
                backend: BACKEND,
                reason: e.to_string(),
            })?;

        let timeout = self.call_timeout;
        let migrate = self.migrate;
        let name = self.name.clone();
        let id = retrying(timeout, || async {
            let mut client = pool.get().await?;
            if migrate {
                migrate::apply(&mut client).await?;
            }
            let row = client.query_one("SELECT wr_open($1)", &[&name]).await?;
            rows::col::<i64>(&row, "wr_open")
        })
        .await
        .map_err(ConnectError::Backend)?;

        let events = Arc::new(EventSender::new());
        let listener = if self.listen {
            Some(
                listen::Listener::start(pg, id, events.clone(), self.call_timeout)
                    .await
                    .map_err(ConnectError::Backend)?,
            )
        } else {
            None
        };
        let params = Params::new(&self.config, self.batch);
        let registry = PostgresRegistry {
            inner: Arc::new(Inner {
                snapshot: SnapshotCache::new(self.config.max_workers()),
                pool,
                settings: self,
                id,
                replica: replica_id(),
                params,
                counters: Counters::default(),
                events,
                listener,
            }),
        };
        registry
            .refresh_snapshot()
            .await
            .map_err(ConnectError::Backend)?;
        Ok(registry)
    }
}

/// A name for this handle that no other handle has: the process id, and a random number.
fn replica_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Relaxed: only uniqueness within the process matters, which the RMW gives.
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(n);
    format!("{}-{}-{:08x}", std::process::id(), n, h.finish() as u32)
}
