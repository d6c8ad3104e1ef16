//! The registry's benchmarks: every hot operation at 1 and 2 threads, next to its floor (bare
//! primitives with the same key types and hasher) and to what a user would otherwise write (a
//! `Mutex<HashMap>` and an `RwLock<HashMap>` registry, moka as the dedupe peer), all in one run.
//!
//! `cargo bench --bench registry` runs everything; `WR_BENCH_REPORT=1` prints the ratio table at
//! the end and `WR_BENCH_GATE=benches/gate.txt` checks the single-thread ratios (see `report.rs`).

use std::time::{Duration, SystemTime};

use criterion::Criterion;

#[path = "registry/baselines.rs"]
mod baselines;
#[path = "registry/common.rs"]
mod common;
#[path = "registry/gate.rs"]
mod gate;
#[path = "registry/mixed.rs"]
mod mixed;
#[path = "registry/naive.rs"]
mod naive;
#[path = "registry/ops.rs"]
mod ops;
#[path = "registry/report.rs"]
mod report;
#[path = "registry/storm.rs"]
mod storm;
#[path = "registry/tail.rs"]
mod tail;

fn main() {
    let started = SystemTime::now();
    // Modest defaults (the machine is small and shared); the command line overrides them, e.g.
    // the CI gate's `--warm-up-time 0.3 --measurement-time 1 --sample-size 10`.
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .without_plots()
        .configure_from_args();
    baselines::bench(&mut c);
    ops::heartbeat(&mut c);
    ops::admit(&mut c);
    ops::claim(&mut c);
    ops::status(&mut c);
    ops::sweep(&mut c);
    mixed::bench(&mut c);
    storm::bench(&mut c);
    tail::bench(&mut c);
    c.final_summary();
    std::process::exit(report::finish(started));
}
