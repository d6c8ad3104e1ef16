//! The PostgreSQL backend against a real server: what only a networked, transactional backend can
//! get wrong (races between connections and replicas, the outbox hand-off, a database restart, a
//! replica killed in the middle of a transaction). The contract's semantics are checked by the
//! conformance suite; these tests check that they hold across connections.
//!
//! A server comes from `WORKER_REGISTRY_POSTGRES_URL`, or is started for the run (see
//! `support/pg_cluster.rs`). Each test works in a registry of its own name.

#[path = "support/differential.rs"]
mod differential;
#[path = "support/ids.rs"]
mod ids;
#[path = "support/pg_cluster.rs"]
mod pg_cluster;
#[path = "support/pg_history.rs"]
mod pg_history;
#[path = "support/proxy.rs"]
mod proxy;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use differential::{apply, Op, SweepView};
use tokio::task::JoinSet;
use worker_registry::postgres::{PostgresRegistry, SchemaTooOld};
use worker_registry::testkit::payload_checks;
use worker_registry::{
    Admission, ClaimOutcome, ClaimState, ConnectError, DeadReason, DeliveryId, Event, HeartbeatAck,
    Maintenance, RegistryConfig, RegistryError, Rejection, ReleaseReason, Status, Subscribe,
    Target, WorkerRegistry,
};

async fn open(url: &str, test: &str, config: RegistryConfig) -> PostgresRegistry {
    PostgresRegistry::builder(url)
        .name(pg_cluster::unique_name(test))
        .config(config)
        .connect()
        .await
        .expect("connect")
}

fn t(n: u64) -> Target {
    Target::new("octo/repo", n).unwrap()
}

fn d(s: &str) -> DeliveryId {
    DeliveryId::new(s).unwrap()
}

