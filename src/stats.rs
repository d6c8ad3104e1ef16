//! What a registry counts ([`WorkerRegistry::stats`](crate::WorkerRegistry::stats)): [`Stats`]
//! and its [`SweepDurations`] histogram (both also at the crate root), whose bucket bounds are
//! [`SWEEP_DURATION_BUCKETS`].
//!
//! # Examples
//!
//! ```
//! use worker_registry::stats::SWEEP_DURATION_BUCKETS;
//! use worker_registry::{InMemoryRegistry, WorkerRegistry};
//!
//! let stats = InMemoryRegistry::default().stats();
//! assert_eq!(stats.sweep_durations.buckets.len(), SWEEP_DURATION_BUCKETS.len() + 1);
//! ```

pub use crate::api::stats::{Stats, SweepDurations, SWEEP_DURATION_BUCKETS};
