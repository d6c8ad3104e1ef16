//! The router's webhook path against its floor, in one run: a bare axum handler that reads the
//! body, verifies its HMAC and parses the JSON the router needs (the same typed fields), and the
//! router itself (in-memory registry, logs on at `info` as the binary has them, metrics on),
//! each on its own port of one tokio runtime, both driven by `wrk` (Debian's package) with unique
//! signed `pull_request.synchronize` deliveries to 64 pull requests (the replayed payload,
//! 4.6 KB). The runs alternate (floor, router, floor, ...) so that both see the same machine.
//!
//! ```text
//! cargo bench -p worker-registry-router --bench webhook_floor            # 3 rounds of 10 s each
//! BENCH_ROUNDS=5 BENCH_SECS=15 BENCH_CONNECTIONS=32 cargo bench -p worker-registry-router --bench webhook_floor
//! BENCH_ONLY=router BENCH_SECS=30 cargo bench ...                # the router alone (for `perf record`)
//! BENCH_PERF=1 cargo bench ...                                   # + server CPU µs per request (perf stat)
//! BENCH_CALLGRIND=/tmp/cg.out BENCH_CONNECTIONS=8 BENCH_WARMUP=5 BENCH_ROUNDS=1 \
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out target/release/deps/webhook_floor-*
//!                                                                # instructions per request
//! ```
//!
//! On a busy machine requests/s swing from run to run; the CPU time per request (`BENCH_PERF`)
//! swings less, and the instructions per request under callgrind not at all (valgrind runs one
//! thread at a time, so those runs are slow: use few connections).
//!
//! It prints, per run, requests/s, p50, p99 and the worst latency wrk saw, the non-2xx answers,
//! and the router's share of the floor. The log goes to stderr (`2>/dev/null` to drop it).
//! Without `wrk` it says so and exits 0 (1 under `CI`).

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use sha2::Sha256;
use tokio::net::TcpListener;
use webhook_router::{app, body, github, server, telemetry};
use worker_registry::{DynRegistry, InMemoryRegistry, RegistryConfig};

const SECRET: &str = "It's a Secret to Everybody";
const PRS: u64 = 64;

/// The fields the router reads from a `pull_request` payload: the floor parses exactly these.
#[derive(Deserialize)]
struct Payload {
    #[allow(dead_code)]
    action: Option<String>,
    #[allow(dead_code)]
    pull_request: Number,
    #[allow(dead_code)]
    repository: Repository,
}

#[derive(Deserialize)]
struct Number {
    #[allow(dead_code)]
    number: u64,
}

#[derive(Deserialize)]
struct Repository {
    #[allow(dead_code)]
    full_name: String,
}

