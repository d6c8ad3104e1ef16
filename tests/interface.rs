//! DoD3: the router depends on the `WorkerRegistry` trait, not on a concrete type or a global; tests
//! substitute a fake.

use std::future::{ready, Future};
use std::sync::{Arc, Mutex};

use worker_registry::{
    Admission, AssignOutcome, ClaimOutcome, DeadReason, DrainAll, DeliveryId, HeartbeatAck, InMemoryRegistry,
    RegistryError, Status, StatusSnapshot, SweepReport, Target, WorkerId, WorkerInfo,
    WorkerRegistry,
};

/// What a router does with one delivery, written against the trait only.
async fn route<R: WorkerRegistry>(registry: &R, target: &Target, event: &DeliveryId) -> u16 {
    match registry.admit(target, event).await {
        Ok(Admission::Assigned(_)) => 202,
        Ok(Admission::Duplicate(_)) => 200,
        Ok(Admission::Rejected(_)) => 503,
        Err(_) => 500,
    }
}

/// A fake: records calls, and fails like an unreachable networked backend would.
#[derive(Default)]
struct UnreachableBackend {
    calls: Mutex<Vec<String>>,
}

impl UnreachableBackend {
    fn down<T: Send>(&self, call: &str) -> impl Future<Output = Result<T, RegistryError>> + Send {
        self.calls.lock().unwrap().push(call.to_owned());
        ready(Err(RegistryError::Unavailable {
            detail: "connection refused".into(),
        }))
    }
}

impl WorkerRegistry for UnreachableBackend {
    fn admit(
        &self,
        t: &Target,
        e: &DeliveryId,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        self.down(&format!("admit {t} {e}"))
    }
    fn claim(
        &self,
        _: &Target,
        _: &DeliveryId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send {
        self.down("claim")
    }
    fn release(
        &self,
        _: &Target,
        _: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        self.down("release")
    }
    fn complete(
        &self,
        _: &Target,
        _: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        self.down("complete")
    }
    fn complete_by(
        &self,
        _: WorkerId,
        _: &Target,
        _: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        self.down("complete_by")
    }
    fn assign(
        &self,
        _: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send {
        self.down("assign")
    }
    fn heartbeat(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send {
        self.down("heartbeat")
    }
    fn loop_started(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.down("loop_started")
    }
    fn loop_finished(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.down("loop_finished")
    }
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send {
        self.down("register")
    }
    fn deregister(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send {
        self.down("deregister")
    }
    fn drain(&self, _: WorkerId) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.down("drain")
    }
    fn drain_all(&self) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send {
        self.down("drain_all")
    }
    fn sweep(&self) -> impl Future<Output = Result<SweepReport, RegistryError>> + Send {
        self.down("sweep")
    }
    fn status(&self) -> impl Future<Output = Result<Arc<StatusSnapshot>, RegistryError>> + Send {
        self.down("status")
    }
    fn worker(
        &self,
        _: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send {
        self.down("worker")
    }
}

#[tokio::test]
async fn router_code_runs_against_the_real_registry() {
    let registry = InMemoryRegistry::default();
    let (t, e) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
    assert_eq!(route(&registry, &t, &e).await, 202);
    assert_eq!(route(&registry, &t, &e).await, 200);
    let w = WorkerRegistry::register(&registry).await.unwrap();
    assert_eq!(
        WorkerRegistry::heartbeat(&registry, w).await,
        Ok(HeartbeatAck::Active)
    );
    let s = WorkerRegistry::sweep(&registry).await.unwrap();
    let status = WorkerRegistry::status(&registry).await.unwrap();
    assert_eq!(status.generation, s.generation);
    assert_eq!(status.workers.len(), 2);
}

#[tokio::test]
async fn router_code_runs_against_a_fake_and_handles_backend_errors() {
    let fake = UnreachableBackend::default();
    let (t, e) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
    assert_eq!(route(&fake, &t, &e).await, 500);
    assert_eq!(
        *fake.calls.lock().unwrap(),
        vec!["admit o/r#1 d".to_owned()]
    );
}

#[test]
fn registries_are_independent_values_not_a_global() {
    let a = InMemoryRegistry::default();
    let b = InMemoryRegistry::default();
    a.register().unwrap();
    assert_eq!((a.live_workers(), b.live_workers()), (1, 0));
    let a2 = a.clone();
    a2.register().unwrap();
    assert_eq!(a.live_workers(), 2, "clones share state");
}
