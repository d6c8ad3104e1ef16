//! Lifecycle events: [`Event`] and, with the `tokio` feature, what a subscriber holds
//! ([`Subscription`], from [`Subscribe::subscribe`](crate::Subscribe::subscribe)) and what a
//! backend publishes through ([`EventSender`], for a backend outside this crate). A subscriber may
//! fall [`EVENT_BUFFER`] events behind before it loses the oldest. [`Event`], [`RecvError`] and
//! [`Subscription`] are also at the crate root.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use worker_registry::events::{Event, EventSender, EVENT_BUFFER};
//! use worker_registry::WorkerId;
//!
//! let sender = EventSender::new();
//! let mut subscription = sender.subscribe();
//! sender.send(|| Event::WorkerCreated { worker: WorkerId::new(1), target: None });
//! assert!(matches!(subscription.recv().await, Ok(Event::WorkerCreated { .. })));
//! assert!(EVENT_BUFFER >= 64);
//! # }
//! ```

pub use crate::api::events::{Event, RecvError, EVENT_BUFFER};
#[cfg(feature = "tokio")]
pub use crate::api::events::{EventSender, Subscription};
