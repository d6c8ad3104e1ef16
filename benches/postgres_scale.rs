//! The PostgreSQL backend at production scale: a registry of 10,000 live workers (each with one
//! delivery in flight), 10,000 dead ones and 100,000 retained claims on a throwaway cluster; then
//! all the live workers fall silent at once (a mass death of 10,000) and two replicas sweep
//! until the deaths and their released deliveries are worked off, while a third replica, the
//! probe, admits a new target and heartbeats one of its own workers every 5 ms. The probe's
//! latencies are reported for a quiet stretch before the death (the same run's baseline) and for
//! the stretch of the sweeps, with p50 / p99 / max and the ratio of the two.
//!
//! ```sh
//! cargo bench --features postgres,testkit --bench postgres_scale            # the full size
//! cargo bench --features postgres,testkit --bench postgres_scale -- --test  # a smoke run
//! ```
//!
//! The server is `WORKER_REGISTRY_POSTGRES_URL`, or a throwaway cluster (`test-servers`); without
//! either the bench says so and exits. The registry is filled with SQL (one statement per table,
//! columns every schema version has), not through the calls, so that the set-up takes seconds.
//! A bench, not a test: it asserts only that the deaths and releases were all worked off.

#[path = "../tests/support/pg_cluster.rs"]
mod pg_cluster;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use worker_registry::WorkerRegistryExt;

use hdrhistogram::Histogram;
use worker_registry::postgres::PostgresRegistry;
use worker_registry::{
    Admission, DeliveryId, Maintenance, RegistryConfig, Target, WorkerId, WorkerRegistry,
};

/// The sizes of one run.
#[derive(Clone, Copy)]
struct Size {
    live: i64,
    dead: i64,
    retained: i64,
    /// How long the probe runs before the mass death (the baseline).
    quiet: Duration,
}

const FULL: Size = Size {
    live: 10_000,
    dead: 10_000,
    retained: 100_000,
    quiet: Duration::from_secs(10),
};

const SMOKE: Size = Size {
    live: 50,
    dead: 50,
    retained: 500,
    quiet: Duration::from_millis(300),
};

/// The probe's pace: one admit and one heartbeat per period.
const PROBE_PERIOD: Duration = Duration::from_millis(5);
/// How long a call may wait: long, so that the figures are the waits themselves rather than
/// timeouts (a sweep that takes longer than the default 10 s is cut off and redone).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest the sweeps may take to work the death off before the bench gives up.
const GIVE_UP: Duration = Duration::from_secs(600);

/// Latencies in µs.
struct Probe {
    admit: Histogram<u64>,
    heartbeat: Histogram<u64>,
    /// Calls that failed (a timeout): their waits are in the histograms too.
    errors: usize,
}

impl Probe {
    fn new() -> Self {
        Self {
            admit: Histogram::new(3).unwrap(),
            heartbeat: Histogram::new(3).unwrap(),
            errors: 0,
        }
    }
}

fn us(d: Duration) -> u64 {
    d.as_micros().max(1) as u64
}

fn ms(v: u64) -> String {
    format!("{:.1}", v as f64 / 1000.0)
}

/// The probe: until `stop`, admits a new target (a new worker) and heartbeats one of the
/// workers it created, every PROBE_PERIOD; latencies go into `quiet` until `loud` is set, then
/// into `during`.
async fn probe(
    r: PostgresRegistry,
    stop: Arc<AtomicBool>,
    loud: Arc<AtomicBool>,
) -> (Probe, Probe) {
    let (mut quiet, mut during) = (Probe::new(), Probe::new());
    let mut workers: Vec<WorkerId> = Vec::new();
    let mut n = 0u64;
    let mut tick = tokio::time::interval(PROBE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let t = Target::new("probe/pr", n).unwrap();
        let d = DeliveryId::new(&format!("probe-{n}")).unwrap();
        let started = Instant::now();
        let a = r.admit(&t, &d).await;
        let took = us(started.elapsed());
        let into = if loud.load(Ordering::Relaxed) {
            &mut during
        } else {
            &mut quiet
        };
        into.admit.record(took).unwrap();
        match a {
            Ok(Admission::Assigned(a)) => workers.push(a.worker),
            Ok(other) => panic!("probe admit: {other:?}"),
            Err(e) => {
                eprintln!("probe admit failed after {}: {e}", ms(took));
                into.errors += 1;
            }
        }
        if let Some(w) = workers.get(n as usize % workers.len().max(1)) {
            let started = Instant::now();
            let beat = r.heartbeat(*w).await;
            let took = us(started.elapsed());
            into.heartbeat.record(took).unwrap();
            if let Err(e) = beat {
                eprintln!("probe heartbeat failed after {}: {e}", ms(took));
                into.errors += 1;
            }
        }
    }
    (quiet, during)
}

