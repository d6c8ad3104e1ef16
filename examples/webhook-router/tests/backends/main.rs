//! The router on real Redis and PostgreSQL servers (see `harness.rs` for which, and for the skip
//! rule): several replicas on one registry (`replicas`), replicas as processes killed with SIGKILL
//! (`processes`), the server stopped and restarted under a router (`outage`), and what the simulator's settle
//! phase waits for (`settle`), and the reconciler's lease, positions and chase, and an outage
//! recovered by three replicas with the reconciling one killed (`reconcile`).

#[path = "../common/mod.rs"]
mod common;
#[path = "../fake_github/mod.rs"]
mod fake_github;
mod harness;
#[path = "../hold/mod.rs"]
mod hold;

mod outage;
mod processes;
mod reconcile;
mod replicas;
mod settle;
mod workers;
