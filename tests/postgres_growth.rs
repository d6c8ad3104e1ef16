//! Nothing grows without bound on PostgreSQL: rounds of the same traffic (workers created, some
//! deliveries completed and some left in flight, the workers dying unheard, their deliveries
//! released to the outbox and acknowledged, a replica that comes, sweeps and goes) leave the
//! registry's rows in every table where the first round left them, once the retentions have
//! passed (the dead purged, the retained claims expired, the outbox empty, the waiting room
//! empty: each parked delivery promoted or dropped past `max_wait`, no payload left of any
//! delivery, in flight, parked or released, and the byte count back to zero); only the purge log,
//! kept for its last 1 000 versions, grows within that window.

#[path = "support/pg_cluster.rs"]
mod pg_cluster;

use std::collections::BTreeMap;
use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use tokio_postgres::NoTls;
use worker_registry::postgres::PostgresRegistry;
use worker_registry::testkit::payload_checks::sample;
use worker_registry::{
    Admission, DeliveryId, Maintenance, RegistryConfig, SweepReport, Target, WorkerRegistry,
};

/// The tables that hold a registry's rows.
const TABLES: [&str; 16] = [
    "wr_capacity",
    "wr_workers",
    "wr_targets",
    "wr_claims",
    "wr_released",
    "wr_snapshots",
    "wr_stalls",
    "wr_retained",
    "wr_leases",
    "wr_purged",
    "wr_waiting",
    "wr_room",
    "wr_owner_waiting",
    "wr_owner_live",
    "wr_payloads",
    "wr_payload_budget",
];

/// The registry's rows per table.
async fn footprint(url: &str, name: &str) -> BTreeMap<&'static str, i64> {
    let (c, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let mut out = BTreeMap::new();
    for table in TABLES {
        let n: i64 = c
            .query_one(
                &format!(
                    "SELECT count(*) FROM {table} \
                      WHERE registry = (SELECT id FROM wr_registries WHERE name = $1)"
                ),
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        out.insert(table, n);
    }
    out
}

/// Lets `total` of registry time pass in sweep intervals (so that no stall is measured), each
/// followed by a sweep whose released deliveries are acknowledged; then sweeps until one finds
/// nothing left to do (bounded).
async fn pass(r: &PostgresRegistry, total: Duration) {
    let step = Duration::from_millis(200);
    let sweep = async || {
        let report: SweepReport = r.sweep().await.unwrap();
        r.acknowledge(&report.released).await.unwrap();
        report
    };
    for _ in 0..total.as_millis() / step.as_millis() {
        r.advance_time_for_tests(step).await.unwrap();
        sweep().await;
    }
    for _ in 0..100 {
        let report = sweep().await;
        if report.died.is_empty()
            && report.released.is_empty()
            && report.expired_claims == 0
            && report.evicted_claims == 0
            && report.purged_workers == 0
            && report.expired_waiting.is_empty()
        {
            return;
        }
    }
    panic!("the sweeps never ran out of work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_of_the_same_traffic_leave_the_same_rows_behind() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let config = RegistryConfig::builder()
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(2)
        .startup_grace(Duration::ZERO)
        .sweep_interval(Duration::from_millis(200))
        .dead_retention(Duration::from_secs(2))
        .claim_retention(Duration::from_secs(3))
        .release_ack_timeout(Duration::from_secs(2))
        // The workers all go silent at once: no mass-death brake holding them.
        .brake_min_workers(1_000)
        // Half of each round's targets wait (4 slots, at most 3 per owner); each is promoted
        // as a slot frees, or dropped past max_wait.
        .max_workers(4)
        .max_workers_per_owner(3)
        .max_waiting(16)
        .max_wait(Duration::from_secs(2))
        .build()
        .unwrap();
    let name = pg_cluster::unique_name("growth");
    let r = PostgresRegistry::builder(&url)
        .name(&name)
        .config(config)
        .listen(false)
        .connect()
        .await
        .unwrap();
    let mut first = None;
    for round in 0..3u64 {
        for i in 0..8 {
            let owner = if i % 3 == 0 { "other" } else { "octo" };
            let t = Target::new(&format!("{owner}/repo"), round * 100 + i + 1).unwrap();
            let d = DeliveryId::new(&format!("d{round}-{i}")).unwrap();
            // Every delivery carries a payload: what is held of them must go with the work.
            let p = sample(&format!("{round}-{i}"), 2_000);
            let placed = matches!(
                r.admit_with(&t, &d, Some(&p)).await.unwrap(),
                Admission::Assigned(_)
            );
            if placed && i % 2 == 0 {
                r.complete(&t, &d).await.unwrap();
            }
        }
        let passing = r.connect_replica().await.unwrap();
        let report = passing.sweep().await.unwrap();
        passing.acknowledge(&report.released).await.unwrap();
        drop(passing);
        // The workers die unheard; their deliveries go to the outbox and are acknowledged.
        pass(&r, Duration::from_secs(3)).await;
        // Past every retention.
        pass(&r, Duration::from_secs(5)).await;
        let mut now = footprint(&url, &name).await;
        // The purge log keeps the purges of the last PURGE_LOG_VERSIONS (1 000) versions: it
        // grows until then (these rounds publish fewer), by the workers purged.
        assert!(now.remove("wr_purged").unwrap() <= 8 * (round as i64 + 1));
        match &first {
            None => first = Some(now),
            Some(first) => assert_eq!(&now, first, "round {round} left more behind"),
        }
    }
    // The waiting room was used, and each parked delivery was promoted or dropped once.
    let s = r.stats();
    assert!(s.parked > 0, "{s:?}");
    assert_eq!(s.promoted + s.waiting_expired, s.parked, "{s:?}");
    let first = first.unwrap();
    for table in [
        "wr_workers",
        "wr_targets",
        "wr_claims",
        "wr_released",
        "wr_waiting",
        "wr_owner_waiting",
        "wr_owner_live",
        "wr_payloads",
    ] {
        assert_eq!(first[table], 0, "{table}: {first:?}");
    }
    // The byte count agrees: nothing held.
    let (c, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let row = c
        .query_one(
            "SELECT held, bytes FROM wr_payload_budget \
              WHERE registry = (SELECT id FROM wr_registries WHERE name = $1)",
            &[&name],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (0, 0));
    assert_eq!(
        (r.stats().payloads_held, r.stats().payload_bytes_held),
        (0, 0)
    );
}
