//! The instruction gate's comparison logic (benches/instructions/gate.rs): a row fails when it
//! grows more than 10% or is missing, passes with a note when it shrank by more than a fifth, and
//! the committed baseline file parses and names every row the runner measures.

#[path = "../benches/instructions/gate.rs"]
mod gate;

use gate::Outcome;

fn measured(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

const FILE: &str = "# header\nheartbeat_by_id 200.0\nstatus 73 # note\n\n";

#[test]
fn parses_the_committed_format() {
    let b = gate::parse(FILE).unwrap();
    assert_eq!(b.len(), 2);
    assert_eq!((b[1].name.as_str(), b[1].per_call), ("status", 73.0));
}

#[test]
fn the_committed_baseline_parses_and_round_trips() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/instructions.txt"
    ))
    .unwrap();
    let b = gate::parse(&text).unwrap();
    for row in [
        "heartbeat_by_id",
        "heartbeat_handle",
        "admit_duplicate",
        "sweep_idle_10k",
    ] {
        assert!(b.iter().any(|x| x.name == row), "{row} missing");
    }
    let again: Vec<(String, f64)> = b.iter().map(|x| (x.name.clone(), x.per_call)).collect();
    assert_eq!(gate::parse(&gate::render("# h\n", &again)).unwrap(), b);
}

#[test]
fn rejects_malformed_lines() {
    assert!(gate::parse("heartbeat_by_id\n").is_err());
    assert!(gate::parse("heartbeat_by_id 1 2\n").is_err());
    assert!(gate::parse("heartbeat_by_id -3\n").is_err());
    assert!(gate::parse("a 1\na 2\n").is_err());
    assert!(gate::parse("# only a comment\n").is_err());
}

#[test]
fn growth_within_ten_percent_passes_and_beyond_fails() {
    let b = gate::parse(FILE).unwrap();
    let v = gate::check(
        &b,
        &measured(&[("heartbeat_by_id", 219.9), ("status", 73.0)]),
    );
    assert!(gate::passed(&v), "{v:?}");
    assert_eq!(v[0].outcome, Outcome::Ok);
    let v = gate::check(
        &b,
        &measured(&[("heartbeat_by_id", 220.1), ("status", 73.0)]),
    );
    assert!(!gate::passed(&v));
    assert_eq!(v[0].outcome, Outcome::Grew);
}

#[test]
fn a_missing_row_fails_and_a_much_smaller_one_passes_with_a_note() {
    let b = gate::parse(FILE).unwrap();
    let v = gate::check(&b, &measured(&[("heartbeat_by_id", 200.0)]));
    assert_eq!(v[1].outcome, Outcome::Missing);
    assert!(!gate::passed(&v));
    let v = gate::check(
        &b,
        &measured(&[("heartbeat_by_id", 100.0), ("status", 73.0)]),
    );
    assert_eq!(v[0].outcome, Outcome::Shrank);
    assert!(gate::passed(&v));
}
