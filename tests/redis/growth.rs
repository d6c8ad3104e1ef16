//! Nothing grows without bound: rounds of the same traffic (workers created, deliveries admitted
//! with payloads, some completed and some left in flight, the workers dying unheard, their
//! deliveries released and acknowledged, a replica that comes, sweeps and goes) leave the
//! registry's keys, and the size of each, where the first round left them, once the retentions
//! have passed; no payload is left (no `p:*`, `r:*` key, nothing counted held). Only the change
//! log (kept for its last `CHANGE_LOG_VERSIONS` versions) and the counters' values move.

use std::collections::BTreeMap;
use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use worker_registry::redis::RedisRegistry;
use worker_registry::{
    Admission, DeliveryId, Maintenance, RegistryConfig, SweepReport, Target, WorkerRegistry,
};

use worker_registry::testkit::payload_checks::sample;

use crate::harness::{self, Server};

/// Checks that the registry holds no payload: no payload key, none counted.
#[track_caller]
fn no_payloads_left(r: &RedisRegistry, footprint: &BTreeMap<String, u64>) {
    for kind in ["p:*", "r:*", "rpi"] {
        assert!(!footprint.contains_key(kind), "{kind} left: {footprint:?}");
    }
    let s = r.stats();
    assert_eq!((s.payloads_held, s.payload_bytes_held), (0, 0), "{s:?}");
}

/// Every key of the registry (`{name}:*`) by kind: a per-item key (`w:<id>`, `c:<...>`) counted
/// under its kind, any other key with its size (members, fields, entries; 1 for a string), and
/// the released stream's consumers and pending entries.
async fn footprint(url: &str, name: &str) -> BTreeMap<String, u64> {
    let mut c = harness::raw(url).await;
    let tag = format!("{{{name}}}:");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{tag}*"))
        .query_async(&mut c)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for key in keys {
        let suffix = key.strip_prefix(&tag).unwrap().to_owned();
        if let Some((kind, _)) = suffix.split_once(':') {
            *out.entry(format!("{kind}:*")).or_insert(0) += 1;
            continue;
        }
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut c)
            .await
            .unwrap();
        let size: u64 = match kind.as_str() {
            "zset" => redis::cmd("ZCARD")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap(),
            "hash" => redis::cmd("HLEN")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap(),
            "set" => redis::cmd("SCARD")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap(),
            "list" => redis::cmd("LLEN")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap(),
            "stream" => redis::cmd("XLEN")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap(),
            _ => 1,
        };
        if kind == "stream" && suffix == "released" {
            let groups: Vec<BTreeMap<String, redis::Value>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap();
            for g in groups {
                for field in ["consumers", "pending"] {
                    if let Some(redis::Value::Int(n)) = g.get(field) {
                        out.insert(format!("released/{field}"), *n as u64);
                    }
                }
            }
        }
        out.insert(suffix, size);
    }
    out
}

/// Lets `total` of registry time pass in sweep intervals (so that no stall is measured, which
/// would credit the silent workers), each followed by a sweep whose released deliveries are
/// acknowledged; then sweeps until one finds nothing left to do (bounded). Real time runs on
/// beside the offset: an interval of a second keeps a loaded machine's scheduling (more than an
/// interval between two of these sweeps) from counting as a stall.
async fn pass(r: &RedisRegistry, total: Duration) {
    let step = r.config().sweep_interval();
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
        {
            return;
        }
    }
    panic!("the sweeps never ran out of work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_of_the_same_traffic_leave_the_same_keys_behind() {
    let Some(server) = Server::start(false, "Redis growth test") else {
        return;
    };
    let config = RegistryConfig::builder()
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(2)
        .startup_grace(Duration::ZERO)
        .sweep_interval(Duration::from_secs(1))
        .dead_retention(Duration::from_secs(10))
        .claim_retention(Duration::from_secs(20))
        .release_ack_timeout(Duration::from_secs(2))
        // The workers all go silent at once: no mass-death brake holding them.
        .brake_min_workers(1_000)
        .build()
        .unwrap();
    let name = harness::unique_name("growth");
    let r = RedisRegistry::builder(server.url())
        .name(&name)
        .config(config)
        .connect()
        .await
        .unwrap();
    let mut first = None;
    for round in 0..4u64 {
        for i in 0..8 {
            let t = Target::new("octo/repo", round * 100 + i + 1).unwrap();
            let d = DeliveryId::new(&format!("d{round}-{i}")).unwrap();
            let p = sample(&format!("{round}-{i}"), 2_000);
            assert!(matches!(
                r.admit_with(&t, &d, Some(&p)).await.unwrap(),
                Admission::Assigned(_)
            ));
            if i % 2 == 0 {
                r.complete(&t, &d).await.unwrap();
            }
        }
        // A replica that comes, joins the released stream's group, and goes.
        let passing = r.connect_replica().await.unwrap();
        let report = passing.sweep().await.unwrap();
        passing.acknowledge(&report.released).await.unwrap();
        drop(passing);
        // The workers die unheard; their deliveries are released and acknowledged.
        pass(&r, Duration::from_secs(5)).await;
        // Past every retention: the dead are purged, the retained claims expire, the gone
        // replica's consumer is forgotten.
        pass(&r, Duration::from_secs(30)).await;
        let mut now = footprint(&server.url(), &name).await;
        no_payloads_left(&r, &now);
        // The change log keeps its last versions (CHANGE_LOG_VERSIONS): it grows until then.
        assert!(now.remove("changes").unwrap_or(0) < 10_000);
        match &first {
            None => first = Some(now),
            Some(first) => assert_eq!(&now, first, "round {round} left more behind"),
        }
    }
    let first = first.unwrap();
    for kind in ["w:*", "ws:*", "c:*", "t:*"] {
        assert!(!first.contains_key(kind), "{kind} left: {first:?}");
    }
    assert_eq!(first.get("released").copied().unwrap_or(0), 0, "{first:?}");
    assert_eq!(first.get("released/pending").copied().unwrap_or(0), 0);
    assert!(
        first.get("released/consumers").copied().unwrap_or(0) <= 1,
        "{first:?}"
    );
}

