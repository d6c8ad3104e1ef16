//! Issue 12: metrics a standard scraper reads. `/metrics` negotiates its format (OpenMetrics when
//! asked, the classic text format 0.0.4 otherwise) and both are run through real parsers: the
//! `prometheus-parse` and `openmetrics-parser` crates for the classic format, Python's
//! `prometheus_client` (the OpenMetrics reference parser) for both when it is installed. The
//! counters add up to what the router answered, every label value is there at zero, and the help
//! texts follow one style.

mod common;

use common::*;

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;

/// `/metrics` with this `Accept` header: content type and body.
async fn scrape(h: &Harness, accept: Option<&str>) -> (String, String) {
    let mut req = h.http.get(format!("{}/metrics", h.base));
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let ct = res.headers()["content-type"].to_str().unwrap().to_owned();
    (ct, res.text().await.unwrap())
}

/// Every sample of a classic-format exposition, parsed by `prometheus-parse`, keyed
/// `name{label="v",...}` with labels sorted.
fn samples(text: &str) -> HashMap<String, f64> {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    scrape
        .samples
        .iter()
        .map(|s| {
            let mut labels: Vec<(String, String)> = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.sort();
            let key = if labels.is_empty() {
                s.metric.clone()
            } else {
                let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                format!("{}{{{}}}", s.metric, l.join(","))
            };
            let v = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            };
            (key, v)
        })
        .collect()
}

/// Runs Python's `prometheus_client` parser (`openmetrics` or `text`) over `exposition`. Returns
/// `None` (after saying so) when the module is not installed, unless `CI` is set.
fn python_parse(kind: &str, exposition: &str) -> Option<usize> {
    let script = r#"
import sys
kind = sys.argv[1]
data = sys.stdin.read()
if kind == "openmetrics":
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
families = list(text_string_to_metric_families(data))
for f in families:
    if not f.documentation:
        sys.exit("no help text for " + f.name)
    if kind == "text" and f.type == "unknown":
        sys.exit("no type for " + f.name)
print(len(families))
"#;
    let probe = Command::new("python3")
        .args(["-c", "import prometheus_client"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but Python's prometheus_client is missing (pip install prometheus_client)"
        );
        eprintln!("skipped: the {kind} check through Python's prometheus_client (pip install prometheus_client to run it)");
        return None;
    }
    let mut child = Command::new("python3")
        .args(["-c", script, kind])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client ({kind}) refused the exposition: {}\n{exposition}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).trim().parse().unwrap())
}

/// Both formats, through real parsers.
#[tokio::test(start_paused = true)]
async fn both_formats_pass_real_parsers() {
    let h = start(Setup::default()).await;
    let first = h.deliver("pull_request", "m-1", &pr("o/r", 1)).await;
    h.until_status(worker_of(&first), "active").await;

    // What Prometheus sends gets OpenMetrics; no header, `*/*` or text/plain get the classic format.
    let prometheus_accept = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    let (ct, om) = scrape(&h, Some(prometheus_accept)).await;
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    assert!(om.ends_with("# EOF\n"));
    for accept in [None, Some("*/*"), Some("text/plain; version=0.0.4")] {
        let (ct, text) = scrape(&h, accept).await;
        assert!(
            ct.starts_with("text/plain; version=0.0.4"),
            "{accept:?}: {ct}"
        );
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"));
    }
    let (_, text) = scrape(&h, None).await;

    // The classic format: `openmetrics-parser`'s Prometheus parser checks that every sample belongs
    // to the family its TYPE line names (what promtool's "no help text" was about) ...
    let families = openmetrics_parser::prometheus::parse_prometheus(&text)
        .unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    assert!(families.families.len() > 30);
    // ... and `prometheus-parse` reads every counter as a counter, with its help text.
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    for s in &scrape.samples {
        // (prometheus-parse reads a histogram's `_sum` and `_count` as untyped samples.)
        let histogram_part = s.metric.ends_with("_sum") || s.metric.ends_with("_count");
        assert!(
            histogram_part || !matches!(s.value, prometheus_parse::Value::Untyped(_)),
            "{} has no type",
            s.metric
        );
        let family = s
            .metric
            .trim_end_matches("_bucket")
            .trim_end_matches("_sum")
            .trim_end_matches("_count");
        assert!(
            scrape.docs.contains_key(&s.metric) || scrape.docs.contains_key(family),
            "{} has no help text",
            s.metric
        );
        if s.metric.ends_with("_total") {
            assert!(
                matches!(s.value, prometheus_parse::Value::Counter(_)),
                "{}",
                s.metric
            );
        }
    }
    // Python's reference parsers, for both formats.
    if let Some(n) = python_parse("openmetrics", &om) {
        assert!(n > 30, "{n} families");
    }
    if let Some(n) = python_parse("text", &text) {
        assert!(n > 30, "{n} families");
    }
}

