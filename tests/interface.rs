//! The seam seen from outside the crate: code written against the contract traits runs on the
//! in-memory registry, on a `DynRegistry` chosen at run time, and on fakes written here with
//! nothing but public constructors, which return every outcome, answer like an unreachable
//! networked backend, and are served by the library's admin router and metrics.

use std::future::{ready, Future};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use worker_registry::WorkerRegistryExt;

use worker_registry::{
    Admission, AlreadyClaimed, AssignOutcome, Assignment, ClaimCounts, ClaimOutcome, ClaimState,
    DeadReason, DeliveryId, DrainAll, DynRegistry, FencingToken, HeartbeatAck, InMemoryRegistry,
    Maintenance, Payload, RegistryConfig, RegistryError, Rejection, ReleaseReason, ReleasedEvent,
    Stats, Status, StatusSnapshot, Subscribe, Subscription, SweepReport, Target, WorkerId,
    WorkerInfo, WorkerKind, WorkerRegistry,
};

/// What a router does with one delivery, written against the trait only.
async fn route<R: WorkerRegistry>(registry: &R, target: &Target, delivery: &DeliveryId) -> u16 {
    match registry.admit(target, delivery).await {
        Ok(Admission::Assigned(_)) => 202,
        Ok(Admission::Duplicate(_)) => 200,
        Ok(Admission::Waiting(_)) => 202,
        Ok(Admission::Rejected(_)) => 503,
        Err(e) if e.is_retryable() => 503,
        Err(_) => 500,
    }
}

fn t(n: u64) -> Target {
    Target::new("octo/repo", n).unwrap()
}

fn d(s: &str) -> DeliveryId {
    DeliveryId::new(s).unwrap()
}

/// A fake backend built from public constructors only: it answers from a script of outcomes
/// keyed by delivery id, and records every call.
struct Scripted {
    config: RegistryConfig,
    calls: Mutex<Vec<String>>,
    snapshot: Arc<StatusSnapshot>,
    events: worker_registry::events::EventSender,
}

const WORKER: WorkerId = WorkerId::new(7);
/// The fake's drain deadline: not the library's default, so a `drain` that passed the default
/// instead of the config's would show.
const FAKE_DRAIN_DEADLINE: Duration = Duration::from_secs(17);

impl Scripted {
    fn new() -> Self {
        let started = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let mut busy = WorkerInfo::new(WORKER, Some(t(1)), WorkerKind::Spawned, started);
        busy.activity = worker_registry::Activity::Busy;
        busy.has_heartbeated = true;
        busy.token = FencingToken::new(WORKER, 3).unwrap();
        let mut dead = WorkerInfo::new(WorkerId::new(6), None, WorkerKind::Registered, started);
        dead.status = Status::Dead(DeadReason::DrainTimedOut);
        dead.died_at = Some(started + Duration::from_secs(60));
        let mut claims = ClaimCounts::default();
        claims.in_flight = 1;
        let snapshot = StatusSnapshot::new(
            42,
            started + Duration::from_secs(90),
            Duration::from_secs(90),
            vec![busy, dead],
            8,
            false,
            claims,
        );
        Self {
            config: RegistryConfig::builder()
                .max_workers(8)
                .drain_deadline(FAKE_DRAIN_DEADLINE)
                .build()
                .unwrap(),
            calls: Mutex::new(Vec::new()),
            snapshot: Arc::new(snapshot),
            events: worker_registry::events::EventSender::new(),
        }
    }

    fn answer<T: Send>(&self, call: String, v: T) -> impl Future<Output = T> + Send {
        self.calls.lock().unwrap().push(call);
        ready(v)
    }
}