/// Fills the registry: live workers with one delivery in flight each and their target rows, dead
/// workers, completed claims, and the counters that go with them.
async fn fill(url: &str, name: &str, size: Size) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect for the set-up");
    tokio::spawn(conn);
    let reg: i64 = client
        .query_one("SELECT id FROM wr_registries WHERE name = $1", &[&name])
        .await
        .unwrap()
        .get(0);
    let (live, dead, retained) = (size.live, size.dead, size.retained);
    let statements = [
        "INSERT INTO wr_workers (registry, id, repo, number, status, dead_reason, busy, beaten,
                                 last_beat_ms, started_ms, died_at_ms, assignments)
         SELECT $1, i, 'scale/live', i, 'active', NULL, true, true, wr_now($1), wr_now($1),
                NULL, 1
           FROM generate_series(1, $2::bigint) i
         UNION ALL
         SELECT $1, $2 + i, 'scale/dead', i, 'dead', 'exited', false, true, wr_now($1),
                wr_now($1), wr_now($1), 1
           FROM generate_series(1, $3::bigint) i",
        "INSERT INTO wr_targets (registry, repo, number, worker)
         SELECT $1, 'scale/live', i, i FROM generate_series(1, $2::bigint) i
          WHERE $3::bigint >= 0",
        "INSERT INTO wr_claims (registry, repo, number, delivery, holder, claimed_at_ms)
         SELECT $1, 'scale/live', i, 'live-' || i, i, wr_now($1)
           FROM generate_series(1, $2::bigint) i WHERE $3::bigint >= 0",
    ];
    for sql in statements {
        client.execute(sql, &[&reg, &live, &dead]).await.unwrap();
    }
    client
        .execute(
            "INSERT INTO wr_claims (registry, repo, number, delivery, holder, claimed_at_ms,
                                    completed_at_ms)
             SELECT $1, 'scale/done', i % 1000, 'done-' || i, NULL, wr_now($1), wr_now($1)
               FROM generate_series(1, $2::bigint) i",
            &[&reg, &retained],
        )
        .await
        .unwrap();
    client
        .execute(
            "UPDATE wr_capacity SET live = (live + $2::bigint)::integer,
                                    next_worker_id = next_worker_id + $2::bigint + $3::bigint
              WHERE registry = $1",
            &[&reg, &live, &dead],
        )
        .await
        .unwrap();
    client
        .execute(
            "UPDATE wr_retained SET n = n + $2 WHERE registry = $1 AND stripe = -1",
            &[&reg, &retained],
        )
        .await
        .unwrap();
    client
        .batch_execute("ANALYZE wr_workers; ANALYZE wr_claims; ANALYZE wr_targets")
        .await
        .unwrap();
}

/// Moves the last heartbeat of every filled live worker `ago` into the past.
async fn silence(url: &str, name: &str, ago: Duration) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect for the death");
    tokio::spawn(conn);
    let ago = i64::try_from(ago.as_millis()).unwrap();
    client
        .execute(
            "UPDATE wr_workers w SET last_beat_ms = wr_now(r.id) - $2
               FROM wr_registries r
              WHERE r.name = $1 AND w.registry = r.id AND w.repo = 'scale/live'",
            &[&name, &ago],
        )
        .await
        .unwrap();
}

/// What the sweeps of one replica did.
#[derive(Default)]
struct Sweeps {
    count: usize,
    errors: usize,
    swept: usize,
    longest: Duration,
    total: Duration,
}

/// Deaths and released deliveries reported by every replica's sweeps so far.
#[derive(Default)]
struct Tally {
    died: AtomicUsize,
    handed: AtomicUsize,
}

