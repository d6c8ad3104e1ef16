//! What the simulator's settle phase waits for on a shared backend (the library's
//! [`WorkerRegistry::audit`], [`Audit::unfinished`](worker_registry::Audit::unfinished)): a
//! released delivery stays unfinished on the server from its release until its re-admission is
//! acknowledged and completed, even while the status snapshot shows nothing in flight and nothing
//! busy. That window is where the old settle phase (quiet snapshots, cut at a wall-clock cap)
//! could hand over to the audit, whose redelivery was then admitted again and counted "lost".

use worker_registry::{
    Admission, DeliveryId, Maintenance, RegistryError, Target, WorkerRegistry, WorkerRegistryExt,
};

use crate::harness::*;

async fn released_delivery_is_unfinished_until_completed(kind: Kind) {
    let Some(choice) = shared(kind) else {
        return;
    };
    let name = unique("settle");
    let registry = open_registry(&choice, &config(4), &name).await;
    // The simulator's probe: a handle of its own on the registry.
    let probe = open_registry(&choice, &config(4), &name).await;
    let unfinished = || async { probe.audit().await.map(|a| a.unfinished()) };
    assert_eq!(
        unfinished().await,
        Ok::<_, RegistryError>(0),
        "a new registry"
    );

    let (t, d) = (
        Target::new("o/r", 1).unwrap(),
        DeliveryId::new("s-1").unwrap(),
    );
    let Ok(Admission::Assigned(a)) = registry.admit(&t, &d).await else {
        panic!("admitted");
    };
    assert_eq!(unfinished().await, Ok(1), "in flight");
    // Its worker goes (a clean exit releases what it holds, as a death does).
    registry.deregister(a.worker).await.unwrap();
    assert_eq!(unfinished().await, Ok(1), "released, not yet handed out");
    // A sweep hands it to this replica, which does not acknowledge it (a replica killed in its
    // sweeper callback; a loaded one that has not got to it yet).
    let report = registry.sweep().await.unwrap();
    let released: Vec<&DeliveryId> = report.released.iter().map(|e| &e.delivery).collect();
    assert_eq!(released, [&d], "{report:?}");
    let s = registry.status();
    assert_eq!(
        (s.claims.in_flight, s.counts.busy),
        (0, 0),
        "the snapshot shows nothing to wait for: {s:?}"
    );
    assert_eq!(unfinished().await, Ok(1), "the server still holds it");
    // A redelivery now is admitted again, not answered as a duplicate (the old audit's "lost"):
    // here it is the re-dispatch, acknowledged as the sweeper would.
    let Ok(Admission::Assigned(again)) = registry.admit(&t, &d).await else {
        panic!("admitted again");
    };
    assert!(again.new, "on a new worker: {again:?}");
    registry.acknowledge(&report.released).await.unwrap();
    assert_eq!(unfinished().await, Ok(1), "in flight on its new worker");
    registry.complete(&t, &d).await.unwrap();
    assert_eq!(unfinished().await, Ok(0), "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_delivery_is_unfinished_until_completed_on_redis() {
    released_delivery_is_unfinished_until_completed(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_delivery_is_unfinished_until_completed_on_postgres() {
    released_delivery_is_unfinished_until_completed(Kind::Postgres).await;
}
