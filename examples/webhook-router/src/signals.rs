//! The signals that stop the router: SIGTERM (what `docker stop`, `kubectl delete pod` and
//! `systemctl stop` send) and SIGINT (Ctrl-C) start the same graceful shutdown; a second one of
//! either exits at once.

use std::io;

use tokio::signal::unix::{signal, Signal, SignalKind};

/// A stopping signal that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM.
    Term,
    /// SIGINT.
    Int,
}

impl Stop {
    /// Its name, for the log.
    pub fn name(self) -> &'static str {
        match self {
            Self::Term => "SIGTERM",
            Self::Int => "SIGINT",
        }
    }

    /// The exit status of a process it ends at once, as a shell reports one a signal killed:
    /// 128 + the signal's number (143, 130).
    pub fn exit_status(self) -> u8 {
        let number = match self {
            Self::Term => libc::SIGTERM,
            Self::Int => libc::SIGINT,
        };
        u8::try_from(128 + number).unwrap_or(u8::MAX)
    }
}

/// SIGTERM and SIGINT, handled by this process from [`new`](Self::new) on (their default action,
/// ending the process on the spot, no longer applies).
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Starts handling both.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next one to arrive.
    pub async fn next(&mut self) -> Stop {
        tokio::select! {
            _ = self.term.recv() => Stop::Term,
            _ = self.int.recv() => Stop::Int,
        }
    }
}
