//! The README's tables against what they describe, so they cannot drift again:
//!
//! * the configuration table: one row per setting of `RegistryConfig` (the names its `Debug`
//!   prints, in order), each naming its `config::DEFAULT_*` constant, whose value is the row's
//!   "Default" column;
//! * the feature table: one row per feature of `[features]` in `Cargo.toml` (less `default`, in
//!   the manifest's order), the same table in the crate documentation (`src/lib.rs`).

use std::time::Duration;

use worker_registry::config::{self, RegistryConfig};

const README: &str = include_str!("../README.md");
const MANIFEST: &str = include_str!("../Cargo.toml");
const LIB: &str = include_str!("../src/lib.rs");

/// The rows of the first Markdown table after the line `heading`: its cells, trimmed.
fn table_after(text: &str, heading: &str) -> Vec<Vec<String>> {
    let start = text
        .lines()
        .position(|l| l.trim() == heading)
        .unwrap_or_else(|| panic!("no line {heading:?}"));
    text.lines()
        .skip(start + 1)
        .skip_while(|l| !l.trim_start().starts_with('|'))
        .take_while(|l| l.trim_start().starts_with('|'))
        .skip(2) // the header and its rule
        .map(|row| {
            // `\|` inside a cell is a pipe, not a separator.
            let row = row.trim().replace("\\|", "\u{1}");
            row.trim_matches('|')
                .split('|')
                .map(|c| c.trim().replace('\u{1}', "|"))
                .collect()
        })
        .collect()
}

/// The setting names of `RegistryConfig`, from its derived `Debug`.
fn settings() -> Vec<String> {
    let debug = format!("{:?}", RegistryConfig::default());
    let fields = debug
        .trim_start_matches("RegistryConfig {")
        .trim_end_matches('}');
    fields
        .split(", ")
        .map(|f| f.split(':').next().unwrap_or("").trim().to_owned())
        .collect()
}

/// What the README's "Default" column says, read as a value: `30 s`, `3 days`, `100 000`,
/// `4 (stale after 2 min)`, `0.5`.
#[derive(Debug, PartialEq)]
enum Said {
    Duration(Duration),
    Number(f64),
}

fn said(cell: &str) -> Said {
    let cell = cell.split(" (").next().unwrap_or(cell);
    // A sum of sizes, `25 MiB + 9 599 B`, is read as its number of bytes.
    if cell.contains(" + ") {
        let bytes = cell.split(" + ").map(|part| match said(part) {
            Said::Number(n) => n,
            Said::Duration(_) => panic!("a sum of durations in {cell:?}"),
        });
        return Said::Number(bytes.sum());
    }
    let (number, unit) = match cell.rsplit_once(' ') {
        Some((n, u)) if u.chars().all(char::is_alphabetic) => (n, Some(u)),
        _ => (cell, None),
    };
    let number: f64 = number
        .replace(' ', "")
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {cell:?}"));
    let secs = match unit {
        None => return Said::Number(number),
        Some("B") => return Said::Number(number),
        Some("KiB") => return Said::Number(number * 1024.0),
        Some("MiB") => return Said::Number(number * 1024.0 * 1024.0),
        Some("GiB") => return Said::Number(number * 1024.0 * 1024.0 * 1024.0),
        Some("ms") => 0.001,
        Some("s") => 1.0,
        Some("min") => 60.0,
        Some("h") => 3600.0,
        Some("day" | "days") => 86_400.0,
        Some(u) => panic!("unknown unit {u:?} in {cell:?}"),
    };
    Said::Duration(Duration::from_secs_f64(number * secs))
}

