//! The bench regression gate's comparison logic (benches/registry/gate.rs): it passes within the
//! thresholds and fails on a breach, on a bench that did not run, and when tightened.

#[path = "../benches/registry/gate.rs"]
mod gate;

use std::collections::BTreeMap;

fn ratios(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

const FILE: &str = "# op  max\nheartbeat_by_id 2.0\nstatus_10  3.5 # note\n\n";

#[test]
fn parses_the_committed_format() {
    let t = gate::parse(FILE).unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!((t[1].name.as_str(), t[1].max_ratio), ("status_10", 3.5));
}

#[test]
fn the_committed_thresholds_file_parses() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/gate.txt")).unwrap();
    assert!(gate::parse(&text).unwrap().len() >= 5);
}

#[test]
fn rejects_malformed_lines() {
    assert!(gate::parse("heartbeat_by_id\n").is_err());
    assert!(gate::parse("x 1.0 extra\n").is_err());
    assert!(gate::parse("x -1\n").is_err());
    assert!(gate::parse("x NaN\n").is_err());
    assert!(gate::parse("x 1\nx 2\n").is_err());
    assert!(gate::parse("# only a comment\n").is_err());
}

#[test]
fn passes_within_thresholds() {
    let t = gate::parse(FILE).unwrap();
    let v = gate::check(
        &t,
        &ratios(&[("heartbeat_by_id", 1.9), ("status_10", 3.5)]),
        1.0,
    );
    assert!(gate::passed(&v), "{v:?}");
}

#[test]
fn fails_on_a_breach() {
    let t = gate::parse(FILE).unwrap();
    let v = gate::check(
        &t,
        &ratios(&[("heartbeat_by_id", 2.01), ("status_10", 1.0)]),
        1.0,
    );
    assert!(!gate::passed(&v));
    assert_eq!(v.iter().filter(|v| !v.pass).count(), 1);
    assert_eq!(v[0].ratio, Some(2.01));
}

#[test]
fn fails_when_a_gated_bench_did_not_run() {
    let t = gate::parse(FILE).unwrap();
    let v = gate::check(&t, &ratios(&[("heartbeat_by_id", 1.0)]), 1.0);
    assert!(!gate::passed(&v));
    assert_eq!(v[1].ratio, None);
}

#[test]
fn fails_when_tightened() {
    let t = gate::parse(FILE).unwrap();
    let r = ratios(&[("heartbeat_by_id", 1.5), ("status_10", 1.5)]);
    assert!(gate::passed(&gate::check(&t, &r, 1.0)));
    let v = gate::check(&t, &r, 0.5);
    assert!(!gate::passed(&v));
    assert_eq!(v[0].limit, 1.0);
}
