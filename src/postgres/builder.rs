//! [`PostgresRegistryBuilder`]: the URL, the registry's name and configuration, the pool and its
//! timeouts; `connect` builds the pool, migrates, opens the registry and starts the listener.

// `Tls` is `NoTls`, a `Copy` type, without `postgres-tls`; `.clone()` serves both builds.
#![cfg_attr(not(feature = "postgres-tls"), allow(clippy::clone_on_copy))]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::types::Type;

use super::error::{retrying, BACKEND};
use super::poll::{Feed, Poller};
use super::{conn, delta, listen, migrate, rows, Inner, Params, PostgresRegistry, Tls};
use crate::api::connect::ConnectError;
use crate::api::error::RegistryError;
use crate::api::events::EventSender;
use crate::config::RegistryConfig;
use crate::remote::counters::Counters;
use crate::remote::loss::LossWatch;
use crate::remote::snapshot::SnapshotCache;

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
    pub(super) lock_timeout: Duration,
    pub(super) statement_timeout: Duration,
    pub(super) listen: bool,
    pub(super) migrate: bool,
    pub(super) transaction_pooler: bool,
    pub(super) listen_url: Option<String>,
    pub(super) poll_interval: Duration,
    #[cfg_attr(not(feature = "postgres-tls"), allow(dead_code))]
    pub(super) tls_roots: Option<Vec<u8>>,
    /// The application's pool ([`PostgresRegistry::builder_with_pool`]), instead of one built
    /// from the URL.
    pub(super) pool: Option<Pool>,
}

impl PostgresRegistryBuilder {
    /// The registry's name: handles with the same name on the same database share one registry
    /// ([`DEFAULT_REGISTRY_NAME`](super::DEFAULT_REGISTRY_NAME) unless set).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://router@localhost/registry").name("pool-a");
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The registry's configuration (the defaults unless set). Every replica of one registry
    /// must use the same one: the first handle to open the registry stores its deciding settings
    /// (`wr_registries.config`), and [`connect`](Self::connect) refuses a handle configured
    /// otherwise with [`RegistryError::ConfigDisagrees`], naming the setting and both values. To
    /// change them, stop every replica, set the column to NULL, and start them again.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::postgres::PostgresRegistry;
    /// use worker_registry::RegistryConfig;
    ///
    /// let config = RegistryConfig::builder().max_workers(8).build().unwrap();
    /// let _b = PostgresRegistry::builder("postgres://router@localhost/registry").config(config);
    /// ```
    pub fn config(mut self, config: RegistryConfig) -> Self {
        self.config = config;
        self
    }

