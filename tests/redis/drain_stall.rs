//! A stall moves every drain deadline that had not passed out by its length, as in memory, and
//! the walk that does it is bounded: with 300 draining workers, the sweep reads `{n}:drain` in
//! chunks (`LIMIT`, over several steps), never the whole set at once. Each command a function runs
//! is in the server's slow log when its threshold is 0, so the test reads the reads of the drain
//! set from there.

use std::time::{Duration, SystemTime};
use worker_registry::WorkerRegistryExt;

use worker_registry::{
    Admission, DeadReason, DeliveryId, InMemoryRegistry, Maintenance, ManualClock, RegistryConfig,
    Target, WorkerId, WorkerRegistry,
};

use crate::harness::{self, Server};

const WORKERS: usize = 300;
/// The most entries one read of the drain set may take (a step's budget allows about 50).
const MOST_PER_READ: u64 = 64;
const INTERVAL: Duration = Duration::from_secs(10);

fn config() -> RegistryConfig {
    RegistryConfig::builder()
        .max_workers(WORKERS)
        .sweep_interval(INTERVAL)
        .heartbeat_interval(Duration::from_secs(60))
        .missed_heartbeats(3)
        .max_in_flight(Duration::from_secs(3600))
        .build()
        .unwrap()
}

/// What one backend did: each worker's drain deadline before and after the stall's sweep, the
/// stall credited, and the deaths of each later sweep.
struct Run {
    moved: Vec<Duration>,
    stall: Duration,
    deaths: Vec<Vec<(WorkerId, DeadReason)>>,
}

/// The same calls on any backend; `advance` moves its time, `log(true)` runs right before the
/// stall's sweep and `log(false)` right after it.
async fn run<R, A, AF, L, LF>(r: &R, advance: A, log: L) -> Run
where
    R: WorkerRegistry + Maintenance,
    A: Fn(Duration) -> AF,
    AF: std::future::Future<Output = ()>,
    L: Fn(bool) -> LF,
    LF: std::future::Future<Output = ()>,
{
    r.sweep().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..WORKERS {
        let t = Target::new("octo/drain-stall", i as u64 + 1).unwrap();
        let Ok(Admission::Assigned(a)) = r.admit(&t, &DeliveryId::new("d").unwrap()).await else {
            panic!("admit")
        };
        r.heartbeat(a.worker).await.unwrap();
        ids.push(a.worker);
    }
    let all = r.drain_all_within(Duration::from_secs(105)).await.unwrap();
    assert_eq!(all.draining, WORKERS);
    advance(INTERVAL).await;
    r.sweep().await.unwrap();
    let deadline = |info: Option<worker_registry::WorkerInfo>| -> SystemTime {
        info.and_then(|i| i.drain_deadline).expect("draining")
    };
    let mut before = Vec::new();
    for &id in &ids {
        before.push(deadline(r.worker(id).await.unwrap()));
    }
    // Four intervals late: a stall of three.
    advance(4 * INTERVAL).await;
    log(true).await;
    let rep = r.sweep().await.unwrap();
    log(false).await;
    assert!(rep.died.is_empty(), "{:?}", rep.died);
    let mut moved = Vec::new();
    for (&id, b) in ids.iter().zip(&before) {
        moved.push(
            deadline(r.worker(id).await.unwrap())
                .duration_since(*b)
                .unwrap(),
        );
    }
    // Past the old deadlines (105 s after the drain; it is 50 s now), then past the moved ones
    // (135 s; no sweep falls on either).
    let mut deaths = Vec::new();
    for _ in 0..9 {
        advance(INTERVAL).await;
        deaths.push(r.sweep().await.unwrap().died);
    }
    Run {
        moved,
        stall: rep.stall_credited,
        deaths,
    }
}

#[tokio::test]
async fn a_stall_moves_every_drain_deadline_out_in_bounded_reads_as_in_memory() {
    // Its own server: the slow log is server-wide.
    let Some(server) = Server::start(false, "drain-stall") else {
        return;
    };
    let url = server.url();

    let clock = ManualClock::new();
    let m = InMemoryRegistry::with_clock(config(), clock.clone());
    let expected = run(
        &m,
        |d| {
            clock.advance(d);
            std::future::ready(())
        },
        |_| std::future::ready(()),
    )
    .await;
    assert_eq!(expected.stall, 3 * INTERVAL);
    assert!(expected.moved.iter().all(|d| *d == 3 * INTERVAL));

    let r = harness::registry(&url, "drain-stall", config()).await;
    let mut raw = harness::raw(&url).await;
    let admin = raw.clone();
    let slowlog = |threshold: i64| {
        let mut raw = admin.clone();
        async move {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("slowlog-log-slower-than")
                .arg(threshold)
                .arg("slowlog-max-len")
                .arg(1_000_000)
                .query_async(&mut raw)
                .await
                .unwrap();
            if threshold == 0 {
                let _: () = redis::cmd("SLOWLOG")
                    .arg("RESET")
                    .query_async(&mut raw)
                    .await
                    .unwrap();
            }
        }
    };
    // Every command of the stall's sweep is logged, each function's own commands too.
    let got = run(
        &r,
        |d| {
            let r = &r;
            async move { r.advance_time_for_tests(d).await.unwrap() }
        },
        |on| slowlog(if on { 0 } else { 10_000 }),
    )
    .await;
    // Redis's time is the server's clock plus the offset: the real milliseconds the test takes
    // count too.
    assert!(got.stall >= expected.stall && got.stall < expected.stall + Duration::from_secs(1));
    assert!(
        got.moved.iter().all(|d| *d == got.stall),
        "each deadline moved by the stall: {:?}",
        got.moved
    );
    let died = |run: &Run| -> Vec<usize> { run.deaths.iter().map(Vec::len).collect() };
    assert_eq!(died(&got), died(&expected), "deaths per sweep");
    assert!(got
        .deaths
        .iter()
        .flatten()
        .all(|(_, reason)| *reason == DeadReason::DrainTimedOut));

    // Every read of the drain set had a LIMIT within the bound; the stall's walk took several.
    let log: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!log.is_empty());
    let drain_key = {
        let claim = r.claim_key(
            &Target::new("octo/drain-stall", 1).unwrap(),
            &DeliveryId::new("d").unwrap(),
        );
        format!("{}drain", &claim[..claim.find("}:").unwrap() + 2])
    };
    let mut walk = 0;
    for entry in &log {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let Some(redis::Value::Array(args)) = fields.get(3) else {
            continue;
        };
        let args: Vec<String> = args
            .iter()
            .map(|a| match a {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => format!("{other:?}"),
            })
            .collect();
        let reads = ["ZRANGEBYSCORE", "ZREVRANGEBYSCORE"];
        if args.len() < 2 || !reads.contains(&args[0].to_uppercase().as_str()) {
            continue;
        }
        if args[1] != drain_key {
            continue;
        }
        let limit = args
            .iter()
            .position(|a| a.eq_ignore_ascii_case("LIMIT"))
            .and_then(|i| args.get(i + 2))
            .and_then(|n| n.parse::<u64>().ok());
        assert!(
            limit.is_some_and(|n| n <= MOST_PER_READ),
            "an unbounded read of the drain set: {args:?}"
        );
        if args[0].eq_ignore_ascii_case("ZREVRANGEBYSCORE") {
            walk += 1;
        }
    }
    assert!(
        walk * MOST_PER_READ as usize >= WORKERS,
        "the stall's walk took {walk} reads for {WORKERS} deadlines"
    );
}
