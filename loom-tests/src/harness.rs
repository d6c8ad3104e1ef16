//! What every model shares: the loom builder, fixtures and the invariant check.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use worker_registry::config::{
    RegistryConfigBuilder, DEFAULT_BRAKE_FRACTION, DEFAULT_BRAKE_MIN_WORKERS,
};
use worker_registry::{memory::Direct, DeliveryId, ManualClock, RegistryConfig, Target};

/// How far loom explores: `None` means no preemption bound, i.e. every interleaving of the model's
/// threads (loom's DPOR prunes only provably equivalent ones). Set in code, so the CI command needs
/// no `LOOM_MAX_PREEMPTIONS`. Every model here is small enough to be explored exhaustively in well
/// under a minute; one that grows past that uses [`BOUNDED`].
pub const EXHAUSTIVE: Option<usize> = None;

/// Three preemptions per execution (the issue asks for at least 2): for the model whose three
/// racing calls make exhaustive exploration take minutes (each extra preemption costs about 4x).
pub const BOUNDED: Option<usize> = Some(3);

/// The prefix of every invariant failure. A must-fail twin (`loom-tests/twins/`) passes only if
/// its model fails with this prefix followed by the invariant's name in brackets.
pub const VIOLATION: &str = "INVARIANT VIOLATED";

/// Panics with `INVARIANT VIOLATED [name]: ...` unless `cond` holds.
#[macro_export]
macro_rules! invariant {
    ($name:literal, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            panic!("{} [{}]: {}", $crate::VIOLATION, $name, format_args!($($fmt)+));
        }
    };
}

/// Stack of every model thread. Loom runs model threads as coroutines on the test's own OS thread,
/// and their default stack (32 KiB, also that of the model's first thread) is too small for the
/// registry's calls; so the model body runs on a thread [`spawn`]ed with this stack, as do the
/// threads it spawns. (The stack is reserved, not committed: untouched pages cost nothing.)
pub const STACK_SIZE: usize = 1 << 20;

/// Spawns a model thread (a loom thread with [`STACK_SIZE`] of stack).
pub fn spawn<F, T>(f: F) -> loom::thread::JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    loom::thread::Builder::new()
        .stack_size(STACK_SIZE)
        .spawn(f)
        .expect("loom spawn")
}

/// The loom builder every model uses, with the given preemption bound (`None`: exhaustive).
pub fn builder(preemption_bound: Option<usize>) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = preemption_bound;
    b
}

/// Runs loom over `model` (each execution on a big-stack model thread, see [`STACK_SIZE`]) and
/// returns how it ended, how many executions it explored and how long it took.
fn explore<F>(
    preemption_bound: Option<usize>,
    model: F,
) -> (std::thread::Result<()>, usize, Duration)
where
    F: Fn() + Sync + Send + 'static,
{
    let started = Instant::now();
    let model = Arc::new(model);
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        builder(preemption_bound).check(move || {
            counted.fetch_add(1, Relaxed);
            let model = model.clone();
            if let Err(panic) = spawn(move || model()).join() {
                resume_unwind(panic);
            }
        })
    }));
    (outcome, runs.load(Relaxed), started.elapsed())
}

/// The variable the twins runner sets to explore a model with a smaller preemption bound than its
/// own (`1`: one thread may be preempted once, so either may start first and each call then runs
/// whole: every sequential order), to show that a twin's bug needs an interleaving. Unset in every
/// ordinary run.
pub const PREEMPTION_BOUND_VAR: &str = "WR_LOOM_PREEMPTION_BOUND";

/// Explores `model` within `preemption_bound` (or the lower bound [`PREEMPTION_BOUND_VAR`]
/// names); any panic fails the test.
pub fn check<F>(name: &str, preemption_bound: Option<usize>, model: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let preemption_bound = match std::env::var(PREEMPTION_BOUND_VAR).ok() {
        Some(v) => {
            let forced: usize = v
                .parse()
                .unwrap_or_else(|_| panic!("{PREEMPTION_BOUND_VAR}={v:?} is not a number"));
            Some(preemption_bound.map_or(forced, |b| b.min(forced)))
        }
        None => preemption_bound,
    };
    let (outcome, runs, took) = explore(preemption_bound, model);
    if let Err(panic) = outcome {
        eprintln!("loom model {name}: failed after {runs} executions");
        resume_unwind(panic);
    }
    eprintln!("loom model {name}: {runs} executions explored, passed in {took:.2?}");
}

/// Heartbeat interval of every model's registry.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Missed intervals before death: the heartbeat timeout is `INTERVAL * MISSED` = 2 s.
pub const MISSED: u32 = 2;

/// A small registry on a manual clock: 2 s heartbeat timeout, no start-up grace, the
/// mass-staleness brake off, and the given capacity.
pub fn registry(max_workers: usize) -> (Direct<ManualClock>, ManualClock) {
    build(config(max_workers).brake_fraction(1.0))
}

/// As [`registry`], with `tweak` applied to its configuration.
pub fn registry_with(
    max_workers: usize,
    tweak: impl FnOnce(RegistryConfigBuilder) -> RegistryConfigBuilder,
) -> (Direct<ManualClock>, ManualClock) {
    build(tweak(config(max_workers).brake_fraction(1.0)))
}

/// As [`registry`], with the brake at its defaults (more than half of at least three live workers
/// silent at once: suspect them, not kill them).
pub fn braking_registry(max_workers: usize) -> (Direct<ManualClock>, ManualClock) {
    build(
        config(max_workers)
            .brake_fraction(DEFAULT_BRAKE_FRACTION)
            .brake_min_workers(DEFAULT_BRAKE_MIN_WORKERS),
    )
}

fn config(max_workers: usize) -> RegistryConfigBuilder {
    RegistryConfig::builder()
        .heartbeat_interval(INTERVAL)
        .missed_heartbeats(MISSED)
        .sweep_interval(INTERVAL)
        .startup_grace(Duration::ZERO)
        .max_workers(max_workers)
}

fn build(config: RegistryConfigBuilder) -> (Direct<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let registry = Direct::with_clock(config.build().expect("valid model config"), clock.clone());
    (registry, clock)
}

/// Target number `n` of one repository.
pub fn target(n: u64) -> Target {
    Target::new("octo/repo", n).expect("valid target")
}

/// Delivery id `d-<n>`.
pub fn event(n: u64) -> DeliveryId {
    DeliveryId::new(&format!("d-{n}")).expect("valid event id")
}
