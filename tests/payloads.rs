//! The payload checks a networked backend's own tests call where they can restart a server or
//! lose a reply (`worker_registry::testkit::payload_checks`), run on the in-memory backend: a
//! restart that keeps everything is nothing at all, and a lost reply is the reply of a call that
//! was carried out replaced by a retryable error (what the reply-dropping proxy does to a Redis
//! or PostgreSQL handle), by a wrapper around the registry.

#![cfg(feature = "testkit")]

use std::future::{ready, Future};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use worker_registry::testkit::{payload_checks, Fixture, MemoryFixture};
use worker_registry::{
    Admission, AssignOutcome, ClaimOutcome, DeadReason, DeliveryId, DrainAll, HeartbeatAck,
    InMemoryRegistry, ManualClock, Payload, RegistryConfig, RegistryError, Stats, Status,
    StatusSnapshot, Target, WorkerId, WorkerInfo, WorkerRegistry,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_survive_a_restart_that_keeps_the_data() {
    let config = payload_checks::restart_config().build().unwrap();
    let r = MemoryFixture::new().registry(config).await;
    payload_checks::payloads_survive_a_restart(&r, || async {}).await;
}

/// The in-memory registry, whose next admission's reply can be lost: the admission is carried
/// out, and its caller gets a retryable error instead of the answer.
#[derive(Clone)]
struct LosesReplies {
    inner: InMemoryRegistry<ManualClock>,
    lose: Arc<AtomicBool>,
}

impl LosesReplies {
    fn lost<T>(&self, answer: Result<T, RegistryError>) -> Result<T, RegistryError> {
        // Relaxed: the flag is set and read by the one test task.
        if self.lose.swap(false, Ordering::Relaxed) {
            let e = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reply lost");
            return Err(RegistryError::backend("lossy", true, e));
        }
        answer
    }
}

impl WorkerRegistry for LosesReplies {
    fn admit_with(
        &self,
        t: &Target,
        d: &DeliveryId,
        p: Option<&Payload>,
    ) -> impl Future<Output = Result<Admission, RegistryError>> + Send {
        ready(self.lost(self.inner.direct().admit_with(t, d, p)))
    }
    fn payload(
        &self,
        t: &Target,
        d: &DeliveryId,
    ) -> impl Future<Output = Result<Option<Payload>, RegistryError>> + Send {
        self.inner.payload(t, d)
    }
    fn claim(
        &self,
        t: &Target,
        d: &DeliveryId,
    ) -> impl Future<Output = Result<ClaimOutcome, RegistryError>> + Send {
        self.inner.claim(t, d)
    }
    fn release(
        &self,
        t: &Target,
        d: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        self.inner.release(t, d)
    }
    fn complete_as(
        &self,
        w: Option<WorkerId>,
        t: &Target,
        d: &DeliveryId,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        self.inner.complete_as(w, t, d)
    }
    fn assign(
        &self,
        t: &Target,
    ) -> impl Future<Output = Result<AssignOutcome, RegistryError>> + Send {
        self.inner.assign(t)
    }
    fn heartbeat(
        &self,
        w: WorkerId,
    ) -> impl Future<Output = Result<HeartbeatAck, RegistryError>> + Send {
        self.inner.heartbeat(w)
    }
    fn loop_started(
        &self,
        w: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.inner.loop_started(w)
    }
    fn loop_finished(
        &self,
        w: WorkerId,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.inner.loop_finished(w)
    }
    fn register(&self) -> impl Future<Output = Result<WorkerId, RegistryError>> + Send {
        self.inner.register()
    }
    fn deregister(
        &self,
        w: WorkerId,
    ) -> impl Future<Output = Result<DeadReason, RegistryError>> + Send {
        self.inner.deregister(w)
    }
    fn drain_within(
        &self,
        w: WorkerId,
        deadline: Duration,
    ) -> impl Future<Output = Result<Status, RegistryError>> + Send {
        self.inner.drain_within(w, deadline)
    }
    fn drain_all_within(
        &self,
        deadline: Duration,
    ) -> impl Future<Output = Result<DrainAll, RegistryError>> + Send {
        self.inner.drain_all_within(deadline)
    }
    fn worker(
        &self,
        w: WorkerId,
    ) -> impl Future<Output = Result<Option<WorkerInfo>, RegistryError>> + Send {
        self.inner.worker(w)
    }
    fn status(&self) -> Arc<StatusSnapshot> {
        self.inner.status()
    }
    fn stats(&self) -> Stats {
        self.inner.stats()
    }
    fn config(&self) -> &RegistryConfig {
        self.inner.config()
    }
}

#[tokio::test]
async fn a_lost_reply_leaves_the_payload_retrievable() {
    let inner = InMemoryRegistry::with_clock(RegistryConfig::default(), ManualClock::new());
    let lose = Arc::new(AtomicBool::new(false));
    let through = LosesReplies {
        inner: inner.clone(),
        lose: lose.clone(),
    };
    let direct = LosesReplies {
        inner,
        lose: Arc::new(AtomicBool::new(false)),
    };
    payload_checks::a_lost_reply_leaves_the_payload_retrievable(&through, &direct, || {
        // Relaxed: see `LosesReplies::lost`.
        lose.store(true, Ordering::Relaxed)
    })
    .await;
}
