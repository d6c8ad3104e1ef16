//! A registry whose admission replies can be held back: the admission of a chosen delivery is
//! carried out (committed, on whatever backend is underneath) and its answer then waits until the
//! test lets it go, as a reply slowed down by a loaded machine or a slow network would; so can the
//! reply to the next read of a worker (`worker`). It also
//! counts the loops each worker starts (`loop_started`), so a test can tell an event run once from
//! one run twice. Everything else goes straight through.
#![allow(dead_code)] // each test binary uses part of it

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use worker_registry::dynamic::{BoxFuture, DynBackend, DynRegistry};
use worker_registry::{
    Admission, AssignOutcome, ClaimOutcome, DeadReason, DeliveryId, DrainAll, HeartbeatAck,
    Payload, RegistryConfig, RegistryError, ReleasedEvent, Stats, Status, StatusSnapshot,
    Subscription, SweepReport, Target, WorkerId, WorkerInfo,
};

/// One held admission reply: `reached` once the admission has been carried out and its answer
/// waits, `release` to let the answer go.
#[derive(Default)]
pub struct Held {
    reached: Notify,
    open: Notify,
}

impl Held {
    /// Waits until the held admission has been carried out (its answer waits).
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets the held answer go.
    pub fn release(&self) {
        self.open.notify_one();
    }
}

/// The registry `inner` with the admission replies of the deliveries [`hold`](Self::hold) names
/// held back (each once).
pub struct Hold {
    inner: Arc<dyn DynBackend>,
    held: Mutex<HashMap<String, Arc<Held>>>,
    read: Mutex<Option<Arc<Held>>>,
    loops: Mutex<HashMap<WorkerId, usize>>,
}

impl Hold {
    /// `inner`, nothing held yet, and the [`DynRegistry`] a router is built on.
    pub fn wrap(inner: DynRegistry) -> (Arc<Self>, DynRegistry) {
        let hold = Arc::new(Self {
            inner: inner.backend().clone(),
            held: Mutex::default(),
            read: Mutex::default(),
            loops: Mutex::default(),
        });
        let registry = DynRegistry::from_arc(hold.clone());
        (hold, registry)
    }

    /// Holds back the reply of the next admission of `delivery`.
    pub fn hold(&self, delivery: &str) -> Arc<Held> {
        let held = Arc::new(Held::default());
        self.held
            .lock()
            .unwrap()
            .insert(delivery.to_owned(), held.clone());
        held
    }

    /// Holds back the reply of the next read of a worker (whichever).
    pub fn hold_read(&self) -> Arc<Held> {
        let held = Arc::new(Held::default());
        *self.read.lock().unwrap() = Some(held.clone());
        held
    }

    /// The loops `worker` has started through this handle.
    pub fn loops(&self, worker: WorkerId) -> usize {
        self.loops
            .lock()
            .unwrap()
            .get(&worker)
            .copied()
            .unwrap_or(0)
    }
}

/// Says the held call was carried out, then waits to be let go (nothing held: goes on at once).
async fn wait(held: Option<Arc<Held>>) {
    if let Some(held) = held {
        held.reached.notify_one();
        held.open.notified().await;
    }
}

impl DynBackend for Hold {
    fn admit_with<'a>(
        &'a self,
        target: &'a Target,
        delivery: &'a DeliveryId,
        payload: Option<&'a Payload>,
    ) -> BoxFuture<'a, Result<Admission, RegistryError>> {
        Box::pin(async move {
            let answer = self.inner.admit_with(target, delivery, payload).await;
            let held = self.held.lock().unwrap().remove(delivery.as_str());
            wait(held).await;
            answer
        })
    }
    fn payload<'a>(
        &'a self,
        t: &'a Target,
        d: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<Option<Payload>, RegistryError>> {
        self.inner.payload(t, d)
    }
    fn claim<'a>(
        &'a self,
        t: &'a Target,
        d: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<ClaimOutcome, RegistryError>> {
        self.inner.claim(t, d)
    }
    fn release<'a>(
        &'a self,
        t: &'a Target,
        d: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        self.inner.release(t, d)
    }
    fn complete_as<'a>(
        &'a self,
        w: Option<WorkerId>,
        t: &'a Target,
        d: &'a DeliveryId,
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        self.inner.complete_as(w, t, d)
    }
    fn assign<'a>(&'a self, t: &'a Target) -> BoxFuture<'a, Result<AssignOutcome, RegistryError>> {
        self.inner.assign(t)
    }
    fn heartbeat<'a>(&'a self, w: WorkerId) -> BoxFuture<'a, Result<HeartbeatAck, RegistryError>> {
        self.inner.heartbeat(w)
    }
    fn loop_started<'a>(&'a self, w: WorkerId) -> BoxFuture<'a, Result<Status, RegistryError>> {
        *self.loops.lock().unwrap().entry(w).or_default() += 1;
        self.inner.loop_started(w)
    }
    fn loop_finished<'a>(&'a self, w: WorkerId) -> BoxFuture<'a, Result<Status, RegistryError>> {
        self.inner.loop_finished(w)
    }
    fn register<'a>(&'a self) -> BoxFuture<'a, Result<WorkerId, RegistryError>> {
        self.inner.register()
    }
    fn deregister<'a>(&'a self, w: WorkerId) -> BoxFuture<'a, Result<DeadReason, RegistryError>> {
        self.inner.deregister(w)
    }
    fn drain_within<'a>(
        &'a self,
        w: WorkerId,
        d: Duration,
    ) -> BoxFuture<'a, Result<Status, RegistryError>> {
        self.inner.drain_within(w, d)
    }
    fn drain_all_within<'a>(
        &'a self,
        d: Duration,
    ) -> BoxFuture<'a, Result<DrainAll, RegistryError>> {
        self.inner.drain_all_within(d)
    }
    fn worker<'a>(
        &'a self,
        w: WorkerId,
    ) -> BoxFuture<'a, Result<Option<WorkerInfo>, RegistryError>> {
        Box::pin(async move {
            let answer = self.inner.worker(w).await;
            let held = self.read.lock().unwrap().take();
            wait(held).await;
            answer
        })
    }
    fn sweep<'a>(&'a self) -> BoxFuture<'a, Result<SweepReport, RegistryError>> {
        self.inner.sweep()
    }
    fn acknowledge<'a>(
        &'a self,
        released: &'a [ReleasedEvent],
    ) -> BoxFuture<'a, Result<(), RegistryError>> {
        self.inner.acknowledge(released)
    }
    fn wake<'a>(&'a self) -> BoxFuture<'a, ()> {
        self.inner.wake()
    }
    fn status(&self) -> Arc<StatusSnapshot> {
        self.inner.status()
    }
    fn stats(&self) -> Stats {
        self.inner.stats()
    }
    fn audit<'a>(&'a self) -> BoxFuture<'a, Result<worker_registry::Audit, RegistryError>> {
        self.inner.audit()
    }
    fn config(&self) -> &RegistryConfig {
        self.inner.config()
    }
    fn subscribe(&self) -> Subscription {
        self.inner.subscribe()
    }
}
