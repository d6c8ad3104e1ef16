//! What the out-of-process launchers (`process`, `docker`) decide the same way: where a worker's
//! mailbox goes ([`MailboxHandoff`]), and how its exit status becomes an [`Exit`] ([`exit_for`]).

use super::Exit;
use crate::mailbox::Mailbox;

use std::sync::Arc;

use worker_registry::WorkerId;

/// The exit status of a worker that was told it is fenced (`410` on a protocol call; see
/// [`crate::docs::worker_protocol`]).
pub const EXIT_FENCED: i32 = 3;

/// Where a launched worker's mailbox goes: the router's worker-protocol server, which serves its
/// events to the worker's "next event" calls. An out-of-process launcher never reads it.
pub type MailboxHandoff = Arc<dyn Fn(WorkerId, Mailbox) + Send + Sync>;

/// Hands worker `id`'s mailbox to `handoff`, or returns it to be held (unread) until the worker
/// ends when there is none.
pub fn hand_over(handoff: Option<&MailboxHandoff>, id: WorkerId, jobs: Mailbox) -> Option<Mailbox> {
    match handoff {
        Some(handoff) => {
            handoff(id, jobs);
            None
        }
        None => Some(jobs),
    }
}

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
