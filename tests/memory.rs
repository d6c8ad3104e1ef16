//! Memory per worker record, per retained claim and per payload held, measured with a counting
//! global allocator, the documented budgets (a retained claim with a GitHub delivery id, keys
//! included, at most `CLAIM_BUDGET` bytes; a completed claim keeps nothing of its payload), and
//! that the hot paths allocate nothing once the registry is warm.
//!
//! Counts are per thread (each test counts only its own allocations) and deterministic up to the
//! maps' hash seeds (which shard a key lands in moves table growth a little), so the budgets have
//! some headroom; time plays no part. "Bytes" are the bytes requested from the allocator plus an
//! allowance of `MALLOC_OVERHEAD` per live allocation for the allocator's own header and rounding.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use worker_registry::{
    memory::Direct, Admission, AssignOutcome, DeliveryId, ManualClock, RegistryConfig, Target,
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

/// Bytes per retained claim, its keys included (issue 10's target, documented in the README).
const CLAIM_BUDGET: usize = 96;
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
    let registry = Direct::with_clock(config(1 << 20), ManualClock::new());
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

/// One million retained claims with GitHub's delivery ids (36-character UUIDs, kept as their 16
/// bytes), everything the registry holds for them counted: the table, its index and the ring
/// slack, built from an empty registry inside the measurement.
#[test]
fn a_retained_claim_costs_at_most_the_budget() {
    const N: usize = 1_000_000;
    const TARGETS: usize = 1_000;
    let targets: Vec<Target> = (0..TARGETS)
        .map(|i| Target::new(&format!("org/repo-{i}"), 1).unwrap())
        .collect();
    let (bytes, allocs, registry) = measure(|| {
        let registry = Direct::with_clock(config(N), ManualClock::new());
        for (i, t) in targets.iter().enumerate() {
            assert!(matches!(
                registry.admit(t, &event(N + i)),
                Admission::Assigned(_)
            ));
        }
        // The delivery ids are made inside the measurement too: the registry keeps what it needs.
        for i in 0..N {
            let (t, e) = (&targets[i % TARGETS], event(i));
            assert!(matches!(registry.admit(t, &e), Admission::Assigned(_)));
            registry.complete(t, &e).unwrap();
        }
        registry
    });
    assert_eq!(registry.stats().retained_claims, N);
    let total = footprint(bytes, allocs);
    let per_claim = total as f64 / N as f64;
    println!(
        "1M retained claims: {bytes} B requested in {allocs} allocations, {total} B with allocator \
         overhead: {per_claim:.1} B per claim (budget {CLAIM_BUDGET} B)"
    );
    assert!(
        per_claim <= CLAIM_BUDGET as f64,
        "{per_claim:.1} B per retained claim exceeds the budget {CLAIM_BUDGET} B"
    );
    assert!(per_claim > 16.0, "the counter counts ({per_claim:.1} B)");
}

/// Delivery ids that are not UUIDs are kept as their (shared) text: each such claim costs more than
/// a claim with a UUID id, measured the same way in the same run, by at least the text's bytes and
/// at most its allocation (the `Arc<str>` with its header and the allocator's overhead).
#[test]
fn a_retained_claim_with_a_text_delivery_id_costs_its_text_more() {
    const N: usize = 200_000;
    let t = Target::new("org/repo", 1).unwrap();
    let per_claim = |id: &dyn Fn(usize) -> DeliveryId| {
        let (bytes, allocs, _registry) = measure(|| {
            let registry = Direct::with_clock(config(N), ManualClock::new());
            for i in 0..N {
                let e = id(i);
                registry.admit(&t, &e);
                registry.complete(&t, &e).unwrap();
            }
            registry
        });
        footprint(bytes, allocs) as f64 / N as f64
    };
    let uuid = per_claim(&event);
    let texted = per_claim(&|i| DeliveryId::new(&format!("delivery-{i:012}")).unwrap()); // 21 bytes
                                                                                         // The text: an `Arc<str>` of 21 bytes (16-byte header, 48-byte size class with overhead).
    let text = 16 + 21 + MALLOC_OVERHEAD + 11;
    let more = texted - uuid;
    println!(
        "retained claim with a 21-byte text id: {texted:.1} B, with a UUID id: {uuid:.1} B: \
         {more:.1} B more (the text is 21 B, its allocation {text} B)"
    );
    assert!(
        more >= 21.0,
        "a text id costs only {more:.1} B more than a UUID"
    );
    assert!(
        more <= text as f64,
        "a text id costs {more:.1} B more than a UUID"
    );
    assert!(texted <= (CLAIM_BUDGET + text) as f64, "{texted:.1} B");
}

