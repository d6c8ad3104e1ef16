//! The builder of a [`RedisRegistry`](super::RedisRegistry): its settings with their `DEFAULT_*`
//! values, and `connect` (the URL or the Sentinels, the server's version, the replica id, the
//! registry's identity and stored configuration, the first snapshot, the event listener).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ::redis::aio::ConnectionManagerConfig;
use ::redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use ::redis::IntoConnectionInfo;

use super::counters::Counters;
use super::keys::Keys;
use super::link::{Conn, Link, Source};
use super::{error, events, keys, loss, Inner, Limits, RedisRegistry, MIN_SERVER_VERSION};
#[allow(unused_imports)] // named by the docs' links
use super::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_RECONNECT_RETRIES, DEFAULT_REGISTRY_NAME,
    DEFAULT_RESPONSE_TIMEOUT,
};
use crate::api::connect::ConnectError;
use crate::api::error::RegistryError;
use crate::api::snapshot::StatusSnapshot;
use crate::config::RegistryConfig;
use crate::remote::agreement;
use crate::remote::loss::LossWatch;
use crate::remote::snapshot::SnapshotCache;
/// Builds a [`RedisRegistry`]: the server URL, the registry name, its configuration and the
/// connection's timeouts, each with a `DEFAULT_*` value.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use worker_registry::redis::RedisRegistry;
///
/// let registry = RedisRegistry::builder("redis://127.0.0.1:6379/0")
///     .name("pool-a")
///     .response_timeout(Duration::from_millis(500))
///     .connect()
///     .await?;
/// assert_eq!(registry.name(), "pool-a");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `connect()` is awaited"]
pub struct RedisRegistryBuilder {
    pub(super) url: String,
    pub(super) name: String,
    pub(super) config: RegistryConfig,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) reconnect_retries: usize,
    pub(super) wait_on_create: Option<(usize, Duration)>,
    /// Whether this handle's calls read the test time offset (a `testkit` build, unless
    /// [`without_test_offset`](Self::without_test_offset)).
    pub(super) test_offset: bool,
    /// The Sentinels' URLs and the monitored primary's name.
    pub(super) sentinel: Option<(Vec<String>, String)>,
    /// More seed nodes of a Redis Cluster (the URL is the first).
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(super) cluster: Option<Vec<String>>,
    /// PEM roots that replace the system's for `rediss://` (feature `redis-tls`).
    #[cfg_attr(not(feature = "redis-tls"), allow(dead_code))]
    pub(super) tls_roots: Option<Vec<u8>>,
    /// The application's connection, for the registry's commands (see
    /// [`connection_manager`](Self::connection_manager)).
    pub(super) given: Option<Conn>,
}

impl RedisRegistryBuilder {
    /// The registry's name: registries with different names on one server are independent
    /// (default [`DEFAULT_REGISTRY_NAME`]). Letters, digits and `- _ . :`, at most
    /// [`MAX_REGISTRY_NAME_LEN`](crate::limits::MAX_REGISTRY_NAME_LEN) bytes; checked by [`connect`](Self::connect).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// // Two pools of workers on one server: their keys live under `{pool-a}:` and `{pool-b}:`.
    /// let _a = RedisRegistry::builder("redis://127.0.0.1/").name("pool-a");
    /// let _b = RedisRegistry::builder("redis://127.0.0.1/").name("pool-b");
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The registry's configuration (default `RegistryConfig::default()`). Every replica of a
    /// registry must use the same one: the first handle to open the registry stores its deciding
    /// settings (`{name}:config`), and [`connect`](Self::connect) refuses a handle configured
    /// otherwise with [`ConnectError::Backend`] holding [`RegistryError::ConfigDisagrees`], naming the setting and both values.
    /// To change them, stop every replica, delete `{name}:config`, and start them again.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::redis::RedisRegistry;
    /// use worker_registry::RegistryConfig;
    ///
    /// let config = RegistryConfig::builder().max_workers(8).build().unwrap();
    /// let _b = RedisRegistry::builder("redis://127.0.0.1/").config(config);
    /// ```
    pub fn config(mut self, config: RegistryConfig) -> Self {
        self.config = config;
        self
    }

