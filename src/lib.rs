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
//! use worker_registry::{Admission, DeliveryId, InMemoryRegistry, Target, WorkerRegistry, WorkerRegistryExt};
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
//! | `metrics` | [`metrics::Metrics`]: Prometheus metrics of any backend (prometheus-client, no HTTP framework) |
//! | `http` | [`http::admin_router`]: the axum admin API, its OpenAPI document, `metrics` on `/metrics` |
//! | `redis` | [`redis::RedisRegistry`]: the registry shared by router replicas through Redis or Valkey |
//! | `redis-tls` | `rediss://` URLs for the Redis backend (rustls) |
//! | `redis-cluster` | Redis Cluster for the Redis backend ([`redis::RedisRegistryBuilder::cluster`]) |
//! | `postgres` | [`postgres::PostgresRegistry`]: the registry in PostgreSQL, shared by router replicas |
//! | `postgres-tls` | `sslmode=require\|verify-full` for the PostgreSQL backend (rustls) |
//! | `testkit` | [`testkit`]: the conformance suite every backend runs, and the reference model |
//!
//! On docs.rs every feature is on, and each item a feature gates says which.
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
// docs.rs (nightly rustdoc, `--cfg docsrs`): each feature-gated item gets its "Available on crate
// feature ..." badge from its `#[cfg]` (`doc_cfg`, which took in `doc_auto_cfg`). A stable build
// never sees this attribute.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod api;
pub mod clock;
pub mod config;
pub mod docs;
pub mod dynamic;
pub mod events;
#[cfg(feature = "http")]
pub mod http;
pub mod limits;
pub mod memory;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod remote;
mod state;
pub mod stats;
#[cfg(feature = "tokio")]
mod sweeper;
mod sync;
#[cfg(feature = "testkit")]
pub mod testkit;

// What a user of the registry names: the traits, the backends' entry points, the ids, what the
// calls answer, the errors and the configuration. Constants and what a backend implementor needs
// live in the modules above (`config::DEFAULT_*`, `limits::MAX_*`, `events::EventSender`,
// `dynamic::DynBackend`, ...).
pub use api::connect::{ConnectError, RegistryNameError};
#[cfg(feature = "tokio")]
pub use api::contract::Subscribe;
pub use api::contract::{Maintenance, WorkerRegistry};
pub use api::dynamic::DynRegistry;
pub use api::error::{BackendSource, RegistryError};
#[cfg(feature = "tokio")]
pub use api::events::Subscription;
pub use api::events::{Event, RecvError};
pub use api::ext::WorkerRegistryExt;
pub use api::ids::{
    DeliveryId, DeliveryIdError, FencingToken, Target, TargetError, WorkerId, WorkerIdError,
};
pub use api::outcome::{
    Admission, AlreadyClaimed, AssignOutcome, Assignment, ClaimOutcome, ClaimState, DrainAll,
    HeartbeatAck, Rejection, Waiting,
};
pub use api::payload::{Payload, PayloadBuilder, PayloadError};
pub use api::report::{Receipt, ReleaseReason, ReleasedEvent, SweepReport};
pub use api::snapshot::{
    Capacity, ClaimCounts, PayloadUsage, StatusCounts, StatusSnapshot, WorkerInfo,
};
pub use api::stats::{Audit, Stats, SweepDurations};
pub use api::status::{Activity, DeadReason, PoolStatus, Status, WorkerKind};
pub use api::waiting::{ExpireReason, ExpiredWaiting};
#[cfg(feature = "tokio")]
pub use clock::TokioClock;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{ConfigError, RegistryConfig};
pub use memory::{InMemoryRegistry, WorkerHandle};
#[cfg(feature = "tokio")]
pub use sweeper::{Deferred, Sweeper, SweeperMonitor};

/// The README's code examples, compiled and run as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
