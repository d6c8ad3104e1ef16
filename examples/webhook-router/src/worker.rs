//! The simulated worker container: one tokio task per worker the registry creates (started by the
//! `task` launcher, [`crate::launcher::task`]), talking to the registry only through its contract
//! ([`WorkerRegistry`]), so it runs on any backend.
//!
//! It heartbeats every heartbeat interval (also while it works), runs one loop of `work` per event
//! handed to it (`loop_started` .. `complete_by` .. `loop_finished`), runs events queued in its
//! mailbox back to back, and:
//!
//! * honours drain (a heartbeat answered `Draining`, or its mailbox closed at shutdown): it finishes
//!   every event already queued, then exits;
//! * stops when it is fenced (a call refused because the registry declared it dead);
//! * leaves by itself after `idle` without events;
//! * can be told to crash: it then simply stops, with no goodbye, as a killed container would, and
//!   only the sweep notices;
//! * can be told to stop now (the shutdown deadline passed): it deregisters, which releases its
//!   claims through the registry, and hands back the events it did not finish.
//!
//! A call that fails because the backend cannot answer ([`RegistryError::is_retryable`]) is not a
//! verdict: a heartbeat is simply tried again at the next tick, a completion a few times.

use crate::mailbox::Mailbox;
use crate::runs::Runs;
use crate::telemetry::{self, Traces};
use worker_registry::WorkerRegistryExt;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::{interval, sleep, sleep_until, Instant, Interval, MissedTickBehavior};
use tracing::Instrument;
use worker_registry::{
    DeadReason, DynRegistry, HeartbeatAck, RegistryError, Status, WorkerId, WorkerRegistry,
};

/// How often a completion refused by an unavailable backend is tried (the claim is not lost if all
/// fail: it stays in flight and the registry releases it after `max_in_flight`).
const COMPLETE_ATTEMPTS: u32 = 3;

/// One event handed to a worker (it lives with the mailbox that carries it).
pub use crate::mailbox::Job;

/// How a worker ended (the launchers' common vocabulary).
pub use crate::launcher::Exit;

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

/// What a worker task is given.
pub struct Worker {
    /// The registry (any backend).
    pub registry: DynRegistry,
    /// Its id.
    pub id: WorkerId,
    /// Its events: its mailbox, then the overflow behind it, in arrival order.
    pub jobs: Mailbox,
    /// Notified to make it crash.
    pub crash: Arc<Notify>,
    /// Becomes `true` when it must stop at once (the shutdown deadline passed).
    pub stop: watch::Receiver<bool>,
    /// Its timings.
    pub timings: Timings,
    /// The process's handed-over events' trace contexts (a completed event is forgotten there).
    pub traces: Arc<Traces>,
    /// Where it records what each completed loop ran on (see [`crate::runs`]).
    pub runs: Arc<Runs>,
}

/// What interrupted a loop.
enum Wake {
    Crash,
    Fenced(Exit),
    Stop,
}

/// `now + d`, or a far-away instant if that overflows (durations are bounded at validation, this is
/// the belt to those braces).
pub(crate) fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(366 * 24 * 3600)))
        .unwrap_or(now)
}

/// What a heartbeat told the worker.
enum Beat {
    /// Recorded; carry on, or finish and exit.
    Ack(HeartbeatAck),
    /// The backend could not answer: try again at the next tick.
    Unavailable,
    /// The registry refused it: the worker is dead; end with this.
    Dead(Exit),
}