    /// How long one connection attempt may take (default [`DEFAULT_CONNECT_TIMEOUT`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let _b = RedisRegistry::builder("redis://127.0.0.1/").connect_timeout(Duration::from_secs(2));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a call may wait for its answer (default [`DEFAULT_RESPONSE_TIMEOUT`]). Each
    /// call is one bounded script (a sweep is several), so the size of the registry does not
    /// call for a longer one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let _b = RedisRegistry::builder("redis://127.0.0.1/").response_timeout(Duration::from_millis(500));
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Reconnection retries before a waiting call fails (default
    /// [`DEFAULT_RECONNECT_RETRIES`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let builder = RedisRegistry::builder("redis://127.0.0.1/").reconnect_retries(0);
    /// # let _ = builder;
    /// ```
    pub fn reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// Makes every call that created a worker (an `admit` or `assign` answering `new: true`, a
    /// `register`) wait, before it answers, until `replicas` replicas of the server have
    /// acknowledged its writes (`WAIT replicas timeout`), so that a failover to one of them
    /// keeps the worker the router is about to start a container for. Default: off. A shortfall
    /// (fewer replicas within `timeout`) is logged and the answer stands: the creation happened
    /// on the primary. `WAIT` holds this handle's connection meanwhile (every call of the handle
    /// waits behind it), so keep `timeout` short.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let builder = RedisRegistry::builder("redis://127.0.0.1/")
    ///     .wait_on_create(1, Duration::from_millis(50));
    /// # let _ = builder;
    /// ```
    pub fn wait_on_create(mut self, replicas: usize, timeout: Duration) -> Self {
        self.wait_on_create = Some((replicas, timeout));
        self
    }

    /// Makes this handle's calls read the server's clock alone, as every call of a build without
    /// the `testkit` feature does: no call pays a `GET` of the registry's test time offset. For
    /// benchmarks, which are built with `testkit` (the crate's dev-dependency on itself) and
    /// should measure what production runs. Feature `testkit`.
    ///
    /// The handle is correct on its own, but it does not see an offset set by
    /// [`advance_time_for_tests`](super::RedisRegistry::advance_time_for_tests), its own or
    /// another handle's: once one is set, it and the handles that read the offset disagree about
    /// the registry's time by that much. Use it on registries whose time is never advanced.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use worker_registry::redis::RedisRegistry;
    /// use worker_registry::WorkerRegistry;
    ///
    /// let registry = RedisRegistry::builder("redis://127.0.0.1/")
    ///     .name("bench")
    ///     .without_test_offset()
    ///     .connect()
    ///     .await?;
    /// let worker = registry.register().await?;
    /// registry.heartbeat(worker).await?; // TIME, HMGET, HSET, ZADD: no GET of an offset
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "testkit")]
    pub fn without_test_offset(mut self) -> Self {
        self.test_offset = false;
        self
    }

    /// Finds the primary through Redis Sentinel: `sentinels` are the Sentinels' URLs
    /// (`redis://host:26379`), `service` the name they monitor the primary under. The builder's
    /// URL then gives only the settings of the connection to the primary (credentials, database,
    /// `rediss://` for TLS): its host and port are those the Sentinels name. After a failover the
    /// handle asks the Sentinels again and goes on with the new primary; no restart is needed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), worker_registry::ConnectError> {
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let registry = RedisRegistry::builder("redis://:secret@primary/0")
    ///     .sentinel(["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"], "registry")
    ///     .connect()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn sentinel<S: Into<String>>(
        mut self,
        sentinels: impl IntoIterator<Item = S>,
        service: impl Into<String>,
    ) -> Self {
        self.sentinel = Some((
            sentinels.into_iter().map(Into::into).collect(),
            service.into(),
        ));
        self
    }

    /// Connects to a Redis Cluster (feature `redis-cluster`): the builder's URL and `nodes` are
    /// seed nodes (`redis://host:port`, any one reachable is enough to find the others), the
    /// connection's settings (credentials, `rediss://` for TLS) those of the builder's URL. The
    /// registry's keys share the hash tag `{name}`, so a registry lives in one slot, on one
    /// primary at a time (spread load over primaries with several registries); the cluster
    /// client follows `MOVED`/`ASK` and a failover of that primary by itself. Only database 0
    /// exists in a cluster: a URL naming another is refused.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), worker_registry::ConnectError> {
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let registry = RedisRegistry::builder("redis://:secret@10.0.0.1:7000")
    ///     .cluster(["redis://:secret@10.0.0.2:7000", "redis://:secret@10.0.0.3:7000"])
    ///     .name("pool-a")
    ///     .connect()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis-cluster")]
    pub fn cluster<S: Into<String>>(mut self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.cluster = Some(nodes.into_iter().map(Into::into).collect());
        self
    }

    /// Sends the registry's commands over `manager`, a redis-rs connection the application
    /// already has, instead of opening one: one multiplexed connection to the server for both,
    /// with the timeouts and retries the application gave it (this builder's
    /// [`response_timeout`](Self::response_timeout) and
    /// [`reconnect_retries`](Self::reconnect_retries) apply only to the connections the registry
    /// opens itself). `manager` must be connected to the server the URL (or the
    /// [`sentinel`](Self::sentinel)s) name, on the same database: the URL still opens the event
    /// listener's pub/sub connection (a subscribed connection answers no other command) and, if
    /// `manager` turns out to talk to a demoted primary (`READONLY`) or stops answering, the
    /// connection that replaces it (the registry then stops using `manager`).
    /// [`connect_replica`](crate::redis::RedisRegistry::connect_replica) opens its own from the URL.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis::aio::ConnectionManager;
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let url = "redis://127.0.0.1:6379/";
    /// let manager = ConnectionManager::new(redis::Client::open(url)?).await?; // the application's
    /// let registry = RedisRegistry::builder(url)
    ///     .connection_manager(manager.clone())
    ///     .connect()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn connection_manager(mut self, manager: ::redis::aio::ConnectionManager) -> Self {
        self.given = Some(Conn::Single(manager));
        self
    }

    /// As [`connection_manager`](Self::connection_manager), for a Redis Cluster (feature
    /// `redis-cluster`): the registry's commands go over the application's cluster connection
    /// (made from a `ClusterClient` of the same nodes); the builder's URL and
    /// [`cluster`](Self::cluster) nodes (only the URL if `cluster` is not called) are the seeds
    /// of the pub/sub connection and of a replacement.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis::cluster::ClusterClient;
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let nodes = ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"];
    /// let conn = ClusterClient::new(nodes)?.get_async_connection().await?; // the application's
    /// let registry = RedisRegistry::builder(nodes[0])
    ///     .cluster([nodes[1]])
    ///     .cluster_connection(conn.clone())
    ///     .connect()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis-cluster")]
    pub fn cluster_connection(mut self, conn: ::redis::cluster_async::ClusterConnection) -> Self {
        self.given = Some(Conn::Cluster(conn));
        if self.cluster.is_none() {
            self.cluster = Some(Vec::new());
        }
        self
    }

    /// The certificate authorities (PEM) a `rediss://` server's certificate must chain to,
    /// instead of the system's store: a private CA. Feature `redis-tls`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let ca = std::fs::read("/etc/registry/ca.pem")?;
    /// let registry = RedisRegistry::builder("rediss://redis.internal:6380/")
    ///     .tls_root_certificate(ca)
    ///     .connect()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis-tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_roots = Some(pem.into());
        self
    }

    /// Refuses the settings that cannot work together, or without a feature, naming why.
    fn refuse_unsupported(&self) -> Result<(), ConnectError> {
        let refuse = |reason: &str| {
            Err(ConnectError::Unsupported {
                backend: error::BACKEND,
                reason: reason.into(),
            })
        };
        if self.url.starts_with("rediss://") && !cfg!(feature = "redis-tls") {
            return refuse(
                "a rediss:// URL needs TLS: build worker-registry with the `redis-tls` feature",
            );
        }
        if self.sentinel.is_some() && self.tls_roots.is_some() {
            return refuse(
                "a private certificate authority with Sentinel is not supported: the system's \
                 store verifies the primary the Sentinels name",
            );
        }
        if self.cluster.is_some() && matches!(self.given, Some(Conn::Single(_))) {
            return refuse(
                "a ConnectionManager talks to one server, not a Redis Cluster: give the \
                 cluster's connection with cluster_connection",
            );
        }
        if self.cluster.is_some() && self.sentinel.is_some() {
            return refuse(
                "Sentinel and Cluster exclude each other: a cluster fails over by itself",
            );
        }
        Ok(())
    }

    /// The source of the primary: the URL's client, or the Sentinels with the URL's settings.
    fn source(&self) -> Result<Source, ConnectError> {
        let invalid = |e: ::redis::RedisError| ConnectError::InvalidUrl {
            backend: error::BACKEND,
            reason: e.to_string(),
        };
        self.refuse_unsupported()?;
        #[cfg(feature = "redis-tls")]
        {
            // The ring provider, unless the process chose one already (then that one is used).
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        #[cfg(feature = "redis-cluster")]
        if let Some(nodes) = &self.cluster {
            return self.cluster_source(nodes).map_err(|e| match e {
                Ok(e) => invalid(e),
                Err(e) => e,
            });
        }
        let Some((sentinels, service)) = &self.sentinel else {
            #[cfg(feature = "redis-tls")]
            if let Some(roots) = &self.tls_roots {
                return Ok(Source::Direct(
                    ::redis::Client::build_with_tls(
                        self.url.as_str(),
                        ::redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(roots.clone()),
                        },
                    )
                    .map_err(invalid)?,
                ));
            }
            return Ok(Source::Direct(
                ::redis::Client::open(self.url.as_str()).map_err(invalid)?,
            ));
        };
        let info = self.url.as_str().into_connection_info().map_err(invalid)?;
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(info.redis_settings().clone());
        if let ::redis::ConnectionAddr::TcpTls { insecure, .. } = info.addr() {
            node = node.set_tls_mode(if *insecure {
                ::redis::TlsMode::Insecure
            } else {
                ::redis::TlsMode::Secure
            });
        }
        let client = SentinelClient::build(
            sentinels.iter().map(String::as_str).collect(),
            service.clone(),
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(invalid)?;
        Ok(Source::Sentinel(tokio::sync::Mutex::new(client)))
    }

    /// The cluster client of [`cluster`](Self::cluster) (a URL error, or a refusal).
    #[cfg(feature = "redis-cluster")]
    fn cluster_source(
        &self,
        nodes: &[String],
    ) -> Result<Source, Result<::redis::RedisError, ConnectError>> {
        use ::redis::cluster::ClusterClientBuilder;
        use ::redis::cluster_routing::{Route, SlotAddr};
        let seeds: Vec<&str> = std::iter::once(self.url.as_str())
            .chain(nodes.iter().map(String::as_str))
            .collect();
        let info = self.url.as_str().into_connection_info().map_err(Ok)?;
        if info.redis_settings().db() != 0 {
            return Err(Err(ConnectError::Unsupported {
                backend: error::BACKEND,
                reason: format!(
                    "a Redis Cluster has only database 0; the URL names {}",
                    info.redis_settings().db()
                ),
            }));
        }
        let builder = ClusterClientBuilder::new(seeds.clone())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            .retries(u32::try_from(self.reconnect_retries).unwrap_or(u32::MAX))
            .min_retry_wait(50)
            .max_retry_wait(1000);
        let mut clients = Vec::with_capacity(seeds.len());
        for seed in &seeds {
            #[cfg(feature = "redis-tls")]
            if let Some(roots) = &self.tls_roots {
                let certs = || ::redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(roots.clone()),
                };
                clients.push(::redis::Client::build_with_tls(*seed, certs()).map_err(Ok)?);
                continue;
            }
            clients.push(::redis::Client::open(*seed).map_err(Ok)?);
        }
        #[cfg(feature = "redis-tls")]
        let builder = match &self.tls_roots {
            Some(roots) => builder.certs(::redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(roots.clone()),
            }),
            None => builder,
        };
        let client = builder.build().map_err(Ok)?;
        Ok(Source::Cluster(super::link::Cluster {
            client,
            home: Route::with_key(
                Keys::new(&self.name, false).offset.as_bytes(),
                SlotAddr::Master,
            ),
            seeds: clients,
        }))
    }

    /// Connects: checks the name and the URL, opens the connection (managed: it reconnects by
    /// itself, and opens a new one after a failover, see `link.rs`), checks the server's version, takes a replica id, fetches the published snapshot
    /// and subscribes to lifecycle events on a second connection.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// match RedisRegistry::builder("redis://127.0.0.1:6379/0").connect().await {
    ///     Ok(registry) => println!("replica {} of {}", registry.replica_id(), registry.name()),
    ///     Err(e) => eprintln!("cannot open the registry: {e}"),
    /// }
    /// # }
    /// ```
    pub async fn connect(self) -> Result<RedisRegistry, ConnectError> {
        keys::validate_name(&self.name).map_err(|error| ConnectError::InvalidName {
            backend: error::BACKEND,
            error,
        })?;
        let mut conn = self.open().await?;
        let keys = Keys::new(&self.name, self.test_offset);
        agree(&mut conn, &keys, &self.config).await?;
        let replica = replica_id(&mut conn, &keys).await?;
        // The registry's incarnation as this handle first sees it (set now if there is none).
        let seen = loss::identity(
            &mut conn,
            &keys,
            &replica,
            &replica,
            "",
            Limits::of(&self.config).forget_consumer_ms,
        )
        .await
        .map_err(ConnectError::Backend)?;
        let events = Arc::new(events::Events::new(self.connect_timeout));
        let listener = self.listen(&conn, &keys, &replica, &events).await?;
        let config = self.config.clone();
        let registry = RedisRegistry {
            inner: Arc::new(Inner {
                limits: Limits::of(&config),
                snapshot: SnapshotCache::new(StatusSnapshot::empty(
                    config.max_workers(),
                    SystemTime::now(),
                )),
                refresh: tokio::sync::Mutex::new(()),
                wake: crate::sync::Wake::new(),
                config,
                keys,
                conn,
                replica,
                counters: Counters::new(),
                loss: LossWatch::new(seen.incarnation, seen.last_id),
                events,
                _listener: listener,
                settings: self,
            }),
        };
        registry
            .refresh_snapshot()
            .await
            .map_err(ConnectError::Backend)?;
        Ok(registry)
    }

    /// Opens the connection to the primary, refuses a server older than Redis 7 and loads this
    /// build's Function library unless the server has it (see `scripts.rs`).
    async fn open(&self) -> Result<Link, ConnectError> {
        let source = self.source()?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(self.reconnect_retries)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        let mut conn = Link::open(source, manager_config, self.given.clone())
            .await
            .map_err(unavailable)?;
        check_version(&mut conn).await?;
        super::scripts::ensure_loaded(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(conn)
    }

    /// Starts this handle's listener of lifecycle events.
    async fn listen(
        &self,
        conn: &Link,
        keys: &Keys,
        replica: &str,
        events: &Arc<events::Events>,
    ) -> Result<events::Listener, ConnectError> {
        events::Listener::start(
            events::Channel {
                conn: conn.clone(),
                channel: keys.events.clone(),
                offset_key: keys.clock.clone(),
                prefix: keys.prefix.clone(),
                replica: replica.to_owned(),
                connect_timeout: self.connect_timeout,
            },
            events.clone(),
        )
        .await
        .map_err(ConnectError::Backend)
    }
}

