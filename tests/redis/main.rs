//! The Redis backend against real servers (see `harness.rs` for which, and for the skip rule).
//!
//! `basics`: each script's answers; `differential`: random call sequences give the same answers
//! as the in-memory registry; `replicas`: the lease, the released-event stream and events across
//! handles on separate connections; `faults`: a restarted server, a script that errors, AOF
//! persistence; `library`: the Function library lost and loaded again, a reply outside the schema; `lost_reply`: an admission whose reply is lost; `failover`: a Sentinel failover followed by a live handle, a lagging replica promoted; `tls` (feature `redis-tls`): the conformance suite over `rediss://`; `cluster` (feature `redis-cluster`): the conformance suite on a three-primary Redis Cluster; `cost`: what a retained claim costs in Redis memory; `growth`: rounds of the same traffic leave the same keys behind; `rescan`: the bounded rescan after a dropped 65th stall; `drain_stall`: a stall's drain-deadline extension in bounded reads; `scale`: a mass death worked
//! off in bounded script calls, and an idle sweep's version a header alone; `waiting`: the
//! waiting room's wake-up and a drain batch's promotion.

mod harness;
#[path = "../support/ids.rs"]
mod ids;

mod basics;
#[cfg(feature = "redis-cluster")]
mod cluster;
mod conformance;
mod cost;
mod differential;
mod drain_stall;
mod failover;
mod faults;
mod given;
mod growth;
#[path = "../support/differential.rs"]
mod histories;
mod library;
mod lost_reply;
#[path = "../support/proxy.rs"]
mod proxy;
mod replicas;
mod rescan;
mod scale;
#[cfg(feature = "redis-tls")]
mod tls;
mod waiting;
