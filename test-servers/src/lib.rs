//! Real servers for the workspace's tests and benchmarks (the library's and the reference
//! router's): the one an environment variable names, or a throwaway one this process starts on a
//! free loopback port in a temporary directory and stops.
//!
//! * [`redis`]: `WORKER_REGISTRY_REDIS_URL`, or a `redis-server` (with or without AOF) that can be
//!   stopped and restarted on the same port and directory; `WORKER_REGISTRY_REDIS_SERVER` and
//!   `WORKER_REGISTRY_REDIS_CLI` name other binaries (Valkey's `valkey-server`, `valkey-cli`).
//! * [`pgbouncer`]: a `pgbouncer` in transaction mode in front of a PostgreSQL server.
//! * [`cluster`]: a three-primary Redis Cluster of such servers (`redis-cli --cluster create`).
//! * [`forward`]: a TCP forwarder that can be pointed at another server (a moved virtual IP).
//! * [`sentinel`]: a `redis-sentinel` monitoring one of those servers (failover tests).
//! * [`postgres`]: `WORKER_REGISTRY_POSTGRES_URL`, or a cluster made with `initdb` + `pg_ctl` (as an
//!   unprivileged user when running as root) that can be killed and restarted;
//!   `WORKER_REGISTRY_POSTGRES_BIN` names the directory of other binaries (PostgreSQL 16's, say).
//!
//! Without the server binaries (and without the variable) a test prints one line saying it skipped
//! and how to enable it; when `CI` is set it fails instead (`.ci/run` sets it). Any other failure
//! to start a server (the binaries are there and fail) is a test failure, `CI` or not.

pub mod cluster;
pub mod forward;
pub mod pgbouncer;
pub mod postgres;
mod process;
pub mod redis;
pub mod sentinel;
