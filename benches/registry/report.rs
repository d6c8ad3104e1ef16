//! The ratio report and the CI gate, run at the end of the bench binary.
//!
//! * `WR_BENCH_REPORT=1`: print the table (operation, ns/op, Mops/s, baseline, ratio, target,
//!   pass/fail) from the criterion estimates written **by this run** (older results are ignored),
//!   and write it to `target/criterion/registry-report.md`.
//! * `WR_BENCH_GATE=<thresholds file>`: also compare the single-thread ratios with the committed
//!   thresholds and exit non-zero on a breach or on a gated bench that did not run.
//!   `WR_BENCH_GATE_TIGHTEN=<factor>` multiplies every threshold (use `0.5` to watch it fail).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::gate;

/// What a row promises.
#[derive(Clone, Copy)]
enum Goal {
    /// op / baseline <= this.
    Ratio(f64),
    /// baseline / op >= this (op at least this many times faster).
    Faster(f64),
    /// Reported only.
    Info,
}

/// Which figure of a bench a row compares.
#[derive(Clone, Copy, PartialEq)]
enum Metric {
    /// Criterion's median time per element.
    Median,
    /// The 99.9th percentile of per-operation latency (`tail.rs`).
    P999,
    /// The slowest single operation (`tail.rs`).
    Max,
}

struct Row {
    /// Stable name (the gate's key for the 1-thread row).
    name: &'static str,
    metric: Metric,
    /// Criterion id without the thread suffix.
    op: &'static str,
    /// Baseline id without the thread suffix; `base_1t` pins it to its 1-thread run.
    base: &'static str,
    base_1t: bool,
    goal: Goal,
    /// Thread counts the goal applies to (others are reported with the goal shown as info).
    goal_at: &'static [usize],
}

const BOTH: &[usize] = &[1, 2];
const ONE: &[usize] = &[1];
const TWO: &[usize] = &[2];

