//! A router's mixed workload on the registry and on the naive registries: per thread, 70% heartbeats,
//! 20% admits (a tenth of them redeliveries), 10% completions of this thread's oldest in-flight
//! delivery; thread 0 also reads the status every 1024 operations and sweeps every 65536.

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use rand::{Rng, SeedableRng};
use worker_registry::{memory::Direct, Admission, Clock, DeliveryId, Target, WorkerId};

use crate::common::{config, events, targets, timed, Fixture, Ring, WORKERS};
use crate::naive::{populate, Admit, MutexRegistry, Router, RwLockRegistry};

impl<C: Clock> Router for Direct<C> {
    fn heartbeat(&self, id: WorkerId) -> bool {
        Direct::heartbeat(self, id).is_ok()
    }
    fn admit(&self, target: &Target, event: &DeliveryId) -> Admit {
        match Direct::admit(self, target, event) {
            Admission::Assigned(a) => Admit::Assigned(a.worker),
            Admission::Duplicate(_) => Admit::Duplicate,
            _ => Admit::Rejected,
        }
    }
    fn complete(&self, target: &Target, event: &DeliveryId) -> bool {
        Direct::complete(self, target, event).is_ok()
    }
    fn release(&self, target: &Target, event: &DeliveryId) {
        let _ = Direct::release(self, target, event);
    }
    fn sweep(&self) -> usize {
        Direct::sweep(self).died.len()
    }
    fn status(&self) -> usize {
        Direct::status(self).workers.len()
    }
}

#[derive(Clone, Copy)]
enum Op {
    Heartbeat,
    Admit,
    Redeliver,
    Complete,
}

/// The fixed operation mix (the same sequence for every registry flavour).
struct Mix(Vec<Op>);

impl Mix {
    fn new() -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x31c);
        Mix((0..8192)
            .map(|_| match rng.gen_range(0..100) {
                0..70 => Op::Heartbeat,
                70..88 => Op::Admit,
                88..90 => Op::Redeliver,
                _ => Op::Complete,
            })
            .collect())
    }
}

struct World<'a> {
    targets: &'a [Target],
    events: &'a [DeliveryId],
    fresh: &'a [DeliveryId],
    ring: &'a Ring,
    mix: &'a Mix,
}

/// Thread `t`'s routine over `router` (whose workers are `ids`, admitted for `events`).
fn drive<R: Router + ?Sized>(
    r: &R,
    ids: &[WorkerId],
    w: &World<'_>,
    t: usize,
    iters: u64,
) -> Duration {
    let mut in_flight: VecDeque<(usize, usize)> = VecDeque::new();
    let mut next_fresh = 0usize;
    timed(iters, |i| {
        let k = w.ring.at(t, i);
        match w.mix.0[i as usize & 8191] {
            Op::Heartbeat => {
                black_box(r.heartbeat(ids[k]));
            }
            Op::Admit => {
                let e = next_fresh % w.fresh.len();
                next_fresh += 1;
                if let Admit::Assigned(_) = r.admit(&w.targets[k], &w.fresh[e]) {
                    in_flight.push_back((k, e));
                }
            }
            Op::Redeliver => {
                black_box(r.admit(&w.targets[k], &w.events[k]));
            }
            Op::Complete => {
                if let Some((k, e)) = in_flight.pop_front() {
                    black_box(r.complete(&w.targets[k], &w.fresh[e]));
                }
            }
        }
        if t == 0 && i % 1024 == 1023 {
            black_box(r.status());
        }
        if t == 0 && i % 65536 == 65535 {
            black_box(r.sweep());
        }
    })
}

pub fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("mixed");
    let (ts, es) = (targets(WORKERS), events(WORKERS, 0xfeed));
    let ring = Ring::new(WORKERS);
    let mix = Mix::new();
    // Fresh deliveries: enough that none repeats within a sample.
    let threads_run = crate::common::scaling_threads();
    let most = threads_run.iter().copied().max().unwrap_or(2);
    let fresh: Vec<Vec<DeliveryId>> = (0..most as u32)
        .map(|t| events(1 << 18, 0xc0 + t))
        .collect();
    let world = |t: usize| World {
        targets: &ts,
        events: &es,
        fresh: &fresh[t],
        ring: &ring,
        mix: &mix,
    };
    // Each sample starts from a freshly populated registry (untimed), so claims never pile up
    // across samples.
    for threads in threads_run {
        g.throughput(criterion::Throughput::Elements(threads as u64));
        g.bench_function(crate::common::id("registry", threads), |b| {
            b.iter_custom(|iters| {
                let f = Fixture::with(Direct::new(config()), WORKERS);
                crate::common::run(threads, iters, |t| {
                    let (f, w) = (&f, world(t));
                    move |iters| drive(&f.registry, &f.ids, &w, t, iters)
                })
            })
        });
        g.bench_function(crate::common::id("mutex", threads), |b| {
            b.iter_custom(|iters| {
                let m = MutexRegistry::new(1 << 20);
                let ids = populate(&m, &ts, &es);
                crate::common::run(threads, iters, |t| {
                    let (m, ids, w) = (&m, &ids, world(t));
                    move |iters| drive(m, ids, &w, t, iters)
                })
            })
        });
        g.bench_function(crate::common::id("rwlock", threads), |b| {
            b.iter_custom(|iters| {
                let r = RwLockRegistry::new(1 << 20);
                let ids = populate(&r, &ts, &es);
                crate::common::run(threads, iters, |t| {
                    let (r, ids, w) = (&r, &ids, world(t));
                    move |iters| drive(r, ids, &w, t, iters)
                })
            })
        });
    }
    g.finish();
}