/// The same with the waiting room on: each round parks more than the capacity holds (two owners,
/// one at its cap, a delivery behind a draining worker), the workers die unheard, the waiting
/// targets are promoted into their slots or expire past `max_wait`, and the promoted workers die
/// in turn. Every round leaves the waiting room's keys where the first left them: none of the
/// per-target, per-owner or per-worker keys, and only the room's settings and its counter; and no
/// payload (the parked, promoted, released and expired ones all carried one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_through_the_waiting_room_leave_the_same_keys_behind() {
    let Some(server) = Server::start(false, "Redis growth test (waiting room)") else {
        return;
    };
    let config = RegistryConfig::builder()
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(2)
        .startup_grace(Duration::ZERO)
        .sweep_interval(Duration::from_secs(1))
        .dead_retention(Duration::from_secs(10))
        .claim_retention(Duration::from_secs(20))
        .release_ack_timeout(Duration::from_secs(2))
        .brake_min_workers(1_000)
        .max_workers(4)
        .max_workers_per_owner(3)
        .max_waiting(64)
        .max_waiting_per_owner(32)
        .max_wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let name = harness::unique_name("growth-waiting");
    let r = RedisRegistry::builder(server.url())
        .name(&name)
        .config(config)
        .connect()
        .await
        .unwrap();
    let mut first = None;
    let (mut parked, mut promoted, mut expired) = (0, 0, 0);
    for round in 0..4u64 {
        let mut first_worker = None;
        for i in 0..12u64 {
            let owner = if i < 8 { "big" } else { "small" };
            let t = Target::new(&format!("{owner}/repo"), round * 100 + i + 1).unwrap();
            let d = DeliveryId::new(&format!("d{round}-{i}")).unwrap();
            let p = sample(&format!("{round}-{i}"), 2_000);
            match r.admit_with(&t, &d, Some(&p)).await.unwrap() {
                Admission::Assigned(a) => {
                    first_worker.get_or_insert((t, a.worker));
                }
                Admission::Waiting(_) => parked += 1,
                other => panic!("{other:?}"),
            }
        }
        // A delivery behind a draining worker: its successor is promoted after the death.
        let (t, w) = first_worker.unwrap();
        r.drain(w).await.unwrap();
        let d = DeliveryId::new(&format!("behind{round}")).unwrap();
        assert!(matches!(
            r.admit(&t, &d).await.unwrap(),
            Admission::Waiting(_)
        ));
        parked += 1;
        pass(&r, Duration::from_secs(5)).await;
        pass(&r, Duration::from_secs(30)).await;
        let s = r.stats();
        (promoted, expired) = (s.promoted, s.waiting_expired);
        assert_eq!(s.waiting, 0);
        let mut now = footprint(&server.url(), &name).await;
        no_payloads_left(&r, &now);
        assert!(now.remove("changes").unwrap_or(0) < 10_000);
        // A stall span (at most 64 are kept) is measured when a loaded machine leaves more than
        // two sweep intervals of real time between two sweeps: not what this test counts.
        now.remove("stalls");
        match &first {
            None => first = Some(now),
            Some(first) => assert_eq!(&now, first, "round {round} left more behind"),
        }
    }
    assert_eq!(
        promoted + expired,
        parked,
        "each parked delivery promoted or expired once"
    );
    assert!(
        promoted > 0 && expired > 0,
        "{promoted} promoted, {expired} expired"
    );
    let first = first.unwrap();
    for kind in ["w:*", "ws:*", "c:*", "t:*", "wd:*", "wo:*", "wb:*"] {
        assert!(!first.contains_key(kind), "{kind} left: {first:?}");
    }
    for key in ["worder", "wt", "wring", "wready", "wpo", "olive"] {
        assert!(!first.contains_key(key), "{key} left: {first:?}");
    }
    assert_eq!(first.get("released").copied().unwrap_or(0), 0, "{first:?}");
}