impl Worker {
    /// Runs the worker until it exits, is fenced, crashes or is stopped.
    pub async fn run(mut self) -> Exit {
        let mut beat = interval(self.timings.heartbeat);
        // Delay: a late tick is not bunched up; one heartbeat covers any number of missed ones.
        beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut idle_until = deadline_after(self.timings.idle);
        loop {
            let crash = self.crash.clone();
            let mut stop = self.stop.clone();
            let first = tokio::select! {
                biased;
                () = crash.notified() => return Exit::Crashed,
                () = stopped(&mut stop) => return self.stop_now(Vec::new()).await,
                _ = beat.tick() => match self.heartbeat().await {
                    Beat::Ack(HeartbeatAck::Draining) => {
                        // Drained between loops. An event admitted just before the drain (which is
                        // what made the worker busy, hence draining rather than exited at once) is
                        // run first; otherwise there is nothing left to do.
                        match self.jobs.try_recv() {
                            Some(job) => job,
                            None => return self.finish().await,
                        }
                    }
                    Beat::Ack(_) | Beat::Unavailable => continue,
                    Beat::Dead(exit) => return exit,
                },
                job = self.jobs.recv() => match job {
                    Some(job) => job,
                    // The router closed the mailbox (shutdown) and every queued event is done.
                    None => return self.leave().await,
                },
                () = sleep_until(idle_until) => {
                    // Nothing to do for a while: leave. Draining an idle worker is an immediate clean
                    // exit; if an event was admitted a moment ago the worker is busy and drains instead.
                    match self.registry.drain(self.id).await {
                        Ok(Status::Draining) => {
                            // That event is on its way: it is the last loop (or, if it never comes,
                            // the next heartbeat ends the worker and the sweep releases its claim).
                            idle_until = deadline_after(self.timings.idle);
                            continue;
                        }
                        Ok(_) => return Exit::Exited,
                        Err(e) if e.is_retryable() => {
                            idle_until = deadline_after(self.timings.idle);
                            continue;
                        }
                        Err(e) => return fenced(self.id, &e),
                    }
                }
            };
            // Loops back to back while events are queued. A draining worker finishes the events
            // already in its mailbox too: they were accepted (answered 202), and leaving them behind
            // would only have the sweep re-dispatch them to another worker later (or, at shutdown,
            // not at all).
            let mut next = Some(first);
            while let Some(job) = next.take() {
                // The loop's span continues the trace the event was dispatched in.
                let span = telemetry::loop_span(self.id, job.token, &job.trace);
                if let Err(exit) = self.one_loop(job, &mut beat).instrument(span).await {
                    return exit;
                }
                next = self.jobs.try_recv();
            }
            match self.registry.loop_finished(self.id).await {
                Ok(Status::Dead(_)) => return Exit::Exited,
                Ok(_) => idle_until = deadline_after(self.timings.idle),
                Err(e) if e.is_retryable() => idle_until = deadline_after(self.timings.idle),
                Err(e) => return fenced(self.id, &e),
            }
        }
    }

    /// One event's loop, `loop_started` .. `complete_by`; `Err` with how the worker ends if it
    /// ends meanwhile. Runs in the event's [`telemetry::loop_span`], which records the `outcome`.
    async fn one_loop(&mut self, job: Job, beat: &mut Interval) -> Result<(), Exit> {
        let span = tracing::Span::current();
        match self.registry.loop_started(self.id).await {
            Ok(_) => {}
            // Not recorded; the loop runs anyway and its completion tells the registry.
            Err(e) if e.is_retryable() => {}
            // Dead: its claims were released and the sweep re-dispatches them.
            Err(e) => {
                span.record("outcome", "fenced");
                return Err(fenced(self.id, &e));
            }
        }
        tracing::debug!(worker = %self.id, target = %job.target, event = %job.event, token = %job.token, "loop started");
        let woken = match self.work(beat).await {
            Ok(()) => None,
            Err(Wake::Crash) => Some(("crashed", Exit::Crashed)),
            Err(Wake::Fenced(exit)) => Some(("fenced", exit)),
            Err(Wake::Stop) => Some(("stopped", self.stop_now(vec![job.clone()]).await)),
        };
        if let Some((outcome, exit)) = woken {
            span.record("outcome", outcome);
            return Err(exit);
        }
        let recorded = self
            .complete(&job)
            .instrument(telemetry::complete_span())
            .await;
        let outcome = if recorded {
            "completed"
        } else {
            "not_recorded"
        };
        span.record("outcome", outcome);
        if recorded {
            // The simulated work "reads" the event: what it ran on is recorded for the audit.
            self.runs
                .ran(self.id, &job.target, &job.event, job.payload.as_ref());
        }
        tracing::debug!(worker = %self.id, target = %job.target, event = %job.event, outcome, "loop finished");
        self.traces.completed(&job.target, &job.event);
        Ok(())
    }

