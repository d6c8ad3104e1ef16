//! The instruction gate's comparison, free of I/O so `tests/instruction_gate.rs` can check it.
//!
//! The committed baseline (`benches/instructions.txt`) has one `name instructions_per_call` pair
//! per line (`#` starts a comment). A row fails when it grew more than `GROWTH` over its baseline
//! or was not measured; a row that shrank by more than `SHRINK` passes with a note, so that the
//! baseline can be refreshed (`WR_INSTR_WRITE=1`) and keeps catching regressions from there.

#![allow(dead_code)]

/// A row may grow by at most this factor (10%).
pub const GROWTH: f64 = 1.10;
/// Below this factor of its baseline a row passes with a note that the baseline is stale.
pub const SHRINK: f64 = 0.80;

/// One committed baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    pub name: String,
    pub per_call: f64,
}

/// Parses the baseline file.
pub fn parse(text: &str) -> Result<Vec<Baseline>, String> {
    let mut out: Vec<Baseline> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(name), Some(v), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "line {}: expected `name instructions_per_call`, found {line:?}",
                n + 1
            ));
        };
        let per_call: f64 = v
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v > 0.0)
            .ok_or_else(|| format!("line {}: {v:?} is not a positive count", n + 1))?;
        if out.iter().any(|b| b.name == name) {
            return Err(format!("line {}: {name} listed twice", n + 1));
        }
        out.push(Baseline {
            name: name.to_string(),
            per_call,
        });
    }
    if out.is_empty() {
        return Err("no baselines".into());
    }
    Ok(out)
}

/// What became of one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// Within `GROWTH` of its baseline (and above `SHRINK` of it).
    Ok,
    /// Shrank below `SHRINK` of its baseline: passes; the baseline should be refreshed.
    Shrank,
    /// Grew more than `GROWTH`: fails.
    Grew,
    /// Listed in the baseline but not measured in this run: fails.
    Missing,
}

/// The verdict on one baseline row.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub name: String,
    pub baseline: f64,
    pub measured: Option<f64>,
    pub outcome: Outcome,
}

impl Verdict {
    pub fn pass(&self) -> bool {
        matches!(self.outcome, Outcome::Ok | Outcome::Shrank)
    }
}

/// Checks every baseline against this run's per-call counts (`measured`: name, count).
pub fn check(baselines: &[Baseline], measured: &[(String, f64)]) -> Vec<Verdict> {
    baselines
        .iter()
        .map(|b| {
            let m = measured
                .iter()
                .find(|(n, _)| *n == b.name)
                .map(|(_, v)| *v)
                .filter(|v| v.is_finite());
            let outcome = match m {
                None => Outcome::Missing,
                Some(v) if v > b.per_call * GROWTH => Outcome::Grew,
                Some(v) if v < b.per_call * SHRINK => Outcome::Shrank,
                Some(_) => Outcome::Ok,
            };
            Verdict {
                name: b.name.clone(),
                baseline: b.per_call,
                measured: m,
                outcome,
            }
        })
        .collect()
}

/// True if every verdict passed.
pub fn passed(verdicts: &[Verdict]) -> bool {
    verdicts.iter().all(Verdict::pass)
}

/// The baseline file for these counts (`header`: comment lines to keep at its top).
pub fn render(header: &str, measured: &[(String, f64)]) -> String {
    let mut out = String::from(header);
    for (name, v) in measured {
        out.push_str(&format!("{name} {v:.1}\n"));
    }
    out
}
