//! What a retained (completed) claim costs in Redis memory: `MEMORY USAGE` of a claim key, its
//! share of the completion index (`{name}:done`), and the server's `used_memory` growth per claim
//! (which also counts the keyspace and expiry dictionary entries). Printed with `--nocapture`:
//!
//! ```text
//! cargo test --features redis,testkit --test redis cost -- --nocapture
//! ```
//!
//! Measured on Redis 7.0.15 (jemalloc), a 36-byte delivery id on a 26-byte target: 168 B for the
//! claim key, 177 B for its share of the index, 411 B of `used_memory` in all. The budget asserted
//! (600 B) catches a layout change that multiplies the cost, not noise.

use redis::AsyncCommands;
use worker_registry::redis::RedisRegistry;
use worker_registry::WorkerRegistryExt;
use worker_registry::{Admission, DeliveryId, RegistryConfig, Target};

use crate::harness::{self, Server};

/// Claims measured.
const N: usize = 2_000;
/// Bytes a retained claim may cost at most (all of it: key, hash, index, dictionaries).
const BUDGET: f64 = 600.0;

async fn used_memory(raw: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn a_retained_claim_costs_a_few_hundred_bytes() {
    // Its own server, so that nothing else moves `used_memory` meanwhile.
    let Some(server) = Server::start(false, "cost") else {
        return;
    };
    let url = server.url();
    let mut raw = harness::raw(&url).await;
    let config = RegistryConfig::builder()
        .max_retained_claims(N * 2)
        .build()
        .unwrap();
    let r = RedisRegistry::builder(&url)
        .name("pool-a")
        .config(config)
        .connect()
        .await
        .unwrap();
    let target = Target::new("octo-org/service-repo", 4242).unwrap();
    // Warm up: the worker, the indexes and the dictionaries exist before measuring.
    let Admission::Assigned(w) = r
        .admit(&target, &DeliveryId::new("warm-up").unwrap())
        .await
        .unwrap()
    else {
        panic!()
    };
    r.complete_by(w.worker, &target, &DeliveryId::new("warm-up").unwrap())
        .await
        .unwrap();
    let before = used_memory(&mut raw).await;
    let mut last = None;
    for i in 0..N {
        // GitHub delivery ids are UUIDs.
        let d = DeliveryId::new(&format!("72d3162e-cc78-11e3-81ab-{i:012x}")).unwrap();
        r.admit(&target, &d).await.unwrap();
        r.complete_by(w.worker, &target, &d).await.unwrap();
        last = Some(d);
    }
    let after = used_memory(&mut raw).await;
    let key = r.claim_key(&target, &last.unwrap());
    let claim: f64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut raw)
        .await
        .unwrap();
    let done: f64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("{pool-a}:done")
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut raw)
        .await
        .unwrap();
    let ttl: i64 = raw.pttl(&key).await.unwrap();
    assert!(ttl > 0, "a completed claim expires by itself");
    let share = done / (N + 1) as f64;
    let total = (after - before) / N as f64;
    println!("retained claim, key {:?} ({} bytes)", key, key.len());
    println!("  MEMORY USAGE claim key           {claim:>7.0} B");
    println!("  share of {{name}}:done (zset)      {share:>7.1} B");
    println!("  used_memory growth per claim     {total:>7.1} B  (N = {N})");
    assert!(
        total < BUDGET,
        "{total:.0} B per retained claim, budget {BUDGET} B"
    );
    drop(server);
}