    async fn heartbeat(&self) -> Beat {
        match self.registry.heartbeat(self.id).await {
            Ok(ack) => Beat::Ack(ack),
            Err(e) if e.is_retryable() => {
                tracing::warn!(worker = %self.id, "heartbeat not recorded, trying again at the next tick: {e}");
                Beat::Unavailable
            }
            Err(e) => Beat::Dead(fenced(self.id, &e)),
        }
    }

    /// One loop: `work` of simulated time, heartbeating meanwhile. A drain noticed meanwhile
    /// changes nothing here: the worker finishes its queue either way, and the registry makes its
    /// `loop_finished` an exit.
    async fn work(&self, beat: &mut tokio::time::Interval) -> Result<(), Wake> {
        let done = sleep(self.timings.work);
        tokio::pin!(done);
        let mut stop = self.stop.clone();
        loop {
            tokio::select! {
                biased;
                () = self.crash.notified() => return Err(Wake::Crash),
                () = stopped(&mut stop) => return Err(Wake::Stop),
                () = &mut done => return Ok(()),
                _ = beat.tick() => if let Beat::Dead(exit) = self.heartbeat().await {
                    return Err(Wake::Fenced(exit));
                },
            }
        }
    }

    /// Records the completion, fenced by the worker id; a few attempts if the backend cannot answer.
    /// Whether it was recorded (also on the current span, [`telemetry::complete_span`]).
    async fn complete(&self, job: &Job) -> bool {
        let recorded = self.complete_attempts(job).await;
        tracing::Span::current().record("recorded", recorded);
        recorded
    }

    async fn complete_attempts(&self, job: &Job) -> bool {
        for attempt in 1..=COMPLETE_ATTEMPTS {
            match self
                .registry
                .complete_by(self.id, &job.target, &job.event)
                .await
            {
                Ok(()) => return true,
                Err(e) if e.is_retryable() && attempt < COMPLETE_ATTEMPTS => {
                    sleep(self.timings.heartbeat / 4).await;
                }
                Err(e) => {
                    // Declared dead mid-loop (the event was released and is re-dispatched elsewhere),
                    // or the backend stayed away (the claim stays in flight until `max_in_flight`
                    // releases it for re-dispatch).
                    tracing::warn!(worker = %self.id, event = %job.event, "completion not recorded: {e}");
                    return false;
                }
            }
        }
        false
    }

    /// Ends the (draining) worker's last loop: the registry records the clean exit.
    async fn finish(&self) -> Exit {
        match self.registry.loop_finished(self.id).await {
            Ok(_) => Exit::Exited,
            Err(e) => fenced(self.id, &e),
        }
    }

    /// Leaves without being asked (mailbox closed, queue done).
    async fn leave(&self) -> Exit {
        match self.registry.deregister(self.id).await {
            Ok(_) => Exit::Exited,
            Err(e) => fenced(self.id, &e),
        }
    }

    /// The shutdown deadline passed: deregister (which releases every claim of this worker through
    /// the registry, so a shared backend's other replicas or the next start can pick them up) and
    /// hand back the events that were not completed: `unfinished` and everything still queued.
    async fn stop_now(&mut self, mut unfinished: Vec<Job>) -> Exit {
        self.jobs.close();
        while let Some(job) = self.jobs.try_recv() {
            unfinished.push(job);
        }
        match self.registry.deregister(self.id).await {
            Ok(_) | Err(RegistryError::WorkerDead { .. } | RegistryError::UnknownWorker { .. }) => {
            }
            Err(e) => tracing::warn!(
                worker = %self.id,
                "could not deregister at shutdown ({e}); the registry releases its claims when it declares it dead"
            ),
        }
        Exit::Stopped(unfinished)
    }
}

/// Resolves once the stop flag is set (or its sender is gone: the router is gone too).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`: drop it here, before any caller awaits more.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
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
