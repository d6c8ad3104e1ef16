//! # worker-registry
//!
//! The bookkeeper between a webhook router and the worker containers it runs. For each delivery a
//! router asks, in well under a microsecond and without a global lock: is this a redelivery of
//! something already handled? Which worker owns this target (repository + PR)? Is there capacity
//! for a new one? Workers heartbeat; a worker that misses N intervals is dead and its work is
//! released for re-dispatch; a worker can be drained; and anyone can read a consistent snapshot of
//! all workers without blocking the hot path.
//!
//! The contract is three traits, documented once for every backend: [`WorkerRegistry`] (per
//! webhook, per worker call), [`Maintenance`] (the sweep, run by a [`Sweeper`]) and [`Subscribe`]
//! (lifecycle [`Event`]s). [`InMemoryRegistry`] implements them for one router process;
//! [`DynRegistry`] picks a backend at run time. With `http`, `http::admin_router` is an axum admin
//! API (workers, drain, Prometheus metrics from `metrics::Metrics`, OpenAPI) over any backend.
//!
//! ```
//! use worker_registry::{Admission, DeliveryId, InMemoryRegistry, Target, WorkerRegistry};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let registry = InMemoryRegistry::default(); // or redis::RedisRegistry, postgres::PostgresRegistry
//! let target = Target::new("octo/repo", 42).unwrap();
//! match registry.admit(&target, &DeliveryId::new("delivery-1").unwrap()).await {
//!     Ok(Admission::Assigned(a)) if a.new => { /* start a container for a.worker */ }
//!     Ok(Admission::Assigned(_)) => { /* hand the event to the running worker */ }
//!     Ok(Admission::Duplicate(_)) => { /* redelivery: skip */ }
//!     Ok(Admission::Waiting(_)) => { /* parked (max_waiting > 0): a sweep hands it over later */ }
//!     Ok(Admission::Rejected(_)) => { /* answer 503; GitHub or the reconciler retries */ }
//!     Err(e) => { /* a shared backend's lost connection: answer 503 if e.is_retryable() */ }
//! }
//! # }
//! ```
//!
//! The in-memory backend also answers the same calls synchronously, in nanoseconds, through
//! [`InMemoryRegistry::direct`] ([`memory::Direct`]): a separate name, so `registry.admit(..)`
//! always means the contract's call.
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `tokio` (default) | the [`Sweeper`] task, [`Subscribe`] and lifecycle events, [`TokioClock`] |
//! | `http` | `http::admin_router` (axum) and `metrics` (prometheus-client) |
//! | `postgres` | [`postgres::PostgresRegistry`]: the registry in PostgreSQL, shared by router replicas |
//! | `testkit` | `testkit`: the conformance suite every backend runs, and the reference model |
//! | `redis` | [`redis::RedisRegistry`]: the registry shared by router replicas through Redis |
//! | `redis-tls` | `rediss://` URLs for the Redis backend (rustls) |
//! | `postgres-tls` | `sslmode=require\|verify-full` for the PostgreSQL backend (rustls) |
//!
//! The shared backends have one surface, module by module (as object_store's `aws` and `gcp`):
//! `redis::RedisRegistry` and `postgres::PostgresRegistry`, each built by
//! `builder(url)...connect()`, which answers a [`ConnectError`] on either; `connect_replica()` opens
//! another handle on the same registry, as another router process would; each module has its
//! `DEFAULT_REGISTRY_NAME` and `DEFAULT_CONNECT_TIMEOUT` (the names are not shared: a Redis
//! registry's name prefixes keys in a keyspace other programs share, a PostgreSQL one is a row in
//! the registry's own tables).
//!
//! The design, each backend's internals, correctness and performance are in [`docs`].
//!
#![warn(missing_docs)]

mod api;
mod clock;
mod config;
pub mod docs;
#[cfg(feature = "http")]
pub mod http;
pub mod memory;
#[cfg(feature = "http")]
pub mod metrics;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod remote;
mod state;
#[cfg(feature = "tokio")]
mod sweeper;
mod sync;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use api::connect::{ConnectError, RegistryNameError, MAX_REGISTRY_NAME_LEN};
#[cfg(feature = "tokio")]
pub use api::contract::Subscribe;
pub use api::contract::{Maintenance, WorkerRegistry};
pub use api::dynamic::{Backend, BoxFuture, DynBackend, DynRegistry};
pub use api::error::{BackendSource, RegistryError};
pub use api::events::{Event, RecvError, EVENT_BUFFER};
#[cfg(feature = "tokio")]
pub use api::events::{EventSender, Subscription};
pub use api::ids::{
    DeliveryId, DeliveryIdError, FencingToken, Target, TargetError, WorkerId, WorkerIdError,
    MAX_DELIVERY_ID_LEN, MAX_OWNER_LEN, MAX_REPO_NAME_LEN,
};
pub use api::outcome::{
    Admission, AlreadyClaimed, AssignOutcome, Assignment, ClaimOutcome, ClaimState, DrainAll,
    HeartbeatAck, Rejection, Waiting,
};
pub use api::payload::{
    Payload, PayloadBuilder, PayloadError, DEFAULT_CONTENT_TYPE, MAX_CONTENT_TYPE_LEN,
    MAX_EVENT_NAME_LEN, MAX_HEADER_NAME_LEN, MAX_HEADER_VALUE_LEN, MAX_PAYLOAD_HEADERS,
    MAX_PAYLOAD_META_LEN,
};
pub use api::report::{Receipt, ReleaseReason, ReleasedEvent, SweepReport};
pub use api::snapshot::{
    Capacity, ClaimCounts, PayloadUsage, StatusCounts, StatusSnapshot, WorkerInfo,
};
pub use api::stats::{Stats, SweepDurations, SWEEP_DURATION_BUCKETS};
pub use api::status::{Activity, DeadReason, PoolStatus, Status, WorkerKind};
pub use api::waiting::{ExpireReason, ExpiredWaiting};
#[cfg(feature = "tokio")]
pub use clock::TokioClock;
pub use clock::{
    Clock, ManualClock, SystemClock, DEFAULT_CLOCK_RESOLUTION, MANUAL_CLOCK_WALL_ORIGIN_SECS,
};
pub use config::{
    ConfigError, RegistryConfig, RegistryConfigBuilder, DEFAULT_BRAKE_FRACTION,
    DEFAULT_BRAKE_MIN_WORKERS, DEFAULT_CLAIM_RETENTION, DEFAULT_DEAD_RETENTION,
    DEFAULT_DRAIN_DEADLINE, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_RETAINED_CLAIMS, DEFAULT_MAX_WAIT, DEFAULT_MAX_WAITING,
    DEFAULT_MAX_WAITING_PER_OWNER, DEFAULT_MAX_WORKERS, DEFAULT_MAX_WORKERS_PER_OWNER,
    DEFAULT_MISSED_HEARTBEATS, DEFAULT_RELEASE_ACK_TIMEOUT, DEFAULT_SHARDS, DEFAULT_STARTUP_GRACE,
    DEFAULT_SUSPECT_GRACE, DEFAULT_SWEEP_INTERVAL, MAX_DURATION,
};
pub use config::{
    DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_PAYLOAD_BUDGET, MAX_PAYLOAD_BUDGET, MAX_PAYLOAD_LIMIT,
};
pub use memory::{InMemoryRegistry, WorkerHandle};
#[cfg(feature = "tokio")]
pub use sweeper::{Deferred, Sweeper, SweeperMonitor};

/// The README's code examples, compiled and run as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