#[rustfmt::skip]
const ROWS: &[Row] = &[
    Row { metric: Metric::Median, name: "heartbeat_by_id", op: "heartbeat/by_id", base: "baseline/dashmap_get_store", base_1t: false, goal: Goal::Ratio(2.05), goal_at: BOTH },
    Row { metric: Metric::Median, name: "heartbeat_by_id_vs_fence", op: "heartbeat/by_id", base: "baseline/fence", base_1t: false, goal: Goal::Ratio(1.5), goal_at: BOTH },
    Row { metric: Metric::Median, name: "heartbeat_handle", op: "heartbeat/handle", base: "baseline/atomic_cas", base_1t: false, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "heartbeat_vs_mutex", op: "heartbeat/by_id", base: "heartbeat/mutex_by_id", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_duplicate", op: "admit/duplicate", base: "baseline/dashmap_get_claim", base_1t: false, goal: Goal::Ratio(1.3), goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_duplicate_vs_moka", op: "admit/duplicate", base: "moka/get_hit", base_1t: false, goal: Goal::Ratio(1.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_duplicate_vs_mutex", op: "admit/duplicate", base: "admit/mutex_duplicate", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_fresh_complete", op: "admit/fresh_complete", base: "baseline/dashmap_insert_remove", base_1t: false, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_fresh_complete_vs_moka", op: "admit/fresh_complete", base: "moka/insert_invalidate", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_fresh_complete_at_limit", op: "admit/fresh_complete_at_limit", base: "baseline/dashmap_insert_remove", base_1t: false, goal: Goal::Ratio(3.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_at_limit_vs_floor", op: "admit/fresh_complete_at_limit", base: "baseline/bounded_insert_remove", base_1t: false, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_at_limit_vs_fresh", op: "admit/fresh_complete_at_limit", base: "admit/fresh_complete", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_payload_duplicate", op: "admit/payload_duplicate", base: "admit/duplicate", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_payload_at_limit", op: "admit/payload_fresh_complete_at_limit", base: "admit/fresh_complete_at_limit", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "claim_duplicate", op: "claim/duplicate", base: "baseline/dashmap_get_claim", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "claim_duplicate_room_on", op: "claim/duplicate_room_on", base: "claim/duplicate", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_sticky", op: "admit/sticky", base: "baseline/dashmap_insert_remove", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "admit_sticky_vs_mutex", op: "admit/sticky", base: "admit/mutex_sticky", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "status_10", op: "status/arc_10", base: "baseline/arcswap_load", base_1t: false, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "status_100k", op: "status/arc_100k", base: "baseline/arcswap_load", base_1t: false, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "status_100k_vs_10", op: "status/arc_100k", base: "status/arc_10", base_1t: false, goal: Goal::Ratio(1.2), goal_at: BOTH },
    Row { metric: Metric::Median, name: "status_sweeping", op: "status/arc_sweeping", base: "baseline/arcswap_load", base_1t: false, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "status_with_10", op: "status/with_10", base: "baseline/arcswap_load", base_1t: false, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "status_with_100k", op: "status/with_100k", base: "baseline/arcswap_load", base_1t: false, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "status_with_100k_vs_10", op: "status/with_100k", base: "status/with_10", base_1t: false, goal: Goal::Ratio(1.2), goal_at: BOTH },
    Row { metric: Metric::Median, name: "status_with_sweeping", op: "status/with_sweeping", base: "baseline/arcswap_load", base_1t: false, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "status_vs_mutex", op: "status/arc_sweeping", base: "status/mutex_10k", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "sweep_idle_10k", op: "sweep/idle_10k", base: "baseline/dashmap_scan_10k", base_1t: true, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "sweep_idle_100k", op: "sweep/idle_100k", base: "baseline/dashmap_scan_100k", base_1t: true, goal: Goal::Ratio(2.0), goal_at: BOTH },
    Row { metric: Metric::Median, name: "sweep_idle_10k_retained_100k", op: "sweep/idle_10k_retained_100k", base: "baseline/dashmap_scan_10k", base_1t: true, goal: Goal::Ratio(2.0), goal_at: ONE },
    Row { metric: Metric::Median, name: "sweep_retained_vs_idle", op: "sweep/idle_10k_retained_100k", base: "sweep/idle_10k", base_1t: true, goal: Goal::Info, goal_at: ONE },
    Row { metric: Metric::Median, name: "sweep_changes_10k", op: "sweep/changes_10k", base: "baseline/dashmap_scan_10k", base_1t: true, goal: Goal::Info, goal_at: ONE },
    Row { metric: Metric::Median, name: "sweep_changes_100k", op: "sweep/changes_100k", base: "baseline/dashmap_scan_100k", base_1t: true, goal: Goal::Info, goal_at: ONE },
    Row { metric: Metric::Median, name: "sweep_vs_mutex", op: "sweep/idle_10k", base: "sweep/mutex_idle_10k", base_1t: true, goal: Goal::Info, goal_at: ONE },
    Row { metric: Metric::P999, name: "tail_p999_vs_mutex", op: "tail/registry", base: "tail/mutex", base_1t: false, goal: Goal::Ratio(1.0), goal_at: BOTH },
    Row { metric: Metric::Max, name: "tail_max_vs_mutex", op: "tail/registry", base: "tail/mutex", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::P999, name: "tail_p999_payload", op: "tail/registry_payload", base: "tail/registry", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Max, name: "tail_max_payload", op: "tail/registry_payload", base: "tail/registry", base_1t: false, goal: Goal::Info, goal_at: BOTH },
    Row { metric: Metric::Median, name: "mixed_vs_mutex", op: "mixed/registry", base: "mixed/mutex", base_1t: false, goal: Goal::Faster(3.0), goal_at: TWO },
    Row { metric: Metric::Median, name: "mixed_vs_rwlock", op: "mixed/registry", base: "mixed/rwlock", base_1t: false, goal: Goal::Info, goal_at: BOTH },
];

/// One measured bench: ns per element (criterion's median) and elements per iteration.
#[derive(Clone, Copy)]
struct Measured {
    ns: f64,
}

pub fn criterion_home() -> PathBuf {
    if let Some(h) = std::env::var_os("CRITERION_HOME") {
        return h.into();
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return Path::new(&t).join("criterion");
    }
    // The bench runs as target/<profile>/deps/registry-<hash>.
    std::env::current_exe()
        .ok()
        .and_then(|p| p.ancestors().nth(3).map(|t| t.join("criterion")))
        .unwrap_or_else(|| "target/criterion".into())
}

/// The figure `metric` of bench `id`, if this run (started at `since`) wrote it.
fn load_metric(home: &Path, id: &str, metric: Metric, since: SystemTime) -> Option<Measured> {
    let field = match metric {
        Metric::Median => return load(home, id, since),
        Metric::P999 => "p999",
        Metric::Max => "max",
    };
    let file = home.join(id).join("tail.json");
    let fresh = std::fs::metadata(&file)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= since);
    if !fresh {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    Some(Measured {
        ns: v[field].as_f64()?,
    })
}

/// The estimate for `id`, if this run (started at `since`) wrote it.
fn load(home: &Path, id: &str, since: SystemTime) -> Option<Measured> {
    let dir = home.join(id).join("new");
    let est = dir.join("estimates.json");
    let fresh = std::fs::metadata(&est)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= since);
    if !fresh {
        return None;
    }
    let est: serde_json::Value = serde_json::from_slice(&std::fs::read(est).ok()?).ok()?;
    let per_iter = est["median"]["point_estimate"].as_f64()?;
    let bench: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("benchmark.json")).ok()?).ok()?;
    let elements = bench["throughput"]["Elements"].as_u64().unwrap_or(1).max(1);
    Some(Measured {
        ns: per_iter / elements as f64,
    })
}

fn goal_text(g: Goal) -> String {
    match g {
        Goal::Ratio(r) => format!("<= {r}x"),
        Goal::Faster(x) => format!(">= {x}x faster"),
        Goal::Info => "-".into(),
    }
}

fn meets(g: Goal, ratio: f64) -> Option<bool> {
    match g {
        Goal::Ratio(r) => Some(ratio <= r),
        Goal::Faster(x) => Some(ratio <= 1.0 / x),
        Goal::Info => None,
    }
}

