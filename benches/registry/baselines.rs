//! The floors: bare primitives with the registry's key types and hasher, and moka as the dedupe peer.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use criterion::Criterion;
use crossbeam_utils::CachePadded;
use dashmap::DashMap;
use worker_registry::config::DEFAULT_SHARDS;
use worker_registry::{DeliveryId, Target, WorkerId};

use crate::common::{both, events, targets, timed, Hasher, Ring, WORKERS};

type ClaimKey = (Target, DeliveryId);

fn claim_map<V>(keys: &[ClaimKey], v: impl Fn(usize) -> V) -> DashMap<ClaimKey, V, Hasher> {
    let m = DashMap::with_hasher_and_shard_amount(Hasher::new(), DEFAULT_SHARDS);
    for (i, k) in keys.iter().enumerate() {
        m.insert(k.clone(), v(i));
    }
    m
}

fn claim_keys() -> Vec<ClaimKey> {
    targets(WORKERS)
        .into_iter()
        .zip(events(WORKERS, 0xfeed))
        .collect()
}

pub fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("baseline");
    let ring = Ring::new(WORKERS);

    // One atomic per thread, on its own cache line (a worker heartbeats its own record).
    let cells: Vec<CachePadded<AtomicU64>> = (0..2).map(|_| Default::default()).collect();
    both(&mut g, "atomic_store", |t| {
        let cell = &cells[t];
        // Release: what a heartbeat store would need to publish.
        move |iters| timed(iters, |i| cell.store(black_box(i), Ordering::Release))
    });
    both(&mut g, "atomic_cas", |t| {
        let cell = &cells[t];
        move |iters| {
            timed(iters, |i| {
                // The registry's transition shape: load, compute, compare-exchange until it sticks.
                let mut cur = cell.load(Ordering::Acquire);
                loop {
                    let next = cur.max(black_box(i)) | 1;
                    match cell.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
                    {
                        Ok(_) => break,
                        Err(seen) => cur = seen,
                    }
                }
            })
        }
    });

    // The price of one shared cache line (for the scaling estimates in docs::performance): every
    // thread adds to the same atomic. At 1 thread it is an uncontended read-modify-write; at 2
    // the line moves between the cores on every add, so the 2-thread time per add (wall time over
    // both threads' adds) is about one line transfer.
    let shared = CachePadded::new(AtomicU64::new(0));
    both(&mut g, "shared_add", |_| {
        let shared = &shared;
        // Relaxed: a count; the cost measured is the line's, not an ordering's.
        move |iters| timed(iters, |_| shared.fetch_add(1, Ordering::Relaxed))
    });

    // Worker id -> atomic word, the shape of a heartbeat by id.
    let words: DashMap<WorkerId, AtomicU64, Hasher> =
        DashMap::with_hasher_and_shard_amount(Hasher::new(), DEFAULT_SHARDS);
    let ids: Vec<WorkerId> = (1..=WORKERS as u64).map(WorkerId::new).collect();
    for id in &ids {
        words.insert(*id, AtomicU64::new(0));
    }
    both(&mut g, "dashmap_get_store", |t| {
        let (words, ids, ring) = (&words, &ids, &ring);
        move |iters| {
            timed(iters, |i| {
                if let Some(w) = words.get(&ids[ring.at(t, i)]) {
                    // Release: as in `atomic_store`.
                    w.store(i, Ordering::Release);
                }
            })
        }
    });

    // The floor of any heartbeat that fences (issue 23): the shard read of a get, a coarse clock
    // read and one CAS on the state word that refuses a dead worker. The registry adds to this
    // only the record's indirection (its state word lives in the worker's record, shared with
    // handles, targets and claims) and the heartbeat counter.
    let clock = worker_registry::SystemClock::new();
    both(&mut g, "fence", |t| {
        let (words, ids, ring, clock) = (&words, &ids, &ring, &clock);
        move |iters| {
            timed(iters, |i| {
                let now = worker_registry::Clock::now_millis(clock);
                words.get(&ids[ring.at(t, i)]).map(|w| {
                    // Acquire / AcqRel: the orderings of the registry's state-word transition.
                    let mut cur = w.load(Ordering::Acquire);
                    loop {
                        if cur & 3 == 2 {
                            return false;
                        }
                        let next = (cur & 0xff) | (now.max(cur >> 8) << 8) | 16;
                        match w.compare_exchange_weak(
                            cur,
                            next,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        ) {
                            Ok(_) => return true,
                            Err(seen) => cur = seen,
                        }
                    }
                })
            })
        }
    });

    // (target, delivery) -> claim, the shape of the duplicate check and of claim + release.
    let keys = claim_keys();
    let claims = claim_map(&keys, |i| i as u64);
    both(&mut g, "dashmap_get_claim", |t| {
        let (claims, keys, ring) = (&claims, &keys, &ring);
        move |iters| {
            timed(iters, |i| {
                black_box(claims.get(&keys[ring.at(t, i)]).map(|v| *v))
            })
        }
    });
    let fresh: Vec<Vec<DeliveryId>> = (0..2).map(|t| events(1 << 14, 0xf00 + t)).collect();
    both(&mut g, "dashmap_insert_remove", |t| {
        let (claims, keys, ring, fresh) = (&claims, &keys, &ring, &fresh[t]);
        move |iters| {
            timed(iters, |i| {
                let target = &keys[ring.at(t, i)].0;
                let event = &fresh[i as usize & (fresh.len() - 1)];
                // A user's dedupe: insert if absent ...
                let inserted = match claims.entry((target.clone(), event.clone())) {
                    dashmap::Entry::Vacant(v) => {
                        v.insert(i);
                        true
                    }
                    dashmap::Entry::Occupied(_) => false,
                };
                // ... and forget it when done.
                black_box(inserted);
                black_box(claims.remove(&(target.clone(), event.clone())));
            })
        }
    });

    // The floor of a fresh admit + complete at the retained bound (issue 23): an insert and a
    // remove in a map that holds the bound, plus a push and a pop on a ring (the oldest claim
    // evicted in completion order). Each thread owns its ring (half the bound each); the map is
    // shared. The floor also hashes the two key strings; the registry's timed call gets
    // keys already validated (their hashes computed once, untimed, when parsed), so the floor
    // leaves the string hashing out as well, which only makes it stricter.
    let bound = worker_registry::config::DEFAULT_MAX_RETAINED_CLAIMS;
    let bounded: DashMap<ClaimKey, u64, Hasher> =
        DashMap::with_hasher_and_shard_amount(Hasher::new(), DEFAULT_SHARDS);
    let pools: Vec<Vec<DeliveryId>> = (0..2).map(|t| events(1 << 17, 0xbd0 + t)).collect();
    let rings: Vec<std::sync::Mutex<(std::collections::VecDeque<ClaimKey>, usize)>> = (0..2)
        .map(|t| {
            let mut ring = std::collections::VecDeque::with_capacity(bound / 2 + 1);
            for (i, e) in pools[t].iter().take(bound / 2).enumerate() {
                let key = (keys[i % keys.len()].0.clone(), e.clone());
                bounded.insert(key.clone(), i as u64);
                ring.push_back(key);
            }
            std::sync::Mutex::new((ring, bound / 2))
        })
        .collect();
    both(&mut g, "bounded_insert_remove", |t| {
        let (bounded, keys, ring, pool, rings) = (&bounded, &keys, &ring, &pools[t], &rings);
        move |iters| {
            let mut guard = rings[t].lock().unwrap();
            let (fifo, next) = &mut *guard;
            timed(iters, |i| {
                let target = &keys[ring.at(t, i)].0;
                let event = &pool[*next & (pool.len() - 1)];
                *next += 1;
                let key = (target.clone(), event.clone());
                // The new claim ...
                black_box(bounded.insert(key.clone(), i));
                fifo.push_back(key);
                // ... and the oldest one evicted.
                if let Some(old) = fifo.pop_front() {
                    black_box(bounded.remove(&old));
                }
            })
        }
    });

    // The published snapshot.
    let cell = ArcSwap::from_pointee(vec![0u64; 16]);
    both(&mut g, "arcswap_load", |_| {
        let cell = &cell;
        move |iters| timed(iters, |_| black_box(cell.load().len()))
    });
    both(&mut g, "arcswap_load_full", |_| {
        let cell = &cell;
        move |iters| timed(iters, |_| black_box(cell.load_full().len()))
    });

    // The floor of a sweep: visit every entry of a 10k / 100k map and read one atomic word.
    for n in [WORKERS, 100_000] {
        let m: DashMap<WorkerId, Arc<AtomicU64>, Hasher> =
            DashMap::with_hasher_and_shard_amount(Hasher::new(), DEFAULT_SHARDS);
        for i in 1..=n as u64 {
            m.insert(WorkerId::new(i), Arc::new(AtomicU64::new(i)));
        }
        g.throughput(criterion::Throughput::Elements(n as u64));
        g.bench_function(
            crate::common::id(&format!("dashmap_scan_{}k", n / 1000), 1),
            |b| {
                b.iter_custom(|iters| {
                    timed(iters, |_| {
                        let mut live = 0u64;
                        for r in m.iter() {
                            // Acquire: as the sweep's read of a state word.
                            live += r.value().load(Ordering::Acquire) & 1;
                        }
                        black_box(live);
                    })
                })
            },
        );
    }
    g.finish();

    // moka as the dedupe peer: a TTL cache with the same key type and hasher.
    let mut g = c.benchmark_group("moka");
    let cache: moka::sync::Cache<ClaimKey, u64, Hasher> = moka::sync::Cache::builder()
        .max_capacity(1 << 20)
        .time_to_live(Duration::from_secs(3 * 24 * 3600))
        .build_with_hasher(Hasher::new());
    for (i, k) in keys.iter().enumerate() {
        cache.insert(k.clone(), i as u64);
    }
    cache.run_pending_tasks();
    both(&mut g, "get_hit", |t| {
        let (cache, keys, ring) = (&cache, &keys, &ring);
        move |iters| timed(iters, |i| black_box(cache.get(&keys[ring.at(t, i)])))
    });
    both(&mut g, "insert_invalidate", |t| {
        let (cache, keys, ring, fresh) = (&cache, &keys, &ring, &fresh[t]);
        move |iters| {
            timed(iters, |i| {
                let target = &keys[ring.at(t, i)].0;
                let event = &fresh[i as usize & (fresh.len() - 1)];
                let key = (target.clone(), event.clone());
                black_box(cache.entry(key.clone()).or_insert(i).is_fresh());
                cache.invalidate(&key);
            })
        }
    });
    g.finish();
}
