//! The router over a backend that cannot answer: every registry call is awaited, a failure is a
//! typed error, answered 503 with `Retry-After` (the delivery was not accepted), never a panic and
//! never a lost delivery. The backend here is the in-memory registry behind a switch that makes
//! every call fail as a lost connection would.

mod common;

use common::*;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use worker_registry::{
    Admission, AssignOutcome, ClaimOutcome, DeadReason, DeliveryId, DrainAll, DynRegistry,
    HeartbeatAck, InMemoryRegistry, Maintenance, Payload, RegistryConfig, RegistryError,
    ReleasedEvent, Stats, Status, StatusSnapshot, Subscribe, Subscription, SweepReport, Target,
    TokioClock, WorkerId, WorkerInfo, WorkerRegistry,
};

/// The in-memory registry, failing every call while `down` is set (reads of the snapshot, the
/// counters and the config never fail: they do no I/O in any backend).
#[derive(Clone)]
struct Flaky {
    inner: InMemoryRegistry<TokioClock>,
    down: Arc<AtomicBool>,
}

impl Flaky {
    fn fail<T>(&self) -> Option<Result<T, RegistryError>> {
        // SeqCst: a test switch flipped between awaits; the strongest ordering costs nothing here.
        self.down.load(Ordering::SeqCst).then(|| {
            Err(RegistryError::backend(
                "flaky",
                true,
                "connection refused (test switch)",
            ))
        })
    }
}

/// Fails now if the switch is on; otherwise makes the call. (The in-memory backend does its work
/// when its method is called, not when the future is polled: the call must not even be made.)
macro_rules! guarded {
    ($self:ident, |$inner:ident| $call:expr) => {{
        let failed = $self.fail();
        let $inner = $self.inner.clone();
        async move {
            match failed {
                Some(e) => e,
                None => $call.await,
            }
        }
    }};
}

impl WorkerRegistry for Flaky {
    fn admit_with(
        &self,
        t: &Target,
        d: &DeliveryId,
        p: Option<&Payload>,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::admit_with(&inner, t, d, p))
    }
    fn payload(
        &self,
        t: &Target,
        d: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Payload>, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::payload(&inner, t, d))
    }
    fn claim(
        &self,
        t: &Target,
        d: &DeliveryId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::claim(&inner, t, d))
    }
    fn release(
        &self,
        t: &Target,
        d: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::release(&inner, t, d))
    }
    fn complete_as(
        &self,
        w: Option<WorkerId>,
        t: &Target,
        d: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::complete_as(&inner, w, t, d))
    }
    fn assign(
        &self,
        t: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::assign(&inner, t))
    }
    fn heartbeat(
        &self,
        w: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::heartbeat(&inner, w))
    }
    fn loop_started(
        &self,
        w: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::loop_started(&inner, w))
    }
    fn loop_finished(
        &self,
        w: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::loop_finished(&inner, w))
    }
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::register(&inner))
    }
    fn deregister(
        &self,
        w: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::deregister(&inner, w))
    }
    fn drain_within(
        &self,
        w: WorkerId,
        d: Duration,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::drain_within(&inner, w, d))
    }
    fn drain_all_within(
        &self,
        d: Duration,
    ) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::drain_all_within(&inner, d))
    }
    fn worker(
        &self,
        w: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send {
        guarded!(self, |inner| WorkerRegistry::worker(&inner, w))
    }
    fn status(&self) -> Arc<StatusSnapshot> {
        WorkerRegistry::status(&self.inner)
    }
    fn stats(&self) -> Stats {
        WorkerRegistry::stats(&self.inner)
    }
    fn config(&self) -> &RegistryConfig {
        WorkerRegistry::config(&self.inner)
    }
}

impl Maintenance for Flaky {
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send {
        guarded!(self, |inner| Maintenance::sweep(&inner))
    }
    fn acknowledge(
        &self,
        released: &[ReleasedEvent],
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        guarded!(self, |inner| Maintenance::acknowledge(&inner, released))
    }
}

impl Subscribe for Flaky {
    fn subscribe(&self) -> Subscription {
        Subscribe::subscribe(&self.inner)
    }
}

