//! The Redis backend's hot calls through `RedisRegistry`, on one connection, with 1 and with 64
//! calls in flight, next to a bare `EVALSHA` of a trivial script (`return 1`) and a bare `FCALL`
//! of a trivial function on the same server in the same run, plus `redis-benchmark` figures for
//! that server. The rows: a sticky admit (a new delivery for a target whose worker is active), a
//! duplicate admit (a redelivery of a delivery in flight on a worker that has heartbeated), a
//! heartbeat, an admit that creates a worker (a new target each call, on a registry with room
//! for all of them), and a completion; and the two admits again with a typical 30 KB payload
//! (`admit_with`: `admit_sticky_30k`, `admit_new_worker_30k`), beside today's in the same run.
//! A payload row makes at most [`PAYLOAD_ROW_CALLS`] calls (each leaves 30 KB on the server
//! until the bench completes them after the row), and runs in criterion only in `--test` mode.
//!
//! ```text
//! cargo bench --features redis --bench redis            # criterion, then the table
//! WORKER_REGISTRY_REDIS_URL=redis://host:6379/ cargo bench --features redis --bench redis
//! ```
//!
//! The server is the one named by `WORKER_REGISTRY_REDIS_URL`, or a throwaway `redis-server`
//! (without either, the bench prints one line and exits). After criterion's own estimates the
//! bench measures each row again with every call's latency in an HDR histogram and prints a table:
//! throughput; its ratios to the bare `FCALL` and the bare `EVALSHA` at the same concurrency and
//! to the bound the row's server cost allows (calls/s × server µs per call); p50 and p99. The
//! issue's aims, marked in the table: at 1 in flight at least 0.8 of the bare `EVALSHA`, at 64 at
//! least 0.8 of the bound. Beside it, `server busy` (calls/s × the server main thread's CPU per
//! call): the share of the row's time the server was on a core, near 1 when the server, not the
//! client, is what limits the row (the bound leaves out the server's own reading and writing of
//! each call, about 1-2 µs, which `usec_per_call` does not count). The registries' handles are built `without_test_offset`, so their
//! calls run what a production build runs (no `GET` of the test offset). `--test` (criterion's
//! smoke mode) runs each bench once and skips the table.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker_registry::WorkerRegistryExt;

use criterion::Criterion;
use hdrhistogram::Histogram;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::runtime::Runtime;
use worker_registry::redis::RedisRegistry;
use worker_registry::{
    Admission, DeliveryId, Payload, RegistryConfig, Target, WorkerId, WorkerRegistry,
};

#[path = "../tests/redis/harness.rs"]
mod harness;

/// Calls in flight in the concurrent rows.
const IN_FLIGHT: usize = 64;
/// Targets (each with its worker) the sticky admits cycle through.
const TARGETS: usize = 64;
/// Registered, running workers the heartbeats cycle through: as in production, a worker's beats
/// are far apart (here about 25 ms at the concurrent row's rate), never two in one ms.
const BEATERS: usize = 4096;

/// The payload rows' body size: a typical `pull_request` delivery's.
const PAYLOAD_BYTES: usize = 30_000;
/// The most calls one payload row makes (its admissions hold 30 KB each until the row ends).
const PAYLOAD_ROW_CALLS: usize = 4_000;

/// What a row calls.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    Bare,
    Admit,
    Duplicate,
    Heartbeat,
    BareFcall,
    Create,
    Complete,
    AdmitPayload,
    CreatePayload,
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Self::Bare => "bare_evalsha",
            Self::Admit => "admit_sticky",
            Self::Duplicate => "admit_duplicate",
            Self::Heartbeat => "heartbeat",
            Self::BareFcall => "bare_fcall",
            Self::Create => "admit_new_worker",
            Self::Complete => "complete",
            Self::AdmitPayload => "admit_sticky_30k",
            Self::CreatePayload => "admit_new_worker_30k",
        }
    }

    fn carries_payload(self) -> bool {
        matches!(self, Self::AdmitPayload | Self::CreatePayload)
    }
}

