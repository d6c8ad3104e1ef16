//! The deterministic regression gate: instructions per hot call, counted by valgrind's callgrind,
//! against the counts committed in `benches/instructions.txt`.
//!
//! ```sh
//! cargo bench --bench instructions              # count every row, compare, exit 1 on a breach
//! cargo bench --bench instructions -- heartbeat # only rows whose name contains `heartbeat`
//! WR_INSTR_WRITE=1 cargo bench --bench instructions   # rewrite the baseline from this run
//! cargo bench --bench instructions -- --test    # smoke: run every row once, natively
//! ```
//!
//! Each row runs in a child process (this executable with `--row <name>`) under
//! `valgrind --tool=callgrind --collect-atstart=no --toggle-collect=*measured*`: only the counted
//! loop (`rows::measured`) is charged, never the fixture. Counts do not depend on the machine's
//! load; they move by well under 1% between runs (the maps' hash seeds are random per process, so
//! probe lengths differ a little). A row fails when it grew more than 10% over its baseline, and
//! passes with a note when it shrank by more than a fifth (refresh the baseline then).

use std::path::PathBuf;

#[path = "instructions/callgrind.rs"]
mod callgrind;
// The wall-clock benches' fixtures (keys, config, the pre-populated registry), so both benches
// measure the same registry; this bench uses only some of them.
#[allow(dead_code)]
#[path = "registry/common.rs"]
mod common;
#[path = "instructions/gate.rs"]
mod gate;
#[path = "instructions/rows.rs"]
mod rows;

const HEADER: &str = "\
# Instructions per call (callgrind `Ir`, counted loop only) for `cargo bench --bench instructions`
# (rows: benches/instructions/rows.rs). CI fails when a row grows more than 10% over the count
# here and notes a row that shrank by more than a fifth. Refresh with
# `WR_INSTR_WRITE=1 cargo bench --bench instructions` after a deliberate change, and say why in
# the commit. The floor_* rows are bare primitives with the same keys and hasher (for ratios).
";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--row") {
        let name = args.get(i + 1).map(String::as_str).unwrap_or("");
        let row = rows::find(name).unwrap_or_else(|| panic!("no row {name:?}"));
        (row.run)(true);
        return;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let selected: Vec<&rows::Row> = rows::ROWS
        .iter()
        .filter(|r| filters.is_empty() || filters.iter().any(|f| r.name.contains(f.as_str())))
        .collect();
    if args.iter().any(|a| a == "--test") {
        for row in &selected {
            (row.run)(false);
            println!("instructions/{}: ok (smoke, not counted)", row.name);
        }
        return;
    }
    std::process::exit(gate_run(&selected, filters.is_empty()));
}

fn baseline_path() -> PathBuf {
    std::env::var_os("WR_INSTR_BASELINE")
        .map(PathBuf::from)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/benches/instructions.txt").into())
}

fn gate_run(selected: &[&rows::Row], all: bool) -> i32 {
    if !callgrind::available() {
        eprintln!("instructions: valgrind not found (Debian: apt-get install valgrind)");
        return 2;
    }
    let exe = std::env::current_exe().expect("own path");
    let dir = std::env::temp_dir().join(format!("wr-instructions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let mut measured = Vec::new();
    for row in selected {
        match callgrind::count(&exe, row.name, &dir) {
            Ok(total) => {
                let per_call = total as f64 / row.calls as f64;
                println!(
                    "{:<32} {per_call:>12.1} instructions/call  ({})",
                    row.name, row.what
                );
                measured.push((row.name.to_string(), per_call));
            }
            Err(e) => {
                eprintln!("{e}");
                return 2;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let ratio = |a: &str, b: &str| {
        let get = |n: &str| measured.iter().find(|(m, _)| m == n).map(|(_, v)| *v);
        get(a).zip(get(b)).map(|(a, b)| a / b)
    };
    for (op, floor) in [
        ("heartbeat_by_id", "floor_fence"),
        ("heartbeat_by_id", "floor_dashmap_get_store"),
        ("admit_duplicate", "floor_dashmap_get_claim"),
        ("admit_payload_duplicate", "admit_duplicate"),
        (
            "admit_payload_fresh_complete_at_limit",
            "admit_fresh_complete_at_limit",
        ),
    ] {
        if let Some(r) = ratio(op, floor) {
            println!("  {op} / {floor}: {r:.2}x instructions");
        }
    }
    let path = baseline_path();
    if std::env::var_os("WR_INSTR_WRITE").is_some() {
        if !all {
            eprintln!("instructions: WR_INSTR_WRITE rewrites every row; run without a filter");
            return 2;
        }
        std::fs::write(&path, gate::render(HEADER, &measured)).expect("write baseline");
        println!("wrote {}", path.display());
        return 0;
    }
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("instructions: cannot read {}: {e}", path.display());
            return 2;
        }
    };
    let baselines = match gate::parse(&text) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("instructions: {}: {e}", path.display());
            return 2;
        }
    };
    let baselines: Vec<_> = baselines
        .into_iter()
        .filter(|b| all || selected.iter().any(|r| r.name == b.name))
        .collect();
    let verdicts = gate::check(&baselines, &measured);
    println!(
        "\ninstruction gate (fails above {:.0}% growth):",
        (gate::GROWTH - 1.0) * 100.0
    );
    for v in &verdicts {
        let m = v
            .measured
            .map_or("not measured".into(), |m| format!("{m:.1}"));
        let change = v.measured.map_or(String::new(), |m| {
            format!("{:+.1}%", (m / v.baseline - 1.0) * 100.0)
        });
        let note = match v.outcome {
            gate::Outcome::Ok => "ok",
            gate::Outcome::Shrank => "ok, shrank a lot: refresh the baseline (WR_INSTR_WRITE=1)",
            gate::Outcome::Grew => "GREW",
            gate::Outcome::Missing => "MISSING",
        };
        println!(
            "  {:<32} {m:>10} vs {:>10.1} {change:>8}  {note}",
            v.name, v.baseline
        );
    }
    if gate::passed(&verdicts) {
        println!("instruction gate passed");
        0
    } else {
        println!("instruction gate FAILED");
        1
    }
}