/// The scaling table: aggregate Mops/s of the heartbeat storm and the mixed workload at every
/// thread count of the run, each flavour's scaling efficiency (rate at n threads over n times
/// its 1-thread rate), and the registry's rate over each peer's at the same thread count.
fn scaling(home: &Path, since: SystemTime, out: &mut String) {
    let counts = crate::common::scaling_threads();
    let _ = writeln!(
        out,
        "\n| scaling | flavour | {} | efficiency at {} threads | registry / flavour at {} |",
        counts
            .iter()
            .map(|n| format!("{n}t Mops/s"))
            .collect::<Vec<_>>()
            .join(" | "),
        counts.last().copied().unwrap_or(2),
        counts.last().copied().unwrap_or(2),
    );
    let _ = writeln!(out, "|---|---|{}---|---|", "---|".repeat(counts.len()));
    for (group, flavours) in [
        ("storm", &["registry", "mutex", "moka"][..]),
        ("mixed", &["registry", "mutex", "rwlock"][..]),
    ] {
        let rate = |flavour: &str, n: usize| {
            load(home, &format!("{group}/{flavour}/{n}t"), since).map(|m| 1e3 / m.ns)
        };
        let top = counts.last().copied().unwrap_or(2);
        for flavour in flavours {
            let rates: Vec<Option<f64>> = counts.iter().map(|n| rate(flavour, *n)).collect();
            if rates.iter().all(Option::is_none) {
                continue;
            }
            let eff = match (rates[0], rates.last().copied().flatten()) {
                (Some(one), Some(all)) => format!("{:.2}", all / (top as f64 * one)),
                _ => "-".into(),
            };
            let vs = match (rate("registry", top), rate(flavour, top)) {
                (Some(r), Some(f)) => format!("{:.2}x", r / f),
                _ => "-".into(),
            };
            let cells: Vec<String> = rates
                .iter()
                .map(|r| r.map_or("-".into(), |r| format!("{r:.1}")))
                .collect();
            let _ = writeln!(
                out,
                "| {group} | {flavour} | {} | {eff} | {vs} |",
                cells.join(" | ")
            );
        }
    }
}

/// Prints the report and runs the gate if asked; returns the process exit code.
pub fn finish(started: SystemTime) -> i32 {
    let report = std::env::var_os("WR_BENCH_REPORT").is_some();
    let gate_file = std::env::var_os("WR_BENCH_GATE");
    if !report && gate_file.is_none() {
        return 0;
    }
    let home = criterion_home();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| operation | threads | ns/op | Mops/s | baseline | baseline ns/op | ratio | target | result |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    let mut ratios = BTreeMap::new();
    let mut rows = 0;
    for row in ROWS {
        for threads in crate::common::scaling_threads() {
            let op = format!("{}/{threads}t", row.op);
            let base = format!("{}/{}t", row.base, if row.base_1t { 1 } else { threads });
            let (Some(m), Some(b)) = (
                load_metric(&home, &op, row.metric, started),
                load_metric(&home, &base, row.metric, started),
            ) else {
                continue;
            };
            rows += 1;
            let ratio = m.ns / b.ns;
            if threads == 1 {
                ratios.insert(row.name.to_string(), ratio);
            }
            let goal = if row.goal_at.contains(&threads) {
                row.goal
            } else {
                Goal::Info
            };
            let result = match meets(goal, ratio) {
                Some(true) => "pass",
                Some(false) => "FAIL",
                None => "-",
            };
            let what = match row.metric {
                Metric::Median => row.op.to_string(),
                Metric::P999 => format!("{} p99.9", row.op),
                Metric::Max => format!("{} max", row.op),
            };
            let _ = writeln!(
                out,
                "| {} | {threads} | {:.1} | {:.1} | {} | {:.1} | {:.2} | {} | {result} |",
                what,
                m.ns,
                1e3 / m.ns,
                row.base,
                b.ns,
                ratio,
                goal_text(goal),
            );
        }
    }
    scaling(&home, started, &mut out);
    if rows == 0 {
        println!("\nregistry report: no estimates written by this run (smoke or filtered run?)");
    } else if report {
        println!("\n{out}");
        let _ = std::fs::write(home.join("registry-report.md"), &out);
    }
    let Some(file) = gate_file else {
        return 0;
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("gate: cannot read {}: {e}", Path::new(&file).display());
            return 2;
        }
    };
    let thresholds = match gate::parse(&text) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("gate: {}: {e}", Path::new(&file).display());
            return 2;
        }
    };
    let tighten = std::env::var("WR_BENCH_GATE_TIGHTEN")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(1.0);
    let verdicts = gate::check(&thresholds, &ratios, tighten);
    println!("\nregression gate (single-thread ratios, same run; thresholds x {tighten}):");
    for v in &verdicts {
        let ratio = v.ratio.map_or("not measured".into(), |r| format!("{r:.2}"));
        let verdict = if v.pass { "ok" } else { "BREACH" };
        println!("  {:<34} {ratio:>12} <= {:<6.2} {verdict}", v.name, v.limit);
    }
    if gate::passed(&verdicts) {
        println!("gate passed");
        0
    } else {
        println!("gate FAILED");
        1
    }
}
