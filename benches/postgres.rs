//! The PostgreSQL backend's hot calls against the floor under them, in one run on one server and
//! one pool: `admit` of a new delivery (onto its target's worker), the same with a typical 30 KB
//! payload (`admit_with`: every such admit also writes the registry's one payload-budget row),
//! `admit` of a duplicate, and `heartbeat`, each with 1 and with 64 calls in flight, next to a
//! bare prepared `SELECT 1` through the same handle (`PostgresRegistry::ping`).
//!
//! `cargo bench --features postgres --bench postgres` uses `WORKER_REGISTRY_POSTGRES_URL`, or
//! starts a throwaway cluster (see `tests/support/pg_cluster.rs`), and says so and exits if there
//! is neither. Criterion reports the time per call (so 1 / throughput); at the end a table gives
//! throughput, p50 and p99 latency per call (hdrhistogram) and each call's throughput as a share
//! of the bare round trip's at the same concurrency.

#[path = "../tests/support/pg_cluster.rs"]
mod pg_cluster;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker_registry::WorkerRegistryExt;

use criterion::{Criterion, Throughput};
use hdrhistogram::Histogram;
use worker_registry::config::MAX_PAYLOAD_BUDGET;
use worker_registry::postgres::PostgresRegistry;
use worker_registry::testkit::payload_checks::sample;
use worker_registry::{
    Admission, DeliveryId, Payload, RegistryConfig, Target, WorkerId, WorkerRegistry,
};

/// Calls in flight at once.
const CONCURRENCY: [usize; 2] = [1, 64];

/// What one benchmark measured, over all its runs: latencies (µs) and calls per elapsed time.
struct Tally {
    latency: Histogram<u64>,
    calls: u64,
    elapsed: Duration,
}

type Results = Arc<Mutex<BTreeMap<(usize, &'static str), Tally>>>;

#[derive(Clone, Copy)]
enum Call {
    Bare,
    Admit,
    AdmitPayload,
    Duplicate,
    Heartbeat,
}

/// Every call, in the order the table lists them.
const CALLS: [Call; 5] = [
    Call::Bare,
    Call::Admit,
    Call::AdmitPayload,
    Call::Duplicate,
    Call::Heartbeat,
];

/// The payload's body: a typical `pull_request` delivery's size.
const PAYLOAD_BYTES: usize = 30 * 1024;

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::Bare => "bare SELECT 1",
            Call::Admit => "admit (new delivery)",
            Call::AdmitPayload => "admit_with (new delivery, 30 KB payload)",
            Call::Duplicate => "admit (duplicate)",
            Call::Heartbeat => "heartbeat",
        }
    }
}

struct Fixture {
    registry: PostgresRegistry,
    targets: Vec<Target>,
    workers: Vec<WorkerId>,
    duplicates: Vec<(Target, DeliveryId)>,
    payload: Payload,
    next: AtomicU64,
}

impl Fixture {
    async fn one(&self, call: Call, slot: usize) {
        let r = &self.registry;
        match call {
            Call::Bare => r.ping().await.unwrap(),
            Call::Admit => {
                // Each slot has its own target, so calls in flight do not queue on one row lock.
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let d = DeliveryId::new(&format!("new-{n}")).unwrap();
                let a = r.admit(&self.targets[slot], &d).await.unwrap();
                assert!(matches!(a, Admission::Assigned(_)), "{a:?}");
            }
            Call::AdmitPayload => {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let d = DeliveryId::new(&format!("new-{n}")).unwrap();
                let a = r
                    .admit_with(&self.targets[slot], &d, Some(&self.payload))
                    .await
                    .unwrap();
                assert!(matches!(a, Admission::Assigned(_)), "{a:?}");
            }
            Call::Duplicate => {
                let (t, d) = &self.duplicates[slot];
                let a = r.admit(t, d).await.unwrap();
                assert!(matches!(a, Admission::Duplicate(_)), "{a:?}");
            }
            Call::Heartbeat => {
                r.heartbeat(self.workers[slot]).await.unwrap();
            }
        }
    }
}

