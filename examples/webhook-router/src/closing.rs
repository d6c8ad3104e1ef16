//! The closing flag: set once, when the router begins its shutdown (or is killed), and read by
//! every part that must stop taking new work: the dispatcher (a webhook delivery is refused
//! with 503), the HTTP edge (before the body is read) and the reconciler (no pass begins).
//! [`crate::shutdown`] sets it; the others hold a clone and only read it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether the router is shutting down; cheap to clone, every clone the same flag.
#[derive(Debug, Clone, Default)]
pub struct Closing(Arc<AtomicBool>);

impl Closing {
    /// Sets the flag: from now on, new deliveries are refused.
    pub fn begin(&self) {
        // Release: pairs with the Acquire in `is_set`, so that what was done before the
        // shutdown began is seen by whoever sees the flag.
        self.0.store(true, Ordering::Release);
    }

    /// Whether shutdown has begun (deliveries are refused with 503).
    pub fn is_set(&self) -> bool {
        // Acquire: pairs with the Release in `begin`.
        self.0.load(Ordering::Acquire)
    }
}