    /// Connections in the handle's pool ([`DEFAULT_POOL_SIZE`](super::DEFAULT_POOL_SIZE) unless set; at least 1).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://router@localhost/registry").pool_size(8);
    /// ```
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n.max(1);
        self
    }

    /// How long one call may take in all ([`DEFAULT_CALL_TIMEOUT`](super::DEFAULT_CALL_TIMEOUT) unless set).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://router@localhost/registry")
    ///     .call_timeout(Duration::from_secs(2));
    /// ```
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
    /// use worker_registry::postgres::PostgresRegistry;
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
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://localhost/db").batch(500);
    /// ```
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How long each statement of the handle waits for a row lock
    /// ([`DEFAULT_LOCK_TIMEOUT`](super::DEFAULT_LOCK_TIMEOUT) unless set; at least 1 ms): set as
    /// `lock_timeout` on every pooled connection (behind a
    /// [`transaction_pooler`](Self::transaction_pooler), the role's setting applies instead). A
    /// call whose statement waited longer is retried like a lost race.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://localhost/db")
    ///     .lock_timeout(Duration::from_millis(500))
    ///     .statement_timeout(Duration::from_secs(2));
    /// ```
    pub fn lock_timeout(mut self, d: Duration) -> Self {
        self.lock_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// How long each statement of the handle may run
    /// ([`DEFAULT_STATEMENT_TIMEOUT`](super::DEFAULT_STATEMENT_TIMEOUT) unless set; at least
    /// 1 ms): set as `statement_timeout` on every pooled connection (behind a
    /// [`transaction_pooler`](Self::transaction_pooler), the role's setting applies instead). A
    /// call cancelled by it is a retryable backend error.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://router@localhost/registry")
    ///     .lock_timeout(Duration::from_secs(1))
    ///     .statement_timeout(Duration::from_secs(3));
    /// ```
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.statement_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// Whether the handle listens for lifecycle events (on by default; a handle that never
    /// subscribes can save the listener's connection).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::postgres::PostgresRegistry;
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
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://localhost/db").migrate(false);
    /// ```
    pub fn migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// Whether the URL goes through a connection pooler in transaction mode (PgBouncer with
    /// `pool_mode = transaction`, off by default), which lends a server connection for one
    /// transaction at a time. On, the handle uses no named prepared statements (each call is one
    /// unnamed statement, parse, bind and execute in one round trip), and sets no session
    /// settings at connect (the pooler would refuse or drop them): give the database role
    /// `lock_timeout` and `statement_timeout` instead (`ALTER ROLE ... SET`); `connect` warns if
    /// they are off. `LISTEN` needs a session: with [`listen`](Self::listen) on, set
    /// [`listen_url`](Self::listen_url) to a direct URL; without one the handle logs a warning
    /// and polls the registry's event log every [`poll_interval`](Self::poll_interval) instead.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://router@pgbouncer:6432/registry")
    ///     .transaction_pooler(true)
    ///     .listen_url("postgres://router@db:5432/registry");
    /// ```
    pub fn transaction_pooler(mut self, on: bool) -> Self {
        self.transaction_pooler = on;
        self
    }

    /// The certificate authorities (PEM) the server's certificate must chain to, instead of the
    /// system's store (feature `postgres-tls`; the URL asks for TLS with `sslmode=require` or
    /// `verify-full`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let ca = std::fs::read("/etc/registry/ca.pem").unwrap();
    /// let _b = PostgresRegistry::builder("postgres://router@db/registry?sslmode=verify-full")
    ///     .tls_root_certificate(ca);
    /// ```
    #[cfg(feature = "postgres-tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_roots = Some(pem.into());
        self
    }

    /// How often a handle that cannot `LISTEN` polls the registry's event log
    /// ([`DEFAULT_POLL_INTERVAL`](super::DEFAULT_POLL_INTERVAL) unless set; at least 10 ms):
    /// behind a [`transaction_pooler`](Self::transaction_pooler) without a
    /// [`listen_url`](Self::listen_url), other replicas' events arrive up to this late (this
    /// handle's own calls still return only once their events reached its subscribers).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// let _b = PostgresRegistry::builder("postgres://router@pgbouncer:6432/registry")
    ///     .transaction_pooler(true)
    ///     .poll_interval(Duration::from_millis(500));
    /// ```
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d.max(Duration::from_millis(10));
        self
    }

    /// Where the event listener connects (default: the builder's URL). Behind a pooler in
    /// transaction mode, the database's own address: `LISTEN` holds a session.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// // Calls through PgBouncer, `LISTEN` on the database's own address.
    /// let _b = PostgresRegistry::builder("postgres://router@pgbouncer:6432/registry")
    ///     .transaction_pooler(true)
    ///     .listen_url("postgres://router@db:5432/registry");
    /// ```
    pub fn listen_url(mut self, url: impl Into<String>) -> Self {
        self.listen_url = Some(url.into());
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
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::postgres::PostgresRegistry;
    ///
    /// match PostgresRegistry::builder("postgres://router@localhost/registry").connect().await {
    ///     Ok(registry) => println!("registry {} open", registry.name()),
    ///     Err(e) => eprintln!("cannot open the registry: {e}"),
    /// }
    /// # }
    /// ```
    pub async fn connect(self) -> Result<PostgresRegistry, ConnectError> {
        let (pool, listen_pg, tls) = match &self.pool {
            Some(given) => (given.clone(), self.listen_session()?, self.tls()?),
            None => {
                let (pg, listen_pg, tls) = self.session()?;
                (self.pool(&pg, &tls)?, listen_pg, tls)
            }
        };
        let id = self.open_registry(&pool).await?;
        let events = Arc::new(EventSender::new());
        let listener = self.feed(listen_pg, id, &events, &pool, &tls).await?;
        let params = Params::new(&self.config, self.batch);
        let owns_pool = self.pool.is_none();
        let registry = PostgresRegistry {
            inner: Arc::new(Inner {
                snapshot: SnapshotCache::new(delta::empty_snapshot(
                    self.config.max_workers(),
                    self.config.payload_budget(),
                )),
                pool,
                settings: self,
                id,
                replica: replica_id(),
                params,
                counters: Counters::default(),
                events,
                listener,
                loss: LossWatch::new(String::new(), 0),
                tls,
                owns_pool,
            }),
        };
        registry.settle_in().await.map_err(ConnectError::Backend)?;
        Ok(registry)
    }

    /// The session's configuration (the connect timeout, the application name, and outside a
    /// transaction pooler the per-call lock and statement timeouts), the listener's (none
    /// behind a transaction pooler without `listen_url`: it polls), and the TLS connector.
    fn session(
        &self,
    ) -> Result<(tokio_postgres::Config, Option<tokio_postgres::Config>, Tls), ConnectError> {
        let (mut pg, tls) = parse(&self.url, self.tls_roots.as_deref())?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(self.connect_timeout);
        }
        if pg.get_application_name().is_none() {
            pg.application_name("worker-registry");
        }
        let listen_pg = match &self.listen_url {
            Some(url) => Some(parse(url, self.tls_roots.as_deref())?.0),
            // LISTEN holds a session, which a pooler in transaction mode does not lend: the
            // handle polls the event log instead (`poll.rs`).
            None if self.transaction_pooler => None,
            None => Some(pg.clone()),
        };
        if !self.transaction_pooler {
            // Every call's statements wait at most this long for a lock and run at most this
            // long (the migration transaction sets its own, longer, limits). A pooler in
            // transaction mode carries no session settings: the role's apply there.
            let limits = format!(
                "-c lock_timeout={}ms -c statement_timeout={}ms",
                rows::ms(self.lock_timeout),
                rows::ms(self.statement_timeout)
            );
            let options = match pg.get_options() {
                Some(o) if !o.is_empty() => format!("{o} {limits}"),
                _ => limits,
            };
            pg.options(&options);
        }
        Ok((pg, listen_pg, tls))
    }

    /// With the application's pool: the listener's session (none without a `listen_url`: the
    /// handle polls), configured as [`session`](Self::session) configures one.
    fn listen_session(&self) -> Result<Option<tokio_postgres::Config>, ConnectError> {
        let Some(url) = &self.listen_url else {
            return Ok(None);
        };
        let (mut pg, _) = parse(url, self.tls_roots.as_deref())?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(self.connect_timeout);
        }
        if pg.get_application_name().is_none() {
            pg.application_name("worker-registry");
        }
        Ok(Some(pg))
    }

    /// With the application's pool: the connector of the listener and of cancel requests.
    fn tls(&self) -> Result<Tls, ConnectError> {
        #[cfg(feature = "postgres-tls")]
        {
            super::tls::MakeRustls::new(self.tls_roots.as_deref()).map_err(|reason| {
                ConnectError::Unsupported {
                    backend: BACKEND,
                    reason,
                }
            })
        }
        #[cfg(not(feature = "postgres-tls"))]
        Ok(tokio_postgres::NoTls)
    }

    /// The connection pool, with this builder's size and timeouts.
    fn pool(&self, pg: &tokio_postgres::Config, tls: &Tls) -> Result<Pool, ConnectError> {
        let manager = Manager::from_config(
            pg.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(self.call_timeout))
            .create_timeout(Some(self.connect_timeout))
            .recycle_timeout(Some(self.connect_timeout))
            .pre_recycle(conn::verify_idle())
            .build()
            .map_err(|e| ConnectError::InvalidUrl {
                backend: BACKEND,
                reason: e.to_string(),
            })
    }

    /// Applies the migrations (unless turned off) and opens the registry's rows: its id. Behind
    /// a transaction pooler or on the application's pool, warns if calls run without lock or
    /// statement timeouts.
    async fn open_registry(&self, pool: &Pool) -> Result<i64, ConnectError> {
        let migrate = self.migrate;
        let name = self.name.clone();
        let unnamed = self.transaction_pooler;
        let (id, limits) = retrying(self.call_timeout, || async {
            let mut client = pool.get().await?;
            if migrate {
                migrate::apply(&mut client).await?;
            }
            let row = if unnamed {
                let rows = client
                    .query_typed("SELECT wr_open($1)", &[(&name, Type::TEXT)])
                    .await?;
                rows.into_iter()
                    .next()
                    .ok_or_else(|| super::error::decode("wr_open answered no row"))?
            } else {
                client.query_one("SELECT wr_open($1)", &[&name]).await?
            };
            let limits = client
                .simple_query("SHOW lock_timeout; SHOW statement_timeout")
                .await?;
            Ok((rows::col::<i64>(&row, "wr_open")?, limits))
        })
        .await
        .map_err(refused)?;
        if self.transaction_pooler || self.pool.is_some() {
            warn_unlimited(&limits);
        }
        Ok(id)
    }

    /// The handle's event feed: a listener on its own connection, or (behind a transaction
    /// pooler without `listen_url`) the event log polled through the pool; none with
    /// `listen(false)`.
    async fn feed(
        &self,
        listen_pg: Option<tokio_postgres::Config>,
        id: i64,
        events: &Arc<EventSender>,
        pool: &Pool,
        tls: &Tls,
    ) -> Result<Option<Feed>, ConnectError> {
        Ok(match (self.listen, listen_pg) {
            (false, _) => None,
            (true, Some(listen_pg)) => Some(Feed::Listen(
                listen::Listener::start(
                    listen_pg,
                    id,
                    events.clone(),
                    self.call_timeout,
                    tls.clone(),
                )
                .await
                .map_err(ConnectError::Backend)?,
            )),
            (true, None) => {
                tracing::warn!(
                    registry = %self.name,
                    poll_interval_ms = rows::ms(self.poll_interval),
                    "no session to LISTEN on (behind a transaction pooler, or on the \
                     application's pool) and no listen_url: lifecycle events are polled from the \
                     event log instead (other replicas' events arrive up to poll_interval late, \
                     and every event is also a row written); set listen_url to the database's \
                     own address to listen"
                );
                Some(Feed::Poll(
                    Poller::start(
                        pool.clone(),
                        tls.clone(),
                        self.transaction_pooler,
                        id,
                        events.clone(),
                        self.poll_interval,
                        self.call_timeout,
                    )
                    .await
                    .map_err(|f| ConnectError::Backend(f.into_registry()))?,
                ))
            }
        })
    }
}

