//! Every registry call the router makes, timed in one place: [`Timed`] wraps the registry the
//! [`App`](crate::app::App) is given (so the webhook path, the workers, the sweeper, the admin
//! API and the probes all go through it) and records each call's duration in
//! `webhook_router_registry_call_duration_seconds{call,backend,outcome}`: `ok`, `refused` (the
//! registry answered no: a dead or unknown worker, a bad argument) or `unavailable` (the backend
//! could not answer: [`RegistryError::is_retryable`]). The snapshot, the counters and the
//! configuration are read without I/O and not timed.

use super::histogram::{Family, Histogram, BUCKETS};

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use worker_registry::{
    Admission, AssignOutcome, ClaimOutcome, DeadReason, DeliveryId, DrainAll, HeartbeatAck,
    Maintenance, Payload, RegistryConfig, RegistryError, ReleasedEvent, Stats, Status,
    StatusSnapshot, Subscribe, Subscription, SweepReport, Target, WorkerId, WorkerInfo,
    WorkerRegistry,
};

/// Every `call` label, in the order of the calls' histograms.
pub const CALLS: [&str; 17] = [
    "admit",
    "payload",
    "claim",
    "release",
    "complete",
    "complete_by",
    "assign",
    "heartbeat",
    "loop_started",
    "loop_finished",
    "register",
    "deregister",
    "drain_within",
    "drain_all_within",
    "worker",
    "sweep",
    "acknowledge",
];

/// Every `outcome` label.
pub const CALL_OUTCOMES: [&str; 3] = ["ok", "refused", "unavailable"];

/// A registry call (an index into [`CALLS`]).
#[derive(Debug, Clone, Copy)]
#[repr(usize)]
enum Call {
    Admit,
    Payload,
    Claim,
    Release,
    Complete,
    CompleteBy,
    Assign,
    Heartbeat,
    LoopStarted,
    LoopFinished,
    Register,
    Deregister,
    DrainWithin,
    DrainAllWithin,
    Worker,
    Sweep,
    Acknowledge,
}

/// The durations of one backend's calls, a histogram per (call, outcome) (cheap to clone).
#[derive(Clone)]
pub struct RegistryCalls {
    series: Arc<[Arc<Histogram>]>,
}

impl RegistryCalls {
    /// The histograms of `backend` (`memory`, `redis`, `postgres`), added to `family`.
    pub fn new(backend: &'static str, family: &mut Family) -> Self {
        let mut series = Vec::with_capacity(CALLS.len() * CALL_OUTCOMES.len());
        for call in CALLS {
            for outcome in CALL_OUTCOMES {
                let labels = vec![("call", call), ("backend", backend), ("outcome", outcome)];
                series.push(family.series(labels, BUCKETS));
            }
        }
        Self {
            series: series.into(),
        }
    }

    /// The family these go in.
    pub fn family() -> Family {
        Family::new(
            "webhook_router_registry_call_duration",
            "Duration of the router's registry calls, by call and backend and outcome.",
        )
    }

    fn observe<T>(&self, call: Call, result: &Result<T, RegistryError>, took: Duration) {
        let outcome = match result {
            Ok(_) => 0,
            Err(e) if e.is_retryable() => 2,
            Err(_) => 1,
        };
        self.series[call as usize * CALL_OUTCOMES.len() + outcome].observe(took);
    }

    /// The number of `call`s timed with `outcome` so far (for tests and the summary).
    pub fn count(&self, call: &str, outcome: &str) -> u64 {
        let c = CALLS.iter().position(|c| *c == call);
        let o = CALL_OUTCOMES.iter().position(|o| *o == outcome);
        match (c, o) {
            (Some(c), Some(o)) => self.series[c * CALL_OUTCOMES.len() + o].count(),
            _ => 0,
        }
    }
}

/// A registry whose every call is timed into [`RegistryCalls`].
pub struct Timed<R> {
    inner: R,
    calls: RegistryCalls,
}

impl<R> Timed<R> {
    /// `inner`, timed into `calls`.
    pub fn new(inner: R, calls: RegistryCalls) -> Self {
        Self { inner, calls }
    }

    fn time<F, T>(
        &self,
        call: Call,
        fut: F,
    ) -> impl Future<Output = F::Output> + Send + use<R, F, T>
    where
        F: Future<Output = Result<T, RegistryError>> + Send,
    {
        let calls = self.calls.clone();
        async move {
            let started = Instant::now();
            let result = fut.await;
            calls.observe(call, &result, started.elapsed());
            result
        }
    }
}

impl<R: WorkerRegistry> WorkerRegistry for Timed<R> {
    fn admit_with(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        payload: Option<&Payload>,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        let fut = self.inner.admit_with(target, delivery, payload);
        self.time(Call::Admit, fut)
    }
    fn payload(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Payload>, RegistryError>> + Send {
        self.time(Call::Payload, self.inner.payload(target, delivery))
    }
    fn claim(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send {
        self.time(Call::Claim, self.inner.claim(target, delivery))
    }
    fn release(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        self.time(Call::Release, self.inner.release(target, delivery))
    }
    /// Timed as `complete` without a holder and `complete_by` with one (the two calls of
    /// `WorkerRegistryExt` it answers).
    fn complete_as(
        &self,
        holder: Option<WorkerId>,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        let call = match holder {
            None => Call::Complete,
            Some(_) => Call::CompleteBy,
        };
        self.time(call, self.inner.complete_as(holder, target, delivery))
    }
    fn assign(
        &self,
        target: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send {
        self.time(Call::Assign, self.inner.assign(target))
    }
    fn heartbeat(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send {
        self.time(Call::Heartbeat, self.inner.heartbeat(worker))
    }
    fn loop_started(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.time(Call::LoopStarted, self.inner.loop_started(worker))
    }
    fn loop_finished(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.time(Call::LoopFinished, self.inner.loop_finished(worker))
    }
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send {
        self.time(Call::Register, self.inner.register())
    }
    fn deregister(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send {
        self.time(Call::Deregister, self.inner.deregister(worker))
    }
    fn drain_within(
        &self,
        worker: WorkerId,
        deadline: Duration,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.time(Call::DrainWithin, self.inner.drain_within(worker, deadline))
    }
    fn drain_all_within(
        &self,
        deadline: Duration,
    ) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send {
        self.time(Call::DrainAllWithin, self.inner.drain_all_within(deadline))
    }
    fn worker(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send {
        self.time(Call::Worker, self.inner.worker(worker))
    }
    fn status(&self) -> Arc<StatusSnapshot> {
        self.inner.status()
    }
    fn stats(&self) -> Stats {
        self.inner.stats()
    }
    /// Not timed: an audit is no call of the router's request path.
    fn audit(&self) -> impl Future<Output = Result<worker_registry::Audit, RegistryError>> + Send {
        self.inner.audit()
    }
    fn config(&self) -> &RegistryConfig {
        self.inner.config()
    }
}

impl<R: Maintenance> Maintenance for Timed<R> {
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send {
        self.time(Call::Sweep, self.inner.sweep())
    }
    fn acknowledge(
        &self,
        released: &[ReleasedEvent],
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        self.time(Call::Acknowledge, self.inner.acknowledge(released))
    }
    fn wake(&self) -> impl Future<Output = ()> + Send {
        self.inner.wake()
    }
}

impl<R: Subscribe> Subscribe for Timed<R> {
    fn subscribe(&self) -> Subscription {
        self.inner.subscribe()
    }
}