/// The floor: the body read, its HMAC verified, the JSON parsed, a small JSON answer.
async fn floor(headers: HeaderMap, body: Bytes) -> (StatusCode, &'static str) {
    let Some(sig) = headers
        .get("x-hub-signature-256")
        .and_then(|v| v.as_bytes().strip_prefix(b"sha256="))
    else {
        return (StatusCode::UNAUTHORIZED, r#"{"error":"unsigned"}"#);
    };
    let mut digest = [0u8; 32];
    if hex::decode_to_slice(sig, &mut digest).is_err() {
        return (StatusCode::UNAUTHORIZED, r#"{"error":"malformed"}"#);
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("any key length");
    mac.update(&body);
    if mac.verify_slice(&digest).is_err() {
        return (StatusCode::UNAUTHORIZED, r#"{"error":"signature"}"#);
    }
    match serde_json::from_slice::<Payload>(&body) {
        Ok(_) => (StatusCode::ACCEPTED, r#"{"outcome":"accepted"}"#),
        Err(_) => (StatusCode::BAD_REQUEST, r#"{"error":"json"}"#),
    }
}

async fn start_floor() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/webhook", post(floor));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/webhook")
}

/// The router as the binary serves it by default (capacity 64, one worker per PR), with no
/// simulated work per event.
async fn start_router() -> (String, server::Server) {
    let config = RegistryConfig::builder()
        .max_workers(PRS as usize)
        .max_waiting(1024)
        .build()
        .unwrap();
    let options = app::Options {
        webhook_secret: Some(SECRET).into(),
        admin_token: Some("bench-token").into(),
        work: Duration::ZERO,
        idle: Duration::from_secs(3600),
        mailbox: webhook_router::limits::DEFAULT_MAILBOX,
        overflow: webhook_router::limits::DEFAULT_OVERFLOW,
        policy: Arc::default(),
        body: body::BodyLimits {
            max: github::MAX_PAYLOAD_BYTES,
            timeout: body::DEFAULT_BODY_TIMEOUT,
            budget: body::BodyBudget::new(body::DEFAULT_BODY_BUDGET),
        },
    };
    let registry = DynRegistry::new(InMemoryRegistry::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = server::serve(app::App::new(registry, options), listener)
        .await
        .unwrap();
    (format!("http://{}/webhook", server.addr()), server)
}

/// The wrk script: one of 64 signed bodies per request, round robin, each with a delivery id of
/// its own.
fn script(dir: &std::path::Path) -> std::path::PathBuf {
    let template: serde_json::Value = serde_json::from_slice(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/replay/payloads/pull_request.opened.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut lua = String::from("bodies = {}\nsigs = {}\n");
    for n in 1..=PRS {
        let mut p = template.clone();
        p["action"] = "synchronize".into();
        p["number"] = n.into();
        p["pull_request"]["number"] = n.into();
        let body = serde_json::to_string(&p).unwrap();
        let sig = github::sign(SECRET.as_bytes(), body.as_bytes());
        lua.push_str(&format!(
            "bodies[{n}] = [==[{body}]==]\nsigs[{n}] = \"{sig}\"\n"
        ));
    }
    lua.push_str(
        r#"
counter = 0
request = function()
  counter = counter + 1
  local i = (counter % 64) + 1
  local headers = {}
  headers["Content-Type"] = "application/json"
  headers["X-GitHub-Event"] = "pull_request"
  headers["X-GitHub-Delivery"] = string.format("bench-%d-%d", os.time(), counter)
  headers["X-Hub-Signature-256"] = sigs[i]
  return wrk.format("POST", nil, headers, bodies[i])
end
"#,
    );
    let path = dir.join("deliveries.lua");
    std::fs::write(&path, lua).unwrap();
    path
}

/// What one wrk run measured.
#[derive(Debug, Default, Clone, Copy)]
struct Run {
    rps: f64,
    requests: u64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    non_2xx: u64,
    /// With `BENCH_PERF=1`: the CPU time this process spent during the run, ms (`perf stat`'s
    /// task-clock: user and kernel, less sensitive to a busy machine than requests/s).
    cpu_ms: Option<f64>,
}

/// A wrk duration (`297.00us`, `1.20ms`, `2.01s`) in milliseconds.
fn ms(s: &str) -> f64 {
    let (v, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let v: f64 = v.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => v / 1000.0,
        "ms" => v,
        "s" => v * 1000.0,
        "m" => v * 60_000.0,
        _ => f64::NAN,
    }
}

/// `perf stat` of this process for `secs`: the CPU time it spent.
fn perf_stat(secs: u64) -> Option<std::process::Child> {
    Command::new("perf")
        .args(["stat", "-x,", "-e", "task-clock", "-p"])
        .arg(std::process::id().to_string())
        .args(["--", "sleep", &secs.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()
}

fn cpu_ms(child: std::process::Child) -> Option<f64> {
    let out = child.wait_with_output().ok()?;
    let text = String::from_utf8_lossy(&out.stderr);
    text.lines()
        .find(|l| l.contains("task-clock"))?
        .split(',')
        .next()?
        .parse()
        .ok()
}

/// Under callgrind (the bench run by `valgrind --tool=callgrind --callgrind-out-file=PATH` with
/// `BENCH_CALLGRIND=PATH`): zeroes the counters, so that [`callgrind_since`] counts one run.
fn callgrind_zero() -> bool {
    std::env::var_os("BENCH_CALLGRIND").is_some() && callgrind_control("-z")
}

fn callgrind_control(what: &str) -> bool {
    Command::new("callgrind_control")
        .arg(what)
        .arg(std::process::id().to_string())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The instructions executed since [`callgrind_zero`]: a dump's `summary:` (callgrind writes it
/// to `PATH.N`, N counting the dumps).
fn callgrind_since(dump: &mut u32) -> Option<u64> {
    let path = std::env::var("BENCH_CALLGRIND").ok()?;
    if !callgrind_control("-d") {
        return None;
    }
    *dump += 1;
    let text = std::fs::read_to_string(format!("{path}.{dump}")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("summary: "))?
        .trim()
        .parse()
        .ok()
}

fn wrk(url: &str, script: &std::path::Path, secs: u64, connections: u32) -> Run {
    let perf = std::env::var_os("BENCH_PERF").and_then(|_| perf_stat(secs));
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{secs}s"),
            "--latency",
        ])
        .arg("-s")
        .arg(script)
        .arg(url)
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut run = Run::default();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", v] => run.rps = v.parse().unwrap_or(f64::NAN),
            ["Latency", _avg, _stdev, max, ..] => run.max_ms = ms(max),
            ["50%", v] => run.p50_ms = ms(v),
            ["99%", v] => run.p99_ms = ms(v),
            ["Non-2xx", "or", "3xx", "responses:", n] => run.non_2xx = n.parse().unwrap_or(0),
            [n, "requests", "in", ..] => run.requests = n.parse().unwrap_or(0),
            _ => {}
        }
    }
    run.cpu_ms = perf.and_then(cpu_ms);
    if run.rps == 0.0 {
        eprintln!("wrk said:\n{text}{}", String::from_utf8_lossy(&out.stderr));
    }
    run
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if Command::new("wrk").arg("--version").output().is_err() {
        println!("webhook_floor: skipped, wrk is not installed (apt-get install wrk)");
        std::process::exit(if std::env::var_os("CI").is_some() {
            1
        } else {
            0
        });
    }
    let (secs, rounds) = (env("BENCH_SECS", 10), env("BENCH_ROUNDS", 3));
    let connections = u32::try_from(env("BENCH_CONNECTIONS", 32)).unwrap_or(32);
    let only = std::env::var("BENCH_ONLY").ok();
    // As the binary does, before the runtime's threads exist.
    body::return_large_buffers_to_the_os();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (floor_url, router_url, _server) = rt.block_on(async {
        // The binary's log: text at info, on stderr.
        let _ = telemetry::init("info", telemetry::LogFormat::Text);
        let floor = start_floor().await;
        let (router, server) = start_router().await;
        (floor, router, server)
    });
    let dir = std::env::temp_dir().join(format!("webhook-floor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = script(&dir);
    let targets: Vec<(&str, &str)> = [
        ("floor", floor_url.as_str()),
        ("router", router_url.as_str()),
    ]
    .into_iter()
    .filter(|(name, _)| only.as_deref().is_none_or(|o| o == *name))
    .collect();
    // Warm-up: the router's 64 workers start, the allocator and caches settle.
    for (_, url) in &targets {
        wrk(url, &script, env("BENCH_WARMUP", 2), connections);
    }
    println!(
        "wrk -t1 -c{connections} -d{secs}s, unique signed pull_request.synchronize deliveries to {PRS} PRs"
    );
    println!("round  target      req/s     p50 ms   p99 ms   max ms   non-2xx   router/floor   CPU µs/request");
    let mut ratios = Vec::new();
    let mut dumps = 0;
    for round in 1..=rounds {
        let mut floor_rps = None;
        for (name, url) in &targets {
            let counting = callgrind_zero();
            let r = wrk(url, &script, secs, connections);
            if let Some(ir) = counting.then(|| callgrind_since(&mut dumps)).flatten() {
                println!(
                    "       {name}: {} instructions per request (callgrind, {} requests)",
                    ir / r.requests.max(1),
                    r.requests
                );
            }
            let ratio = match (*name, floor_rps) {
                ("router", Some(f)) => {
                    ratios.push(r.rps / f);
                    format!("{:.2}", r.rps / f)
                }
                _ => String::new(),
            };
            if *name == "floor" {
                floor_rps = Some(r.rps);
            }
            let per = r
                .cpu_ms
                .filter(|_| r.requests > 0)
                .map(|ms| format!("{:.1}", ms * 1000.0 / r.requests as f64))
                .unwrap_or_default();
            println!(
                "{round:>5}  {name:<8} {:>9.0} {:>9.3} {:>8.3} {:>8.1} {:>9}   {ratio:>12}   {per}",
                r.rps, r.p50_ms, r.p99_ms, r.max_ms, r.non_2xx
            );
        }
    }
    if !ratios.is_empty() {
        ratios.sort_by(f64::total_cmp);
        println!(
            "router/floor: min {:.2}, median {:.2}, max {:.2} over {} rounds",
            ratios[0],
            ratios[ratios.len() / 2],
            ratios[ratios.len() - 1],
            ratios.len()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