/// Runs `iters` calls with `inflight` of them at a time (each of `inflight` tasks makes its
/// share one after another) and returns the wall time.
async fn run(
    f: &Arc<Fixture>,
    call: Call,
    inflight: usize,
    iters: u64,
    tally: &Mutex<Histogram<u64>>,
) -> Duration {
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(inflight);
    for slot in 0..inflight {
        let share = iters / inflight as u64 + u64::from((slot as u64) < iters % inflight as u64);
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3).unwrap();
            for _ in 0..share {
                let t = Instant::now();
                f.one(call, slot).await;
                let _ = h.record(t.elapsed().as_micros() as u64);
            }
            h
        }));
    }
    let mut all = Histogram::<u64>::new(3).unwrap();
    for t in tasks {
        all.add(t.await.unwrap()).unwrap();
    }
    let elapsed = started.elapsed();
    tally.lock().unwrap().add(all).unwrap();
    elapsed
}

fn main() {
    // Without a server, `shared_url` has said (once) that this is skipped and how to enable it.
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fixture = rt.block_on(async {
        let config = RegistryConfig::builder()
            .max_workers(10_000)
            // The bench admits without completing: the budget must not be what it measures.
            .payload_budget(MAX_PAYLOAD_BUDGET)
            .build()
            .unwrap();
        let registry = PostgresRegistry::builder(&url)
            .name(pg_cluster::unique_name("bench"))
            .config(config)
            .pool_size(64)
            .listen(false)
            .connect()
            .await
            .unwrap();
        let max = *CONCURRENCY.iter().max().unwrap();
        let mut targets = Vec::new();
        let mut duplicates = Vec::new();
        let mut workers = Vec::new();
        for i in 0..max {
            let t = Target::new("bench/repo", i as u64 + 1).unwrap();
            let d = DeliveryId::new(&format!("dup-{i}")).unwrap();
            registry.admit(&t, &d).await.unwrap();
            targets.push(t.clone());
            duplicates.push((t, d));
            workers.push(registry.register().await.unwrap());
        }
        // Warm every pooled connection's statement cache.
        let f = Arc::new(Fixture {
            registry,
            targets,
            workers,
            duplicates,
            payload: sample("bench", PAYLOAD_BYTES),
            next: AtomicU64::new(0),
        });
        for call in CALLS {
            let h = Mutex::new(Histogram::new(3).unwrap());
            run(&f, call, max, max as u64 * 2, &h).await;
        }
        f
    });

    let results: Results = Arc::default();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10)
        .without_plots()
        .configure_from_args();
    for inflight in CONCURRENCY {
        let mut g = c.benchmark_group(format!("postgres/{inflight}-in-flight"));
        g.throughput(Throughput::Elements(1));
        for call in CALLS {
            let (f, results) = (fixture.clone(), results.clone());
            g.bench_function(call.name(), |b| {
                b.iter_custom(|iters| {
                    let h = Mutex::new(Histogram::new(3).unwrap());
                    let took = rt.block_on(run(&f, call, inflight, iters, &h));
                    let mut all = results.lock().unwrap();
                    let entry = all.entry((inflight, call.name())).or_insert_with(|| Tally {
                        latency: Histogram::new(3).unwrap(),
                        calls: 0,
                        elapsed: Duration::ZERO,
                    });
                    entry.latency.add(h.into_inner().unwrap()).unwrap();
                    entry.calls += iters;
                    entry.elapsed += took;
                    took
                })
            });
        }
        g.finish();
    }
    c.final_summary();
    if std::env::args().any(|a| a == "--test") {
        println!("smoke run (--test): one call per benchmark, no table");
    } else {
        print_table(&results.lock().unwrap());
    }
}

fn print_table(all: &BTreeMap<(usize, &'static str), Tally>) {
    println!();
    println!("| call | in flight | calls/s | p50 µs | p99 µs | vs bare SELECT 1 |");
    println!("|---|---:|---:|---:|---:|---:|");
    for inflight in CONCURRENCY {
        let rate = |name: &str| {
            all.get(&(inflight, name))
                .map(|t| t.calls as f64 / t.elapsed.as_secs_f64().max(1e-9))
        };
        let bare = rate(Call::Bare.name());
        for call in CALLS {
            let Some(t) = all.get(&(inflight, call.name())) else {
                continue;
            };
            let r = rate(call.name()).unwrap_or(0.0);
            let share = bare
                .map(|b| format!("{:.0}%", 100.0 * r / b))
                .unwrap_or_default();
            println!(
                "| {} | {inflight} | {r:.0} | {} | {} | {share} |",
                call.name(),
                t.latency.value_at_quantile(0.5),
                t.latency.value_at_quantile(0.99),
            );
        }
    }
}