impl PostgresRegistry {
    /// The new handle's first calls: the configuration agreement, the waiting room's settings,
    /// the identity the data-loss watch starts from, and the snapshot.
    async fn settle_in(&self) -> Result<(), RegistryError> {
        self.agree().await?;
        self.open_room().await?;
        let seen = self.identity().await?;
        self.inner.loss.begin(&seen.incarnation, seen.last_id);
        self.refresh_snapshot().await
    }
}

/// Parses a URL (or key-value string) and makes the TLS connector its `sslmode` needs.
pub(super) fn parse(
    url: &str,
    roots: Option<&[u8]>,
) -> Result<(tokio_postgres::Config, Tls), ConnectError> {
    let invalid = |reason: String| ConnectError::InvalidUrl {
        backend: BACKEND,
        reason,
    };
    #[cfg(feature = "postgres-tls")]
    let url = super::tls::normalize_sslmode(url);
    #[cfg(not(feature = "postgres-tls"))]
    if url.contains("sslmode=verify-") {
        return Err(ConnectError::Unsupported {
            backend: BACKEND,
            reason: "the URL asks for TLS (sslmode=verify-*): build worker-registry with the \
                     `postgres-tls` feature"
                .into(),
        });
    }
    let pg: tokio_postgres::Config = url
        .parse()
        .map_err(|e: tokio_postgres::Error| invalid(e.to_string()))?;
    #[cfg(feature = "postgres-tls")]
    {
        let tls =
            super::tls::MakeRustls::new(roots).map_err(|reason| ConnectError::Unsupported {
                backend: BACKEND,
                reason,
            })?;
        Ok((pg, tls))
    }
    #[cfg(not(feature = "postgres-tls"))]
    {
        let _ = roots;
        if pg.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(ConnectError::Unsupported {
                backend: BACKEND,
                reason: "the URL requires TLS (sslmode=require): build worker-registry with the \
                         `postgres-tls` feature"
                    .into(),
            });
        }
        Ok((pg, tokio_postgres::NoTls))
    }
}