/// Everything a call needs, shared by the tasks in flight.
struct Fixture {
    registry: RedisRegistry,
    /// A registry with room for a worker per creating admit.
    roomy: RedisRegistry,
    bare: ConnectionManager,
    script: redis::Script,
    targets: Vec<Target>,
    /// The heartbeat row's workers (see [`BEATERS`]).
    beaters: Vec<WorkerId>,
    dup: (Target, DeliveryId),
    /// Makes every sticky admit's delivery id unique across rows and runs.
    next: AtomicUsize,
    /// The sticky admits completed so far (the complete row walks them in order; it runs only
    /// in the table, after the admit row of the same size, so it never passes the admits).
    done: AtomicUsize,
    /// The creating admits so far (each a new target).
    created: AtomicUsize,
    /// The payload the payload rows carry, and the pairs they admitted (completed after the row).
    payload: Payload,
    /// The sticky payload row's own counter (the complete row walks `next`'s ids).
    next_carrying: AtomicUsize,
    carried: Mutex<Vec<(bool, Target, DeliveryId)>>,
    run: u128,
}

impl Fixture {
    async fn call(&self, call: Call, i: usize) {
        match call {
            Call::Bare => {
                let mut conn = self.bare.clone();
                let one: i64 = self.script.invoke_async(&mut conn).await.expect("EVALSHA");
                assert_eq!(one, 1);
            }
            Call::Admit => {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let d = DeliveryId::new(&format!("bench-{}-{n}", self.run)).unwrap();
                let a = self.registry.admit(&self.targets[n % TARGETS], &d).await;
                assert!(matches!(a, Ok(Admission::Assigned(_))), "{a:?}");
            }
            Call::BareFcall => {
                let mut conn = self.bare.clone();
                let one: i64 = redis::cmd("FCALL")
                    .arg("wr_bench_one")
                    .arg(0)
                    .query_async(&mut conn)
                    .await
                    .expect("FCALL");
                assert_eq!(one, 1);
            }
            Call::Create => {
                let n = self.created.fetch_add(1, Ordering::Relaxed);
                let t = Target::new(&format!("octo/new-{}", self.run % 1_000_000), n as u64 + 1)
                    .unwrap();
                let a = self.roomy.admit(&t, &DeliveryId::new("d").unwrap()).await;
                assert!(
                    matches!(a, Ok(Admission::Assigned(ref x)) if x.new),
                    "{a:?}"
                );
            }
            Call::Complete => {
                // Completes the sticky admits made before it (a fresh pair each call); the pair
                // was admitted by the rows before, so this is an in-flight completion.
                let n = self.done.fetch_add(1, Ordering::Relaxed);
                let d = DeliveryId::new(&format!("bench-{}-{n}", self.run)).unwrap();
                self.registry
                    .complete(&self.targets[n % TARGETS], &d)
                    .await
                    .expect("complete");
            }
            Call::AdmitPayload => {
                let n = self.next_carrying.fetch_add(1, Ordering::Relaxed);
                let (t, d) = (
                    &self.targets[n % TARGETS],
                    DeliveryId::new(&format!("bench-p-{}-{n}", self.run)).unwrap(),
                );
                let a = self.registry.admit_with(t, &d, Some(&self.payload)).await;
                assert!(matches!(a, Ok(Admission::Assigned(_))), "{a:?}");
                self.carried.lock().unwrap().push((false, t.clone(), d));
            }
            Call::CreatePayload => {
                let n = self.created.fetch_add(1, Ordering::Relaxed);
                let t = Target::new(&format!("octo/new-{}", self.run % 1_000_000), n as u64 + 1)
                    .unwrap();
                let d = DeliveryId::new("d").unwrap();
                let a = self.roomy.admit_with(&t, &d, Some(&self.payload)).await;
                assert!(
                    matches!(a, Ok(Admission::Assigned(ref x)) if x.new),
                    "{a:?}"
                );
                self.carried.lock().unwrap().push((true, t, d));
            }
            Call::Duplicate => {
                let a = self.registry.admit(&self.dup.0, &self.dup.1).await;
                assert!(matches!(a, Ok(Admission::Duplicate(_))), "{a:?}");
            }
            Call::Heartbeat => {
                self.registry
                    .heartbeat(self.beaters[i % BEATERS])
                    .await
                    .expect("heartbeat");
            }
        }
    }
}

