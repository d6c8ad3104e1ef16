//! The reference webhook router: GitHub deliveries in, one simulated worker container (a tokio
//! task) per pull request, the worker registry in between, and the library's admin API beside it.
//! Written against the registry's contract through a [`DynRegistry`](worker_registry::DynRegistry),
//! so it runs on whichever backend `--registry` names.
//!
//! The modules, from the top floor down; each imports only from the floors below it:
//!
//! * [`cli`]: the flags, validated into [`cli::Settings`]; [`signals`]: the signals that stop
//!   the binary; [`sim`]: `--simulate`, built-in traffic over HTTP with an audit and a summary,
//!   one file per phase.
//! * [`server`]: [`server::serve`], the accept loops (one address, or the webhook's and the
//!   admin's), and the shutdown path that runs [`shutdown`]'s steps with the HTTP server and the
//!   sweeper.
//! * [`http`]: the edge: `POST /webhook` (parsing, signatures, answers), the probes, the debug
//!   and internal endpoints, the admin API and the OpenAPI document. It reads bodies with [`body`] (a size
//!   cap, a time limit, a shared memory budget) and GitHub's format with [`github`].
//! * [`app`]: the composition ([`app::App`]) that builds the parts below from [`app::Options`]
//!   and an [`app::Platform`] and hands them out; no part imports it.
//! * [`routing`]: the routing policy's decision carried out for one pull request.
//! * [`reconcile`]: failed deliveries found in GitHub's hook logs and redelivered.
//! * [`shutdown`]: refusing, draining, stopping and accounting for what was not finished.
//! * [`redispatch`]: released deliveries placed again (the sweeper's callback).
//! * [`dispatch`]: admission and the handover to a worker's container, here or on its owner.
//! * [`lifecycle`]: containers started (through a [`launcher`]), crashed, killed, stopped and
//!   forgotten.
//! * [`closing`], [`outstanding`]: what two parts share, one owner each (the closing flag; the
//!   accepted deliveries not finished that the router holds).
//! * [`protocol`]: the worker protocol's router side (the key, the lease rules, the workers
//!   served over `/worker/v1`, whose handlers are [`http::worker`]).
//! * [`containers`]: the in-process container platform (worker id -> [`mailbox`], a bounded
//!   channel with a bounded overflow behind it); [`remote`]:
//!   the owner records and forwarding to containers that other router processes run; [`store`]:
//!   those records next to a shared registry; [`launcher`]: what starts, stops and watches
//!   workers, one trait, a launcher a module ([`launcher::task`]: tokio tasks); [`worker`]: the
//!   simulated worker container the `task` launcher runs;
//!   [`runs`]: what its loops ran on (the body's digest, for the simulator's audit);
//!   [`metrics`]: the router's own metrics; [`backend`]: `--registry`, the backend choice;
//!   [`telemetry`]: a delivery's spans, the `traceparent` handed to its worker, and (feature
//!   `otel`) their export over OTLP.
//! * [`reload`]: the secret files re-read on SIGHUP and when they change.
//! * [`docs`]: long-form design pages (no code): the worker protocol and self-fencing.
//! * At the bottom, what every layer speaks: [`outcome`] (what was done with a delivery:
//!   [`outcome::Dispatch`], [`outcome::Source`], [`outcome::Unfinished`]), [`limits`], the
//!   routing [`policy`] table, [`secrets`] (the reloadable secret handles), [`credential`] (a
//!   worker's credential, minted and verified under the router's worker key), [`lease`] (the
//!   self-fencing lease a heartbeat answer grants), [`failed`] (the most recent deliveries whose
//!   command failed every attempt, for the admin API), and [`github`]'s vocabulary.

pub mod app;
pub mod backend;
pub mod body;
pub mod cli;
pub mod closing;
pub mod containers;
pub mod credential;
pub mod dispatch;
pub mod docs;
pub mod failed;
pub mod github;
pub mod http;
pub mod launch_flags;
pub mod launcher;
pub mod lease;
pub mod lifecycle;
pub mod limits;
pub mod mailbox;
pub mod metrics;
pub mod outcome;
pub mod outstanding;
pub mod policy;
pub mod protocol;
pub mod reconcile;
pub mod redispatch;
pub mod reload;
pub mod remote;
pub mod routing;
pub mod runs;
pub mod secrets;
pub mod server;
pub mod shutdown;
pub mod signals;
pub mod sim;
pub mod store;
pub mod telemetry;
pub mod worker;
