//! The registry's operations, each next to the naive registries doing the same thing.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use worker_registry::{
    memory::Direct, Admission, ClaimOutcome, Clock, DeliveryId, SystemClock, WorkerId,
};

use crate::common::{
    both, config, events, id, run, targets, timed, Fixture, Ring, Stopwatch, WORKERS,
};
use crate::naive::{populate, MutexRegistry, Router, RwLockRegistry};

/// The system clock plus a skip the bench adds by hand: real clock cost, but time can jump so a
/// bench can expire claims or let workers go stale between timed batches.
#[derive(Clone, Default)]
pub struct SkipClock {
    base: SystemClock,
    skip_ns: Arc<AtomicU64>,
}

impl SkipClock {
    pub fn skip(&self, by: Duration) {
        // Relaxed: bench bookkeeping; the registry reads it through `now` only.
        self.skip_ns
            .fetch_add(by.as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Clock for SkipClock {
    #[inline]
    fn now(&self) -> Duration {
        // Relaxed: see `skip`.
        self.base.now() + Duration::from_nanos(self.skip_ns.load(Ordering::Relaxed))
    }
}

/// Operations timed in batches with untimed clean-up in between.
const BATCH: u64 = 4096;

fn batched<R>(
    iters: u64,
    mut op: impl FnMut(u64) -> R,
    mut cleanup: impl FnMut(u64, u64),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = BATCH.min(iters - done);
        let start = Stopwatch::start();
        for i in done..done + n {
            black_box(op(i));
        }
        total += start.elapsed();
        cleanup(done, n);
        done += n;
    }
    total
}

fn naive_fixtures() -> (MutexRegistry, RwLockRegistry, Vec<WorkerId>, Vec<WorkerId>) {
    let (t, e) = (targets(WORKERS), events(WORKERS, 0xfeed));
    let m = MutexRegistry::new(1 << 20);
    let r = RwLockRegistry::new(1 << 20);
    let mi = populate(&m, &t, &e);
    let ri = populate(&r, &t, &e);
    (m, r, mi, ri)
}

pub fn heartbeat(c: &mut Criterion) {
    let mut g = c.benchmark_group("heartbeat");
    let ring = Ring::new(WORKERS);
    let f = Fixture::new(WORKERS);
    both(&mut g, "by_id", |t| {
        let (f, ring) = (&f, &ring);
        move |iters| {
            timed(iters, |i| {
                black_box(f.registry.heartbeat(f.ids[ring.at(t, i)]).is_ok())
            })
        }
    });
    both(&mut g, "handle", |t| {
        // A worker heartbeats its own record through its handle.
        let h = f.registry.handle(f.ids[t]).unwrap();
        move |iters| timed(iters, |_| black_box(h.heartbeat().is_ok()))
    });
    let (m, r, mi, ri) = naive_fixtures();
    both(&mut g, "mutex_by_id", |t| {
        let (m, ids, ring) = (&m, &mi, &ring);
        move |iters| timed(iters, |i| black_box(m.heartbeat(ids[ring.at(t, i)])))
    });
    both(&mut g, "rwlock_by_id", |t| {
        let (r, ids, ring) = (&r, &ri, &ring);
        move |iters| timed(iters, |i| black_box(r.heartbeat(ids[ring.at(t, i)])))
    });
    g.finish();
}

pub fn admit(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit");
    let ring = Ring::new(WORKERS);
    let f = Fixture::new(WORKERS);
    // Redelivery of an in-flight delivery.
    both(&mut g, "duplicate", |t| {
        let (f, ring) = (&f, &ring);
        move |iters| {
            timed(iters, |i| {
                let k = ring.at(t, i);
                let a = f.registry.admit(&f.targets[k], &f.events[k]);
                debug_assert!(matches!(a, Admission::Duplicate(_)));
                black_box(a);
            })
        }
    });
    let fresh: Vec<Vec<DeliveryId>> = (0..2).map(|t| events(BATCH as usize, 0xa0 + t)).collect();
    // A new delivery for a target whose worker is running (timed); released in between (untimed).
    both(&mut g, "sticky", |t| {
        let (f, ring, fresh) = (&f, &ring, &fresh[t]);
        move |iters| {
            batched(
                iters,
                |i| {
                    let a = f
                        .registry
                        .admit(&f.targets[ring.at(t, i)], &fresh[(i % BATCH) as usize]);
                    debug_assert!(matches!(a, Admission::Assigned(ref a) if !a.new));
                    black_box(a);
                },
                |from, n| {
                    for i in from..from + n {
                        let _ = f
                            .registry
                            .release(&f.targets[ring.at(t, i)], &fresh[(i % BATCH) as usize]);
                    }
                },
            )
        }
    });
    // A new delivery, admitted and completed (timed); the retained claims are expired in between
    // (untimed: jump past the retention, keep the workers alive, sweep).
    let clock = SkipClock::default();
    let cfg = worker_registry::RegistryConfig::builder()
        .max_workers(1 << 20)
        .max_retained_claims(1 << 22)
        .claim_retention(worker_registry::config::DEFAULT_SWEEP_INTERVAL)
        .build()
        .unwrap();
    let sf = Fixture::with(Direct::with_clock(cfg, clock.clone()), WORKERS);
    both(&mut g, "fresh_complete", |t| {
        let (f, ring, fresh, clock) = (&sf, &ring, &fresh[t], &clock);
        move |iters| {
            batched(
                iters,
                |i| {
                    let (tg, e) = (&f.targets[ring.at(t, i)], &fresh[(i % BATCH) as usize]);
                    let a = f.registry.admit(tg, e);
                    debug_assert!(matches!(a, Admission::Assigned(_)), "{a:?}");
                    black_box(a);
                    black_box(f.registry.complete(tg, e).is_ok());
                },
                |_, _| {
                    clock.skip(
                        worker_registry::config::DEFAULT_SWEEP_INTERVAL + Duration::from_millis(1),
                    );
                    for id in &f.ids {
                        let _ = f.registry.heartbeat(*id);
                    }
                    f.registry.sweep();
                },
            )
        }
    });
    // The same at the default `max_retained_claims` (100k) in steady state: every completion
    // eventually costs an eviction, amortised over the batch that the far-over-limit check evicts.
    let lf = Fixture::new(WORKERS);
    let pools: Vec<Vec<DeliveryId>> = (0..2).map(|t| events(1 << 17, 0xb0 + t)).collect();
    both(&mut g, "fresh_complete_at_limit", |t| {
        let (f, ring, pool) = (&lf, &ring, &pools[t]);
        move |iters| {
            timed(iters, |i| {
                let (tg, e) = (
                    &f.targets[ring.at(t, i)],
                    &pool[i as usize & (pool.len() - 1)],
                );
                black_box(f.registry.admit(tg, e));
                black_box(f.registry.complete(tg, e).is_ok());
            })
        }
    });

    // The same two with a typical payload (a 30 KB `pull_request` body and GitHub's headers),
    // built once: what they add is the registry's work (the size check; for a new delivery the
    // budget's CAS, the pointer stored with the claim, the bytes given back at completion).
    let payload = worker_registry::Payload::builder("pull_request", vec![b'x'; 30 * 1024])
        .action("synchronize")
        .header("x-github-hook-id", "123456789")
        .header("x-hub-signature-256", format!("sha256={}", "ab".repeat(32)))
        .build()
        .unwrap();
    both(&mut g, "payload_duplicate", |t| {
        let (f, ring, payload) = (&f, &ring, &payload);
        move |iters| {
            timed(iters, |i| {
                let k = ring.at(t, i);
                let a = f
                    .registry
                    .admit_with(&f.targets[k], &f.events[k], Some(payload));
                // What a router reads of it (the whole `Result` through `black_box` would be
                // written to memory, which the plain row's `Admission` is not).
                black_box(matches!(a, Ok(Admission::Duplicate(_))))
            })
        }
    });
    both(&mut g, "payload_fresh_complete_at_limit", |t| {
        let (f, ring, pool, payload) = (&lf, &ring, &pools[t], &payload);
        move |iters| {
            timed(iters, |i| {
                let (tg, e) = (
                    &f.targets[ring.at(t, i)],
                    &pool[i as usize & (pool.len() - 1)],
                );
                black_box(f.registry.admit_with(tg, e, Some(payload)).is_ok());
                black_box(f.registry.complete(tg, e).is_ok());
            })
        }
    });

    let (m, r, _, _) = naive_fixtures();
    let (nt, ne) = (targets(WORKERS), events(WORKERS, 0xfeed));
    both(&mut g, "mutex_duplicate", |t| {
        let (m, nt, ne, ring) = (&m, &nt, &ne, &ring);
        move |iters| {
            timed(iters, |i| {
                black_box(m.admit(&nt[ring.at(t, i)], &ne[ring.at(t, i)]))
            })
        }
    });
    both(&mut g, "rwlock_duplicate", |t| {
        let (r, nt, ne, ring) = (&r, &nt, &ne, &ring);
        move |iters| {
            timed(iters, |i| {
                black_box(r.admit(&nt[ring.at(t, i)], &ne[ring.at(t, i)]))
            })
        }
    });
    for (name, router) in [("mutex_sticky", &m as &dyn Router), ("rwlock_sticky", &r)] {
        both(&mut g, name, |t| {
            let (nt, ring, fresh) = (&nt, &ring, &fresh[t]);
            move |iters| {
                batched(
                    iters,
                    |i| black_box(router.admit(&nt[ring.at(t, i)], &fresh[(i % BATCH) as usize])),
                    |from, n| {
                        for i in from..from + n {
                            router.release(&nt[ring.at(t, i)], &fresh[(i % BATCH) as usize]);
                        }
                    },
                )
            }
        });
    }
    g.finish();
}

/// The bare claim (dedupe without assignment): a redelivery of a pair claimed already, with the
/// waiting room off and on (on, but empty: nothing waits, so nothing should cost more).
pub fn claim(c: &mut Criterion) {
    let mut g = c.benchmark_group("claim");
    let ring = Ring::new(WORKERS);
    let off = Fixture::new(WORKERS);
    let room = worker_registry::RegistryConfig::builder()
        .max_workers(1 << 20)
        .max_in_flight(worker_registry::config::MAX_DURATION)
        .max_waiting(1024)
        .build()
        .expect("valid bench config");
    let on = Fixture::with(Direct::new(room), WORKERS);
    for (name, f) in [("duplicate", &off), ("duplicate_room_on", &on)] {
        both(&mut g, name, |t| {
            let ring = &ring;
            move |iters| {
                timed(iters, |i| {
                    let k = ring.at(t, i);
                    let a = f.registry.claim(&f.targets[k], &f.events[k]);
                    debug_assert!(matches!(a, ClaimOutcome::AlreadyClaimed(_)));
                    black_box(a);
                })
            }
        });
    }
    g.finish();
}

pub fn status(c: &mut Criterion) {
    let mut g = c.benchmark_group("status");
    for n in [10, 100_000] {
        let f = Fixture::new(n);
        let name = if n == 10 {
            "10".to_string()
        } else {
            format!("{}k", n / 1000)
        };
        both(&mut g, &format!("arc_{name}"), |_| {
            let r = &f.registry;
            move |iters| timed(iters, |_| r.status().version)
        });
        both(&mut g, &format!("with_{name}"), |_| {
            let r = &f.registry;
            move |iters| timed(iters, |_| r.status_with(|s| s.version))
        });
    }
    // Readers while another thread sweeps 10k workers in a loop.
    let f = Fixture::new(WORKERS);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Relaxed: a stop flag; nothing is published through it.
            while !stop.load(Ordering::Relaxed) {
                f.registry.sweep();
            }
        });
        both(&mut g, "arc_sweeping", |_| {
            let r = &f.registry;
            move |iters| timed(iters, |_| r.status().version)
        });
        both(&mut g, "with_sweeping", |_| {
            let r = &f.registry;
            move |iters| timed(iters, |_| r.status_with(|s| s.version))
        });
        // Relaxed: see above.
        stop.store(true, Ordering::Relaxed);
    });
    let (m, r, _, _) = naive_fixtures();
    both(&mut g, "mutex_10k", |_| {
        let m = &m;
        move |iters| timed(iters, |_| black_box(m.status()))
    });
    both(&mut g, "rwlock_10k", |_| {
        let r = &r;
        move |iters| timed(iters, |_| black_box(r.status()))
    });
    g.finish();
}