/// The value of the constant the row names.
fn constant(name: &str) -> Said {
    let d = |d: Duration| Said::Duration(d);
    let n = |n: f64| Said::Number(n);
    match name {
        "DEFAULT_HEARTBEAT_INTERVAL" => d(config::DEFAULT_HEARTBEAT_INTERVAL),
        "DEFAULT_MISSED_HEARTBEATS" => n(config::DEFAULT_MISSED_HEARTBEATS.into()),
        "DEFAULT_SWEEP_INTERVAL" => d(config::DEFAULT_SWEEP_INTERVAL),
        "DEFAULT_MAX_WORKERS" => n(config::DEFAULT_MAX_WORKERS as f64),
        "DEFAULT_CLAIM_RETENTION" => d(config::DEFAULT_CLAIM_RETENTION),
        "DEFAULT_MAX_RETAINED_CLAIMS" => n(config::DEFAULT_MAX_RETAINED_CLAIMS as f64),
        "DEFAULT_DEAD_RETENTION" => d(config::DEFAULT_DEAD_RETENTION),
        "DEFAULT_STARTUP_GRACE" => d(config::DEFAULT_STARTUP_GRACE),
        "DEFAULT_BRAKE_FRACTION" => n(config::DEFAULT_BRAKE_FRACTION),
        "DEFAULT_BRAKE_MIN_WORKERS" => n(config::DEFAULT_BRAKE_MIN_WORKERS as f64),
        "DEFAULT_SUSPECT_GRACE" => d(config::DEFAULT_SUSPECT_GRACE),
        "DEFAULT_SHARDS" => n(config::DEFAULT_SHARDS as f64),
        "DEFAULT_DRAIN_DEADLINE" => d(config::DEFAULT_DRAIN_DEADLINE),
        "DEFAULT_MAX_IN_FLIGHT" => d(config::DEFAULT_MAX_IN_FLIGHT),
        "DEFAULT_RELEASE_ACK_TIMEOUT" => d(config::DEFAULT_RELEASE_ACK_TIMEOUT),
        "DEFAULT_MAX_WAITING" => n(config::DEFAULT_MAX_WAITING as f64),
        "DEFAULT_MAX_WAITING_PER_OWNER" => n(config::DEFAULT_MAX_WAITING_PER_OWNER as f64),
        "DEFAULT_MAX_WAIT" => d(config::DEFAULT_MAX_WAIT),
        "DEFAULT_MAX_WORKERS_PER_OWNER" => n(config::DEFAULT_MAX_WORKERS_PER_OWNER as f64),
        "DEFAULT_MAX_PAYLOAD_BYTES" => n(config::DEFAULT_MAX_PAYLOAD_BYTES as f64),
        "DEFAULT_PAYLOAD_BUDGET" => n(config::DEFAULT_PAYLOAD_BUDGET as f64),
        other => panic!("the README names {other}, which this test does not know: add it"),
    }
}

#[test]
fn the_configuration_table_lists_every_setting_with_its_constant_and_value() {
    let rows = table_after(README, "## Configuration");
    let named: Vec<String> = rows
        .iter()
        .map(|r| r[0].trim_matches('`').to_owned())
        .collect();
    assert_eq!(
        named,
        settings(),
        "the README's configuration table and RegistryConfig's settings differ"
    );
    for row in &rows {
        let setting = row[0].trim_matches('`');
        let name = row[1].trim_matches('`');
        assert_eq!(
            name,
            format!("DEFAULT_{}", setting.to_uppercase()),
            "row {setting}: the constant is named for the setting"
        );
        assert_eq!(
            said(&row[2]),
            constant(name),
            "row {setting}: the Default column and {name} differ"
        );
    }
}

/// The features `[features]` declares, in order, less `default`.
fn features() -> Vec<String> {
    MANIFEST
        .lines()
        .skip_while(|l| l.trim() != "[features]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.starts_with('#') && l.contains(" = ["))
        .map(|l| l.split(" = ").next().unwrap_or("").trim().to_owned())
        .filter(|f| f != "default")
        .collect()
}

fn default_features() -> Vec<String> {
    let line = MANIFEST
        .lines()
        .find(|l| l.starts_with("default = ["))
        .expect("a default feature list");
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_feature_tables_list_every_feature_in_the_manifests_order() {
    let lib_doc: String = LIB
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let readme = table_after(README, "## Features");
    let crate_doc = table_after(&lib_doc, "# Features");
    assert_eq!(
        readme, crate_doc,
        "the README's feature table and the crate documentation's differ"
    );
    let defaults = default_features();
    let listed: Vec<String> = readme
        .iter()
        .map(|r| {
            let name = r[0].split(' ').next().unwrap_or("").trim_matches('`');
            let marked = r[0].ends_with("(default)");
            assert_eq!(
                marked,
                defaults.iter().any(|d| d == name),
                "feature {name}: marked (default) exactly when `default` lists it"
            );
            name.to_owned()
        })
        .collect();
    assert_eq!(
        listed,
        features(),
        "the feature table and [features] in Cargo.toml differ"
    );
}
