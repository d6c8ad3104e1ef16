//! Scaling: a heartbeat storm (every thread heartbeats random workers by id, nothing else) at 1, 2
//! and all available threads, on the registry, on the `Mutex<HashMap>` registry and on moka (a
//! `sync::Cache` of worker id -> last heartbeat, where a heartbeat is an insert). Wall time: one
//! element is one heartbeat on one thread, so criterion's figure is the aggregate rate.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use worker_registry::{Clock, SystemClock, WorkerId};

use crate::common::{config, id, run, scaling_threads, timed, Fixture, Hasher, Ring, WORKERS};
use crate::naive::{populate, MutexRegistry, Router};

pub fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("storm");
    let ring = Ring::new(WORKERS);
    let f = Fixture::with(worker_registry::memory::Direct::new(config()), WORKERS);
    let m = MutexRegistry::new(1 << 20);
    let mi = populate(&m, &f.targets, &f.events);
    let clock = SystemClock::new();
    let cache: moka::sync::Cache<WorkerId, u64, Hasher> = moka::sync::Cache::builder()
        .max_capacity(1 << 20)
        .build_with_hasher(Hasher::new());
    for id in &f.ids {
        cache.insert(*id, 0);
    }
    cache.run_pending_tasks();
    for threads in scaling_threads() {
        g.throughput(Throughput::Elements(threads as u64));
        g.bench_function(id("registry", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |t| {
                    let (f, ring) = (&f, &ring);
                    move |iters| {
                        timed(iters, |i| {
                            black_box(f.registry.heartbeat(f.ids[ring.at(t, i)]).is_ok())
                        })
                    }
                })
            })
        });
        g.bench_function(id("mutex", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |t| {
                    let (m, ids, ring) = (&m, &mi, &ring);
                    move |iters| timed(iters, |i| black_box(m.heartbeat(ids[ring.at(t, i)])))
                })
            })
        });
        g.bench_function(id("moka", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |t| {
                    let (cache, ids, ring, clock) = (&cache, &f.ids, &ring, &clock);
                    move |iters| {
                        timed(iters, |i| {
                            cache.insert(ids[ring.at(t, i)], clock.now_millis())
                        })
                    }
                })
            })
        });
    }
    g.finish();
}
