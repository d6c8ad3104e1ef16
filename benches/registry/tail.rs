//! Tail latency of the hot path at steady state: fresh admit + complete at the default
//! retained-claims bound (so every completion evicts), while another thread sweeps every
//! millisecond, on the registry (without payloads, and with a typical one on every delivery) and
//! on the `Mutex<HashMap>` registry doing the same.
//!
//! Every operation is timed on its own (`Instant`, wall time: preemption and lock waits count)
//! into an HDR histogram, corrected for coordinated omission (a stalled call stands for the calls
//! that would have been made meanwhile at one per microsecond); criterion's own estimate is the
//! mean. The percentiles of all operations
//! timed in this run (warm-up included) are written to `<criterion home>/tail/<name>/<n>t/tail.json`
//! for the report (`report.rs`), which shows p99.9 and max next to the naive registry's.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::Criterion;
use hdrhistogram::Histogram;
use worker_registry::config::DEFAULT_MAX_RETAINED_CLAIMS;
use worker_registry::{memory::Direct, Admission, DeliveryId, Payload, Target, WorkerId};

use crate::common::{config, events, id, run, Fixture, Ring, THREADS, WORKERS};
use crate::naive::{populate, Admit, MutexRegistry, Router};

/// The interval at which a busy router would issue these calls (about a thousand webhooks per
/// second per core would be far slower; this is the rate the loop itself runs at).
const EXPECTED_NS: u64 = 1_000;

/// Fresh deliveries per thread: more than the retained bound, so a reused one was evicted long ago.
const POOL: usize = 1 << 17;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Fills `r` to the retained-claims bound with completed claims (untimed).
fn fill<R: Router + ?Sized>(r: &R, targets: &[worker_registry::Target]) {
    let extra = events(DEFAULT_MAX_RETAINED_CLAIMS + 1024, 0xdead);
    for (i, e) in extra.iter().enumerate() {
        let t = &targets[i % targets.len()];
        r.admit(t, e);
        r.complete(t, e);
    }
}

/// One flavour at `threads` threads: the timed loop, a sweeper beside it, and the percentiles.
fn measure<R: Router + ?Sized>(
    c: &mut Criterion,
    name: &str,
    threads: usize,
    r: &R,
    targets: &[worker_registry::Target],
) {
    let ring = Ring::new(WORKERS);
    let pools: Vec<Vec<DeliveryId>> = (0..threads as u32)
        .map(|t| events(POOL, 0x7a11 + t))
        .collect();
    let next = Mutex::new(vec![0usize; threads]);
    let all = Mutex::new(histogram());
    let stop = AtomicBool::new(false);
    let mut g = c.benchmark_group("tail");
    std::thread::scope(|s| {
        s.spawn(|| {
            // Relaxed: a stop flag; nothing is published through it.
            while !stop.load(Ordering::Relaxed) {
                black_box(r.sweep());
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        g.throughput(criterion::Throughput::Elements(threads as u64));
        g.bench_function(id(name, threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |t| {
                    let (ring, pool, next, all) = (&ring, &pools[t], &next, &all);
                    move |iters| {
                        let mut h = histogram();
                        let mut k = next.lock().unwrap()[t];
                        let started = Instant::now();
                        for i in 0..iters {
                            let tg = &targets[ring.at(t, i)];
                            let e = &pool[k & (POOL - 1)];
                            k = k.wrapping_add(1);
                            let t0 = Instant::now();
                            black_box(r.admit(tg, e));
                            black_box(r.complete(tg, e));
                            let ns = t0.elapsed().as_nanos() as u64;
                            // Corrected for coordinated omission: a call stalled for `ns` also
                            // stalled the calls a router would have made meanwhile, one per
                            // EXPECTED interval (a closed loop otherwise records one slow sample).
                            let _ = h.record_correct(ns.max(1), EXPECTED_NS);
                        }
                        let took = started.elapsed();
                        next.lock().unwrap()[t] = k;
                        let _ = all.lock().unwrap().add(&h);
                        took
                    }
                })
            })
        });
        // Relaxed: see above.
        stop.store(true, Ordering::Relaxed);
    });
    g.finish();
    let h = all.into_inner().unwrap();
    if h.is_empty() {
        return; // filtered out of this run
    }
    let dir = crate::report::criterion_home()
        .join("tail")
        .join(name)
        .join(format!("{threads}t"));
    let _ = std::fs::create_dir_all(&dir);
    let json = format!(
        "{{\"count\":{},\"p50\":{},\"p99\":{},\"p999\":{},\"max\":{}}}\n",
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max()
    );
    let _ = std::fs::write(dir.join("tail.json"), json);
}

/// The registry admitting every delivery with the same typical payload (a 30 KB body, GitHub's
/// headers): the same loop, plus the budget's CAS at admission and its release at completion.
struct WithPayload<'a>(&'a Direct, Payload);

impl Router for WithPayload<'_> {
    fn heartbeat(&self, id: WorkerId) -> bool {
        self.0.heartbeat(id).is_ok()
    }
    fn admit(&self, target: &Target, event: &DeliveryId) -> Admit {
        match self.0.admit_with(target, event, Some(&self.1)) {
            Ok(Admission::Assigned(a)) => Admit::Assigned(a.worker),
            Ok(Admission::Duplicate(_)) => Admit::Duplicate,
            _ => Admit::Rejected,
        }
    }
    fn complete(&self, target: &Target, event: &DeliveryId) -> bool {
        self.0.complete(target, event).is_ok()
    }
    fn release(&self, target: &Target, event: &DeliveryId) {
        let _ = self.0.release(target, event);
    }
    fn sweep(&self) -> usize {
        self.0.sweep().died.len()
    }
    fn status(&self) -> usize {
        self.0.status().workers.len()
    }
}

pub fn bench(c: &mut Criterion) {
    let payload = Payload::builder("pull_request", vec![b'x'; 30 * 1024])
        .action("synchronize")
        .header("x-github-hook-id", "123456789")
        .header("x-hub-signature-256", format!("sha256={}", "ab".repeat(32)))
        .build()
        .expect("a valid payload");
    for threads in THREADS {
        let f = Fixture::with(Direct::new(config()), WORKERS);
        fill(&f.registry, &f.targets);
        measure(c, "registry", threads, &f.registry, &f.targets);
        drop(f);

        let f = Fixture::with(Direct::new(config()), WORKERS);
        fill(&f.registry, &f.targets);
        let with = WithPayload(&f.registry, payload.clone());
        measure(c, "registry_payload", threads, &with, &f.targets);
        drop(f);

        let targets = crate::common::targets(WORKERS);
        let m = MutexRegistry::new(1 << 20);
        populate(&m, &targets, &events(WORKERS, 0xfeed));
        fill(&m, &targets);
        measure(c, "mutex", threads, &m, &targets);
    }
}
