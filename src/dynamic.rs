//! Choosing a backend at run time: [`DynRegistry`] (also at the crate root) wraps any backend in
//! an `Arc<dyn DynBackend>` and implements the contract traits itself. [`DynBackend`] is the
//! object-safe form of the traits, implemented for every [`Backend`]; [`BoxFuture`] is what its
//! methods return.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use worker_registry::dynamic::DynBackend;
//! use worker_registry::{DynRegistry, InMemoryRegistry};
//!
//! let backend: Arc<dyn DynBackend> = Arc::new(InMemoryRegistry::default());
//! let registry = DynRegistry::new(InMemoryRegistry::default());
//! # let _ = (backend, registry);
//! ```

pub use crate::api::dynamic::{Backend, BoxFuture, DynBackend, DynRegistry};