impl WorkerRegistry for Scripted {
    fn admit_with(
        &self,
        target: &Target,
        delivery: &DeliveryId,
        _: Option<&Payload>,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        let token = FencingToken::new(WORKER, 4).unwrap();
        let outcome = match delivery.as_str() {
            "new" => Admission::Assigned(Assignment::new(WORKER, token, true)),
            "dup" => Admission::Duplicate(AlreadyClaimed::new(
                Some(WORKER),
                SystemTime::UNIX_EPOCH,
                ClaimState::Completed,
            )),
            "full" => Admission::Rejected(Rejection::CapacityFull { limit: 8 }),
            "budget" => Admission::Rejected(Rejection::PayloadBudget {
                held: 90,
                needed: 20,
                limit: 100,
            }),
            _ => Admission::Rejected(Rejection::TargetDraining { worker: WORKER }),
        };
        self.answer(format!("admit {target} {delivery}"), Ok(outcome))
    }
    fn payload(
        &self,
        _: &Target,
        _: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Payload>, RegistryError>> + Send {
        self.answer("payload".into(), Ok(None))
    }
    fn claim(
        &self,
        _: &Target,
        _: &DeliveryId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send {
        self.answer("claim".into(), Ok(ClaimOutcome::Claimed))
    }
    fn release(
        &self,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        let err = RegistryError::ClaimCompleted {
            target: target.clone(),
            delivery: delivery.clone(),
        };
        self.answer("release".into(), Err(err))
    }
    fn complete_as(
        &self,
        holder: Option<WorkerId>,
        target: &Target,
        delivery: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        let Some(worker) = holder else {
            return self.answer("complete".into(), Ok(()));
        };
        let err = RegistryError::ClaimReleased {
            target: target.clone(),
            delivery: delivery.clone(),
            holder: Some(worker),
            reason: ReleaseReason::Stuck,
        };
        self.answer("complete_by".into(), Err(err))
    }
    fn assign(
        &self,
        _: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send {
        let a = Assignment::new(WORKER, FencingToken::new(WORKER, 5).unwrap(), false);
        self.answer("assign".into(), Ok(AssignOutcome::Assigned(a)))
    }
    fn heartbeat(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send {
        let ack = if worker == WORKER {
            Ok(HeartbeatAck::Draining)
        } else {
            Err(RegistryError::WorkerDead {
                id: worker,
                reason: DeadReason::MissedHeartbeats,
            })
        };
        self.answer(format!("heartbeat {worker}"), ack)
    }
    fn loop_started(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.answer("loop_started".into(), Ok(Status::Active))
    }
    fn loop_finished(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.answer("loop_finished".into(), Ok(Status::Dead(DeadReason::Exited)))
    }
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send {
        let full = RegistryError::Rejected(Rejection::CapacityFull { limit: 8 });
        self.answer("register".into(), Err(full))
    }
    fn deregister(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send {
        self.answer("deregister".into(), Ok(DeadReason::Deregistered))
    }
    fn drain_within(
        &self,
        worker: WorkerId,
        deadline: Duration,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        let r = if worker == WORKER {
            Ok(Status::Draining)
        } else {
            Err(RegistryError::UnknownWorker { id: worker })
        };
        self.answer(format!("drain {worker} {deadline:?}"), r)
    }
    fn drain_all_within(
        &self,
        _: Duration,
    ) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send {
        let mut done = DrainAll::default();
        done.draining = 1;
        self.answer("drain_all".into(), Ok(done))
    }
    fn worker(
        &self,
        worker: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send {
        let info = self.snapshot.worker(worker).cloned().map(|mut w| {
            if self
                .calls
                .lock()
                .unwrap()
                .iter()
                .any(|c| c.starts_with("drain"))
            {
                w.status = Status::Draining;
            }
            w
        });
        self.answer(format!("worker {worker}"), Ok(info))
    }
    fn status(&self) -> Arc<StatusSnapshot> {
        self.snapshot.clone()
    }
    fn stats(&self) -> Stats {
        let mut s = Stats::default();
        s.admitted_new = 3;
        s.deaths_drain_timed_out = 1;
        s.live_workers = 1;
        s
    }
    fn config(&self) -> &RegistryConfig {
        &self.config
    }
}

impl Maintenance for Scripted {
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send {
        let mut report = SweepReport::default();
        report.swept = true;
        report.version = 43;
        report
            .died
            .push((WorkerId::new(6), DeadReason::DrainTimedOut));
        report.released.push(ReleasedEvent::new(
            t(1),
            d("lost"),
            Some(WorkerId::new(6)),
            ReleaseReason::WorkerDied(DeadReason::DrainTimedOut),
        ));
        self.answer("sweep".into(), Ok(report))
    }
    fn acknowledge(
        &self,
        released: &[ReleasedEvent],
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        self.answer(format!("acknowledge {}", released.len()), Ok(()))
    }
}

impl Subscribe for Scripted {
    fn subscribe(&self) -> Subscription {
        self.events.subscribe()
    }
}

/// A fake that fails like an unreachable networked backend would.
#[derive(Default, Clone)]
struct Unreachable {
    config: RegistryConfig,
}

fn down<T: Send>() -> impl Future<Output = Result<T, RegistryError>> + Send {
    let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    ready(Err(RegistryError::backend("fake", true, refused)))
}

impl WorkerRegistry for Unreachable {
    fn admit_with(
        &self,
        _: &Target,
        _: &DeliveryId,
        _: Option<&Payload>,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        down()
    }
    fn payload(
        &self,
        _: &Target,
        _: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Payload>, RegistryError>> + Send {
        down()
    }
    fn claim(
        &self,
        _: &Target,
        _: &DeliveryId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send {
        down()
    }
    fn release(
        &self,
        _: &Target,
        _: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        down()
    }
    fn complete_as(
        &self,
        _: Option<WorkerId>,
        _: &Target,
        _: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        down()
    }
    fn assign(
        &self,
        _: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send {
        down()
    }
    fn heartbeat(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send {
        down()
    }
    fn loop_started(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        down()
    }
    fn loop_finished(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        down()
    }
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send {
        down()
    }
    fn deregister(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send {
        down()
    }
    fn drain_within(
        &self,
        _: WorkerId,
        _: Duration,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        down()
    }
    fn drain_all_within(
        &self,
        _: Duration,
    ) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send {
        down()
    }
    fn worker(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send {
        down()
    }
    fn status(&self) -> Arc<StatusSnapshot> {
        Arc::new(StatusSnapshot::empty(8, SystemTime::UNIX_EPOCH))
    }
    fn stats(&self) -> Stats {
        Stats::default()
    }
    fn config(&self) -> &RegistryConfig {
        &self.config
    }
}

#[tokio::test]
async fn router_code_runs_against_the_in_memory_registry_statically_and_dynamically() {
    let registry = InMemoryRegistry::default();
    assert_eq!(route(&registry, &t(1), &d("a")).await, 202);
    assert_eq!(route(&registry, &t(1), &d("a")).await, 200);
    let dynamic = DynRegistry::new(registry.clone());
    assert_eq!(route(&dynamic, &t(1), &d("a")).await, 200, "same state");
    assert_eq!(route(&dynamic, &t(2), &d("b")).await, 202);
    let w = dynamic.register().await.unwrap();
    assert_eq!(dynamic.heartbeat(w).await, Ok(HeartbeatAck::Active));
    let report = dynamic.sweep().await.unwrap();
    assert!(report.swept);
    assert_eq!(dynamic.status().version, report.version);
    assert_eq!(dynamic.status().workers.len(), 3);
    assert_eq!(dynamic.stats().admitted_new, 2);
}

#[tokio::test]
async fn a_fake_returns_every_outcome_through_the_seam() {
    let fake = Scripted::new();
    assert_eq!(route(&fake, &t(1), &d("new")).await, 202);
    assert_eq!(route(&fake, &t(1), &d("dup")).await, 200);
    assert_eq!(route(&fake, &t(1), &d("full")).await, 503);
    assert_eq!(route(&fake, &t(1), &d("draining")).await, 503);
    assert_eq!(route(&fake, &t(1), &d("budget")).await, 503);
    // A payload passes through the trait's `admit_with`; `admit` is that call without one.
    let p = Payload::builder("ping", &b"{}"[..]).build().unwrap();
    assert!(matches!(
        fake.admit_with(&t(1), &d("new"), Some(&p)).await,
        Ok(Admission::Assigned(_))
    ));
    assert_eq!(fake.payload(&t(1), &d("new")).await, Ok(None));
    assert_eq!(fake.heartbeat(WORKER).await, Ok(HeartbeatAck::Draining));
    assert!(matches!(
        fake.heartbeat(WorkerId::new(1)).await,
        Err(RegistryError::WorkerDead { .. })
    ));
    assert!(matches!(
        fake.register().await,
        Err(RegistryError::Rejected(Rejection::CapacityFull {
            limit: 8
        }))
    ));
    // Through the dynamic form too, and the default `drain` uses the config's deadline.
    let fake = Arc::new(fake);
    let dynamic = DynRegistry::from_arc(fake.clone());
    assert_eq!(dynamic.drain(WORKER).await, Ok(Status::Draining));
    let drains: Vec<String> = fake
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.starts_with("drain"))
        .cloned()
        .collect();
    assert_eq!(
        drains,
        vec![format!("drain {WORKER} {FAKE_DRAIN_DEADLINE:?}")],
        "the default drain passes the fake's configured deadline (not the library default)"
    );
    assert_ne!(
        FAKE_DRAIN_DEADLINE,
        worker_registry::config::DEFAULT_DRAIN_DEADLINE
    );
    let calls = dynamic.backend().status();
    assert_eq!(calls.version, 42);
    assert_eq!(calls.counts.busy, 1);
    assert_eq!(calls.counts.dead, 1);
    assert_eq!(calls.capacity.used, 1);
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_runs_a_fakes_maintenance_and_acknowledges_what_it_handed_over() {
    let fake = Arc::new(Scripted::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let sweeper = worker_registry::Sweeper::spawn(DynRegistry::from_arc(fake.clone()), move |r| {
        log.lock().unwrap().extend(r.released_pairs());
    });
    tokio::time::sleep(fake.config.sweep_interval() * 2 + Duration::from_millis(1)).await;
    sweeper.shutdown().await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, vec![(t(1), d("lost")), (t(1), d("lost"))]);
    let calls = fake.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec!["sweep", "acknowledge 1", "sweep", "acknowledge 1"],
        "each report's released events are acknowledged after the callback"
    );
}

#[tokio::test]
async fn router_code_maps_an_unreachable_backend_to_a_retryable_503() {
    let fake = Unreachable::default();
    assert_eq!(route(&fake, &t(1), &d("d")).await, 503);
    let err = fake.heartbeat(WORKER).await.unwrap_err();
    assert!(err.is_retryable());
    assert_eq!(
        err.to_string(),
        "fake backend unavailable: connection refused"
    );
}

#[test]
fn registries_are_independent_values_not_a_global() {
    let a = InMemoryRegistry::default();
    let b = InMemoryRegistry::default();
    a.direct().register().unwrap();
    assert_eq!(
        (a.direct().live_workers(), b.direct().live_workers()),
        (1, 0)
    );
    let a2 = a.clone();
    a2.direct().register().unwrap();
    assert_eq!(a.direct().live_workers(), 2, "clones share state");
    // The two surfaces are two views of one state, either way round.
    let a3 = InMemoryRegistry::from(a.direct().clone());
    a3.into_direct().register().unwrap();
    assert_eq!(a.stats().live_workers, 3, "so do the two surfaces");
}

#[cfg(feature = "http")]
mod served {
    use reqwest::StatusCode;
    use serde_json::Value;
    use worker_registry::http::{admin_router, AdminOptions};
    use worker_registry::metrics::Metrics;

    use super::*;

    async fn serve(router: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        format!("http://{addr}")
    }

    async fn get(url: String) -> (StatusCode, String) {
        let r = reqwest::get(url).await.unwrap();
        (r.status(), r.text().await.unwrap())
    }

    #[tokio::test]
    async fn the_admin_router_and_metrics_serve_a_fake() {
        let fake = DynRegistry::new(Scripted::new());
        let options = AdminOptions::new().metrics(Metrics::new(&fake));
        let base = serve(admin_router(fake, options)).await;

        let (status, body) = get(format!("{base}/workers")).await;
        assert_eq!(status, StatusCode::OK);
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["version"], 42);
        let by_id = |id: u64| {
            body["workers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|w| w["id"] == id)
                .cloned()
                .unwrap()
        };
        assert_eq!(by_id(7)["pool_status"], "busy");
        assert_eq!(by_id(7)["token"], (7 << 20) | 3);
        assert_eq!(by_id(6)["reason"], "drain_timed_out");

        let (status, body) = get(format!("{base}/workers/7")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, _) = get(format!("{base}/workers/99")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        let drained = reqwest::Client::new()
            .post(format!("{base}/workers/7/drain"))
            .send()
            .await
            .unwrap();
        assert_eq!(drained.status(), StatusCode::OK);
        let drained: Value = drained.json().await.unwrap();
        assert_eq!(drained["status"], "draining");

        let (status, text) = get(format!("{base}/metrics")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            text.contains("worker_registry_admitted_total{worker=\"new\"} 3"),
            "{text}"
        );
        assert!(text.contains("worker_registry_deaths_total{reason=\"drain_timed_out\"} 1"));
        assert!(text.contains("worker_registry_snapshot_version 42"));
    }

    #[tokio::test]
    async fn the_admin_router_answers_503_when_the_backend_is_unreachable() {
        let base = serve(admin_router(Unreachable::default(), AdminOptions::new())).await;
        let (status, body) = get(format!("{base}/workers/1")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("connection refused"), "{body}");
    }
}
