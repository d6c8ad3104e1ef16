//! The conformance cases, one module per concern. Each case is an `async fn` generic over a
//! [`Fixture`](super::Fixture) that panics on a violation;
//! [`conformance_suite!`](crate::conformance_suite) runs each as a test of its own.
//!
//! # Examples
//!
//! Running one case by hand (what each generated test does):
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() {
//! use worker_registry::testkit::{cases, ReferenceFixture};
//!
//! cases::admission::ac2_a_redelivery_is_a_duplicate_naming_its_holder(&ReferenceFixture::new()).await;
//! # }
//! ```

pub mod admission;
pub mod assignment;
pub mod bad_input;
pub mod brake;
pub mod drain;
pub mod events;
pub mod liveness;
pub mod mass;
pub mod payloads;
pub mod races;
pub mod registration;
pub mod released;
pub mod retention;
pub mod snapshot;
pub mod stall;
pub mod startup;
pub mod stuck;
pub mod waiting;