/// Live workers of the registry as the database counts them, on a connection of its own.
async fn live_in_db(url: &str, name: &str) -> (i64, i32) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM wr_workers w WHERE w.registry = r.id AND w.status <> 'dead'),
                    (SELECT c.live FROM wr_capacity c WHERE c.registry = r.id)
               FROM wr_registries r WHERE r.name = $1",
            &[&name],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_admits_of_one_delivery_across_replicas_get_one_assigned() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let first = open(&url, "race-one", RegistryConfig::default()).await;
    let mut replicas = vec![first.clone()];
    for _ in 0..3 {
        replicas.push(first.connect_replica().await.unwrap());
    }
    let mut tasks = JoinSet::new();
    for i in 0..64 {
        let r = replicas[i % replicas.len()].clone();
        tasks.spawn(async move { r.admit(&t(1), &d("same")).await });
    }
    let mut assigned = Vec::new();
    let mut holders = HashSet::new();
    while let Some(r) = tasks.join_next().await {
        match r.unwrap().unwrap() {
            Admission::Assigned(a) => assigned.push(a),
            Admission::Duplicate(dup) => {
                holders.insert(dup.holder);
            }
            other => panic!("neither assigned nor a duplicate: {other:?}"),
        }
    }
    assert_eq!(assigned.len(), 1, "{assigned:?}");
    assert!(assigned[0].new);
    assert_eq!(holders, HashSet::from([Some(assigned[0].worker)]));
    assert_eq!(live_in_db(&url, first.name()).await, (1, 1));
    // The duplicates were counted by the replicas that saw them, the admission by its own.
    let counted: u64 = replicas
        .iter()
        .map(|r| r.stats().duplicates + r.stats().admitted_new)
        .sum();
    assert_eq!(counted, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_is_never_exceeded_while_replicas_race_to_create_and_kill_workers() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    const MAX: usize = 5;
    let config = RegistryConfig::builder().max_workers(MAX).build().unwrap();
    let first = open(&url, "race-capacity", config).await;
    let name = first.name().to_owned();
    let mut replicas = vec![first.clone()];
    for _ in 0..3 {
        replicas.push(first.connect_replica().await.unwrap());
    }

    // A sampler reads the live count on its own connection throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, url, name) = (stop.clone(), url.clone(), name.clone());
        tokio::spawn(async move {
            let mut worst = 0;
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let (rows, counter) = live_in_db(&url, &name).await;
                assert!(
                    rows <= MAX as i64 && counter <= MAX as i32,
                    "{rows} {counter}"
                );
                worst = worst.max(rows);
                samples += 1;
            }
            (worst, samples)
        })
    };

    let assigned = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for i in 0..32u64 {
        let (r, assigned) = (replicas[i as usize % 4].clone(), assigned.clone());
        tasks.spawn(async move {
            for round in 0..6u64 {
                let target = t(1 + i * 100 + round);
                match r.admit(&target, &d("x")).await.unwrap() {
                    Admission::Assigned(a) => {
                        assigned.fetch_add(1, Ordering::Relaxed);
                        // Half the workers exit at once (their slot is reused), half stay.
                        if round % 2 == 0 {
                            r.drain(a.worker).await.unwrap();
                            r.loop_finished(a.worker).await.unwrap();
                        }
                    }
                    Admission::Rejected(Rejection::CapacityFull { limit }) => {
                        assert_eq!(limit, MAX)
                    }
                    other => panic!("{other:?}"),
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (worst, samples) = sampler.await.unwrap();
    assert!(samples > 0);
    assert!(worst <= MAX as i64);
    let (rows, counter) = live_in_db(&url, &name).await;
    assert_eq!(
        rows,
        i64::from(counter),
        "the counter row agrees with the rows"
    );
    assert!(rows <= MAX as i64);
    assert!(assigned.load(Ordering::Relaxed) >= MAX);
    // The slots left are exactly MAX - rows: that many registrations succeed, the next is refused.
    for _ in rows..MAX as i64 {
        replicas[0].register().await.unwrap();
    }
    assert_eq!(
        replicas[1].register().await,
        Err(RegistryError::Rejected(Rejection::CapacityFull {
            limit: MAX
        }))
    );
    assert_eq!(live_in_db(&url, &name).await, (MAX as i64, MAX as i32));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_events_go_to_one_replica_and_come_back_after_one_dies_without_acking() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = RegistryConfig::builder()
        .startup_grace(Duration::ZERO)
        .release_ack_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let a = open(&url, "outbox", config.clone()).await;
    let b = a.connect_replica().await.unwrap();
    for i in 0..3 {
        let Admission::Assigned(_) = a.admit(&t(1), &d(&format!("d{i}"))).await.unwrap() else {
            panic!()
        };
    }
    a.advance_time_for_tests(config.heartbeat_timeout() + Duration::from_secs(1))
        .await
        .unwrap();

    // A sweeps first: it holds the lock, kills the worker, and is handed the three events.
    let ra = a.sweep().await.unwrap();
    assert!(ra.swept);
    assert_eq!(ra.died.len(), 1);
    let mut got: Vec<_> = ra.released.iter().map(|e| e.delivery.to_string()).collect();
    got.sort();
    assert_eq!(got, ["d0", "d1", "d2"]);
    assert!(ra.released.iter().all(|e| e.receipt().is_some()));
    // B sees none of them while A's claim on them is fresh.
    assert!(b.sweep().await.unwrap().released.is_empty());

    // A dies before acknowledging (its pool and listener go with it).
    drop(a);
    assert!(b.sweep().await.unwrap().released.is_empty());
    b.advance_time_for_tests(Duration::from_secs(61))
        .await
        .unwrap();
    let rb = b.sweep().await.unwrap();
    assert_eq!(
        rb.released.len(),
        3,
        "offered again after release_ack_timeout"
    );
    b.acknowledge(&rb.released).await.unwrap();
    b.acknowledge(&rb.released).await.unwrap(); // twice is not an error
    b.advance_time_for_tests(Duration::from_secs(61))
        .await
        .unwrap();
    assert!(
        b.sweep().await.unwrap().released.is_empty(),
        "acknowledged: gone"
    );
    // Re-dispatching a released delivery admits it again, onto a new worker.
    let Admission::Assigned(again) = b.admit(&t(1), &d("d0")).await.unwrap() else {
        panic!()
    };
    assert!(again.new);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_offset_is_shared_and_a_heartbeat_racing_the_sweep_lands_or_is_refused() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = RegistryConfig::builder()
        .startup_grace(Duration::ZERO)
        .brake_fraction(1.0)
        .build()
        .unwrap();
    let a = open(&url, "beat-race", config.clone()).await;
    let b = a.connect_replica().await.unwrap();
    for round in 0..20u64 {
        let w = a.register().await.unwrap();
        a.heartbeat(w).await.unwrap();
        // Stale by a hair on the shared clock: the sweep (on B) and the heartbeat (on A) race.
        a.advance_time_for_tests(config.heartbeat_timeout() + Duration::from_millis(5))
            .await
            .unwrap();
        let (beat, swept) = tokio::join!(a.heartbeat(w), b.sweep());
        let died = swept
            .unwrap()
            .died
            .contains(&(w, DeadReason::MissedHeartbeats));
        let status = b.worker(w).await.unwrap().unwrap().status;
        match beat {
            Ok(HeartbeatAck::Active) => {
                assert!(!died, "round {round}: beat landed and the worker died");
                assert_eq!(status, Status::Active);
            }
            Err(RegistryError::WorkerDead { .. }) => {
                assert!(died, "round {round}: refused but not killed");
                assert_eq!(status, Status::Dead(DeadReason::MissedHeartbeats));
            }
            other => panic!("round {round}: {other:?}"),
        }
        let _ = a.deregister(w).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_sees_every_lifecycle_event_in_order() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let a = open(&url, "events", RegistryConfig::default()).await;
    let b = a.connect_replica().await.unwrap();
    let mut on_b = b.subscribe();
    let mut on_a = a.subscribe();
    let Admission::Assigned(x) = a.admit(&t(7), &d("e")).await.unwrap() else {
        panic!()
    };
    assert_eq!(b.drain(x.worker).await.unwrap(), Status::Draining);
    assert_eq!(
        a.loop_finished(x.worker).await.unwrap(),
        Status::Dead(DeadReason::Exited)
    );
    let expected = vec![
        Event::WorkerCreated {
            worker: x.worker,
            target: Some(t(7)),
        },
        Event::WorkerDraining {
            worker: x.worker,
            target: Some(t(7)),
        },
        Event::WorkerDied {
            worker: x.worker,
            target: Some(t(7)),
            reason: DeadReason::Exited,
        },
    ];
    for sub in [&mut on_a, &mut on_b] {
        let mut seen = Vec::new();
        for _ in 0..expected.len() {
            let e = tokio::time::timeout(Duration::from_secs(10), sub.recv())
                .await
                .expect("event within 10 s")
                .unwrap();
            seen.push(e);
        }
        assert_eq!(seen, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_transaction_leaves_nothing_behind() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let r = open(&url, "killed-tx", RegistryConfig::default()).await;
    let name = r.name().to_owned();

    // A "replica" that got half-way: its admit ran inside a transaction it never committed, and
    // holds the target's lock, when its connection is cut.
    let (victim, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let victim_conn = tokio::spawn(conn);
    let pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    victim.batch_execute("BEGIN").await.unwrap();
    let row = victim
        .query_one(
            "SELECT o_outcome, o_new, o_worker FROM wr_admit(
                    (SELECT id FROM wr_registries WHERE name = $1),
                    'octo/repo', 1, 'half', 64, 1000000, 1000000, 0, 0, 0,
                    NULL, NULL, NULL, NULL, NULL, NULL, 0)",
            &[&name],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "assigned");
    assert!(row.get::<_, bool>(1));
    let victims_id = worker_registry::WorkerId::new(row.get::<_, i64>(2) as u64);

    // Another replica's admit of the same target waits for that lock...
    let waiting = {
        let r = r.clone();
        tokio::spawn(async move { r.admit(&t(1), &d("other")).await })
    };
    // ...until the victim's backend is terminated (as if its process had been SIGKILLed).
    let (killer, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let killed: bool = killer
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(killed);
    let _ = victim_conn.await;

    let Admission::Assigned(other) = waiting.await.unwrap().unwrap() else {
        panic!()
    };
    assert!(other.new, "the victim's worker never existed");
    // Ids follow the server's clock, so the other one may take the same id or a later one; the
    // victim's, if different, names no worker.
    if victims_id != other.worker {
        assert_eq!(r.worker(victims_id).await.unwrap(), None);
    }
    // Its claim never existed either: the same delivery is admitted as new.
    assert!(matches!(
        r.admit(&t(1), &d("half")).await.unwrap(),
        Admission::Assigned(a) if a.worker == other.worker && !a.new
    ));
    assert_eq!(live_in_db(&url, &name).await, (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_is_a_retryable_error_and_the_same_handle_recovers() {
    let Some(mut cluster) = pg_cluster::own_cluster() else {
        return;
    };
    let url = cluster.url();
    let r = PostgresRegistry::builder(&url)
        .name("restart")
        .call_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let mut events = r.subscribe();
    let Admission::Assigned(a) = r.admit(&t(1), &d("before")).await.unwrap() else {
        panic!()
    };
    assert!(matches!(
        events.recv().await,
        Ok(Event::WorkerCreated { .. })
    ));

    let (snapshot, stats) = (r.status(), r.stats());
    cluster.kill().unwrap();
    for _ in 0..3 {
        match r.admit(&t(1), &d("during")).await {
            Err(e @ RegistryError::Backend { .. }) => assert!(e.is_retryable(), "{e}"),
            other => panic!("while the database is down: {other:?}"),
        }
        assert!(r.heartbeat(a.worker).await.unwrap_err().is_retryable());
    }
    // status() and stats() never touch the database: with it down they still answer, from what
    // this handle holds (the snapshot it had, its own counters; the refused calls counted none).
    assert_eq!(r.status().version, snapshot.version);
    assert_eq!(r.status().workers, snapshot.workers);
    let now = r.stats();
    assert_eq!(
        (now.admitted_new, now.live_workers, now.heartbeats),
        (stats.admitted_new, stats.live_workers, stats.heartbeats)
    );

    cluster.restart().unwrap();
    // Pooled connections that died with the server fail once at most; then the pool has
    // replaced them. Bounded: a handful of calls.
    let mut recovered = None;
    for _ in 0..20 {
        match r.heartbeat(a.worker).await {
            Ok(ack) => {
                recovered = Some(ack);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e:?}"),
        }
    }
    assert_eq!(recovered, Some(HeartbeatAck::Active));
    // What was committed before the crash is still there.
    assert!(matches!(
        r.admit(&t(1), &d("before")).await.unwrap(),
        Admission::Duplicate(dup) if dup.holder == Some(a.worker)
    ));
    // The listener reconnected: events flow again (it retries with a pause of at most 5 s).
    let mut got = None;
    for i in 0..60 {
        let w = r.register().await.unwrap();
        if let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(500), events.recv()).await {
            got = Some((i, e));
            break;
        }
        r.deregister(w).await.unwrap();
    }
    assert!(got.is_some(), "no event after the restart");
}

/// Payloads are rows like the claims: a restart of the server (fsync on) keeps the one in flight
/// and the parked one, byte for byte, and the handle hands them on after it
/// (`testkit::payload_checks::payloads_survive_a_restart`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_survive_a_database_restart() {
    let Some(mut cluster) = pg_cluster::own_cluster() else {
        return;
    };
    let url = cluster.url();
    let r = PostgresRegistry::builder(&url)
        .name("payload-restart")
        .config(payload_checks::restart_config().build().unwrap())
        .call_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    payload_checks::payloads_survive_a_restart(&r, || async {
        cluster.kill().unwrap();
        cluster.restart().unwrap();
    })
    .await;
}

/// Creates an empty database of its own on the cluster at `url` and returns its URL.
async fn fresh_database(url: &str, prefix: &str) -> String {
    let db = pg_cluster::unique_name(prefix).replace('-', "_");
    let (admin, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    let parsed: tokio_postgres::Config = url.parse().unwrap();
    format!(
        "postgres://postgres@127.0.0.1:{}/{db}",
        parsed.get_ports().first().copied().unwrap_or(5432)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_connects_apply_the_migrations_once() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    // A database of its own, so that the migrations really run here.
    let db_url = fresh_database(&url, "migrate").await;
    let mut tasks = JoinSet::new();
    for i in 0..4 {
        let u = db_url.clone();
        tasks.spawn(async move {
            PostgresRegistry::builder(u)
                .name(format!("m{}", i % 2))
                .listen(false)
                .connect()
                .await
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    assert!(PostgresRegistry::migrate(&db_url).await.unwrap().is_empty());
    let (client, conn) = tokio_postgres::connect(&db_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let n: i64 = client
        .query_one("SELECT count(*) FROM wr_schema_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "the baseline");
    let regs: i64 = client
        .query_one("SELECT count(*) FROM wr_registries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(regs, 2, "two names, two registries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unreachable_servers_are_typed_errors() {
    let err = PostgresRegistry::builder("postgres://[not a url")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ConnectError::InvalidUrl {
                backend: "postgres",
                ..
            }
        ),
        "{err:?}"
    );
    // A port nothing listens on (bound and released just now).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = PostgresRegistry::builder(format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .call_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(matches!(err, ConnectError::Backend(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_and_purge_work_through_a_backlog_in_bounded_batches() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = RegistryConfig::builder()
        .claim_retention(Duration::from_secs(60))
        .dead_retention(Duration::from_secs(60))
        .build()
        .unwrap();
    let r = PostgresRegistry::builder(&url)
        .name(pg_cluster::unique_name("batches"))
        .config(config)
        .batch(4)
        .connect()
        .await
        .unwrap();
    for i in 0..10 {
        let target = t(100 + i);
        let Admission::Assigned(a) = r.admit(&target, &d("x")).await.unwrap() else {
            panic!()
        };
        r.complete(&target, &d("x")).await.unwrap();
        r.deregister(a.worker).await.unwrap();
    }
    r.advance_time_for_tests(Duration::from_secs(61))
        .await
        .unwrap();
    let mut expired = Vec::new();
    let mut purged = Vec::new();
    for _ in 0..4 {
        let s = r.sweep().await.unwrap();
        expired.push(s.expired_claims);
        purged.push(s.purged_workers);
    }
    assert_eq!(expired, [4, 4, 2, 0]);
    assert_eq!(purged, [4, 4, 2, 0]);
    assert!(r.status().workers.is_empty());
    assert_eq!(r.stats().claims_expired, 10);
    assert_eq!(r.stats().workers_purged, 10);
}

/// One step of a random history (the harness's calls: `support/differential.rs`). Drains use
/// the configured deadline, drain-all 32 s, and an advance is one time step of the test's.
fn random_op(rng: &mut impl rand::Rng) -> Op {
    // Drawn as the histories always were (the target as a u64), so that each seed's history
    // stays the one the tests' expectations were checked against.
    let (t, e, w) = (
        rng.gen_range(1..=5u64) as u8,
        rng.gen_range(1..=4u8),
        rng.gen_range(1..=12u64),
    );
    match rng.gen_range(0..100) {
        0..=19 => Op::Admit(t, e),
        20..=24 => Op::Claim(t, e),
        25..=27 => Op::Release(t, e),
        28..=35 => Op::Complete(t, e),
        36..=40 => Op::CompleteBy(w, t, e),
        41..=44 => Op::Assign(t),
        45..=56 => Op::Heartbeat(w),
        57..=59 => Op::LoopStarted(w),
        60..=65 => Op::LoopFinished(w),
        66..=68 => Op::Register,
        69..=71 => Op::Deregister(w),
        72..=75 => Op::Drain(w, 0),
        76 => Op::DrainAll(32),
        77..=81 => Op::Worker(w),
        82..=90 => Op::Sweep,
        _ => Op::Advance(1),
    }
}

/// PostgreSQL's version moves only when something changed (memory's every sweep): versions are
/// not compared; the stall in whole seconds and the stuck count are.
const VIEW: SweepView = SweepView {
    version: false,
    stall_seconds: true,
    stuck_count: true,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_as_the_in_memory_registry_does_on_random_histories() {
    use rand::SeedableRng;
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    // Decisions are at least seconds from any boundary, so the few milliseconds of real time
    // that pass on the server during a history cannot change one. Time moves in steps of 25 s,
    // and every step between two sweeps is a stall that leaves 5 s (one sweep interval) of
    // running time, so running time moves in multiples of 5 s: every duration judged on it (the
    // timeout, with the grace, the suspect grace, drain deadlines, max_in_flight) is 2 s off a
    // multiple of 5 s, and those judged on the clock (retention, bare claims) are off multiples
    // of 25 s.
    let base = RegistryConfig::builder()
        .heartbeat_interval(Duration::from_secs(14))
        .missed_heartbeats(3)
        .startup_grace(Duration::from_secs(20))
        .sweep_interval(Duration::from_secs(5))
        .max_workers(5)
        .claim_retention(Duration::from_secs(110))
        .max_retained_claims(1_000)
        .dead_retention(Duration::from_secs(90))
        .suspect_grace(Duration::from_secs(67))
        .brake_min_workers(3)
        .brake_fraction(0.5)
        .drain_deadline(Duration::from_secs(37));
    const STEP: Duration = Duration::from_secs(25);
    // Most histories with max_in_flight out of reach of most deliveries; a few with it short,
    // so that deliveries get stuck and their workers drained (and stuck claims meet deaths,
    // drains, redeliveries and late completions).
    for seed in 0..12u64 {
        let max_in_flight = if seed < 8 { 97 } else { 17 };
        let config = base
            .clone()
            .max_in_flight(Duration::from_secs(max_in_flight))
            .build()
            .unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let clock = worker_registry::ManualClock::new();
        let memory = worker_registry::InMemoryRegistry::with_clock(config.clone(), clock.clone());
        let pg = open(&url, "differential", config.clone()).await;
        let (mut memory_ids, mut pg_ids) = (ids::Ids::default(), ids::Ids::default());
        for step in 0..300 {
            let op = random_op(&mut rng);
            if let Op::Advance(_) = op {
                clock.advance(STEP);
                pg.advance_time_for_tests(STEP).await.unwrap();
                if std::env::var_os("WR_SHOW_HISTORY").is_some() {
                    println!("Advance {STEP:?}");
                }
                continue;
            }
            let want = apply(&memory, &op, &mut memory_ids, VIEW).await;
            let got = apply(&pg, &op, &mut pg_ids, VIEW).await;
            assert_eq!(got, want, "seed {seed}, step {step}: {op:?}");
            if std::env::var_os("WR_SHOW_HISTORY").is_some() {
                println!("{op:?} => {want}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_calls_that_returned_before_subscribe_never_reach_the_subscription() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let r = open(&url, "settle", RegistryConfig::default()).await;
    for _ in 0..30 {
        // The creation's NOTIFY is on its way to this handle's listener when `register` returns;
        // the handle waits until it has passed, so the subscription below cannot see it.
        let before = r.register().await.unwrap();
        let mut events = r.subscribe();
        let after = r.register().await.unwrap();
        // ...and the event of a call that returned after subscribing is already there.
        assert_eq!(
            events.try_recv(),
            Ok(Some(Event::WorkerCreated {
                worker: after,
                target: None
            }))
        );
        assert_eq!(events.try_recv(), Ok(None));
        r.deregister(before).await.unwrap();
        r.deregister(after).await.unwrap();
    }
}

/// The retained-claims counter (`wr_retained`, summed) and a real count of the completed claims,
/// on a connection of its own.
async fn retained_in_db(client: &tokio_postgres::Client, name: &str) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT coalesce(sum(x.n), 0)::bigint FROM wr_retained x
                      WHERE x.registry = r.id),
                    (SELECT count(*) FROM wr_claims k
                      WHERE k.registry = r.id AND k.completed_at_ms IS NOT NULL)
               FROM wr_registries r WHERE r.name = $1",
            &[&name],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retained_counter_agrees_with_a_count_of_completed_claims() {
    use rand::SeedableRng;
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // Retention shorter than two time steps and a small cap, a batch of 2: claims expire, are
    // evicted, and expired ones wait for a later sweep, so redeliveries replace some of them.
    let config = RegistryConfig::builder()
        .heartbeat_interval(Duration::from_secs(14))
        .missed_heartbeats(3)
        .sweep_interval(Duration::from_secs(5))
        .max_workers(5)
        .claim_retention(Duration::from_secs(40))
        .max_retained_claims(3)
        .dead_retention(Duration::from_secs(90))
        .build()
        .unwrap();
    let (mut expired, mut evicted, mut replaced) = (0, 0, 0);
    for seed in 0..6u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let pg = PostgresRegistry::builder(&url)
            .name(pg_cluster::unique_name("retained-counter"))
            .config(config.clone())
            .batch(2)
            .connect()
            .await
            .unwrap();
        let mut before = retained_in_db(&client, pg.name()).await.1;
        let mut ids = ids::Ids::default();
        for step in 0..300 {
            let op = random_op(&mut rng);
            if let Op::Advance(_) = op {
                pg.advance_time_for_tests(Duration::from_secs(25))
                    .await
                    .unwrap();
                continue;
            }
            if let Op::Sweep = op {
                let s = pg.sweep().await.unwrap();
                pg.acknowledge(&s.released).await.unwrap();
                expired += s.expired_claims;
                evicted += s.evicted_claims;
                // The gauge the sweep published is the count as it left it.
                assert_eq!(
                    pg.status().claims.retained as i64,
                    retained_in_db(&client, pg.name()).await.1,
                    "seed {seed}, step {step}: the published gauge"
                );
            } else {
                apply(&pg, &op, &mut ids, VIEW).await;
            }
            let (counter, count) = retained_in_db(&client, pg.name()).await;
            assert_eq!(counter, count, "seed {seed}, step {step}: {op:?}");
            // Outside the sweep, only a redelivery replacing an expired claim lowers the count.
            if !matches!(op, Op::Sweep) && count < before {
                replaced += 1;
            }
            before = count;
        }
    }
    assert!(expired > 0, "no claim expired");
    assert!(evicted > 0, "no claim evicted");
    assert!(
        replaced > 0,
        "no expired claim was replaced by a redelivery"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retained_counter_stays_exact_while_replicas_complete_and_sweep_at_once() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let config = RegistryConfig::builder()
        .max_workers(64)
        .claim_retention(Duration::from_secs(3600))
        .max_retained_claims(20)
        .build()
        .unwrap();
    let first = open(&url, "retained-race", config).await;
    let mut tasks = JoinSet::new();
    for i in 0..4u64 {
        let r = first.connect_replica().await.unwrap();
        tasks.spawn(async move {
            for j in 0..40u64 {
                let target = t(1 + (i * 40 + j) % 8);
                let delivery = d(&format!("r{i}-{j}"));
                if let Admission::Assigned(_) = r.admit(&target, &delivery).await.unwrap() {
                    r.complete(&target, &delivery).await.unwrap();
                }
                if j % 8 == 0 {
                    let s = r.sweep().await.unwrap();
                    r.acknowledge(&s.released).await.unwrap();
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let (counter, count) = retained_in_db(&client, first.name()).await;
    assert_eq!(counter, count);
    assert!(count > 0, "nothing was completed");
    // Eviction works the backlog down to the cap, one batch per sweep, once the maintenance
    // lease of the replicas that swept has lapsed (only its holder maintains).
    first
        .advance_time_for_tests(Duration::from_secs(60))
        .await
        .unwrap();
    for _ in 0..200 {
        if retained_in_db(&client, first.name()).await.1 <= 20 {
            break;
        }
        first.sweep().await.unwrap();
    }
    let (counter, count) = retained_in_db(&client, first.name()).await;
    assert_eq!((counter, count), (20, 20));
}

/// A connection of its own to the database at `url`.
async fn client_of(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// The rows of `wr_schema_migrations`, by version.
async fn recorded_migrations(client: &tokio_postgres::Client) -> Vec<(i32, String)> {
    client
        .query(
            "SELECT version, name FROM wr_schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_baseline_is_the_old_history_without_its_functions() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let old = fresh_database(&url, "old_history").await;
    if !pg_history::migrate_old(&client_of(&old).await, 9).await {
        return;
    }
    let new = fresh_database(&url, "baseline").await;
    assert_eq!(PostgresRegistry::migrate(&new).await.unwrap(), [1]);
    let (Some(old_schema), Some(new_schema)) = (
        pg_history::schema_without_functions(&old),
        pg_history::schema_without_functions(&new),
    ) else {
        return;
    };
    assert!(old_schema.len() > 60, "{old_schema:#?}");
    let only_old: Vec<_> = old_schema
        .iter()
        .filter(|e| !new_schema.contains(e))
        .collect();
    let only_new: Vec<_> = new_schema
        .iter()
        .filter(|e| !old_schema.contains(e))
        .collect();
    assert!(
        only_old.is_empty() && only_new.is_empty(),
        "only in the old history: {only_old:#?}\nonly in the baseline: {only_new:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_the_old_history_brought_to_0009_opens_at_the_baseline() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    // As the last build with the old history left it: migrated to 0009, functions applied, and
    // a registry with a claim in flight.
    let db_url = fresh_database(&url, "old_at_9").await;
    let client = client_of(&db_url).await;
    if !pg_history::migrate_old(&client, 9).await {
        return;
    }
    let old = PostgresRegistry::builder(&db_url)
        .name("kept")
        .listen(false)
        .migrate(false)
        .connect()
        .await
        .unwrap();
    let Admission::Assigned(a) = old.admit(&t(1), &d("before")).await.unwrap() else {
        panic!("the first admission is assigned");
    };
    drop(old);
    assert!(PostgresRegistry::migrate(&db_url).await.unwrap().is_empty());
    assert_eq!(
        recorded_migrations(&client).await,
        [(1, "baseline".to_owned())]
    );
    let r = PostgresRegistry::builder(&db_url)
        .name("kept")
        .listen(false)
        .connect()
        .await
        .unwrap();
    match r.admit(&t(1), &d("before")).await.unwrap() {
        Admission::Duplicate(dup) => assert_eq!(dup.holder, Some(a.worker)),
        other => panic!("the claim made before the upgrade is kept: {other:?}"),
    }
    let Admission::Assigned(b) = r.admit(&t(1), &d("after")).await.unwrap() else {
        panic!("a new delivery of the target is assigned");
    };
    assert_eq!(b.worker, a.worker, "sticky across the upgrade");
    assert!(PostgresRegistry::migrate(&db_url).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_the_old_history_before_0009_is_refused_naming_its_version() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let db_url = fresh_database(&url, "old_at_5").await;
    let client = client_of(&db_url).await;
    if !pg_history::migrate_old(&client, 5).await {
        return;
    }
    let e = PostgresRegistry::migrate(&db_url).await.unwrap_err();
    assert!(!e.is_retryable(), "{e}");
    let found = std::iter::successors(std::error::Error::source(&e), |c| c.source())
        .find_map(|c| c.downcast_ref::<SchemaTooOld>())
        .unwrap_or_else(|| panic!("not a SchemaTooOld: {e:?}"));
    assert_eq!(found.found, 5);
    let text = e.to_string();
    assert!(
        text.contains("migration 0005") && text.contains("git"),
        "{text}"
    );
    let refused = PostgresRegistry::builder(&db_url)
        .listen(false)
        .connect()
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("migration 0005"), "{refused}");
    // Nothing was changed: the history is as it was.
    assert_eq!(recorded_migrations(&client).await.len(), 5);
}

/// The registry's id, on a connection of its own.
async fn registry_id(client: &tokio_postgres::Client, name: &str) -> i64 {
    client
        .query_one("SELECT id FROM wr_registries WHERE name = $1", &[&name])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_maintains_and_another_takes_over_once_it_lapses() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = RegistryConfig::builder()
        .sweep_interval(Duration::from_secs(5)) // a lease of 15 s
        .build()
        .unwrap();
    let a = open(&url, "lease", config).await;
    let b = a.connect_replica().await.unwrap();
    assert!(a.sweep().await.unwrap().swept, "the first sweeper takes it");
    assert!(!b.sweep().await.unwrap().swept, "another replica skips");
    a.advance_time_for_tests(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(a.sweep().await.unwrap().swept, "the holder renews it");
    a.advance_time_for_tests(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(!b.sweep().await.unwrap().swept, "renewed 10 s ago: held");
    // The holder stops sweeping (as if it had died): once its lease lapses, b takes over.
    a.advance_time_for_tests(Duration::from_secs(6))
        .await
        .unwrap();
    assert!(b.sweep().await.unwrap().swept, "lapsed: taken over");
    assert!(!a.sweep().await.unwrap().swept, "and held by b now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_death_of_many_steps_is_worked_off_in_one_sweep_each_delivery_released_once() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    // No brake: all of them die at once. 100 workers are several death steps (32 each) and
    // release steps, each its own transaction.
    let config = RegistryConfig::builder()
        .max_workers(200)
        .brake_fraction(1.0)
        .build()
        .unwrap();
    let r = open(&url, "mass-death", config.clone()).await;
    let other = r.connect_replica().await.unwrap();
    let mut want = HashSet::new();
    for i in 0..100 {
        let delivery = format!("d{i}");
        let Admission::Assigned(a) = r.admit(&t(i + 1), &d(&delivery)).await.unwrap() else {
            panic!("admitted")
        };
        assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));
        want.insert(delivery);
    }
    r.advance_time_for_tests(config.heartbeat_timeout() + Duration::from_secs(1))
        .await
        .unwrap();
    let s = r.sweep().await.unwrap();
    assert_eq!(s.died.len(), 100, "every one in this sweep");
    assert!(s
        .died
        .iter()
        .all(|(_, reason)| *reason == DeadReason::MissedHeartbeats));
    let mut ids: Vec<_> = s.died.iter().map(|(w, _)| *w).collect();
    ids.dedup();
    assert_eq!(ids.len(), 100, "each death reported once, in id order");
    assert_eq!(s.released_targets.len(), 100);
    let got: Vec<String> = s
        .released
        .iter()
        .map(|e| e.delivery.as_str().to_owned())
        .collect();
    assert_eq!(got.len(), 100, "each released delivery handed out once");
    assert_eq!(got.into_iter().collect::<HashSet<_>>(), want);
    r.acknowledge(&s.released).await.unwrap();
    assert_eq!(
        live_in_db(&url, r.name()).await,
        (0, 0),
        "every slot given back"
    );
    let again = r.sweep().await.unwrap();
    assert!(
        again.died.is_empty() && again.released.is_empty(),
        "{again:?}"
    );
    let o = other.sweep().await.unwrap();
    assert!(o.released.is_empty(), "nothing left for another replica");
    assert_eq!(other.status().counts.dead, 100);
    assert_eq!(r.status().capacity.used, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_reads_only_the_worker_rows_changed_since_its_snapshot() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let config = RegistryConfig::builder()
        .dead_retention(Duration::from_secs(60))
        .build()
        .unwrap();
    let r = open(&url, "delta", config).await;
    let other = r.connect_replica().await.unwrap();
    let id = registry_id(&client, r.name()).await;
    let mut workers = Vec::new();
    for i in 1..=20 {
        let Admission::Assigned(a) = r.admit(&t(i), &d("x")).await.unwrap() else {
            panic!("admitted")
        };
        workers.push(a.worker);
    }
    r.sweep().await.unwrap();
    other.sweep().await.unwrap();
    assert_eq!(other.status().workers.len(), 20);
    let known = other.status().version as i64;

    r.heartbeat(workers[0]).await.unwrap();
    r.deregister(workers[1]).await.unwrap();
    r.sweep().await.unwrap();
    let delta = |known: i64| {
        let client = &client;
        async move {
            let row = client
                .query_one(
                    "SELECT (SELECT coalesce(jsonb_agg(w->'id' ORDER BY (w->>'id')::bigint), '[]')
                               FROM jsonb_array_elements(s->'workers') w)::text,
                            (s->'purged')::text
                       FROM wr_snapshot_since($1, $2) s",
                    &[&id, &known],
                )
                .await
                .unwrap();
            (row.get::<_, String>(0), row.get::<_, String>(1))
        }
    };
    let changed = format!("[{}, {}]", workers[0].get(), workers[1].get());
    assert_eq!(
        delta(known).await,
        (changed, "[]".to_owned()),
        "two rows, not 20"
    );
    other.sweep().await.unwrap();
    let s = other.status();
    assert_eq!(s.workers.len(), 20);
    assert!(s.worker(workers[0]).unwrap().has_heartbeated);
    assert_eq!(
        s.worker(workers[1]).unwrap().status,
        Status::Dead(DeadReason::Deregistered)
    );

    // The purge reaches the replica as an id to drop.
    let known = s.version as i64;
    r.advance_time_for_tests(Duration::from_secs(61))
        .await
        .unwrap();
    assert_eq!(r.sweep().await.unwrap().purged_workers, 1);
    assert_eq!(
        delta(known).await.1,
        format!("[{}]", workers[1].get()),
        "the purged id"
    );
    other.sweep().await.unwrap();
    let s = other.status();
    assert_eq!(s.workers.len(), 19);
    assert!(s.worker(workers[1]).is_none());
}

/// `postgres://user@host:port/db` with `host:port` replaced by `addr`, and the `host:port` it had.
fn via(url: &str, addr: std::net::SocketAddr) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (user, rest) = rest.rsplit_once('@').map_or(("", rest), |(u, r)| (u, r));
    let (hostport, db) = rest.split_once('/').unwrap_or((rest, ""));
    let at = if user.is_empty() {
        String::new()
    } else {
        format!("{user}@")
    };
    (format!("{scheme}://{at}{addr}/{db}"), hostport.to_owned())
}

/// A reply-dropping proxy in front of the server at `url`, a handle on a new registry through it,
/// and one on the same registry directly.
async fn behind_a_proxy(
    url: &str,
    test: &str,
) -> (proxy::Proxy, PostgresRegistry, PostgresRegistry) {
    // The proxy's address is known once it listens; the upstream is the URL's.
    let (_, upstream) = via(url, "127.0.0.1:1".parse().unwrap());
    let proxy = proxy::Proxy::start(&upstream).await;
    let (proxied, _) = via(url, proxy.addr());
    let name = pg_cluster::unique_name(test);
    let through = PostgresRegistry::builder(&proxied)
        .name(&name)
        .connect()
        .await
        .unwrap();
    let direct = PostgresRegistry::builder(url)
        .name(&name)
        .connect()
        .await
        .unwrap();
    (proxy, through, direct)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_of_an_admission_whose_reply_was_lost_is_an_unstarted_duplicate() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let (proxy, through, direct) = behind_a_proxy(&url, "lost-reply").await;
    // An admission first (the statement is prepared on the connection before the lost one).
    assert!(matches!(
        through.admit(&t(1), &d("lost")).await,
        Ok(Admission::Assigned(_))
    ));

    proxy.drop_next_reply();
    let err = through.admit(&t(7), &d("lost")).await.unwrap_err();
    assert!(err.is_retryable(), "a lost reply is retryable: {err:?}");
    assert_eq!(proxy.dropped(), 1);

    let mut retry = None;
    for _ in 0..50 {
        match through.admit(&t(7), &d("lost")).await {
            Ok(a) => {
                retry = Some(a);
                break;
            }
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{e:?}"),
        }
    }
    let Some(Admission::Duplicate(dup)) = retry else {
        panic!("the admission committed, so its retry is a duplicate: {retry:?}")
    };
    let worker = dup.holder.expect("held by the worker it created");
    assert!(dup.unstarted, "nothing started it: {dup:?}");
    assert_eq!(dup.needs_start(), Some(worker));
    let info = direct
        .worker(worker)
        .await
        .unwrap()
        .expect("the worker exists");
    assert!(info.status.is_alive() && !info.has_heartbeated);

    // Once started, a redelivery is a plain duplicate: no second start.
    direct.heartbeat(worker).await.unwrap();
    let Ok(Admission::Duplicate(after)) = through.admit(&t(7), &d("lost")).await else {
        panic!("still a duplicate")
    };
    assert_eq!(after.needs_start(), None);
}

/// A lost reply to an admission that carried a payload (the reply-dropping proxy): the payload
/// was committed with the claim, so the retry is a duplicate and the payload is there, byte for
/// byte, through the proxy and directly
/// (`testkit::payload_checks::a_lost_reply_leaves_the_payload_retrievable`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_an_admission_with_a_payload_leaves_the_payload_retrievable() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let (proxy, through, direct) = behind_a_proxy(&url, "lost-payload").await;
    payload_checks::a_lost_reply_leaves_the_payload_retrievable(&through, &direct, || {
        proxy.drop_next_reply()
    })
    .await;
    assert_eq!(proxy.dropped(), 1);
}

/// The next `DataLost` event on `events` (bounded wait), skipping others; its workers sorted.
async fn next_loss(events: &mut worker_registry::Subscription) -> Vec<worker_registry::WorkerId> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Ok(Event::DataLost { mut lost })) => {
                lost.sort();
                return lost;
            }
            Ok(Ok(_)) | Ok(Err(worker_registry::RecvError::Lagged { .. })) => {}
            other => panic!("no DataLost event: {other:?}"),
        }
    }
}

/// The registry's rows, as a restore of an older copy (or a failover to a standby that lagged)
/// brings them back: the tables that say which workers and claims exist.
const REGISTRY_TABLES: [&str; 5] = [
    "wr_capacity",
    "wr_workers",
    "wr_targets",
    "wr_claims",
    "wr_snapshots",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewound_registry_repeats_no_id_or_token_and_every_replica_reports_the_lost_workers() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let r = open(&url, "rewound", RegistryConfig::default()).await;
    let other = PostgresRegistry::builder(&url)
        .name(r.name())
        .connect()
        .await
        .unwrap();
    let (mut events, mut other_events) = (r.subscribe(), other.subscribe());
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let reg = registry_id(&client, r.name()).await;
    let admit = |r: &PostgresRegistry, n: u64| {
        let r = r.clone();
        async move {
            let Ok(Admission::Assigned(a)) = r.admit(&t(n), &d("x")).await else {
                panic!("admitted")
            };
            a
        }
    };

    let mut kept = Vec::new();
    for n in 1..=3 {
        kept.push(admit(&r, n).await);
    }
    r.sweep().await.unwrap();
    // The copy that will come back.
    for table in REGISTRY_TABLES {
        client
            .batch_execute(&format!(
                "CREATE TEMP TABLE keep_{table} AS SELECT * FROM {table} WHERE registry = {reg}"
            ))
            .await
            .unwrap();
    }
    let mut lost = Vec::new();
    for n in 4..=6 {
        lost.push(admit(&other, n).await);
    }
    r.sweep().await.unwrap();
    other.sweep().await.unwrap();
    assert_eq!(r.status().capacity.used, 6);
    assert_eq!(other.status().capacity.used, 6);

    // The older copy is restored: workers 4-6 and their claims never happened.
    let mut restore = String::from("BEGIN;");
    for table in REGISTRY_TABLES {
        restore.push_str(&format!(
            "DELETE FROM {table} WHERE registry = {reg}; \
             INSERT INTO {table} SELECT * FROM keep_{table};"
        ));
    }
    restore.push_str("COMMIT;");
    client.batch_execute(&restore).await.unwrap();

    // New workers get ids (and tokens) above every one handed out before, the lost included.
    let newest = lost.iter().map(|a| a.token).max().unwrap();
    for n in 7..=8 {
        let a = admit(&r, n).await;
        assert!(a.new);
        assert!(
            lost.iter().chain(&kept).all(|b| b.worker != a.worker),
            "worker id {} handed out again",
            a.worker
        );
        assert!(a.token > newest, "token {} not above {newest}", a.token);
    }

    // Every replica finds the rewind in its next sweep and reports the workers that are gone.
    let mut gone: Vec<_> = lost.iter().map(|a| a.worker).collect();
    gone.sort();
    r.sweep().await.unwrap();
    assert_eq!(next_loss(&mut events).await, gone);
    assert_eq!(r.stats().data_losses, 1);
    other.sweep().await.unwrap();
    assert_eq!(next_loss(&mut other_events).await, gone);
    assert_eq!(other.stats().data_losses, 1);
    // Once; the snapshot starts over from the rows as they are.
    r.sweep().await.unwrap();
    r.sweep().await.unwrap();
    assert_eq!(r.stats().data_losses, 1);
    assert_eq!(r.status().capacity.used, 5);
    assert!(matches!(
        r.heartbeat(lost[0].worker).await,
        Err(RegistryError::UnknownWorker { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_configured_otherwise_is_refused_naming_the_setting_and_both_values() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = |n| RegistryConfig::builder().max_workers(n).build().unwrap();
    let first = open(&url, "agreement", config(4)).await;
    let err = PostgresRegistry::builder(&url)
        .name(first.name())
        .config(config(5))
        .connect()
        .await
        .unwrap_err();
    let worker_registry::ConnectError::Backend(err) = err else {
        panic!("{err:?}")
    };
    assert_eq!(
        err,
        RegistryError::ConfigDisagrees {
            setting: "max_workers",
            stored: "4".into(),
            configured: "5".into(),
        }
    );
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("max_workers = 4"), "{err}");
    // The same configuration is welcome.
    let again = PostgresRegistry::builder(&url)
        .name(first.name())
        .config(config(4))
        .connect()
        .await
        .unwrap();
    assert_eq!(again.config().max_workers(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_delivery_never_acknowledged_expires_after_claim_retention_counted_once() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = RegistryConfig::builder()
        .startup_grace(Duration::ZERO)
        .release_ack_timeout(Duration::from_secs(60))
        .claim_retention(Duration::from_secs(300))
        .build()
        .unwrap();
    let a = open(&url, "outbox_expiry", config.clone()).await;
    let Admission::Assigned(_) = a.admit(&t(1), &d("never-acked")).await.unwrap() else {
        panic!()
    };
    a.advance_time_for_tests(config.heartbeat_timeout() + Duration::from_secs(1))
        .await
        .unwrap();
    let r = a.sweep().await.unwrap();
    assert_eq!(r.released.len(), 1, "released when its worker died");
    // Not acknowledged: offered again after release_ack_timeout, not yet expired.
    a.advance_time_for_tests(Duration::from_secs(61))
        .await
        .unwrap();
    let r = a.sweep().await.unwrap();
    assert_eq!(
        r.released.len(),
        1,
        "offered again after release_ack_timeout"
    );
    assert_eq!(a.stats().released_expired, 0);
    // claim_retention after its release: deleted, counted once, not offered again.
    a.advance_time_for_tests(Duration::from_secs(240))
        .await
        .unwrap();
    let r = a.sweep().await.unwrap();
    assert!(r.released.is_empty(), "expired, not offered: {r:?}");
    assert_eq!(a.stats().released_expired, 1);
    for _ in 0..2 {
        a.advance_time_for_tests(Duration::from_secs(61))
            .await
            .unwrap();
        assert!(a.sweep().await.unwrap().released.is_empty());
    }
    assert_eq!(a.stats().released_expired, 1, "counted once");
}

// ---------------------------------------------------------------------------------------------
// The waiting room across connections and replicas (the contract's cases run in the
// conformance suite; these check what two handles on one database can get wrong).
// ---------------------------------------------------------------------------------------------

fn of(owner: &str, n: u64) -> Target {
    Target::new(&format!("{owner}/repo"), n).unwrap()
}

/// Live workers of one owner's targets, as the database's rows count them.
async fn owner_live_in_db(url: &str, name: &str, owner: &str) -> i64 {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .query_one(
            "SELECT count(*) FROM wr_workers w JOIN wr_registries r ON w.registry = r.id
              WHERE r.name = $1 AND w.status <> 'dead' AND w.repo LIKE $2 || '/%'",
            &[&name, &owner],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_cap_holds_while_two_handles_race_to_create_and_kill_its_workers() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    const CAP: usize = 3;
    let config = RegistryConfig::builder()
        .max_workers(20)
        .max_workers_per_owner(CAP)
        .max_waiting(512)
        .build()
        .unwrap();
    let first = open(&url, "race-owner-cap", config).await;
    let name = first.name().to_owned();
    let handles = [first.clone(), first.connect_replica().await.unwrap()];

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, url, name) = (stop.clone(), url.clone(), name.clone());
        tokio::spawn(async move {
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let live = owner_live_in_db(&url, &name, "big").await;
                assert!(live <= CAP as i64, "{live} live workers of one owner");
                samples += 1;
            }
            samples
        })
    };
    let (assigned, parked) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = JoinSet::new();
    for i in 0..16u64 {
        let r = handles[i as usize % 2].clone();
        let (assigned, parked) = (assigned.clone(), parked.clone());
        tasks.spawn(async move {
            for round in 0..4u64 {
                let target = of("big", 1 + i * 100 + round);
                match r.admit(&target, &d("x")).await.unwrap() {
                    Admission::Assigned(a) => {
                        assigned.fetch_add(1, Ordering::Relaxed);
                        if round % 2 == 0 {
                            // Its slot is given back at once, racing the other handle's admits.
                            r.deregister(a.worker).await.unwrap();
                        }
                    }
                    Admission::Waiting(w) => {
                        // Its owner at the cap, or (arrivals do not overtake the waiting)
                        // others of it waiting for a slot.
                        assert!(
                            matches!(w.reason, Rejection::CapacityFull { limit } if limit == CAP || limit == 20),
                            "{w:?}"
                        );
                        parked.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("{other:?}"),
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(sampler.await.unwrap() > 0);
    assert!(assigned.load(Ordering::Relaxed) >= CAP);
    assert!(parked.load(Ordering::Relaxed) > 0, "some had to wait");
    // Sweeps promote the rest as slots free; the cap holds there too.
    for _ in 0..4 {
        let s = handles[0].sweep().await.unwrap();
        handles[0].acknowledge(&s.released).await.unwrap();
    }
    assert!(owner_live_in_db(&url, &name, "big").await <= CAP as i64);
    // The counter row agrees with the rows.
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let counted: Option<i32> = client
        .query_opt(
            "SELECT l.live FROM wr_owner_live l JOIN wr_registries r ON l.registry = r.id
              WHERE r.name = $1 AND l.owner = 'big'",
            &[&name],
        )
        .await
        .unwrap()
        .map(|row| row.get(0));
    assert_eq!(
        i64::from(counted.unwrap_or(0)),
        owner_live_in_db(&url, &name, "big").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_delivery_handed_to_a_replica_that_dies_is_offered_to_another() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = RegistryConfig::builder()
        .max_workers(1)
        .max_waiting(8)
        .release_ack_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let a = open(&url, "promoted-crash", config).await;
    let b = a.connect_replica().await.unwrap();
    let Admission::Assigned(first) = a.admit(&t(1), &d("a")).await.unwrap() else {
        panic!()
    };
    let Admission::Waiting(w) = b.admit(&t(2), &d("b")).await.unwrap() else {
        panic!()
    };
    assert_eq!(w.position, 1);
    // The exit promotes in its own transaction; A's sweep is handed the delivery.
    a.deregister(first.worker).await.unwrap();
    let ra = a.sweep().await.unwrap();
    let promoted: Vec<_> = ra
        .released
        .iter()
        .filter(|e| e.reason == ReleaseReason::Promoted)
        .cloned()
        .collect();
    assert_eq!(promoted.len(), 1, "{ra:?}");
    let assignment = promoted[0].assignment.expect("its assignment");
    assert!(assignment.new);
    assert_eq!(promoted[0].target, t(2));
    assert!(
        b.sweep().await.unwrap().released.is_empty(),
        "A's, while fresh"
    );

    // A dies before it acknowledged (or started the worker).
    drop(a);
    b.advance_time_for_tests(Duration::from_secs(61))
        .await
        .unwrap();
    // The promoted worker never heartbeated (A never started it) and lives (its start-up grace
    // runs): the delivery is offered again, with the assignment saying to start it.
    let rb = b.sweep().await.unwrap();
    let again: Vec<_> = rb
        .released
        .iter()
        .filter(|e| e.reason == ReleaseReason::Promoted)
        .collect();
    assert_eq!(
        again.len(),
        1,
        "offered again after release_ack_timeout: {rb:?}"
    );
    assert_eq!(again[0].assignment, Some(assignment));
    assert_eq!(again[0].delivery, d("b"));
    b.acknowledge(&rb.released).await.unwrap();
    assert_eq!(
        b.stats().promoted,
        0,
        "counted once, by the replica that first took it"
    );
    b.advance_time_for_tests(Duration::from_secs(61))
        .await
        .unwrap();
    let rest = b.sweep().await.unwrap();
    assert!(
        rest.released
            .iter()
            .all(|e| e.reason != ReleaseReason::Promoted),
        "acknowledged: gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mass_death_promotes_the_waiting_in_bounded_steps_each_once() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    const N: u64 = 40;
    // No brake; the new (promoted) workers have a long start-up grace, the old ones heartbeat
    // and then go silent.
    let config = RegistryConfig::builder()
        .max_workers(N as usize)
        .max_waiting(64)
        .brake_fraction(1.0)
        .startup_grace(Duration::from_secs(600))
        .build()
        .unwrap();
    let r = PostgresRegistry::builder(&url)
        .name(pg_cluster::unique_name("mass-promote"))
        .config(config.clone())
        .batch(16)
        .connect()
        .await
        .unwrap();
    for i in 0..N {
        let Admission::Assigned(a) = r.admit(&t(i + 1), &d(&format!("old{i}"))).await.unwrap()
        else {
            panic!()
        };
        assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));
    }
    let mut want = HashSet::new();
    for i in 0..N {
        let delivery = format!("new{i}");
        let Admission::Waiting(_) = r.admit(&t(1000 + i), &d(&delivery)).await.unwrap() else {
            panic!()
        };
        want.insert(delivery);
    }
    r.advance_time_for_tests(config.heartbeat_timeout() + Duration::from_secs(1))
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut sweeps = 0;
    while got.len() < N as usize {
        let s = r.sweep().await.unwrap();
        sweeps += 1;
        assert!(sweeps <= 20, "worked off in bounded sweeps");
        let promoted: Vec<String> = s
            .released
            .iter()
            .filter(|e| e.reason == ReleaseReason::Promoted)
            .map(|e| e.delivery.as_str().to_owned())
            .collect();
        assert!(
            promoted.len() <= 16,
            "one sweep's bound: {}",
            promoted.len()
        );
        got.extend(promoted);
        r.acknowledge(&s.released).await.unwrap();
    }
    assert!(sweeps > 1, "more than one sweep's bound");
    assert_eq!(got.len(), N as usize, "each promoted once");
    assert_eq!(got.into_iter().collect::<HashSet<_>>(), want);
    assert_eq!(live_in_db(&url, r.name()).await, (N as i64, N as i32));
    let s = r.sweep().await.unwrap();
    assert_eq!(s.waiting, 0);
    assert_eq!(r.stats().promoted, N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_delivery_offered_again_starts_no_second_worker_and_goes_with_a_dead_one() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = RegistryConfig::builder()
        .max_workers(1)
        .max_waiting(8)
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(2)
        .startup_grace(Duration::ZERO)
        .sweep_interval(Duration::from_secs(1))
        .release_ack_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let a = open(&url, "promoted-again", config).await;
    let b = a.connect_replica().await.unwrap();
    let Admission::Assigned(first) = a.admit(&t(1), &d("a")).await.unwrap() else {
        panic!()
    };
    let Admission::Waiting(_) = a.admit(&t(2), &d("b")).await.unwrap() else {
        panic!()
    };
    a.deregister(first.worker).await.unwrap();
    let ra = a.sweep().await.unwrap();
    let promoted: Vec<_> = ra
        .released
        .iter()
        .filter(|e| e.reason == ReleaseReason::Promoted)
        .collect();
    assert_eq!(promoted.len(), 1, "{ra:?}");
    let assignment = promoted[0].assignment.unwrap();
    assert!(assignment.new);
    // A started the worker (it heartbeats), then died before acknowledging.
    let w = assignment.worker;
    assert_eq!(b.heartbeat(w).await, Ok(HeartbeatAck::Active));
    drop(a);
    let promoted_of = |r: &worker_registry::SweepReport| -> Vec<worker_registry::Assignment> {
        r.released
            .iter()
            .filter(|e| e.reason == ReleaseReason::Promoted)
            .filter_map(|e| e.assignment)
            .collect()
    };
    // Past release_ack_timeout, the worker heartbeating: offered again, not to be started.
    let mut again = Vec::new();
    for _ in 0..11 {
        b.advance_time_for_tests(Duration::from_secs(1))
            .await
            .unwrap();
        b.heartbeat(w).await.unwrap();
        again.extend(promoted_of(&b.sweep().await.unwrap()));
    }
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].worker, w);
    assert!(!again[0].new, "its worker runs: not started a second time");
    // Not acknowledged again; its worker goes silent and dies before the next offer: the row is
    // dropped, and the delivery comes back as its worker's release instead.
    let mut released = Vec::new();
    for _ in 0..12 {
        b.advance_time_for_tests(Duration::from_secs(1))
            .await
            .unwrap();
        let r = b.sweep().await.unwrap();
        assert!(promoted_of(&r).is_empty(), "{r:?}");
        released.extend(r.released);
    }
    assert!(
        released
            .iter()
            .any(|e| e.delivery == d("b") && matches!(e.reason, ReleaseReason::WorkerDied(_))),
        "{released:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_of_a_promoted_pair_before_its_handover_starts_nothing() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = RegistryConfig::builder()
        .max_workers(1)
        .max_waiting(8)
        .build()
        .unwrap();
    let a = open(&url, "promoted-dup", config).await;
    let b = a.connect_replica().await.unwrap();
    let Admission::Assigned(first) = a.admit(&t(1), &d("a")).await.unwrap() else {
        panic!()
    };
    let Admission::Waiting(_) = a.admit(&t(2), &d("b")).await.unwrap() else {
        panic!()
    };
    a.deregister(first.worker).await.unwrap();
    // Promoted onto a worker nobody has started yet; the redelivery reaches another replica
    // before any sweep hands the promotion over: a duplicate, and not one that asks for a start
    // (the promoted event's taker starts it).
    let Admission::Duplicate(dup) = b.admit(&t(2), &d("b")).await.unwrap() else {
        panic!()
    };
    assert!(dup.holder.is_some());
    assert!(!dup.unstarted, "{dup:?}");
    let r = a.sweep().await.unwrap();
    let promoted: Vec<_> = r
        .released
        .iter()
        .filter(|e| e.reason == ReleaseReason::Promoted)
        .collect();
    assert_eq!(promoted.len(), 1);
    assert!(promoted[0].assignment.unwrap().new);
}

/// A bare claim of a parked pair is `admit`'s duplicate check without the assignment: it answers
/// the pair as waiting (no holder, since its parking) and leaves it parked, so the promotion
/// still hands it over (a claim that took the pair would make the promotion drop it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_claim_of_a_parked_pair_answers_waiting_and_leaves_it_parked() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = RegistryConfig::builder()
        .max_workers(1)
        .max_waiting(8)
        .build()
        .unwrap();
    let a = open(&url, "claim-parked", config).await;
    let b = a.connect_replica().await.unwrap();
    let Admission::Assigned(first) = a.admit(&t(1), &d("a")).await.unwrap() else {
        panic!()
    };
    let Admission::Waiting(_) = a.admit(&t(2), &d("b")).await.unwrap() else {
        panic!()
    };
    for handle in [&a, &b] {
        let ClaimOutcome::AlreadyClaimed(dup) = handle.claim(&t(2), &d("b")).await.unwrap() else {
            panic!("a parked pair claimed")
        };
        assert_eq!(dup.state, ClaimState::Waiting, "{dup:?}");
        assert_eq!(dup.holder, None);
        assert!(!dup.unstarted);
    }
    let Admission::Duplicate(dup) = b.admit(&t(2), &d("b")).await.unwrap() else {
        panic!()
    };
    assert_eq!(dup.state, ClaimState::Waiting);
    // A pair that is neither claimed nor parked is still claimed.
    assert_eq!(
        b.claim(&t(2), &d("c")).await.unwrap(),
        ClaimOutcome::Claimed
    );
    a.deregister(first.worker).await.unwrap();
    let r = a.sweep().await.unwrap();
    let promoted: Vec<_> = r
        .released
        .iter()
        .filter(|e| e.reason == ReleaseReason::Promoted)
        .map(|e| (e.target.clone(), e.delivery.clone()))
        .collect();
    assert_eq!(promoted, vec![(t(2), d("b"))], "{r:?}");
    assert_eq!(r.waiting, 0);
}

/// A handle on the application's deadpool `Pool` (`builder_with_pool`): its calls take that
/// pool's connections (it opens no pool of its own), other handles' events reach it by polling
/// the event log through the pool (it has no URL to LISTEN on), a replica shares the pool, and
/// dropping every handle leaves the pool open for the application.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_on_the_applications_pool_uses_it_and_leaves_it_open() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let manager = deadpool_postgres::Manager::new(url.parse().unwrap(), tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(3)
        .build()
        .unwrap();
    let name = pg_cluster::unique_name("given-pool");
    let a = PostgresRegistry::builder_with_pool(pool.clone())
        .name(&name)
        .poll_interval(Duration::from_millis(20))
        .connect()
        .await
        .expect("connect on the pool");
    let b = a
        .connect_replica()
        .await
        .expect("a replica on the same pool");
    let mut on_a = a.subscribe();
    // The replica's call: its event reaches `a` only through `a`'s poller.
    let Admission::Assigned(x) = b.admit(&t(1), &d("given")).await.unwrap() else {
        panic!()
    };
    assert!(x.new);
    let seen = tokio::time::timeout(Duration::from_secs(10), on_a.recv())
        .await
        .expect("the event within 10 s")
        .unwrap();
    assert_eq!(
        seen,
        Event::WorkerCreated {
            worker: x.worker,
            target: Some(t(1)),
        }
    );
    assert_eq!(live_in_db(&url, &name).await, (1, 1));
    // Every connection the handles used is the pool's (no more than its three).
    let status = pool.status();
    assert!(
        (1..=3).contains(&status.size),
        "the registry's calls went through the given pool: {status:?}"
    );
    drop((a, b, on_a));
    assert!(
        !pool.is_closed(),
        "the application's pool outlives the registry"
    );
    let client = pool.get().await.expect("the pool still lends connections");
    let row = client.query_one("SELECT 1::int4", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
}
