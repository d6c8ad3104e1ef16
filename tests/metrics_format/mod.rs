//! A strict reader of the OpenMetrics text exposition format (what prometheus-client writes and
//! Prometheus scrapes), for the metrics tests: every line must be a descriptor (`# HELP`, `# TYPE`,
//! `# UNIT`), a sample of the family described just before it, or the final `# EOF`.

use std::collections::{BTreeMap, HashSet};

/// A parsed exposition: the families' types and every sample, keyed `name{labels}` as written.
#[derive(Debug, Default)]
pub struct Exposition {
    pub types: BTreeMap<String, String>,
    pub samples: BTreeMap<String, f64>,
}

impl Exposition {
    /// The value of one sample; panics with the available keys if it is missing.
    pub fn get(&self, key: &str) -> f64 {
        match self.samples.get(key) {
            Some(v) => *v,
            None => panic!(
                "no sample {key}; have:\n{}",
                self.samples.keys().cloned().collect::<Vec<_>>().join("\n")
            ),
        }
    }
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s
            .parse::<f64>()
            .map_err(|e| format!("bad value {s:?}: {e}")),
    }
}

/// Checks `name="value",...` (OpenMetrics escapes: `\\`, `\"`, `\n`).
fn check_labels(s: &str) -> Result<(), String> {
    let mut rest = s;
    let mut seen = HashSet::new();
    while !rest.is_empty() {
        let (name, after) = rest
            .split_once("=\"")
            .ok_or_else(|| format!("bad label set {s:?}"))?;
        if !is_name(name) || !seen.insert(name) {
            return Err(format!("bad or repeated label name {name:?} in {s:?}"));
        }
        let mut escaped = false;
        let mut end = None;
        for (i, c) in after.char_indices() {
            match (escaped, c) {
                (true, '\\' | '"' | 'n') => escaped = false,
                (true, _) => return Err(format!("bad escape in {s:?}")),
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                (false, _) => {}
            }
        }
        let end = end.ok_or_else(|| format!("unterminated label value in {s:?}"))?;
        rest = &after[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.is_empty() {
            return Err(format!("junk after label value in {s:?}"));
        }
    }
    Ok(())
}

fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "gauge" | "unknown" => &[""],
        "histogram" => &["_bucket", "_sum", "_count", "_created"],
        "summary" => &["", "_sum", "_count", "_created"],
        "info" => &["_info"],
        "stateset" => &[""],
        _ => &[],
    }
}

/// Parses and checks a whole exposition.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let body = text
        .strip_suffix("# EOF\n")
        .ok_or("the exposition does not end with \"# EOF\\n\"")?;
    let mut out = Exposition::default();
    let mut current: Option<(String, String)> = None;
    let mut described = HashSet::new();
    for (n, line) in body.lines().enumerate() {
        let n = n + 1;
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kw, name, arg) = (parts.next(), parts.next(), parts.next());
            let (Some(kw), Some(name)) = (kw, name) else {
                return Err(format!("line {n}: bad descriptor {line:?}"));
            };
            if !is_name(name) {
                return Err(format!("line {n}: bad metric name {name:?}"));
            }
            match kw {
                "TYPE" => {
                    let kind = arg.ok_or(format!("line {n}: TYPE without a type"))?;
                    if suffixes(kind).is_empty() {
                        return Err(format!("line {n}: unknown type {kind:?}"));
                    }
                    if !described.insert(name.to_owned()) {
                        return Err(format!("line {n}: family {name} described twice"));
                    }
                    out.types.insert(name.to_owned(), kind.to_owned());
                    current = Some((name.to_owned(), kind.to_owned()));
                }
                "HELP" => {}
                "UNIT" => {
                    let unit = arg.ok_or(format!("line {n}: UNIT without a unit"))?;
                    if !name.ends_with(&format!("_{unit}")) {
                        return Err(format!(
                            "line {n}: {name} does not end with its unit {unit}"
                        ));
                    }
                }
                _ => return Err(format!("line {n}: unknown descriptor {line:?}")),
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            return Err(format!("line {n}: stray line {line:?}"));
        }
        let (series, val) = match line.find('}') {
            Some(close) => {
                let open = line
                    .find('{')
                    .ok_or(format!("line {n}: '}}' without '{{'"))?;
                check_labels(&line[open + 1..close]).map_err(|e| format!("line {n}: {e}"))?;
                let name = &line[..open];
                let rest = line[close + 1..]
                    .strip_prefix(' ')
                    .ok_or(format!("line {n}: no space before the value"))?;
                (name, (&line[..=close], rest))
            }
            None => {
                let (name, rest) = line.split_once(' ').ok_or(format!("line {n}: no value"))?;
                (name, (name, rest))
            }
        };
        let (key, rest) = val;
        let v =
            value(rest.split(' ').next().unwrap_or("")).map_err(|e| format!("line {n}: {e}"))?;
        let Some((family, kind)) = &current else {
            return Err(format!("line {n}: sample before any TYPE"));
        };
        let ok = suffixes(kind)
            .iter()
            .any(|suffix| series == format!("{family}{suffix}"));
        if !ok {
            return Err(format!(
                "line {n}: sample {series} does not belong to the {kind} family {family}"
            ));
        }
        if out.samples.insert(key.to_owned(), v).is_some() {
            return Err(format!("line {n}: duplicate sample {key}"));
        }
    }
    Ok(out)
}

#[allow(dead_code)]
/// Checks a histogram family: cumulative buckets, `+Inf` equal to `_count`.
pub fn check_histogram(e: &Exposition, family: &str) -> Result<u64, String> {
    let mut buckets: Vec<(f64, f64)> = e
        .samples
        .iter()
        .filter_map(|(k, v)| {
            let le = k
                .strip_prefix(&format!("{family}_bucket{{le=\""))?
                .strip_suffix("\"}")?;
            Some((value(le).ok()?, *v))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    if buckets.last().map(|b| b.0) != Some(f64::INFINITY) {
        return Err(format!("{family}: no +Inf bucket"));
    }
    if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
        return Err(format!("{family}: buckets are not cumulative: {buckets:?}"));
    }
    let count = e.get(&format!("{family}_count"));
    if buckets.last().map(|b| b.1) != Some(count) {
        return Err(format!("{family}: +Inf bucket differs from _count {count}"));
    }
    Ok(count as u64)
}

#[test]
fn the_reader_rejects_malformed_expositions() {
    let good = "# HELP a_total x\n# TYPE a counter\na_total{k=\"v\"} 1\n# EOF\n";
    assert_eq!(parse(good).unwrap().get("a_total{k=\"v\"}"), 1.0);
    for bad in [
        "# TYPE a counter\na_total 1\n",                           // no EOF
        "a 1\n# EOF\n",                                            // sample before TYPE
        "# TYPE a counter\na 1\n# EOF\n",                          // counter sample without _total
        "# TYPE a gauge\nb 1\n# EOF\n",                            // wrong family
        "# TYPE a gauge\na{k=v} 1\n# EOF\n",                       // unquoted label
        "# TYPE a gauge\na x\n# EOF\n",                            // bad value
        "# TYPE a gauge\n# TYPE a gauge\n# EOF\n",                 // described twice
        "# TYPE a gauge\na 1\na 2\n# EOF\n",                       // duplicate sample
        "# TYPE a_seconds gauge\n# UNIT a_seconds bytes\n# EOF\n", // unit mismatch
    ] {
        assert!(parse(bad).is_err(), "accepted {bad:?}");
    }
}
