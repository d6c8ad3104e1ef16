//! Memory per worker record and per retained claim, measured with a counting global allocator, and
//! the documented budget: one million retained claims (36-byte GitHub delivery ids) fit in
//! `CLAIMS_BUDGET_1M` bytes.
//!
//! Counts are per thread (each test counts only its own allocations) and deterministic up to the
//! maps' hash seeds (which shard a key lands in moves table growth a little), so the budgets have
//! some headroom; time plays no part. "Bytes" are the bytes requested from the allocator plus an
//! allowance of `MALLOC_OVERHEAD` per live allocation for the allocator's own header and rounding.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use worker_registry::{
    Admission, AssignOutcome, DeliveryId, InMemoryRegistry, ManualClock, RegistryConfig, Target,
};

struct Counting;

thread_local! {
    static BYTES: Cell<isize> = const { Cell::new(0) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn track(bytes: isize, allocs: isize) {
    let _ = BYTES.try_with(|c| c.set(c.get() + bytes));
    let _ = LIVE.try_with(|c| c.set(c.get() + allocs));
}

// SAFETY: forwards every call to the system allocator unchanged; the bookkeeping only touches
// const-initialised thread-locals (no allocation, no re-entrancy).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            track(layout.size() as isize, 1);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            track(layout.size() as isize, 1);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        track(-(layout.size() as isize), -1);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            track(new_size as isize - layout.size() as isize, 0);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The allowance per live allocation for the allocator's header and size-class rounding (glibc:
/// an 8-byte header, 16-byte granularity).
const MALLOC_OVERHEAD: usize = 16;

/// One million retained claims must fit in this (documented in the README).
const CLAIMS_BUDGET_1M: usize = 256 << 20;
/// Per live worker (record, map entries, its target, its snapshot entry), at 10k workers.
const WORKER_BUDGET: usize = 768;

/// Net (bytes, live allocations) this thread allocated while running `f`, plus what `f` returned.
fn measure<R>(f: impl FnOnce() -> R) -> (usize, usize, R) {
    let (b0, l0) = (BYTES.with(Cell::get), LIVE.with(Cell::get));
    let r = f();
    let (b1, l1) = (BYTES.with(Cell::get), LIVE.with(Cell::get));
    ((b1 - b0).max(0) as usize, (l1 - l0).max(0) as usize, r)
}

fn footprint(bytes: usize, allocs: usize) -> usize {
    bytes + allocs * MALLOC_OVERHEAD
}

fn config(max_retained: usize) -> RegistryConfig {
    RegistryConfig::builder()
        .max_workers(1 << 20)
        .max_retained_claims(max_retained)
        .build()
        .unwrap()
}

fn event(i: usize) -> DeliveryId {
    // The shape of GitHub's X-GitHub-Delivery: a 36-byte GUID.
    DeliveryId::new(&format!("{:08x}-cc78-11e3-81ab-{i:012x}", i as u32)).unwrap()
}

#[test]
fn bytes_per_worker_record_are_bounded() {
    const N: usize = 10_000;
    let registry = InMemoryRegistry::with_clock(config(1 << 20), ManualClock::new());
    // Spawned workers: record, worker-map and target-map entries, the target's name.
    let (bytes, allocs, ()) = measure(|| {
        for i in 0..N {
            let t = Target::new(&format!("org-{}/repo-{i}", i % 97), 1).unwrap();
            assert!(matches!(registry.assign(&t), AssignOutcome::Assigned(_)));
        }
    });
    let per_worker = footprint(bytes, allocs) as f64 / N as f64;
    // Plus each one's entry in the published snapshot.
    let (sbytes, sallocs, _) = measure(|| registry.sweep());
    let per_snapshot_entry = footprint(sbytes, sallocs) as f64 / N as f64;
    // A self-registered pool worker: record and worker-map entry only.
    let (rbytes, rallocs, handles) = measure(|| {
        (0..N)
            .map(|_| registry.register().unwrap())
            .collect::<Vec<_>>()
    });
    let handles_vec = N * std::mem::size_of::<worker_registry::WorkerHandle<ManualClock>>();
    let per_registered = (footprint(rbytes, rallocs) - handles_vec) as f64 / N as f64;
    println!(
        "per spawned worker: {per_worker:.0} B ({:.2} allocations); its snapshot entry: \
         {per_snapshot_entry:.0} B; per registered worker: {per_registered:.0} B",
        allocs as f64 / N as f64
    );
    assert!(
        per_worker + per_snapshot_entry <= WORKER_BUDGET as f64,
        "{per_worker:.0} + {per_snapshot_entry:.0} B per worker exceeds {WORKER_BUDGET}"
    );
    assert!(
        per_registered <= WORKER_BUDGET as f64,
        "{per_registered:.0} B per registered worker exceeds {WORKER_BUDGET}"
    );
    assert!(
        per_worker > 0.0 && per_snapshot_entry > 0.0,
        "the counter counts"
    );
    drop(handles);
}

#[test]
fn a_million_retained_claims_fit_the_budget() {
    const N: usize = 1_000_000;
    const TARGETS: usize = 1_000;
    let registry = InMemoryRegistry::with_clock(config(N), ManualClock::new());
    let targets: Vec<Target> = (0..TARGETS)
        .map(|i| Target::new(&format!("org/repo-{i}"), 1).unwrap())
        .collect();
    for (i, t) in targets.iter().enumerate() {
        assert!(matches!(
            registry.admit(t, &event(N + i)),
            Admission::Assigned(_)
        ));
    }
    // The delivery ids are made inside the measurement: the registry keeps them.
    let (bytes, allocs, ()) = measure(|| {
        for i in 0..N {
            let (t, e) = (&targets[i % TARGETS], event(i));
            assert!(matches!(registry.admit(t, &e), Admission::Assigned(_)));
            registry.complete(t, &e).unwrap();
        }
    });
    assert_eq!(registry.stats().retained_claims, N);
    let total = footprint(bytes, allocs);
    println!(
        "1M retained claims: {} B requested in {allocs} allocations, {total} B with allocator \
         overhead ({:.0} B per claim); budget {CLAIMS_BUDGET_1M} B",
        bytes,
        total as f64 / N as f64
    );
    assert!(
        total <= CLAIMS_BUDGET_1M,
        "{total} B exceeds the budget {CLAIMS_BUDGET_1M} B"
    );
    assert!(
        allocs >= N,
        "each claim keeps its delivery id ({allocs} allocations)"
    );
}