/// Sweeps `r` until `done` is set, acknowledging what it is handed.
async fn sweeper(r: PostgresRegistry, done: Arc<AtomicBool>, tally: Arc<Tally>) -> Sweeps {
    let mut s = Sweeps::default();
    while !done.load(Ordering::Relaxed) {
        let report = match r.sweep().await {
            Ok(report) => report,
            Err(e) => {
                eprintln!("sweep failed: {e}");
                s.errors += 1;
                continue;
            }
        };
        r.acknowledge(&report.released).await.expect("acknowledge");
        s.count += 1;
        s.swept += usize::from(report.swept);
        tally.died.fetch_add(report.died.len(), Ordering::Relaxed);
        tally
            .handed
            .fetch_add(report.released.len(), Ordering::Relaxed);
        s.longest = s.longest.max(report.took);
        s.total += report.took;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s
}

fn row(what: &str, quiet: &Histogram<u64>, during: &Histogram<u64>) {
    let ratio = |a: u64, b: u64| b as f64 / a.max(1) as f64;
    println!(
        "| {what} | {} | {} / {} / {} | {} / {} / {} | {:.1}x / {:.1}x |",
        during.len(),
        ms(quiet.value_at_quantile(0.5)),
        ms(quiet.value_at_quantile(0.99)),
        ms(quiet.max()),
        ms(during.value_at_quantile(0.5)),
        ms(during.value_at_quantile(0.99)),
        ms(during.max()),
        ratio(
            quiet.value_at_quantile(0.99),
            during.value_at_quantile(0.99)
        ),
        ratio(quiet.max(), during.max()),
    );
}

async fn run(url: String, size: Size) {
    let config = RegistryConfig::builder()
        .max_workers(1_000_000)
        .claim_retention(Duration::from_secs(24 * 3600))
        .max_retained_claims(1_000_000)
        .dead_retention(Duration::from_secs(24 * 3600))
        .brake_fraction(1.0) // the mass death kills (with the brake on, it would suspect first)
        .build()
        .unwrap();
    let name = pg_cluster::unique_name("scale");
    let first = PostgresRegistry::builder(&url)
        .name(&name)
        .config(config.clone())
        .call_timeout(CALL_TIMEOUT)
        .connect()
        .await
        .expect("connect");
    let started = Instant::now();
    fill(&url, &name, size).await;
    println!(
        "filled: {} live workers (one delivery in flight each), {} dead, {} retained claims in {:.1?}",
        size.live,
        size.dead,
        size.retained,
        started.elapsed()
    );
    let other = first.connect_replica().await.expect("replica");
    let probe_handle = PostgresRegistry::builder(&url)
        .name(&name)
        .config(config.clone())
        .call_timeout(CALL_TIMEOUT)
        .listen(std::env::var_os("WR_SCALE_PROBE_NO_LISTEN").is_none())
        .connect()
        .await
        .expect("probe replica");
    // Settle: the first sweeps take the lease and publish the filled registry.
    for _ in 0..3 {
        first.sweep().await.unwrap();
        other.sweep().await.unwrap();
    }

    let (stop, loud) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let probe_task = tokio::spawn(probe(probe_handle, stop.clone(), loud.clone()));
    // The quiet stretch: the two replicas sweep (nothing is due), the probe runs.
    let quiet_done = Arc::new(AtomicBool::new(false));
    let quiet_tally = Arc::new(Tally::default());
    let quiet_sweeps = [
        tokio::spawn(sweeper(
            first.clone(),
            quiet_done.clone(),
            quiet_tally.clone(),
        )),
        tokio::spawn(sweeper(
            other.clone(),
            quiet_done.clone(),
            quiet_tally.clone(),
        )),
    ];
    tokio::time::sleep(size.quiet).await;
    quiet_done.store(true, Ordering::Relaxed);
    for t in quiet_sweeps {
        t.await.unwrap();
    }

    // The mass death: every filled live worker's last heartbeat moves back past the timeout, in
    // one statement. (Not a jump of the registry's time: the sweep after a jump measures a
    // stall and, by the stall rule, kills nobody for it.)
    silence(
        &url,
        &name,
        config.heartbeat_timeout() + Duration::from_secs(1),
    )
    .await;
    loud.store(true, Ordering::Relaxed);
    let death = Instant::now();
    let (done, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Tally::default()));
    let sweeps = [
        tokio::spawn(sweeper(first.clone(), done.clone(), tally.clone())),
        tokio::spawn(sweeper(other.clone(), done.clone(), tally.clone())),
    ];
    let target = usize::try_from(size.live).unwrap();
    while (tally.died.load(Ordering::Relaxed) < target
        || tally.handed.load(Ordering::Relaxed) < target)
        && death.elapsed() < GIVE_UP
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let worked_off = death.elapsed();
    done.store(true, Ordering::Relaxed);
    let mut results = Vec::new();
    for t in sweeps {
        results.push(t.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let (quiet, during) = probe_task.await.unwrap();

    let died = tally.died.load(Ordering::Relaxed);
    let handed = tally.handed.load(Ordering::Relaxed);
    println!(
        "mass death of {target}: {died} died, {handed} released deliveries handed out, \
         worked off in {worked_off:.1?}"
    );
    for (i, s) in results.iter().enumerate() {
        println!(
            "replica {i}: {} sweeps ({} holding the maintenance, {} failed), longest {:.1?}, \
             total {:.1?}",
            s.count, s.swept, s.errors, s.longest, s.total
        );
    }
    println!();
    println!("| probe call | calls during the sweeps | quiet p50 / p99 / max ms | during the sweeps p50 / p99 / max ms | during / quiet p99, max |");
    println!("|---|---:|---:|---:|---:|");
    row("admit (new target)", &quiet.admit, &during.admit);
    row("heartbeat", &quiet.heartbeat, &during.heartbeat);
    println!(
        "probe calls failed: {} quiet, {} during the sweeps",
        quiet.errors, during.errors
    );
    assert!(
        died >= target,
        "the mass death was worked off: {died} < {target}"
    );
    assert!(
        handed >= target,
        "its deliveries were handed out: {handed} < {target}"
    );
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    // `cargo bench` passes `--bench`; anything else (a filter) is ignored.
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let size = if smoke { SMOKE } else { FULL };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(url, size));
}