/// Every label value of every family is present before anything happened, at zero.
#[tokio::test(start_paused = true)]
async fn label_values_are_present_at_zero() {
    let h = start(Setup::default()).await;
    let (_, text) = scrape(&h, None).await;
    let m = samples(&text);
    let zero = |k: &str| assert_eq!(m.get(k), Some(&0.0), "{k} missing or not 0 in\n{text}");
    for outcome in webhook_router::metrics::DELIVERY_OUTCOMES {
        zero(&format!(
            "webhook_router_deliveries_total{{outcome=\"{outcome}\"}}"
        ));
    }
    for source in ["webhook", "redispatch"] {
        let admissions = webhook_router::outcome::Outcome::ALL
            .into_iter()
            .filter(|o| o.is_admission());
        for outcome in admissions.map(|o| o.as_str()) {
            zero(&format!(
                "webhook_router_admissions_total{{outcome=\"{outcome}\",source=\"{source}\"}}"
            ));
        }
    }
    for how in webhook_router::worker::Exit::ALL {
        zero(&format!(
            "webhook_router_worker_exits_total{{how=\"{how}\"}}"
        ));
    }
    for reason in ["capacity", "draining"] {
        zero(&format!(
            "worker_registry_rejected_total{{reason=\"{reason}\"}}"
        ));
    }
    for reason in [
        "missed_heartbeats",
        "exited",
        "deregistered",
        "drain_timed_out",
    ] {
        zero(&format!(
            "worker_registry_deaths_total{{reason=\"{reason}\"}}"
        ));
    }
    zero("webhook_router_shutdown_unfinished_total");
    zero("worker_registry_sweeper_panics_total");
}

/// The registry's admitted, duplicate and rejected counters add up to what the router answered:
/// a delivery the router gave back because its worker's queue was full is rejected (capacity)
/// by the registry's counters, not admitted, and answered `overflow_full`, told apart from a
/// registry with no capacity.
#[tokio::test(start_paused = true)]
async fn admission_counters_add_up_to_the_answers() {
    let h = start(Setup {
        capacity: 2,
        mailbox: 1,
        // No overflow: a full mailbox is refused, which is what this test counts.
        overflow: 0,
        work: Duration::from_secs(60),
        ..Setup::default()
    })
    .await;
    let mut answered: HashMap<String, f64> = HashMap::new();
    let note = |answered: &mut HashMap<String, f64>, a: &Answer| {
        *answered
            .entry(a.body["outcome"].as_str().unwrap().to_owned())
            .or_default() += 1.0;
    };
    // PR 1: one loop running, one queued, then a full queue.
    for id in ["a-0", "a-1", "a-2", "a-3"] {
        let a = h.deliver("pull_request", id, &pr("o/r", 1)).await;
        note(&mut answered, &a);
        // Let the worker take the first event into its loop.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        answered.get("overflow_full").is_some_and(|n| *n >= 1.0),
        "{answered:?}"
    );
    // Redeliveries, a second PR, and a third that finds no capacity.
    note(
        &mut answered,
        &h.deliver("pull_request", "a-0", &pr("o/r", 1)).await,
    );
    note(
        &mut answered,
        &h.deliver("pull_request", "b-0", &pr("o/r", 2)).await,
    );
    note(
        &mut answered,
        &h.deliver("pull_request", "c-0", &pr("o/r", 3)).await,
    );
    // PR 2's worker drains: a new event for it is refused.
    let w2 = h
        .server
        .app()
        .routing()
        .live_worker_of(&worker_registry::Target::new("o/r", 2).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        h.post(&format!("/workers/{w2}/drain")).await.status,
        StatusCode::OK
    );
    note(
        &mut answered,
        &h.deliver("pull_request", "b-1", &pr("o/r", 2)).await,
    );
    for o in [
        "assigned",
        "duplicate",
        "capacity",
        "overflow_full",
        "draining",
    ] {
        assert!(answered.contains_key(o), "no {o} answer in {answered:?}");
    }

    let (_, text) = scrape(&h, None).await;
    let m = samples(&text);
    let get = |k: &str| {
        m.get(k)
            .copied()
            .unwrap_or_else(|| panic!("no {k} in\n{text}"))
    };
    let admissions = |o: &str| {
        get(&format!(
            "webhook_router_admissions_total{{outcome=\"{o}\",source=\"webhook\"}}"
        )) + get(&format!(
            "webhook_router_admissions_total{{outcome=\"{o}\",source=\"redispatch\"}}"
        ))
    };
    let admitted = get("worker_registry_admitted_total{worker=\"new\"}")
        + get("worker_registry_admitted_total{worker=\"existing\"}");
    assert_eq!(admitted, admissions("assigned"), "admitted\n{text}");
    assert_eq!(admitted, answered["assigned"]);
    assert_eq!(
        get("worker_registry_duplicates_total"),
        admissions("duplicate")
    );
    assert_eq!(
        get("worker_registry_duplicates_total"),
        answered["duplicate"]
    );
    assert_eq!(
        get("worker_registry_rejected_total{reason=\"capacity\"}"),
        admissions("capacity") + admissions("overflow_full")
    );
    assert_eq!(
        get("worker_registry_rejected_total{reason=\"capacity\"}"),
        answered["capacity"] + answered["overflow_full"]
    );
    assert_eq!(
        get("worker_registry_rejected_total{reason=\"draining\"}"),
        answered["draining"]
    );
    for (o, n) in &answered {
        assert_eq!(
            get(&format!(
                "webhook_router_deliveries_total{{outcome=\"{o}\"}}"
            )),
            *n,
            "{o}"
        );
    }
}

