//! The CI regression gate's logic, kept free of I/O so `tests/bench_gate.rs` can check that it fails
//! when it should.
//!
//! The committed thresholds file has one `name max_ratio` pair per line (`#` starts a comment). A
//! ratio is an operation's time over its baseline's time, both measured in the same run, so machine
//! speed cancels out; the gate fails if any listed ratio is above its threshold (times an optional
//! tightening factor) or was not measured at all.

#![allow(dead_code)]

use std::collections::BTreeMap;

/// One threshold: the largest ratio `name` may show.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub name: String,
    pub max_ratio: f64,
}

/// Parses the thresholds file.
pub fn parse(text: &str) -> Result<Vec<Threshold>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(name), Some(max), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "line {}: expected `name max_ratio`, found {line:?}",
                n + 1
            ));
        };
        let max_ratio: f64 = max
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v > 0.0)
            .ok_or_else(|| format!("line {}: {max:?} is not a positive ratio", n + 1))?;
        if out.iter().any(|t: &Threshold| t.name == name) {
            return Err(format!("line {}: {name} listed twice", n + 1));
        }
        out.push(Threshold {
            name: name.to_string(),
            max_ratio,
        });
    }
    if out.is_empty() {
        return Err("no thresholds".into());
    }
    Ok(out)
}

/// The verdict on one threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub name: String,
    /// The measured ratio, if the bench ran in this run.
    pub ratio: Option<f64>,
    /// The threshold after tightening.
    pub limit: f64,
    pub pass: bool,
}

/// Checks every threshold against the ratios measured in this run. `tighten` multiplies every
/// threshold (1.0 in CI; below 1 to see the gate fail).
pub fn check(
    thresholds: &[Threshold],
    ratios: &BTreeMap<String, f64>,
    tighten: f64,
) -> Vec<Verdict> {
    thresholds
        .iter()
        .map(|t| {
            let limit = t.max_ratio * tighten;
            let ratio = ratios.get(&t.name).copied().filter(|r| r.is_finite());
            Verdict {
                name: t.name.clone(),
                ratio,
                limit,
                pass: ratio.is_some_and(|r| r <= limit),
            }
        })
        .collect()
}

/// True if every verdict passed.
pub fn passed(verdicts: &[Verdict]) -> bool {
    verdicts.iter().all(|v| v.pass)
}
