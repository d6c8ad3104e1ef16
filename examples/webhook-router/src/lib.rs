//! The reference webhook router: GitHub deliveries in, one simulated worker container (a tokio
//! task) per pull request, the worker registry in between, and the library's admin API beside it.
//! Written against the registry's contract, so it runs on any backend.
//!
//! * [`app`]: the router's state ([`app::App`]) and HTTP app, and [`app::serve`].
//! * [`github`]: GitHub's webhook format: signatures, headers, payloads, routing to a target.
//! * [`worker`]: the simulated worker container.
//! * [`sim`]: `--simulate`, built-in traffic over HTTP with an audit and a summary.

pub mod app;
pub mod github;
pub mod sim;
pub mod worker;