async fn flaky_router(setup: Setup) -> (Harness, Arc<AtomicBool>) {
    let down = Arc::new(AtomicBool::new(false));
    let switch = down.clone();
    let h = start_with(setup, move |inner| {
        DynRegistry::new(Flaky {
            inner,
            down: switch,
        })
    })
    .await;
    (h, down)
}

fn set(down: &AtomicBool, on: bool) {
    // SeqCst: see `Flaky::fail`.
    down.store(on, Ordering::SeqCst);
}

#[tokio::test(start_paused = true)]
async fn a_failed_admission_is_503_with_retry_after_and_accepts_nothing() {
    let (h, down) = flaky_router(Setup::default()).await;
    set(&down, true);
    let refused = h.deliver("pull_request", "b-1", &pr("o/r", 1)).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body["outcome"], "unavailable");
    assert!(refused.body["reason"]
        .as_str()
        .unwrap()
        .contains("connection refused"));
    assert!(refused.retry_after.is_some_and(|s| s >= 1));
    // The delivery was not accepted: no claim, and once the backend is back its redelivery is
    // admitted as new rather than skipped as a duplicate.
    assert_eq!(h.memory.direct().claim_count(), 0);
    set(&down, false);
    let again = h.deliver("pull_request", "b-1", &pr("o/r", 1)).await;
    assert_eq!(again.status, StatusCode::ACCEPTED);
    assert_eq!(again.body["outcome"], "assigned");
    // The admin API answers 503 for a live read while the backend is down.
    set(&down, true);
    let w = worker_of(&again);
    let live = h.get(&format!("/workers/{w}")).await;
    assert_eq!(live.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(live.retry_after, Some(1), "503 with Retry-After");
    set(&down, false);
}

/// A short outage (below the heartbeat timeout) while a worker works: its heartbeats and the
/// sweeps fail, nothing panics, the worker is not fenced, and its delivery is completed once the
/// backend answers again.
#[tokio::test(start_paused = true)]
async fn workers_and_the_sweeper_ride_out_a_short_outage() {
    let (h, down) = flaky_router(Setup {
        work: Duration::from_millis(400),
        ..Setup::default()
    })
    .await;
    let a = h.deliver("pull_request", "o-1", &pr("o/r", 1)).await;
    let w = worker_of(&a);
    set(&down, true);
    tokio::time::sleep(HEARTBEAT * 2).await;
    set(&down, false);
    let done = eventually(|| async {
        let d = h.deliver("pull_request", "o-1", &pr("o/r", 1)).await;
        (d.body["state"] == "completed").then_some(d)
    })
    .await;
    assert_eq!(worker_of(&done), w);
    assert_eq!(h.until_status(w, "active").await["target"], "o/r#1");
    assert!(h.server.sweeper_running());
    let metrics = h.get("/metrics").await;
    let text = metrics.body.as_str().unwrap().to_owned();
    let errors: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("worker_registry_sweeper_errors_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(errors >= 1.0, "the failed sweeps are counted:\n{text}");
}

/// Issue 37: `/readyz` reads the backend: 503 `unavailable` (with the error) while it cannot
/// answer, 200 once it does again (a verdict lives a second); `/healthz` stays 200 throughout.
#[tokio::test(start_paused = true)]
async fn readiness_follows_the_backend() {
    let (h, down) = flaky_router(Setup::default()).await;
    assert_eq!(h.get("/readyz").await.status, StatusCode::OK);
    // The verdict is reused for a second: the outage shows once it is older.
    set(&down, true);
    assert_eq!(h.get("/readyz").await.status, StatusCode::OK, "reused");
    tokio::time::advance(webhook_router::http::probes::READINESS_TTL).await;
    let not_ready = h.get("/readyz").await;
    assert_eq!(not_ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        not_ready.body["status"], "unavailable",
        "{}",
        not_ready.body
    );
    assert!(not_ready.body["reason"]
        .as_str()
        .unwrap()
        .contains("connection refused"));
    assert_eq!(not_ready.retry_after, Some(1));
    assert_eq!(h.get("/healthz").await.status, StatusCode::OK);
    set(&down, false);
    tokio::time::advance(webhook_router::http::probes::READINESS_TTL).await;
    assert_eq!(h.get("/readyz").await.status, StatusCode::OK);
}