pub fn sweep(c: &mut Criterion) {
    let mut g = c.benchmark_group("sweep");
    for n in [WORKERS, 100_000] {
        let k = format!("{}k", n / 1000);
        g.throughput(Throughput::Elements(n as u64));
        // No state changes: every worker alive, nothing to release, expire or purge.
        let f = Fixture::new(n);
        g.bench_function(id(&format!("idle_{k}"), 1), |b| {
            b.iter_custom(|iters| timed(iters, |_| black_box(f.registry.sweep().version)))
        });
        // The same while another thread heartbeats (the hot path keeps running during a sweep).
        g.bench_function(id(&format!("idle_{k}"), 2), |b| {
            b.iter_custom(|iters| {
                let stop = AtomicBool::new(false);
                run(2, iters, |t| {
                    let (f, stop) = (&f, &stop);
                    move |iters: u64| {
                        if t == 1 {
                            let mut i = 0usize;
                            // Relaxed: a stop flag.
                            while !stop.load(Ordering::Relaxed) {
                                let _ = f.registry.heartbeat(f.ids[i % f.ids.len()]);
                                i = i.wrapping_add(7919);
                            }
                            return Duration::ZERO;
                        }
                        let d = timed(iters, |_| black_box(f.registry.sweep().version));
                        // Relaxed: a stop flag.
                        stop.store(true, Ordering::Relaxed);
                        d
                    }
                })
            })
        });
        drop(f);
        if n == WORKERS {
            // The same with 100k completed claims retained (a router at the default bound): a
            // sweep must not walk them, so this costs what the idle sweep costs.
            let f = Fixture::new(n);
            let extra = events(100_000, 0x5e7a);
            for (i, e) in extra.iter().enumerate() {
                let t = &f.targets[i % n];
                f.registry.admit(t, e);
                let _ = f.registry.complete(t, e);
            }
            f.registry.sweep();
            g.bench_function(id("idle_10k_retained_100k", 1), |b| {
                b.iter_custom(|iters| timed(iters, |_| black_box(f.registry.sweep().version)))
            });
        }
        // With state changes: each sweep, 1% of the workers have gone silent and die (their claims
        // are released, their targets unmapped), 1% new workers arrived since the last one, and the
        // dead of five sweeps ago are purged.
        let clock = SkipClock::default();
        let f = Fixture::with(Direct::with_clock(config(), clock.clone()), n);
        let mut live: std::collections::VecDeque<WorkerId> = f.ids.iter().copied().collect();
        let mut next = n;
        let step = f.registry.config().heartbeat_timeout() + Duration::from_millis(1);
        let victims = n / 100;
        g.bench_function(id(&format!("changes_{k}"), 1), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    clock.skip(step);
                    for (j, id) in live.iter().enumerate() {
                        if j >= victims {
                            let _ = f.registry.heartbeat(*id);
                        }
                    }
                    let start = Stopwatch::start();
                    let report = f.registry.sweep();
                    total += start.elapsed();
                    debug_assert_eq!(report.died.len(), victims);
                    live.drain(..victims);
                    for _ in 0..victims {
                        let t = worker_registry::Target::new(&format!("new/r-{next}"), 1).unwrap();
                        let e = DeliveryId::new(&format!("ev-{next}")).unwrap();
                        next += 1;
                        if let Admission::Assigned(a) = f.registry.admit(&t, &e) {
                            live.push_back(a.worker);
                        }
                    }
                }
                total
            })
        });
    }
    let (m, r, _, _) = naive_fixtures();
    g.throughput(Throughput::Elements(WORKERS as u64));
    g.bench_function(id("mutex_idle_10k", 1), |b| {
        b.iter_custom(|iters| timed(iters, |_| black_box(m.sweep())))
    });
    g.bench_function(id("rwlock_idle_10k", 1), |b| {
        b.iter_custom(|iters| timed(iters, |_| black_box(r.sweep())))
    });
    g.finish();
}