/// A connect failure: a pooler that refused the session settings is told apart (the one
/// configuration error a newcomer meets first behind PgBouncer), every other is the backend's.
fn refused(e: RegistryError) -> ConnectError {
    // The server's message is at the end of the chain (RegistryError, driver error, DbError).
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text = format!("{text}: {c}");
        cause = c.source();
    }
    if text.contains("unsupported startup parameter") {
        return ConnectError::Unsupported {
            backend: BACKEND,
            reason: format!(
                "{text}: the URL goes through a connection pooler, which refuses the session \
                 settings (lock_timeout, statement_timeout) the handle sends; build it with \
                 transaction_pooler(true)"
            ),
        };
    }
    ConnectError::Backend(e)
}

/// Behind a pooler, or on the application's pool, no session setting is sent: says so when the
/// connections leave a call unbounded.
fn warn_unlimited(shown: &[tokio_postgres::SimpleQueryMessage]) {
    for message in shown {
        if let tokio_postgres::SimpleQueryMessage::Row(row) = message {
            if row.get(0) == Some("0") {
                tracing::warn!(
                    setting = row.columns().first().map(|c| c.name()).unwrap_or("?"),
                    "worker-registry behind a transaction pooler or on the application's \
                     pool: this setting is off for its connections, so a call may wait on a \
                     lock or run without bound; set it with ALTER ROLE ... SET or in the \
                     connections' options (the handle does not set it there)"
                );
            }
        }
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
