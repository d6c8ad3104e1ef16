//! How the worker ends, and its exit status for each (the README's table).

use std::fmt;

/// Why the worker ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ending {
    /// Drained: it finished its events and `loop/finished` said it is dead, or a call made
    /// while no command ran was answered `410` with reason `exited` (a drain that found it
    /// idle). Status 0.
    Drained,
    /// Left after `--idle-exit` without events (`exit`). Status 0.
    Idle,
    /// `SIGTERM`/`SIGINT` while no command ran. Status 0.
    Stopped,
    /// `SIGTERM`/`SIGINT` while a command ran: it was stopped (`SIGTERM`, `SIGKILL` after the
    /// grace) and its delivery was not completed. Status 5.
    Interrupted {
        /// The delivery whose command was stopped.
        delivery: String,
    },
    /// A call answered `401`: the credential does not verify. Status 2.
    Unauthorized,
    /// A call answered `410` (other than `exited` while idle): the registry declared the
    /// worker dead. Status 3.
    Fenced {
        /// The router's reason.
        reason: String,
    },
    /// The lease ran out before a heartbeat renewed it; a running command was killed first.
    /// Status 4.
    LeaseExpired {
        /// The delivery whose command was killed, if one ran.
        delivery: Option<String>,
    },
    /// The router answered outside the protocol, or the worker could not run at all. Status 1.
    Failed(String),
}

/// The status of a bad command line or environment (clap's own 2 would read as a refused
/// credential).
pub const USAGE_STATUS: i32 = 64;

impl Ending {
    /// The process's exit status.
    pub fn status(&self) -> i32 {
        match self {
            Self::Drained | Self::Idle | Self::Stopped => 0,
            Self::Failed(_) => 1,
            Self::Unauthorized => 2,
            Self::Fenced { .. } => 3,
            Self::LeaseExpired { .. } => 4,
            Self::Interrupted { .. } => 5,
        }
    }
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Drained => f.write_str("drained: every event finished"),
            Self::Idle => f.write_str("no event for the idle time: left"),
            Self::Stopped => f.write_str("stopped by a signal while idle"),
            Self::Interrupted { delivery } => write!(
                f,
                "stopped by a signal: the command of delivery {delivery} was stopped unfinished"
            ),
            Self::Unauthorized => f.write_str(
                "the router refused the credential (401): the worker was launched with a wrong \
                 WORKER_CREDENTIAL or against another router",
            ),
            Self::Fenced { reason } => write!(
                f,
                "fenced: the registry declared this worker dead ({reason}); its work goes to a \
                 successor"
            ),
            Self::LeaseExpired { delivery: Some(d) } => write!(
                f,
                "the lease ran out with no heartbeat answered: the command of delivery {d} was \
                 killed (SIGKILL of its process group) before the registry could hand the pull \
                 request on"
            ),
            Self::LeaseExpired { delivery: None } => {
                f.write_str("the lease ran out with no heartbeat answered, while idle")
            }
            Self::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}
