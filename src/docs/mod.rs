//! Long-form documentation, as doc-only modules (arc-swap's `docs` pattern): the design and why
//! the contract is three traits, each backend's internals, how correctness is checked, and what
//! every call costs. Nothing here is code; each page is a Markdown file beside this one
//! (`src/docs/*.md`), readable on GitHub and on docs.rs alike.
//!
//! | page | what it covers |
//! |---|---|
//! | [`design`] | the seam (one contract, many backends) and why three traits; the layout; the state machine; time; the brake and the stall rule |
//! | [`in_memory`] | the in-memory backend's two surfaces, data structures, locking, memory orderings and memory per claim |
//! | [`redis`] | the Redis backend: keys, scripts, replicas, faults, measured cost |
//! | [`postgres`] | the PostgreSQL backend: schema, functions, plans, measured cost, which backend suits which deployment |
//! | [`correctness`] | the conformance suite, the loom models and their must-fail twins, stress and model-based tests |
//! | [`performance`] | every bench against its same-run baseline, the floors and why, the CI regression gate |
//! | [`admin`] | the admin API, Prometheus metrics and lifecycle events |
//!
//! # Examples
//!
//! The pages are read, not called; the crate's front page has the quick start:
//!
//! ```
//! use worker_registry::WorkerRegistry;
//!
//! let registry = worker_registry::InMemoryRegistry::default();
//! assert_eq!(registry.status().capacity.used, 0);
//! ```

#[doc = include_str!("design.md")]
pub mod design {}

#[doc = include_str!("in_memory.md")]
pub mod in_memory {}

#[doc = include_str!("redis.md")]
pub mod redis {}

#[doc = include_str!("postgres.md")]
pub mod postgres {}

#[doc = include_str!("correctness.md")]
pub mod correctness {}

#[doc = include_str!("performance.md")]
pub mod performance {}

#[doc = include_str!("admin.md")]
pub mod admin {}
