//! The measured calls: one fixture and one loop per row, each loop run inside [`measured`], the
//! only function whose instructions callgrind counts (`--toggle-collect`).
//!
//! Every row builds its fixture with the wall-clock benches' `common::Fixture` (10 000 live workers, each
//! holding one in-flight claim; the at-limit row at the default retained bound), runs the call
//! `WARM` times uncounted (caches, tables and rings reach their steady size) and then `CALLS`
//! times counted. Floors (bare primitives with the same key types and hasher) are rows too, so a
//! ratio of instruction counts can be read beside the wall-clock one.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use rand::{Rng, SeedableRng};
use worker_registry::config::DEFAULT_SHARDS;
use worker_registry::{Admission, Clock, DeliveryId, Payload, SystemClock, Target, WorkerId};

pub use crate::common::WORKERS;
use crate::common::{events, targets, Fixture, Hasher};

/// Counted calls per row (sweeps: `SWEEPS`).
pub const CALLS: u64 = 20_000;
const WARM: u64 = 4_096;
const SWEEPS: u64 = 4;

/// Runs `op(i)` for `i` in `0..n`. Never inlined and not generic over anything but the closure,
/// so callgrind's `--toggle-collect=*measured*` counts exactly these loops.
#[inline(never)]
pub fn measured<R>(n: u64, mut op: impl FnMut(u64) -> R) {
    for i in 0..n {
        black_box(op(i));
    }
}

/// One row: its name, what it measures, how many calls one counted loop makes and how to run it.
pub struct Row {
    pub name: &'static str,
    pub what: &'static str,
    /// Calls per counted loop (the per-call figure is the loop's count over this).
    pub calls: u64,
    pub run: fn(bool),
}

pub const ROWS: &[Row] = &[
    Row { name: "heartbeat_by_id", what: "Direct::heartbeat(id), 10k workers", calls: CALLS, run: heartbeat_by_id },
    Row { name: "heartbeat_handle", what: "WorkerHandle::heartbeat()", calls: CALLS, run: heartbeat_handle },
    Row { name: "admit_duplicate", what: "admit of an in-flight delivery (redelivery)", calls: CALLS, run: admit_duplicate },
    Row { name: "admit_fresh_complete_at_limit", what: "admit + complete of a fresh delivery at the default retained bound (every completion evicts)", calls: CALLS, run: admit_fresh_complete_at_limit },
    Row { name: "admit_payload_duplicate", what: "admit_with(30 KB payload) of an in-flight delivery (redelivery)", calls: CALLS, run: admit_payload_duplicate },
    Row { name: "admit_payload_fresh_complete_at_limit", what: "admit_with(30 KB payload) + complete of a fresh delivery at the retained bound", calls: CALLS, run: admit_payload_fresh_complete_at_limit },
    Row { name: "status", what: "status() (Arc of the snapshot)", calls: CALLS, run: status },
    Row { name: "status_with", what: "status_with(|s| s.version)", calls: CALLS, run: status_with },
    Row { name: "sweep_idle_10k", what: "sweep(), 10k idle workers (per sweep)", calls: SWEEPS, run: sweep_idle_10k },
    Row { name: "floor_dashmap_get_store", what: "floor: DashMap<WorkerId, AtomicU64> get + store", calls: CALLS, run: floor_get_store },
    Row { name: "floor_fence", what: "floor of a fencing heartbeat: DashMap get + coarse clock read + one CAS", calls: CALLS, run: floor_fence },
    Row { name: "floor_dashmap_get_claim", what: "floor of a duplicate: DashMap get on the (target, delivery) key", calls: CALLS, run: floor_get_claim },
];

pub fn find(name: &str) -> Option<&'static Row> {
    ROWS.iter().find(|r| r.name == name)
}

/// A fixed pseudo-random access pattern over `0..n`, a power of two long.
struct Pattern(Vec<u32>);

impl Pattern {
    fn new(n: usize) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        Pattern((0..8192).map(|_| rng.gen_range(0..n as u32)).collect())
    }
    #[inline(always)]
    fn at(&self, i: u64) -> usize {
        self.0[i as usize & 8191] as usize
    }
}

/// Runs `op` `WARM` times, then (`count`) `calls` times inside `measured`.
fn run<R>(count: bool, calls: u64, mut op: impl FnMut(u64) -> R) {
    for i in 0..WARM.min(calls * 1024) {
        black_box(op(i.wrapping_add(1 << 40)));
    }
    if count {
        measured(calls, op);
    }
}

fn heartbeat_by_id(count: bool) {
    let f = Fixture::new(WORKERS);
    let p = Pattern::new(WORKERS);
    run(count, CALLS, |i| {
        f.registry.heartbeat(f.ids[p.at(i)]).is_ok()
    });
}

fn heartbeat_handle(count: bool) {
    let f = Fixture::new(WORKERS);
    let h = f.registry.handle(f.ids[0]).unwrap();
    run(count, CALLS, |_| h.heartbeat().is_ok());
}

fn admit_duplicate(count: bool) {
    let f = Fixture::new(WORKERS);
    let p = Pattern::new(WORKERS);
    run(count, CALLS, |i| {
        let k = p.at(i);
        matches!(
            f.registry.admit(&f.targets[k], &f.events[k]),
            Admission::Duplicate(_)
        )
    });
}

