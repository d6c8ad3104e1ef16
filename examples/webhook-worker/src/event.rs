//! One event: its command run up to `--max-attempts` times, each run only while the worker
//! holds its lease and killed when the lease, a verdict or a stop says so; then `complete`.

use crate::cli::Args;
use crate::client::{Client, Completion, Event, Refusal};
use crate::command::{self, Running};
use crate::ending::Ending;
use crate::state::{Shared, Verdict};

use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a `complete` the router cannot take (`503`, no answer) is tried.
const COMPLETE_TRIES: u32 = 5;

/// Runs `event` to its completion; `Err` with how the worker ends if it ends meanwhile.
pub fn handle(
    args: &Args,
    shared: &Arc<Shared>,
    client: &Client,
    event: &Event,
) -> Result<(), Ending> {
    let mut reason = String::new();
    let mut attempts = 0;
    for attempt in 1..=args.max_attempts {
        if attempt > 1 {
            let backoff = args
                .retry_backoff
                .saturating_mul(1 << (attempt - 2).min(16));
            pause(shared, backoff, event)?;
        }
        attempts = attempt;
        match run_once(args, shared, event)? {
            Ok(status) if status.success() => {
                return complete(shared, client, event, attempt, "succeeded", String::new());
            }
            Ok(status) => reason = describe(status),
            Err(e) => reason = format!("the command could not be started: {e}"),
        }
        tracing::warn!(delivery = %event.delivery, target = %event.target, attempt, max_attempts = args.max_attempts, "event command failed: {reason}");
    }
    tracing::error!(delivery = %event.delivery, target = %event.target, attempts, "event failed after every attempt: {reason}");
    complete(shared, client, event, attempts, "failed", reason)
}

/// One run of the command: `Ok(Ok(status))` once it ended by itself, `Ok(Err(_))` if it could
/// not be started.
fn run_once(
    args: &Args,
    shared: &Arc<Shared>,
    event: &Event,
) -> Result<std::io::Result<ExitStatus>, Ending> {
    {
        let mut s = shared.lock();
        ended(&s, event)?;
        s.command_exit = None;
    }
    let (running, guard) = match command::start(&args.event_command, args.worker_id, event, shared)
    {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    let end = watch(args, shared, event, running);
    // The group's leftovers (a background child of the command) end with the event.
    guard.release();
    end
}

/// Waits for the command's end; kills it if the worker must end first.
fn watch(
    args: &Args,
    shared: &Shared,
    event: &Event,
    running: Running,
) -> Result<std::io::Result<ExitStatus>, Ending> {
    let mut s = shared.lock();
    loop {
        if let Some(status) = s.command_exit.take() {
            return Ok(status);
        }
        if let Err(end) = ended(&s, event) {
            let graceful = matches!(end, Ending::Interrupted { .. });
            drop(s);
            stop_command(shared, running, graceful.then_some(args.stop_grace));
            return Err(end);
        }
        let until = s.lease_until;
        s = shared.wait(s, until);
    }
}

/// Stops the command's whole group (`SIGTERM` and `SIGKILL` after `grace`, or `SIGKILL` at
/// once), and returns once the shell is reaped.
fn stop_command(shared: &Shared, running: Running, grace: Option<Duration>) {
    let mut s = shared.lock();
    if let Some(grace) = grace {
        running.signal(libc::SIGTERM);
        let until = Instant::now() + grace;
        while s.command_exit.is_none() && Instant::now() < until {
            s = shared.wait(s, Some(until));
        }
    }
    // The group, even when the shell has ended: a grandchild may still be in it.
    running.signal(libc::SIGKILL);
    while s.command_exit.is_none() {
        s = shared.wait(s, None);
    }
}

/// Whether the worker must end now (a verdict, a stop, the lease run out), and how.
fn ended(s: &crate::state::State, event: &Event) -> Result<(), Ending> {
    match &s.verdict {
        Some(Verdict::Fenced(reason)) => Err(Ending::Fenced {
            reason: reason.clone(),
        }),
        Some(Verdict::Unauthorized) => Err(Ending::Unauthorized),
        None if s.stop => Err(Ending::Interrupted {
            delivery: event.delivery.clone(),
        }),
        None if !s.holds_lease(Instant::now()) => Err(Ending::LeaseExpired {
            delivery: Some(event.delivery.clone()),
        }),
        None => Ok(()),
    }
}

/// Waits `d` before the next attempt, ending early as [`ended`] says.
fn pause(shared: &Shared, d: Duration, event: &Event) -> Result<(), Ending> {
    let until = Instant::now() + d;
    let mut s = shared.lock();
    loop {
        ended(&s, event)?;
        if Instant::now() >= until {
            return Ok(());
        }
        let wake = s.lease_until.map_or(until, |l| l.min(until));
        s = shared.wait(s, Some(wake));
    }
}

fn complete(
    shared: &Shared,
    client: &Client,
    event: &Event,
    attempts: u32,
    outcome: &'static str,
    reason: String,
) -> Result<(), Ending> {
    let c = Completion {
        delivery: event.delivery.clone(),
        outcome,
        attempts,
        reason,
    };
    for _ in 0..COMPLETE_TRIES {
        match client.complete(&c) {
            Ok(()) => {
                tracing::info!(delivery = %event.delivery, target = %event.target, outcome, attempts, "completed");
                return Ok(());
            }
            Err(Refusal::Fenced { reason }) => return Err(Ending::Fenced { reason }),
            Err(Refusal::Unauthorized) => return Err(Ending::Unauthorized),
            Err(e @ Refusal::Unexpected { .. }) => {
                // `409`: the registry no longer counts this worker the event's holder (a stuck
                // delivery, released and re-dispatched): nothing to retry.
                tracing::error!(delivery = %event.delivery, "completion refused: {e}");
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(delivery = %event.delivery, "completion not taken, trying again: {e}");
                let mut s = shared.lock();
                let until = Instant::now() + crate::heartbeat::RETRY_INTERVAL;
                while Instant::now() < until && s.verdict.is_none() {
                    s = shared.wait(s, Some(until));
                }
            }
        }
    }
    // The claim stays in flight; the registry releases it for re-dispatch after max_in_flight.
    tracing::error!(delivery = %event.delivery, "completion not recorded after {COMPLETE_TRIES} tries");
    Ok(())
}

/// `exit status 1`, `killed by signal 9`.
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => status.to_string(),
    }
}
