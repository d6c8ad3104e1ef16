//! Real Redis servers for the tests (the workspace's `test-servers` crate, shared with the
//! reference router's tests: the one named by `WORKER_REGISTRY_REDIS_URL`, or a throwaway
//! `redis-server` on a free loopback port, and the skip rule), and the registry helpers of these
//! tests.

#![allow(dead_code)]

#[allow(unused_imports)] // the benchmarks use part of it
pub use test_servers::redis::*;

use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use worker_registry::redis::RedisRegistry;
use worker_registry::{
    Admission, Assignment, DeliveryId, Event, RegistryConfig, Subscribe, Target,
};

/// A fresh registry on `url` with `config`, under a unique name.
pub async fn registry(url: &str, test: &str, config: RegistryConfig) -> RedisRegistry {
    RedisRegistry::builder(url)
        .name(unique_name(test))
        .config(config)
        .connect()
        .await
        .expect("connect to Redis")
}

/// A raw connection, for inspecting and corrupting keys in tests.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// Admits a delivery of `target`, which no worker holds, on `r` with a subscription open, and
/// returns the assignment once its `WorkerCreated` event arrived (within 10 s).
pub async fn admit_fresh(r: &RedisRegistry, target: &Target) -> Assignment {
    let mut events = r.subscribe();
    let delivery = DeliveryId::new("fresh").unwrap();
    let Admission::Assigned(a) = r.admit(target, &delivery).await.unwrap() else {
        panic!("a fresh target is assigned")
    };
    let created = tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("the event within 10 s")
        .unwrap();
    assert_eq!(
        created,
        Event::WorkerCreated {
            worker: a.worker,
            target: Some(target.clone()),
        }
    );
    a
}