/// A typical `pull_request` delivery's payload: a 30 KB body and GitHub's headers. Built once:
/// what an admission costs is the registry's work, not building the payload.
fn payload() -> Payload {
    Payload::builder("pull_request", vec![b'x'; 30 * 1024])
        .action("synchronize")
        .header("x-github-hook-id", "123456789")
        .header("x-hub-signature-256", format!("sha256={}", "ab".repeat(32)))
        .build()
        .unwrap()
}

fn admit_payload_duplicate(count: bool) {
    let f = Fixture::new(WORKERS);
    let p = Pattern::new(WORKERS);
    let payload = payload();
    run(count, CALLS, |i| {
        let k = p.at(i);
        matches!(
            f.registry
                .admit_with(&f.targets[k], &f.events[k], Some(&payload)),
            Ok(Admission::Duplicate(_))
        )
    });
}

fn admit_fresh_complete_at_limit(count: bool) {
    let (f, p, pool) = at_limit();
    let mask = pool.len() - 1;
    let mut next = worker_registry::config::DEFAULT_MAX_RETAINED_CLAIMS;
    run(count, CALLS, |i| {
        let (t, e) = (&f.targets[p.at(i)], &pool[next & mask]);
        next += 1;
        let a = f.registry.admit(t, e);
        (
            matches!(a, Admission::Assigned(_)),
            f.registry.complete(t, e).is_ok(),
        )
    });
}

fn admit_payload_fresh_complete_at_limit(count: bool) {
    let (f, p, pool) = at_limit();
    let payload = payload();
    let mask = pool.len() - 1;
    let mut next = worker_registry::config::DEFAULT_MAX_RETAINED_CLAIMS;
    run(count, CALLS, |i| {
        let (t, e) = (&f.targets[p.at(i)], &pool[next & mask]);
        next += 1;
        let a = f.registry.admit_with(t, e, Some(&payload));
        (
            matches!(a, Ok(Admission::Assigned(_))),
            f.registry.complete(t, e).is_ok(),
        )
    });
}

/// The fixture of the at-limit rows: the registry filled to the default retained bound
/// (untimed), so that every counted completion evicts the oldest claim, an access pattern, and
/// the pool of fresh delivery ids (the first `DEFAULT_MAX_RETAINED_CLAIMS` used).
fn at_limit() -> (Fixture, Pattern, Vec<DeliveryId>) {
    let f = Fixture::new(WORKERS);
    let p = Pattern::new(WORKERS);
    // Fill to the bound (untimed), then every counted completion evicts the oldest claim.
    let bound = worker_registry::config::DEFAULT_MAX_RETAINED_CLAIMS;
    let pool = events(1 << 17, 0xb0);
    assert!(pool.len() > bound);
    for (i, e) in pool.iter().enumerate().take(bound) {
        let t = &f.targets[i % WORKERS];
        f.registry.admit(t, e);
        let _ = f.registry.complete(t, e);
    }
    (f, p, pool)
}

fn status(count: bool) {
    let f = Fixture::new(10);
    run(count, CALLS, |_| f.registry.status().version);
}

fn status_with(count: bool) {
    let f = Fixture::new(10);
    run(count, CALLS, |_| f.registry.status_with(|s| s.version));
}

fn sweep_idle_10k(count: bool) {
    let f = Fixture::new(WORKERS);
    run(count, SWEEPS, |_| f.registry.sweep().version);
}

fn floor_words() -> (DashMap<WorkerId, AtomicU64, Hasher>, Vec<WorkerId>) {
    let words = DashMap::with_hasher_and_shard_amount(Hasher::new(), DEFAULT_SHARDS);
    let ids: Vec<WorkerId> = (1..=WORKERS as u64).map(WorkerId::new).collect();
    for id in &ids {
        words.insert(*id, AtomicU64::new(0));
    }
    (words, ids)
}

fn floor_get_store(count: bool) {
    let (words, ids) = floor_words();
    let p = Pattern::new(WORKERS);
    run(count, CALLS, |i| {
        if let Some(w) = words.get(&ids[p.at(i)]) {
            // Release: what a heartbeat store would need to publish.
            w.store(i, Ordering::Release);
        }
    });
}

fn floor_fence(count: bool) {
    let (words, ids) = floor_words();
    let p = Pattern::new(WORKERS);
    let clock = SystemClock::new();
    run(count, CALLS, |i| {
        let now = clock.now_millis();
        words.get(&ids[p.at(i)]).map(|w| {
            // Acquire/AcqRel: the orderings of the registry's state-word transition.
            let mut cur = w.load(Ordering::Acquire);
            loop {
                if cur & 3 == 2 {
                    return false;
                }
                let next = (cur & 0xff) | (now.max(cur >> 8) << 8) | 16;
                match w.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return true,
                    Err(seen) => cur = seen,
                }
            }
        })
    });
}

fn floor_get_claim(count: bool) {
    let keys: Vec<(Target, DeliveryId)> = targets(WORKERS)
        .into_iter()
        .zip(events(WORKERS, 0xfeed))
        .collect();
    let m: DashMap<(Target, DeliveryId), u64, Hasher> =
        DashMap::with_hasher_and_shard_amount(Hasher::new(), DEFAULT_SHARDS);
    for (i, k) in keys.iter().enumerate() {
        m.insert(k.clone(), i as u64);
    }
    let p = Pattern::new(WORKERS);
    run(count, CALLS, |i| m.get(&keys[p.at(i)]).map(|v| *v));
}
