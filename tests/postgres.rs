//! The PostgreSQL backend against a real server.

#[path = "support/pg_cluster.rs"]
mod pg_cluster;

use worker_registry::{
    Admission, DeliveryId, Maintenance, PostgresRegistry, Subscribe, Target, WorkerRegistry,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let r = PostgresRegistry::builder(&url)
        .name(pg_cluster::unique_name("smoke"))
        .connect()
        .await
        .unwrap();
    let mut events = r.subscribe();
    let t = Target::new("o/r", 1).unwrap();
    let d = DeliveryId::new("d-1").unwrap();
    let a = r.admit(&t, &d).await.unwrap();
    println!("{a:?}");
    let b = r.admit(&t, &d).await.unwrap();
    println!("{b:?}");
    let Admission::Assigned(a) = a else { panic!() };
    println!("{:?}", r.heartbeat(a.worker).await);
    println!("{:?}", r.complete(&t, &d).await);
    println!("{:?}", r.sweep().await);
    println!("{:?}", r.status());
    println!("{:?}", r.worker(a.worker).await);
    println!("{:?}", events.recv().await);
    println!("{:?}", r.stats());
}