/// Runs `n` calls with `in_flight` at a time; returns the elapsed time and, if asked, every
/// call's latency.
async fn drive(
    f: &Arc<Fixture>,
    call: Call,
    n: usize,
    in_flight: usize,
    record: bool,
) -> (Duration, Option<Histogram<u64>>) {
    let next = Arc::new(AtomicUsize::new(0));
    let hist = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap(),
    ));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (f, next, hist) = (f.clone(), next.clone(), hist.clone());
        tasks.spawn(async move {
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let t = Instant::now();
                f.call(call, i).await;
                if record {
                    let _ = local.record(t.elapsed().as_nanos() as u64);
                }
            }
            hist.lock().unwrap().add(local).unwrap();
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("bench task");
    }
    let elapsed = started.elapsed();
    let hist = Arc::try_unwrap(hist).ok().map(|m| m.into_inner().unwrap());
    (elapsed, if record { hist } else { None })
}

async fn setup(url: &str) -> Arc<Fixture> {
    let config = RegistryConfig::builder()
        .max_workers(4 * TARGETS + BEATERS)
        .build()
        .unwrap();
    // Both registries' calls read the server's clock alone, as a production build's do (this
    // bench is built with `testkit`, whose handles would also `GET` the test offset).
    let registry = RedisRegistry::builder(url)
        .name(harness::unique_name("bench"))
        .without_test_offset()
        .config(config)
        // A loaded VM may pause the server longer than the default allows.
        .response_timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect");
    let mut targets = Vec::new();
    let mut workers = Vec::new();
    for i in 0..TARGETS {
        let t = Target::new("octo/bench", i as u64 + 1).unwrap();
        let Ok(Admission::Assigned(a)) = registry
            .admit(&t, &DeliveryId::new(&format!("first-{i}")).unwrap())
            .await
        else {
            panic!("setup admit")
        };
        workers.push(a.worker);
        targets.push(t);
    }
    // The duplicate: a redelivery of a delivery in flight on a running worker (one that has
    // heartbeated, as a worker is for all but its first seconds), so it reads the claim alone.
    registry
        .heartbeat(workers[0])
        .await
        .expect("setup heartbeat");
    let dup = (targets[0].clone(), DeliveryId::new("redelivered").unwrap());
    let Ok(Admission::Assigned(_)) = registry.admit(&dup.0, &dup.1).await else {
        panic!("setup sticky admit")
    };
    // Started (a first beat each, as every worker's is but its first), as the heartbeat row's are.
    let mut beaters = Vec::with_capacity(BEATERS);
    for _ in 0..BEATERS {
        let w = registry.register().await.expect("setup register");
        registry.heartbeat(w).await.expect("setup heartbeat");
        beaters.push(w);
    }
    let client = redis::Client::open(url).unwrap();
    let bare_config =
        ConnectionManagerConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    let mut bare = ConnectionManager::new_with_config(client, bare_config)
        .await
        .unwrap();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(
            "#!lua name=wr_bench\nredis.register_function('wr_bench_one', function() return 1 end)",
        )
        .query_async(&mut bare)
        .await
        .unwrap();
    let roomy = RedisRegistry::builder(url)
        .name(harness::unique_name("bench-new"))
        .without_test_offset()
        .response_timeout(Duration::from_secs(30))
        .config(
            RegistryConfig::builder()
                .max_workers(10_000_000)
                .build()
                .unwrap(),
        )
        .connect()
        .await
        .expect("connect");
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    Arc::new(Fixture {
        registry,
        roomy,
        bare,
        script: redis::Script::new("return 1"),
        targets,
        beaters,
        dup,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        created: AtomicUsize::new(0),
        payload: Payload::builder("pull_request", vec![b'x'; PAYLOAD_BYTES])
            .action("synchronize")
            .content_type("application/json")
            .build()
            .unwrap(),
        next_carrying: AtomicUsize::new(0),
        carried: Mutex::new(Vec::new()),
        run,
    })
}

