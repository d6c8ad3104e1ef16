//! What the out-of-process launchers (`process`, `docker`) decide the same way: how a worker's exit
//! status becomes an [`Exit`] ([`exit_for`]). Both speak the worker protocol
//! ([`Launcher::speaks_protocol`](super::Launcher::speaks_protocol)): the router serves their
//! workers' mailboxes itself, and they get [`Launch::jobs`](super::Launch::jobs) closed and empty.

use super::Exit;
/// The exit status of a worker that was told it is fenced (`410` on a protocol call; see
/// [`crate::docs::worker_protocol`]).
pub const EXIT_FENCED: i32 = 3;

/// The [`Exit`] of a worker that ended with status `code` (`None`: killed by a signal, or not
/// known), after the router `killed` or began `stopping` it: a stop wins (the worker is
/// [`Exit::Stopped`], with no jobs: the router accounts its mailbox), then a kill
/// ([`Exit::Crashed`]); otherwise 0 is [`Exit::Exited`], [`EXIT_FENCED`] is [`Exit::Fenced`], and
/// anything else (the lease's 4, a crash, a signal) is [`Exit::Crashed`].
pub fn exit_for(code: Option<i64>, killed: bool, stopping: bool) -> Exit {
    if stopping {
        return Exit::Stopped(Vec::new());
    }
    if killed {
        return Exit::Crashed;
    }
    match code {
        Some(0) => Exit::Exited,
        Some(c) if c == i64::from(EXIT_FENCED) => Exit::Fenced,
        _ => Exit::Crashed,
    }
}
