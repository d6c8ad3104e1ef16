//! Fixtures shared by every bench: keys, pre-populated registries, the access pattern and the
//! 1-thread / 2-thread runners.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Throughput};
use rand::{Rng, SeedableRng};
use worker_registry::{
    memory::Direct, Admission, Clock, DeliveryId, RegistryConfig, SystemClock, Target, WorkerId,
};

/// Live workers in every bench unless a bench says otherwise.
pub const WORKERS: usize = 10_000;

/// The thread counts every operation runs at.
pub const THREADS: [usize; 2] = [1, 2];

/// The thread counts the scaling benches (heartbeat storm, mixed workload) run at: 1, 2 and every
/// available thread (the same as 2 on a 2-core machine, then not repeated).
pub fn scaling_threads() -> Vec<usize> {
    let all = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut t = vec![1, 2];
    if all > 2 {
        t.push(all);
    }
    t
}

/// The hasher the registry uses for every map (same key types, same hasher, in the baselines).
pub type Hasher = ahash::RandomState;

/// A registry config big enough for the benches: room for 200k workers and the default timings,
/// except that no delivery is ever stuck (benches that skip time ahead keep their fixture's
/// deliveries in flight for hours of registry time).
pub fn config() -> RegistryConfig {
    RegistryConfig::builder()
        .max_workers(1 << 20)
        .max_in_flight(worker_registry::config::MAX_DURATION)
        .build()
        .expect("valid bench config")
}

/// `n` distinct, valid targets spread over 97 owners.
pub fn targets(n: usize) -> Vec<Target> {
    (0..n)
        .map(|i| Target::new(&format!("org-{}/repo-{i}", i % 97), i as u64 + 1).unwrap())
        .collect()
}

/// `n` distinct delivery ids shaped like GitHub's (36-byte GUIDs); `salt` keeps pools apart.
pub fn events(n: usize, salt: u32) -> Vec<DeliveryId> {
    (0..n)
        .map(|i| DeliveryId::new(&format!("{salt:08x}-cc78-11e3-81ab-{i:012x}")).unwrap())
        .collect()
}

/// A registry holding `n` live workers, one per target, each admitted for one delivery (so each
/// holds one in-flight claim, as in a running router).
pub struct Fixture<C: Clock = SystemClock> {
    pub registry: Direct<C>,
    pub targets: Vec<Target>,
    pub events: Vec<DeliveryId>,
    pub ids: Vec<WorkerId>,
}

impl Fixture<SystemClock> {
    pub fn new(n: usize) -> Self {
        Self::with(Direct::new(config()), n)
    }
}

impl<C: Clock> Fixture<C> {
    pub fn with(registry: Direct<C>, n: usize) -> Self {
        let targets = targets(n);
        let events = events(n, 0xfeed);
        let ids = targets
            .iter()
            .zip(&events)
            .map(|(t, e)| match registry.admit(t, e) {
                Admission::Assigned(a) => a.worker,
                other => panic!("fixture admit: {other:?}"),
            })
            .collect();
        registry.sweep();
        Self {
            registry,
            targets,
            events,
            ids,
        }
    }
}

/// A fixed pseudo-random access pattern over `0..n` (the same for the registry and its baselines),
/// a power of two long so indexing is a mask.
pub struct Ring {
    idx: Vec<u32>,
    mask: usize,
}

impl Ring {
    pub fn new(n: usize) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let idx: Vec<u32> = (0..8192).map(|_| rng.gen_range(0..n as u32)).collect();
        Self {
            mask: idx.len() - 1,
            idx,
        }
    }

    /// The `i`-th index for thread `t` (threads walk the ring from different offsets).
    #[inline(always)]
    pub fn at(&self, t: usize, i: u64) -> usize {
        self.idx[(i as usize).wrapping_add(t * 4099) & self.mask] as usize
    }
}

thread_local! {
    /// Set on the threads of a multi-thread run: they measure wall time.
    static WALL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec for the call to fill in.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// What a bench times with. Single-thread benches count the bench thread's CPU time, so time
/// spent preempted by other processes on a shared machine is not charged to the operation;
/// multi-thread runs count wall time (blocking on a contended lock is part of what they measure).
pub enum Stopwatch {
    Cpu(Duration),
    Wall(Instant),
}

impl Stopwatch {
    #[inline(always)]
    pub fn start() -> Self {
        if WALL.with(|w| w.get()) {
            Stopwatch::Wall(Instant::now())
        } else {
            Stopwatch::Cpu(thread_cpu_time())
        }
    }

    #[inline(always)]
    pub fn elapsed(&self) -> Duration {
        match self {
            Stopwatch::Cpu(t) => thread_cpu_time().saturating_sub(*t),
            Stopwatch::Wall(t) => t.elapsed(),
        }
    }
}

/// Times `iters` calls of `op` on this thread (its result goes through `black_box`).
#[inline(always)]
pub fn timed<R>(iters: u64, mut op: impl FnMut(u64) -> R) -> Duration {
    let start = Stopwatch::start();
    for i in 0..iters {
        std::hint::black_box(op(i));
    }
    start.elapsed()
}

/// Runs `make(t)` on `threads` threads (inline for one) released together by a barrier; each
/// thread's routine runs `iters` operations and returns the time it measured. The result is the
/// slowest thread's time: the wall time of `threads x iters` operations.
pub fn run<M, F>(threads: usize, iters: u64, make: M) -> Duration
where
    M: Fn(usize) -> F + Sync,
    F: FnMut(u64) -> Duration,
{
    if threads == 1 {
        return make(0)(iters);
    }
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (make, barrier) = (&make, &barrier);
                s.spawn(move || {
                    WALL.with(|w| w.set(true));
                    let mut routine = make(t);
                    barrier.wait();
                    routine(iters)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .max()
            .unwrap_or_default()
    })
}

/// The id of a bench at `threads` threads: `<name>/1t` or `<name>/2t`.
pub fn id(name: &str, threads: usize) -> BenchmarkId {
    BenchmarkId::new(name, format!("{threads}t"))
}

/// Registers `name` at 1 and 2 threads; `make(t)` builds thread `t`'s routine. One element is one
/// operation on one thread, so criterion's throughput is the aggregate over threads.
pub fn both<M, F>(g: &mut BenchmarkGroup<'_, WallTime>, name: &str, make: M)
where
    M: Fn(usize) -> F + Sync,
    F: FnMut(u64) -> Duration,
{
    for threads in THREADS {
        g.throughput(Throughput::Elements(threads as u64));
        g.bench_function(id(name, threads), |b| {
            b.iter_custom(|iters| run(threads, iters, &make))
        });
    }
}