/// A backend error while connecting.
fn unavailable(e: ::redis::RedisError) -> ConnectError {
    ConnectError::Backend(error::backend(e))
}

/// This handle's replica id, `r<n>-<server µs>`: the counter makes ids unique among live
/// replicas; the server's clock keeps them unique across a data loss that resets the counter.
async fn replica_id(conn: &mut Link, keys: &Keys) -> Result<String, ConnectError> {
    let (n, (secs, micros)): (u64, (u64, u64)) = ::redis::pipe()
        .cmd("INCR")
        .arg(&keys.next_replica_id)
        .cmd("TIME")
        .query_async(conn)
        .await
        .map_err(unavailable)?;
    Ok(format!("r{n}-{}", secs * 1_000_000 + micros))
}

/// Stores `config`'s deciding settings with the registry unless some are stored already
/// (`{n}:config`, `SET NX`), and refuses a configuration that differs from them (see
/// `crate::remote::agreement`).
async fn agree(conn: &mut Link, keys: &Keys, config: &RegistryConfig) -> Result<(), ConnectError> {
    let ours = agreement::settings(config);
    let key = format!("{}config", keys.prefix);
    let (stored,): (String,) = ::redis::pipe()
        .cmd("SET")
        .arg(&key)
        .arg(agreement::encode(&ours))
        .arg("NX")
        .ignore()
        .cmd("GET")
        .arg(&key)
        .query_async(conn)
        .await
        .map_err(|e| ConnectError::Backend(error::backend(e)))?;
    match agreement::disagreement(&stored, &ours) {
        None => Ok(()),
        Some((setting, stored, configured)) => {
            Err(ConnectError::Backend(RegistryError::ConfigDisagrees {
                setting,
                stored,
                configured,
            }))
        }
    }
}

/// Refuses servers older than [`MIN_SERVER_VERSION`].
async fn check_version(conn: &mut Link) -> Result<(), ConnectError> {
    let info: String = ::redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .map_err(|e| ConnectError::Backend(error::backend(e)))?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("")
        .trim()
        .to_owned();
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    if major < 7 {
        return Err(ConnectError::ServerTooOld {
            backend: error::BACKEND,
            version,
            required: MIN_SERVER_VERSION,
        });
    }
    Ok(())
}
