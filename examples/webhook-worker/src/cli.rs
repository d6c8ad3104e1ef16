//! The command line and environment (`--help` lists both; the README explains them).

use std::time::Duration;

use clap::Parser;

/// The default number of times an event's command is run before the delivery is completed as
/// failed.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// The default pause before a failed command is run again (doubled after each failure).
pub const DEFAULT_RETRY_BACKOFF: &str = "500ms";

/// The default grace a command gets between `SIGTERM` and `SIGKILL` when the worker is stopped.
pub const DEFAULT_STOP_GRACE: &str = "2s";

/// The default time the worker waits without events before it leaves (`exit`).
pub const DEFAULT_IDLE_EXIT: &str = "60s";

/// Runs a command once per GitHub event its router hands it, over the worker protocol.
#[derive(Debug, Parser)]
#[command(name = "webhook-worker", version, about)]
pub struct Args {
    /// The worker's id in the registry (set by the launcher).
    #[arg(long, env = "WORKER_ID")]
    pub worker_id: u64,
    /// The fencing token of the assignment that created the worker (set by the launcher).
    #[arg(long, env = "WORKER_TOKEN")]
    pub worker_token: u64,
    /// The worker's credential, `v1.<id>.<token>.<mac>` (set by the launcher; never passed on to
    /// the command).
    #[arg(long, env = "WORKER_CREDENTIAL", hide_env_values = true)]
    pub credential: String,
    /// The router's worker-protocol URL, e.g. `http://127.0.0.1:41234` (set by the launcher).
    #[arg(long, env = "WORKER_ROUTER_URL")]
    pub router_url: String,
    /// The command run once per event through `sh -c`, the event's body on its stdin.
    #[arg(long, env = "WEBHOOK_EVENT_COMMAND")]
    pub event_command: String,
    /// How many times an event's command runs before the delivery is completed as failed.
    #[arg(long, default_value_t = DEFAULT_MAX_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
    /// The pause before a failed command runs again, doubled after each failure.
    #[arg(long, default_value = DEFAULT_RETRY_BACKOFF, value_parser = humantime::parse_duration)]
    pub retry_backoff: Duration,
    /// The grace between `SIGTERM` and `SIGKILL` of the command when the worker is stopped.
    #[arg(long, default_value = DEFAULT_STOP_GRACE, value_parser = humantime::parse_duration)]
    pub stop_grace: Duration,
    /// How long the worker waits without an event before it leaves (`exit`); `0s` never.
    #[arg(long, default_value = DEFAULT_IDLE_EXIT, value_parser = humantime::parse_duration)]
    pub idle_exit: Duration,
    /// Log lines as JSON objects (otherwise text).
    #[arg(long, env = "WEBHOOK_WORKER_LOG_JSON")]
    pub log_json: bool,
}
