//! The reference webhook router: GitHub deliveries in, one simulated worker container (a tokio
//! task) per pull request, the worker registry in between, and the library's admin API beside it.
//! Written against the registry's contract through a [`DynRegistry`](worker_registry::DynRegistry),
//! so it runs on whichever backend `--registry` names.
//!
//! * [`cli`]: the flags, validated into [`cli::Settings`].
//! * [`backend`]: `--registry`, the backend choice.
//! * [`store`]: the router's own records next to a shared registry (which replica owns which
//!   container).
//! * [`containers`]: the in-process container platform (worker id -> mailbox), one container per
//!   worker.
//! * [`remote`]: reaching containers that other router processes run.
//! * [`app`]: the router's state and decisions ([`app::App`]).
//! * [`http`]: the HTTP app (`POST /webhook`, the debug endpoint, the admin API).
//! * [`server`]: [`server::serve`] and the shutdown path.
//! * [`github`]: GitHub's webhook format: signatures, headers, payloads, the pull requests named.
//! * [`routing`]: the routing policy (which events start, reach or drain a PR's worker).
//! * [`body`]: reading a body under a size cap, a time limit and a shared memory budget.
//! * [`answer`] and [`openapi`]: the answers' JSON and the OpenAPI document.
//! * [`worker`]: the simulated worker container.
//! * [`metrics`]: the router's own metrics.
//! * [`sim`]: `--simulate`, built-in traffic over HTTP with an audit and a summary.

pub mod answer;
pub mod app;
pub mod backend;
pub mod body;
pub mod cli;
pub mod containers;
pub mod github;
pub mod http;
pub mod metrics;
pub mod openapi;
pub mod remote;
pub mod routing;
pub mod server;
pub mod sim;
pub mod store;
pub mod worker;
