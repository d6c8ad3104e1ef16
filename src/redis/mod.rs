//! [`RedisRegistry`] (feature `redis`): the registry shared by several router replicas through
//! one Redis server, behind the same contract as the in-memory backend and passing the same
//! conformance suite. The contract is documented on [`WorkerRegistry`](crate::WorkerRegistry);
//! how it is kept in Redis (the Function library, the keys, the replies, the sweep's steps,
//! events, errors, operating it, measured cost) is in [`docs::redis`](crate::docs::redis).
//!
//! In short: every decision is one function of one Redis Function library (`FCALL`), atomic on
//! the server and on the server's clock; every key of a registry shares the hash tag `{name}`;
//! maintenance runs in bounded steps under a lease; the snapshot is cached per handle.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the handle and what its methods share |
//! | `builder.rs` | [`RedisRegistryBuilder`]: settings with their `DEFAULT_*` values, `connect` (URL, Sentinel, Cluster), the configuration agreement |
//! | `contract.rs` | the contract traits: each method one function call, its reply decoded |
//! | `call.rs` | a function call: the arguments every function takes, the reply, the events it published |
//! | `placement.rs` | what an admission or an assignment answers (placed, duplicate, refused), and the payload an admission carries |
//! | `workers.rs` | what worker calls share: refusals, a status, `drain` over a batch of ids |
//! | `scripts.rs`, `scripts/*.lua` | the Function library: shared files (`lib_base`, `lib_claims`, `lib_workers`, `lib_waiting`) and one file per decision, assembled and loaded by checksum |
//! | `codec.rs` | claim members, worker lines, the snapshot, events and replies, encoded and decoded |
//! | `keys.rs` | the key layout of one registry (`{name}:` prefix) |
//! | `sweep.rs`, `lease.rs` | the sweep in bounded steps; the maintenance lease |
//! | `publish.rs` | the snapshot, published and fetched in bounded steps |
//! | `stream.rs` | the released-event stream: each delivery to exactly one replica, re-offered if unacknowledged |
//! | `waiting.rs`, `payloads.rs` | the waiting room's and the payloads' Rust side |
//! | `events.rs` | lifecycle events across replicas (`PUBLISH`, one listener per handle) |
//! | `link.rs` | the connection to the primary, replaced on failover |
//! | `loss.rs` | data loss found (`{name}:epoch`) and reported |
//! | `counters.rs` | this handle's counters, read into `Stats` |
//! | `error.rs` | Redis failures as registry errors |
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
//!     Ok(Admission::Waiting(_)) => { /* parked in the waiting room: promoted later */ }
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
mod call;
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
mod placement;
mod publish;
mod scripts;
mod stream;
mod sweep;
mod waiting;
mod workers;

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
/// I/O and take no lock but a short mutex around two gauges. How to connect one: the [module
/// documentation](self).
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
    /// ```
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let _b = RedisRegistry::builder("rediss://router:secret@redis.internal:6380/0").name("webhooks");
    /// ```
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
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let registry = RedisRegistry::builder("redis://127.0.0.1/").name("webhooks").connect().await?;
    /// assert_eq!(registry.name(), "webhooks");
    /// # Ok(())
    /// # }
    /// ```
    pub fn name(&self) -> &str {
        &self.inner.settings.name
    }

    /// This handle's replica id (the consumer name in the released stream, the lease owner).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use worker_registry::redis::RedisRegistry;
    ///
    /// let registry = RedisRegistry::builder("redis://127.0.0.1/").connect().await?;
    /// // Logged beside the sweeps it runs: the lease and the released stream name it.
    /// println!("this replica: {}", registry.replica_id());
    /// # Ok(())
    /// # }
    /// ```
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
