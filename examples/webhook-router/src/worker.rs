//! The simulated worker container: one tokio task per worker the registry creates.
//!
//! It heartbeats through its [`WorkerHandle`] every heartbeat interval (also while it works), runs
//! one loop of `work` per event handed to it (`loop_started` .. `complete` .. `loop_finished`),
//! honours drain (a heartbeat answered `Draining`: finish the current loop, then exit), stops when it
//! is fenced (a heartbeat or a loop call refused because the registry declared it dead), leaves by
//! itself after `idle` without events, and can be told to crash: it then simply stops, with no
//! goodbye, as a killed container would, and only the sweep notices.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::{interval, sleep, sleep_until, Instant, MissedTickBehavior};
use worker_registry::{
    Clock, DeadReason, DeliveryId, FencingToken, HeartbeatAck, InMemoryRegistry, RegistryError,
    Status, Target, WorkerHandle, WorkerId,
};

/// One event handed to a worker.
#[derive(Debug)]
pub struct Job {
    /// The worker's target.
    pub target: Target,
    /// The delivery.
    pub event: DeliveryId,
    /// The fencing token of this assignment.
    pub token: FencingToken,
}

/// How a worker task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It finished its loop after a drain (or its idle time) and the registry recorded a clean exit.
    Exited,
    /// The registry refused it (declared dead while it was silent or slow): it stopped at once.
    Fenced,
    /// It was told to crash and stopped heartbeating.
    Crashed,
}

/// Timings of a simulated worker.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// One loop's duration (per event).
    pub work: Duration,
    /// How long it waits for another event before it leaves.
    pub idle: Duration,
}

/// What ended a stretch of waiting.
enum Wake {
    Crash,
    Fenced,
}

/// Runs a worker until it exits, is fenced or crashes.
pub async fn run<C: Clock>(
    registry: InMemoryRegistry<C>,
    me: WorkerHandle<C>,
    mut jobs: mpsc::Receiver<Job>,
    crash: Arc<Notify>,
    t: Timings,
) -> Exit {
    let id = me.id();
    let mut beat = interval(t.heartbeat);
    // Delay: a late tick is not bunched up; one heartbeat covers any number of missed ones.
    beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut idle_until = Instant::now() + t.idle;
    let mut draining = false;
    loop {
        let job = tokio::select! {
            biased;
            () = crash.notified() => return Exit::Crashed,
            _ = beat.tick() => {
                match me.heartbeat() {
                    Ok(HeartbeatAck::Draining) => {
                        // Drained between loops: an event was assigned just before the drain (that
                        // is what made the worker busy, hence draining rather than exited at once).
                        // It is this worker's last loop if it has arrived; otherwise leave, and the
                        // sweep releases its claim for re-dispatch.
                        draining = true;
                        match jobs.try_recv() {
                            Ok(job) => job,
                            Err(_) => return finish(&me),
                        }
                    }
                    Ok(_) => continue,
                    Err(e) => return fenced(id, &e),
                }
            }
            job = jobs.recv() => match job {
                Some(job) => job,
                // The router dropped the mailbox (only at shutdown): leave cleanly.
                None => return leave(&me),
            },
            () = sleep_until(idle_until) => {
                // Nothing to do for a while: leave. Draining an idle worker is an immediate clean exit;
                // if an event was assigned a moment ago, the worker is busy and drains instead.
                match registry.drain(id) {
                    Ok(Status::Draining) => {
                        // That event is on its way: it is the last loop (or, if it never comes, the
                        // next heartbeat ends the worker and the sweep releases it).
                        draining = true;
                        idle_until = Instant::now() + t.idle;
                        continue;
                    }
                    Ok(_) => return Exit::Exited,
                    Err(e) => return fenced(id, &e),
                }
            }
        };
        // One or more loops, back to back while events are queued.
        let mut next = Some(job);
        while let Some(job) = next.take() {
            if let Err(e) = me.loop_started() {
                return fenced(id, &e);
            }
            tracing::debug!(worker = %id, target = %job.target, event = %job.event, token = %job.token, "loop started");
            match work(&me, &mut beat, &crash, t.work, &mut draining).await {
                Ok(()) => {}
                Err(Wake::Crash) => return Exit::Crashed,
                Err(Wake::Fenced) => return Exit::Fenced,
            }
            if let Err(e) = me.complete(&job.target, &job.event) {
                // Declared dead mid-loop: the event was released and is re-dispatched elsewhere.
                tracing::warn!(worker = %id, event = %job.event, "completion refused: {e}");
            }
            if draining {
                break;
            }
            // Another event is queued: run it back to back, unless a drain came in mid-loop (the
            // queued event is then left to the sweep, which releases it once this worker is gone).
            if let Ok(queued) = jobs.try_recv() {
                match me.heartbeat() {
                    Ok(HeartbeatAck::Draining) => draining = true,
                    Ok(_) => next = Some(queued),
                    Err(e) => return fenced(id, &e),
                }
            }
        }
        match me.loop_finished() {
            Ok(Status::Dead(_)) => return Exit::Exited,
            Ok(_) => idle_until = Instant::now() + t.idle,
            Err(e) => return fenced(id, &e),
        }
    }
}

/// One loop: `work` of simulated time, heartbeating meanwhile.
async fn work<C: Clock>(
    me: &WorkerHandle<C>,
    beat: &mut tokio::time::Interval,
    crash: &Notify,
    work: Duration,
    draining: &mut bool,
) -> Result<(), Wake> {
    let done = sleep(work);
    tokio::pin!(done);
    loop {
        tokio::select! {
            biased;
            () = crash.notified() => return Err(Wake::Crash),
            () = &mut done => return Ok(()),
            _ = beat.tick() => match me.heartbeat() {
                Ok(HeartbeatAck::Draining) => *draining = true,
                Ok(_) => {}
                Err(e) => {
                    fenced(me.id(), &e);
                    return Err(Wake::Fenced);
                }
            },
        }
    }
}

/// Ends the (draining) worker's last loop: the registry records the clean exit.
fn finish<C: Clock>(me: &WorkerHandle<C>) -> Exit {
    match me.loop_finished() {
        Ok(_) => Exit::Exited,
        Err(e) => fenced(me.id(), &e),
    }
}

/// Leaves without being asked (mailbox closed).
fn leave<C: Clock>(me: &WorkerHandle<C>) -> Exit {
    match me.deregister() {
        Ok(_) => Exit::Exited,
        Err(e) => fenced(me.id(), &e),
    }
}

/// The registry refused a call: the worker is dead. If it was drained while idle (an immediate
/// clean exit) or deregistered, that is an ordinary exit; otherwise it was fenced.
fn fenced(id: WorkerId, e: &RegistryError) -> Exit {
    match e {
        RegistryError::WorkerDead {
            reason: DeadReason::Exited | DeadReason::Deregistered,
            ..
        } => Exit::Exited,
        _ => {
            tracing::info!(worker = %id, "worker stops: {e}");
            Exit::Fenced
        }
    }
}
