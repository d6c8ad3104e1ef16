//! # worker-registry
//!
//! The bookkeeper between a webhook router and the worker containers it runs. For each delivery a
//! router asks, in well under a microsecond and without a global lock: is this a redelivery of
//! something already handled? Which worker owns this target (repository + PR)? Is there capacity
//! for a new one? Workers heartbeat; a worker that misses N intervals is dead and its work is
//! released for re-dispatch; a worker can be drained; and anyone can read a consistent snapshot of
//! all workers without blocking the hot path.
//!
//! Start with [`Registry`] (and [`Registry::admit`]); route code against the [`WorkerRegistry`]
//! trait so tests can use a fake; run a [`Sweeper`] next to it. With the `tokio` feature,
//! `Registry::subscribe` streams lifecycle [`Event`]s; with `http`, `http::admin_router` is an
//! axum admin API (workers, drain, Prometheus metrics from `metrics::Metrics`, OpenAPI).
//!
//! ```
//! use worker_registry::{Admission, EventId, Registry, Target};
//!
//! let registry = Registry::default();
//! let target = Target::new("octo/repo", 42).unwrap();
//! match registry.admit(&target, &EventId::new("delivery-1").unwrap()) {
//!     Admission::Assigned(a) if a.new => { /* spawn a container for a.worker */ }
//!     Admission::Assigned(_) => { /* hand the event to the running worker */ }
//!     Admission::Duplicate(_) => { /* redelivery: skip */ }
//!     Admission::Rejected(_) => { /* answer 503; GitHub or the reconciler retries */ }
//! }
//! ```
#![warn(missing_docs)]

mod claim;
mod clock;
mod config;
mod error;
mod events;
#[cfg(feature = "http")]
pub mod http;
mod ids;
mod interface;
#[cfg(feature = "http")]
pub mod metrics;
mod outcome;
mod registry;
mod snapshot;
mod state;
mod stats;
mod sweep;
#[cfg(feature = "tokio")]
mod sweeper;
mod sync;
mod worker;

pub use claim::{AlreadyClaimed, ClaimState};
#[cfg(feature = "tokio")]
pub use clock::TokioClock;
pub use clock::{Clock, ManualClock, SystemClock, MANUAL_CLOCK_WALL_ORIGIN_SECS};
pub use config::{
    ConfigError, RegistryConfig, RegistryConfigBuilder, DEFAULT_BRAKE_FRACTION,
    DEFAULT_BRAKE_MIN_WORKERS, DEFAULT_CLAIM_RETENTION, DEFAULT_DEAD_RETENTION,
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_MAX_RETAINED_CLAIMS, DEFAULT_MAX_WORKERS,
    DEFAULT_MISSED_HEARTBEATS, DEFAULT_SHARDS, DEFAULT_STARTUP_GRACE, DEFAULT_SUSPECT_GRACE,
    DEFAULT_SWEEP_INTERVAL,
};
pub use error::RegistryError;
#[cfg(all(feature = "tokio", not(worker_registry_loom)))]
pub use events::Subscription;
pub use events::{Event, RecvError, EVENT_BUFFER};
pub use ids::{
    EventId, EventIdError, Generation, Target, TargetError, WorkerId, WorkerIdError,
    MAX_EVENT_ID_LEN, MAX_OWNER_LEN, MAX_REPO_NAME_LEN,
};
pub use interface::WorkerRegistry;
pub use outcome::{Admission, AssignOutcome, Assignment, ClaimOutcome, HeartbeatAck, Rejection};
pub use registry::{DrainAll, Registry, WorkerHandle};
pub use snapshot::{Capacity, ClaimCounts, StatusCounts, StatusSnapshot};
pub use state::{Activity, DeadReason, PoolStatus, Status};
pub use stats::Stats;
pub use sweep::SweepReport;
#[cfg(feature = "tokio")]
pub use sweeper::Sweeper;
pub use worker::{WorkerInfo, WorkerKind};

/// The README's code examples, compiled and run as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