/// Completes what the payload rows admitted, so that their payloads leave the server (untimed).
async fn complete_carried(f: &Fixture) {
    let carried = std::mem::take(&mut *f.carried.lock().unwrap());
    for (roomy, t, d) in carried {
        let r = if roomy { &f.roomy } else { &f.registry };
        r.complete(&t, &d)
            .await
            .expect("complete a payload row's admission");
    }
}

const CALLS: [Call; 9] = [
    Call::Bare,
    Call::BareFcall,
    Call::Admit,
    Call::AdmitPayload,
    Call::Duplicate,
    Call::Heartbeat,
    Call::Create,
    Call::CreatePayload,
    Call::Complete,
];

fn criterion_benches(c: &mut Criterion, rt: &Runtime, f: &Arc<Fixture>, smoke: bool) {
    let mut g = c.benchmark_group("redis");
    for in_flight in [1, IN_FLIGHT] {
        for call in CALLS {
            if call == Call::Complete || (call.carries_payload() && !smoke) {
                continue; // table only (see `Fixture::done`, `PAYLOAD_ROW_CALLS`)
            }
            g.bench_function(format!("{}/{in_flight}", call.name()), |b| {
                b.iter_custom(|iters| {
                    rt.block_on(drive(f, call, iters as usize, in_flight, false))
                        .0
                });
            });
        }
    }
    g.finish();
    rt.block_on(complete_carried(f));
}

struct Row {
    call: Call,
    in_flight: usize,
    /// The server's own time per call for the row's command (`INFO commandstats`: the time of
    /// EVALSHA and FCALL over their calls, the measured calls only). Wall-clock time inside the
    /// command: on a loaded machine it includes the time the server waited for a core.
    server_us: f64,
    /// The server's main-thread CPU time per call over the row (`INFO cpu`, user + system):
    /// everything the server did for a call (reading, parsing, the function, the reply), and not
    /// the time it waited for a core, so it holds on a loaded machine.
    cpu_us: f64,
    /// This process's CPU time per call over the row (`/proc/self/stat`, user + system, every
    /// thread): the client's own cost, the kernel's share of its socket calls included.
    client_cpu_us: f64,
    ops_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    /// The commands the row's functions ran, per call: (command, calls per row call, µs per
    /// command), from `INFO commandstats` (which counts a function's own commands too).
    inner: Vec<(String, f64, f64)>,
}

fn table(rt: &Runtime, f: &Arc<Fixture>, calls_per_row: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    for in_flight in [1, IN_FLIGHT] {
        for call in CALLS {
            let mut n = if in_flight == 1 {
                calls_per_row / 4
            } else {
                calls_per_row
            };
            if call.carries_payload() {
                n = n.min(PAYLOAD_ROW_CALLS);
            }
            // Warm up, then measure.
            rt.block_on(drive(f, call, n / 10, in_flight, false));
            rt.block_on(reset_stats(f));
            let cpu_before = rt.block_on(main_thread_cpu(f));
            let client_before = own_cpu();
            let (elapsed, hist) = rt.block_on(drive(f, call, n, in_flight, true));
            let client = own_cpu() - client_before;
            let cpu = rt.block_on(main_thread_cpu(f)) - cpu_before;
            let server_us = rt.block_on(script_usec_per_call(f));
            let inner = rt.block_on(inner_commands(f, n));
            let hist = hist.unwrap();
            rows.push(Row {
                call,
                in_flight,
                server_us,
                cpu_us: cpu * 1e6 / n as f64,
                client_cpu_us: client * 1e6 / n as f64,
                ops_per_s: n as f64 / elapsed.as_secs_f64(),
                p50_us: hist.value_at_quantile(0.50) as f64 / 1_000.0,
                p99_us: hist.value_at_quantile(0.99) as f64 / 1_000.0,
                inner,
            });
            rt.block_on(complete_carried(f));
        }
    }
    rows
}