/// Once warm (at the retained bound, so every completion also evicts), admitting and completing
/// fresh deliveries, redeliveries, and heartbeats by id and through a handle allocate nothing.
#[test]
fn hot_paths_do_not_allocate_once_warm() {
    const WARM: usize = 400_000;
    const OPS: usize = 100_000;
    const TARGETS: usize = 256;
    let clock = ManualClock::new();
    let registry = Direct::with_clock(config(100_000), clock.clone());
    let targets: Vec<Target> = (0..TARGETS)
        .map(|i| Target::new(&format!("org-{}/repo-{i}", i % 7), 1).unwrap())
        .collect();
    let ids: Vec<worker_registry::WorkerId> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| match registry.admit(t, &event(10_000_000 + i)) {
            Admission::Assigned(a) => a.worker,
            other => panic!("{other:?}"),
        })
        .collect();
    let handle = registry.handle(ids[0]).unwrap();
    let fresh: Vec<DeliveryId> = (0..WARM + OPS).map(event).collect();
    for (i, e) in fresh[..WARM].iter().enumerate() {
        let t = &targets[i % TARGETS];
        registry.admit(t, e);
        registry.complete(t, e).unwrap();
        // Time passes (eviction is oldest first by completion time, so it needs time to order).
        if i % 100 == 0 {
            clock.advance(std::time::Duration::from_millis(1));
        }
        if i % 50_000 == 0 {
            registry.sweep();
        }
    }
    registry.sweep();
    // Redeliveries of the delivery completed a thousand rounds earlier (well within the bound).
    let redelivered: Vec<(usize, &DeliveryId)> = (0..OPS)
        .map(|i| {
            let j = WARM + i - 1000;
            (j % TARGETS, &fresh[j])
        })
        .collect();
    let (bytes, allocs, ()) = measure(|| {
        for (i, e) in fresh[WARM..].iter().enumerate() {
            let t = &targets[(WARM + i) % TARGETS];
            assert!(matches!(registry.admit(t, e), Admission::Assigned(_)));
            registry.complete(t, e).unwrap();
            if i % 100 == 0 {
                clock.advance(std::time::Duration::from_millis(1));
            }
            let (k, old) = redelivered[i];
            let a = registry.admit(&targets[k], old);
            assert!(
                matches!(a, Admission::Duplicate(_)),
                "round {i}: {a:?} {:?}",
                registry.stats()
            );
            registry.heartbeat(ids[i % TARGETS]).unwrap();
            handle.heartbeat().unwrap();
        }
    });
    assert_eq!(
        (bytes, allocs),
        (0, 0),
        "{OPS} rounds of admit + complete + redelivery + heartbeats allocated"
    );
    assert!(
        registry.stats().claims_evicted >= OPS as u64,
        "every completion evicted"
    );
}

/// The high-water mark (issue 23): 200 000 deliveries admitted before any completes, then all
/// completed. The storage sized for the burst of in-flight claims is given back as they complete,
/// so what the registry keeps afterwards is within the same per-claim budget as claims completed
/// one at a time.
#[test]
fn a_retained_claim_costs_at_most_the_budget_after_a_burst_in_flight() {
    const N: usize = 200_000;
    const TARGETS: usize = 1_000;
    let targets: Vec<Target> = (0..TARGETS)
        .map(|i| Target::new(&format!("org/repo-{i}"), 1).unwrap())
        .collect();
    let events: Vec<DeliveryId> = (0..N).map(event).collect();
    let (bytes, allocs, registry) = measure(|| {
        let registry = Direct::with_clock(config(N), ManualClock::new());
        for (i, e) in events.iter().enumerate() {
            let a = registry.admit(&targets[i % TARGETS], e);
            assert!(matches!(a, Admission::Assigned(_)), "{a:?}");
        }
        for (i, e) in events.iter().enumerate() {
            registry.complete(&targets[i % TARGETS], e).unwrap();
        }
        registry
    });
    let stats = registry.stats();
    assert_eq!(
        (stats.retained_claims, stats.claims_completed),
        (N, N as u64)
    );
    let per_claim = footprint(bytes, allocs) as f64 / N as f64;
    println!(
        "{N} claims admitted before any completed, then completed: {bytes} B in {allocs} \
         allocations, {per_claim:.1} B per retained claim (budget {CLAIM_BUDGET} B)"
    );
    assert!(
        per_claim <= CLAIM_BUDGET as f64,
        "{per_claim:.1} B per retained claim after a burst exceeds the budget {CLAIM_BUDGET} B"
    );
    // Every one is still a duplicate: nothing was lost by giving the burst's storage back.
    for (i, e) in events.iter().enumerate().step_by(997) {
        assert!(matches!(
            registry.admit(&targets[i % TARGETS], e),
            Admission::Duplicate(_)
        ));
    }
}

