//! The worker's main loop: wait for the first lease, long-poll `next`, run each event
//! ([`crate::event`]), `loop/started` before a batch and `loop/finished` once `next` is empty,
//! leave when drained, idle, fenced, stopped or out of lease.

use crate::cli::Args;
use crate::client::{Client, Event, Refusal};
use crate::ending::Ending;
use crate::event;
use crate::state::{Shared, State, Verdict};

use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest long poll asked for (the router caps it at its own `DEFAULT_LONG_POLL` too).
pub const LONG_POLL: Duration = Duration::from_secs(20);

/// Runs the worker until it ends (the heartbeat thread runs beside it).
pub fn run(args: &Args, shared: &Arc<Shared>, client: &Client) -> Ending {
    if let Err(end) = first_lease(shared) {
        return end;
    }
    let mut in_loop = false;
    let mut idle_since = Instant::now();
    loop {
        let wait = match poll_wait(args, shared, in_loop, idle_since) {
            Ok(w) => w,
            Err(end) => return end,
        };
        // While `polling`, a stop signal ends the process at once (see `main`): nothing runs.
        {
            let mut s = shared.lock();
            if s.stop {
                return Ending::Stopped;
            }
            s.polling = true;
        }
        let next = client.next(wait);
        shared.update(|s| s.polling = false);
        match next {
            Ok(Some(ev)) => {
                if !in_loop {
                    started(shared, client, &ev);
                    in_loop = true;
                }
                if let Err(end) = event::handle(args, shared, client, &ev) {
                    return end;
                }
                idle_since = Instant::now();
            }
            Ok(None) => {
                let draining = shared.lock().draining;
                if in_loop || draining {
                    match client.loop_finished() {
                        Ok(true) => return Ending::Drained,
                        Ok(false) => in_loop = false,
                        Err(e) => {
                            if let Err(end) = refused(shared, e) {
                                return end;
                            }
                        }
                    }
                } else if !args.idle_exit.is_zero() && idle_since.elapsed() >= args.idle_exit {
                    return leave(client);
                }
            }
            Err(e) => {
                if let Err(end) = refused(shared, e) {
                    return end;
                }
            }
        }
    }
}

/// How long the next long poll may wait: nothing in a batch or while draining (the queue is
/// being emptied), otherwise up to [`LONG_POLL`], the lease left and the idle time left; `Err`
/// if the worker must end first.
fn poll_wait(
    args: &Args,
    shared: &Shared,
    in_loop: bool,
    idle_since: Instant,
) -> Result<Duration, Ending> {
    let s = shared.lock();
    idle_ending(&s)?;
    if in_loop || s.draining {
        return Ok(Duration::ZERO);
    }
    let mut wait = LONG_POLL.min(s.remaining(Instant::now()));
    if !args.idle_exit.is_zero() {
        wait = wait.min(args.idle_exit.saturating_sub(idle_since.elapsed()));
    }
    Ok(wait)
}

/// Rule 1: no event before the first successful heartbeat.
fn first_lease(shared: &Shared) -> Result<(), Ending> {
    let mut s = shared.lock();
    while s.lease_until.is_none() {
        if let Some(v) = &s.verdict {
            return Err(verdict(v));
        }
        if s.stop {
            return Err(Ending::Stopped);
        }
        s = shared.wait(s, None);
    }
    Ok(())
}

/// How an idle worker ends now, if it does.
fn idle_ending(s: &State) -> Result<(), Ending> {
    if let Some(v) = &s.verdict {
        return Err(verdict(v));
    }
    if s.stop {
        return Err(Ending::Stopped);
    }
    if !s.holds_lease(Instant::now()) {
        return Err(Ending::LeaseExpired { delivery: None });
    }
    Ok(())
}

fn verdict(v: &Verdict) -> Ending {
    match v {
        Verdict::Fenced(reason) => fenced_while_idle(reason.clone()),
        Verdict::Unauthorized => Ending::Unauthorized,
    }
}

/// A `410` while no command runs. Reason `exited` is a drain that found the worker idle: the
/// registry ended it at once (a clean exit, [`Ending::Drained`]); any other reason is a fencing.
fn fenced_while_idle(reason: String) -> Ending {
    if reason == "exited" {
        tracing::info!("drained while idle: the registry counts this worker exited");
        return Ending::Drained;
    }
    Ending::Fenced { reason }
}

/// `loop/started`, once per batch; not recorded is not fatal (the completion tells the
/// registry), a verdict is seen by the next check.
fn started(shared: &Shared, client: &Client, ev: &Event) {
    match client.loop_started(&ev.delivery) {
        Ok(()) => {}
        Err(Refusal::Fenced { reason }) => shared.update(|s| {
            s.verdict.get_or_insert(Verdict::Fenced(reason));
        }),
        Err(Refusal::Unauthorized) => shared.update(|s| {
            s.verdict.get_or_insert(Verdict::Unauthorized);
        }),
        Err(e) => tracing::warn!(delivery = %ev.delivery, "loop/started not recorded: {e}"),
    }
}

/// A call refused: a verdict ends the worker; an unavailable router is waited out (a second, or
/// until something changes), the lease running meanwhile.
fn refused(shared: &Shared, e: Refusal) -> Result<(), Ending> {
    match e {
        Refusal::Fenced { reason } => Err(fenced_while_idle(reason)),
        Refusal::Unauthorized => Err(Ending::Unauthorized),
        Refusal::Unexpected { .. } => Err(Ending::Failed(e.to_string())),
        Refusal::Unavailable { .. } => {
            tracing::warn!("{e}; trying again");
            let until = Instant::now() + crate::heartbeat::RETRY_INTERVAL;
            let mut s = shared.lock();
            while Instant::now() < until && idle_ending(&s).is_ok() {
                s = shared.wait(s, Some(until));
            }
            Ok(())
        }
    }
}

/// Leaves after the idle time: `exit` deregisters the worker (an event admitted meanwhile is
/// released by the registry and re-dispatched to a successor).
fn leave(client: &Client) -> Ending {
    match client.exit() {
        Ok(()) => Ending::Idle,
        Err(Refusal::Fenced { reason }) => fenced_while_idle(reason),
        Err(Refusal::Unauthorized) => Ending::Unauthorized,
        Err(e) => {
            // Not recorded: the registry declares the silent worker dead, nothing is lost.
            tracing::warn!("exit not recorded: {e}");
            Ending::Idle
        }
    }
}