/// This process's CPU time so far (seconds, user + system, all threads; `/proc/self/stat`, in
/// clock ticks of 10 ms: a row's tens of thousands of calls take seconds).
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which is in parentheses): utime and stime are the
    // 12th and 13th.
    let rest = stat.rsplit(") ").next().unwrap_or("");
    let ticks: f64 = rest
        .split(' ')
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

/// The server's main-thread CPU time so far (seconds, user + system).
async fn main_thread_cpu(f: &Fixture) -> f64 {
    let mut conn = f.bare.clone();
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn)
        .await
        .expect("INFO cpu");
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user_main_thread:")
                .or_else(|| l.strip_prefix("used_cpu_sys_main_thread:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// The commands run since the last reset other than the row's own calls and the bench's
/// (`FCALL`, `EVALSHA`, `INFO`, `CONFIG`): each one's calls per row call and µs per command.
async fn inner_commands(f: &Fixture, row_calls: usize) -> Vec<(String, f64, f64)> {
    let mut conn = f.bare.clone();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats");
    let mut out = Vec::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if ["fcall", "evalsha", "info", "config"].contains(&name) {
            continue;
        }
        let field = |key: &str| -> f64 {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        out.push((
            name.to_uppercase(),
            field("calls=") / row_calls as f64,
            field("usec_per_call="),
        ));
    }
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

/// Zeroes the server's command statistics (`CONFIG RESETSTAT`).
async fn reset_stats(f: &Fixture) {
    let mut conn = f.bare.clone();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("CONFIG RESETSTAT");
}

/// The server time per script call since the last reset: EVALSHA's and FCALL's `usec` over
/// their `calls` (a row's calls are one of them: the scripts before the Function library, the
/// functions after; the bare rows one each).
async fn script_usec_per_call(f: &Fixture) -> f64 {
    let mut conn = f.bare.clone();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats");
    let (mut usec, mut calls) = (0.0, 0.0);
    for cmd in ["cmdstat_evalsha:", "cmdstat_fcall:"] {
        let Some(line) = info.lines().find_map(|l| l.strip_prefix(cmd)) else {
            continue;
        };
        let field = |name: &str| -> f64 {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(name))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        usec += field("usec=");
        calls += field("calls=");
    }
    if calls == 0.0 {
        f64::NAN
    } else {
        usec / calls
    }
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "| call | in flight | server µs/call | server CPU µs/call | client CPU µs/call | calls/s | \
         vs bare FCALL | vs bare EVALSHA | vs 1/server cost | server busy | p50 | p99 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mark = |r: &Row, ratio: f64| {
        if matches!(r.call, Call::Bare | Call::BareFcall) {
            ""
        } else if ratio >= 0.8 {
            " (>= 0.8)"
        } else {
            " (below 0.8)"
        }
    };
    for r in rows {
        let bare = |call: Call| {
            rows.iter()
                .find(|b| b.call == call && b.in_flight == r.in_flight)
                .map(|b| r.ops_per_s / b.ops_per_s)
                .unwrap_or(f64::NAN)
        };
        let (fcall, evalsha) = (bare(Call::BareFcall), bare(Call::Bare));
        let bound = r.ops_per_s * r.server_us / 1e6;
        // The share of the row's wall-clock time the server's main thread was on the CPU
        // (calls/s x its CPU per call): near 1, the server is what bounds the row, not the
        // client, whatever `bound` says (that one leaves out the server's own I/O per call).
        let busy = r.ops_per_s * r.cpu_us / 1e6;
        // The issue's aims: at 1 in flight, 0.8 of a bare EVALSHA (the round trip bounds it);
        // with calls in flight, 0.8 of what the server's cost allows (1 / server µs per call).
        let (evalsha_mark, bound_mark) = if r.in_flight == 1 {
            (mark(r, evalsha), "")
        } else {
            ("", mark(r, bound))
        };
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {fcall:.2} | {evalsha:.2}{evalsha_mark} | \
             {bound:.2}{bound_mark} | {busy:.2} | {:.0} µs | {:.0} µs |",
            r.call.name(),
            r.in_flight,
            r.server_us,
            r.cpu_us,
            r.client_cpu_us,
            r.ops_per_s,
            r.p50_us,
            r.p99_us
        );
    }
}

/// Each row's commands per call, counted by the server (64 in flight; the 1-in-flight rows run
/// the same functions).
fn print_inner(rows: &[Row]) {
    println!();
    println!(
        "| call | commands per call (server-counted) | each: calls per call, µs per command |"
    );
    println!("|---|---:|---|");
    for r in rows.iter().filter(|r| r.in_flight == IN_FLIGHT) {
        let total: f64 = r.inner.iter().map(|c| c.1).sum();
        let each: Vec<String> = r
            .inner
            .iter()
            .filter(|c| c.1 >= 0.01)
            .map(|(name, per, us)| format!("{name} {per:.2} × {us:.2}"))
            .collect();
        println!("| {} | {total:.2} | {} |", r.call.name(), each.join(", "));
    }
}

/// `redis-benchmark` on the same server: PING, and the same trivial script by SHA.
fn redis_benchmark(url: &str, sha: &str) {
    let Some(rest) = url.strip_prefix("redis://") else {
        return;
    };
    let hostport = rest.split('/').next().unwrap_or(rest);
    let hostport = hostport.rsplit('@').next().unwrap_or(hostport);
    let (host, port) = hostport.rsplit_once(':').unwrap_or((hostport, "6379"));
    println!();
    println!("redis-benchmark -h {host} -p {port} (same server):");
    for clients in [1, IN_FLIGHT] {
        for args in [vec!["-t", "ping_mbulk"], vec!["EVALSHA", sha, "0"]] {
            let out = std::process::Command::new("redis-benchmark")
                .args(["-h", host, "-p", port, "-q", "-n", "100000", "-c"])
                .arg(clients.to_string())
                .args(&args)
                .output();
            match out {
                Ok(o) if o.status.success() => {
                    let text = String::from_utf8_lossy(&o.stdout);
                    let line = text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
                    let line = line.rsplit('\r').next().unwrap_or(line).trim();
                    println!("  -c {clients:>2}  {line}");
                }
                _ => {
                    println!("  redis-benchmark not available");
                    return;
                }
            }
        }
    }
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let server;
    let url = match std::env::var(harness::URL_VAR) {
        Ok(url) => url,
        Err(_) if harness::have_binary() => {
            server = harness::Server::start(false, "bench").expect("redis-server");
            server.url()
        }
        Err(_) => {
            println!(
                "skipped: Redis benches (install redis-server or set {})",
                harness::URL_VAR
            );
            return;
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let f = rt.block_on(setup(&url));
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .without_plots()
        .configure_from_args();
    criterion_benches(&mut c, &rt, &f, smoke);
    c.final_summary();
    if smoke {
        return;
    }
    let calls = std::env::var("WR_REDIS_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(80_000);
    let rows = table(&rt, &f, calls);
    print_table(&rows);
    print_inner(&rows);
    redis_benchmark(&url, f.script.get_hash());
}