/// What a held payload costs beyond what `Payload::size` counts, at most: its shared record
/// (the `Arc` with the body's `Bytes` and the metadata's boxes, seven allocations with the
/// allocator's overhead); measured 280 B for a `pull_request` payload with one extra header.
const PAYLOAD_OVERHEAD_BUDGET: usize = 320;

/// Payloads in flight: storing one with a claim costs the registry nothing beyond the claim (the
/// slab entry holds a pointer whether or not there is a payload, and the payload is the caller's
/// value, shared, not copied), and a completion frees it: the bytes of N completed claims with
/// payloads equal those of N completed claims without, up to hash-seed noise; a payload itself
/// costs its `size()` plus at most `PAYLOAD_OVERHEAD_BUDGET` bytes while held.
#[test]
fn a_payload_costs_its_size_plus_a_bounded_overhead_and_nothing_once_completed() {
    use worker_registry::Payload;
    const N: usize = 20_000;
    const BODY: usize = 1_000;
    let t = Target::new("org/repo", 1).unwrap();
    let run = |with: bool| {
        measure(|| {
            let registry = Direct::with_clock(config(N), ManualClock::new());
            for i in 0..N {
                let e = event(i);
                let p = with.then(|| {
                    Payload::builder("pull_request", vec![i as u8; BODY])
                        .action("opened")
                        .header("x-github-hook-id", "12345")
                        .build()
                        .unwrap()
                });
                let a = registry.admit_with(&t, &e, p.as_ref()).unwrap();
                assert!(matches!(a, Admission::Assigned(_)));
                registry.complete(&t, &e).unwrap();
            }
            registry
        })
    };
    let (plain_bytes, plain_allocs, plain) = run(false);
    let (with_bytes, with_allocs, with) = run(true);
    assert_eq!(with.stats().payload_bytes_held, 0);
    let (plain_total, with_total) = (
        footprint(plain_bytes, plain_allocs),
        footprint(with_bytes, with_allocs),
    );
    println!(
        "{N} completed claims: {plain_total} B without payloads, {with_total} B with ({:+.2} B per claim)",
        (with_total as f64 - plain_total as f64) / N as f64
    );
    assert!(
        with_total.abs_diff(plain_total) <= plain_total / 50,
        "a completed claim keeps no payload: {with_total} B vs {plain_total} B"
    );
    drop((plain, with));

    // Held: N payloads in flight (a fresh registry), the payloads made inside the measurement.
    let (bytes, allocs, (registry, sizes)) = measure(|| {
        let registry = Direct::with_clock(config(N), ManualClock::new());
        let mut sizes = 0u64;
        for i in 0..N {
            let p = Payload::builder("pull_request", vec![i as u8; BODY])
                .action("opened")
                .header("x-github-hook-id", "12345")
                .build()
                .unwrap();
            sizes += p.size();
            registry.admit_with(&t, &event(i), Some(&p)).unwrap();
        }
        (registry, sizes)
    });
    assert_eq!(registry.stats().payload_bytes_held, sizes);
    let (plain_bytes, plain_allocs, _) = measure(|| {
        let registry = Direct::with_clock(config(N), ManualClock::new());
        for i in 0..N {
            registry.admit(&t, &event(i));
        }
        registry
    });
    let per_payload = (footprint(bytes, allocs) as f64
        - footprint(plain_bytes, plain_allocs) as f64
        - sizes as f64)
        / N as f64;
    println!(
        "{N} payloads of {} B held in flight: {per_payload:.1} B each beyond size() (budget {PAYLOAD_OVERHEAD_BUDGET} B)",
        sizes / N as u64
    );
    assert!(
        per_payload <= PAYLOAD_OVERHEAD_BUDGET as f64,
        "{per_payload:.1} B per payload beyond its size"
    );
}