/// Every help text, the registry's and the router's, in one style: sentence case, one final
/// period, `, by <labels>.` exactly for labelled families.
#[tokio::test(start_paused = true)]
async fn help_texts_follow_one_style() {
    let h = start(Setup::default()).await;
    let (_, om) = scrape(&h, Some("application/openmetrics-text")).await;
    let mut labels: HashMap<String, Vec<String>> = HashMap::new();
    let mut family = String::new();
    let mut helps = Vec::new();
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap();
            helps.push((name.to_owned(), text.to_owned()));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            family = rest.split(' ').next().unwrap().to_owned();
        } else if !line.starts_with('#') {
            if let (Some(o), Some(c)) = (line.find('{'), line.find('}')) {
                for pair in line[o + 1..c].split(',') {
                    let k = pair.split('=').next().unwrap().to_owned();
                    let e = labels.entry(family.clone()).or_default();
                    if k != "le" && !e.contains(&k) {
                        e.push(k);
                    }
                }
            }
        }
    }
    let mut bad = Vec::new();
    for (name, text) in helps {
        let want = labels.get(&name).cloned().unwrap_or_default();
        let by = if want.is_empty() {
            !text.contains(", by ")
        } else {
            text.ends_with(&format!(", by {}.", want.join(" and ")))
        };
        let upper = text.chars().next().is_some_and(char::is_uppercase);
        if !upper || !text.ends_with('.') || text.ends_with("..") || !by || text.contains("as of") {
            bad.push(format!("{name}: {text:?} {want:?}"));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Issue 37: the webhook's answer time by outcome (one observation per answer, so its counts are
/// the deliveries'), every registry call timed by call, backend and outcome, and the build.
#[tokio::test(start_paused = true)]
async fn webhook_and_registry_call_durations_and_the_build() {
    let h = start(Setup::default()).await;
    let (_, before) = scrape(&h, None).await;
    let m = samples(&before);
    let zero = |k: &str| assert_eq!(m.get(k), Some(&0.0), "{k} missing or not 0 in\n{before}");
    for outcome in webhook_router::metrics::DELIVERY_OUTCOMES {
        let status = if ["unauthorized", "invalid"].contains(&outcome) {
            "4xx"
        } else if ["assigned", "duplicate", "waiting", "ignored", "drained"].contains(&outcome) {
            "2xx"
        } else {
            "5xx"
        };
        zero(&format!(
            "webhook_router_webhook_duration_seconds_count{{outcome=\"{outcome}\",status=\"{status}\"}}"
        ));
    }
    zero("webhook_router_registry_call_duration_seconds_count{backend=\"memory\",call=\"admit\",outcome=\"ok\"}");
    let build = format!(
        "webhook_router_build_info{{features=\"{}\",profile=\"{}\",version=\"{}\"}}",
        if cfg!(feature = "otel") { "otel" } else { "" },
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(m.get(&build), Some(&1.0), "{build} in\n{before}");

    for i in 0..3 {
        h.deliver("pull_request", &format!("d-{i}"), &pr("o/r", i + 1))
            .await;
    }
    h.deliver("pull_request", "d-0", &pr("o/r", 1)).await;
    let (_, after) = scrape(&h, None).await;
    let m = samples(&after);
    let get = |k: &str| {
        *m.get(k)
            .unwrap_or_else(|| panic!("{k} missing in\n{after}"))
    };
    assert_eq!(
        get("webhook_router_webhook_duration_seconds_count{outcome=\"assigned\",status=\"2xx\"}"),
        3.0
    );
    assert_eq!(
        get("webhook_router_webhook_duration_seconds_count{outcome=\"duplicate\",status=\"2xx\"}"),
        1.0
    );
    assert!(
        after.lines().any(
            |l| l.starts_with("webhook_router_webhook_duration_seconds_bucket{")
                && l.contains("outcome=\"assigned\"")
                && l.contains("le=\"+Inf\"")
                && l.ends_with(" 3")
        ),
        "{after}"
    );
    let calls = h.server.app().metrics().registry_calls();
    assert_eq!(
        calls.count("admit", "ok"),
        4,
        "three admissions and a duplicate"
    );
    assert_eq!(
        get("webhook_router_registry_call_duration_seconds_count{backend=\"memory\",call=\"admit\",outcome=\"ok\"}"),
        4.0
    );
    // The workers' calls go through the same wrapper.
    assert!(calls.count("heartbeat", "ok") + calls.count("loop_started", "ok") > 0);
}
