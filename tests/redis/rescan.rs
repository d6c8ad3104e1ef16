//! The rescan after a dropped stall in bounded steps: when the 65th stall drops the oldest span
//! still within reach, the credit it gave is gone and a deadline may now lie below its score in
//! `{n}:live`; the sweep steps walk `live` (and `flight`) a chunk at a time and a worker whose
//! deadline depended on the dropped span is found dead, as the in-memory registry finds it.

use std::time::Duration;

use worker_registry::config::RegistryConfigBuilder;
use worker_registry::{
    Admission, DeadReason, DeliveryId, InMemoryRegistry, Maintenance, ManualClock, RegistryConfig,
    ReleaseReason, Status, SweepReport, Target, WorkerId, WorkerRegistry, WorkerRegistryExt,
};

use crate::harness;

const FILLERS: usize = 300;
const STALLS: usize = 65;
/// The first cycle is a stall of 99 s (the span the 65th drops); each later one is three intervals
/// late: a stall of 2 s, 1 s of running time.
fn cycle(i: usize) -> Duration {
    Duration::from_secs(if i == 1 { 100 } else { 3 })
}

/// A heartbeat timeout of 120 s. The worker that beat before the first stall has run 65 s by the
/// 65th; without the dropped 99 s of credit, 164 s: dead. Its score in `{n}:live` was last set in
/// cycle 46 (to 309 s, judged with 189 s of credit), so at the 65th (292 s) it is no candidate:
/// only the rescan finds it. The fillers beat after cycle 40 (the dropped span is no credit of
/// theirs); until then the start-up grace of 200 s covers them, and it widens the stall horizon
/// so that all 64 spans stay within reach.
fn config() -> RegistryConfig {
    settings().build().unwrap()
}

/// [`config`]'s settings, for a test that adds one.
fn settings() -> RegistryConfigBuilder {
    RegistryConfig::builder()
        .max_workers(FILLERS + 1)
        .sweep_interval(Duration::from_secs(1))
        .heartbeat_interval(Duration::from_secs(60))
        .missed_heartbeats(2)
        .startup_grace(Duration::from_secs(200))
}

#[tokio::test]
async fn a_dropped_stalls_lost_credit_is_found_by_the_bounded_rescan_as_in_memory() {
    let Some(url) = harness::shared("rescan") else {
        return;
    };
    // In memory, for the expected answer.
    let clock = ManualClock::new();
    let m = InMemoryRegistry::with_clock(config(), clock.clone());
    Maintenance::sweep(&m).await.unwrap();
    let mw = WorkerRegistry::register(&m).await.unwrap();
    WorkerRegistry::heartbeat(&m, mw).await.unwrap();
    let mut mfill = Vec::new();
    for _ in 0..FILLERS {
        mfill.push(WorkerRegistry::register(&m).await.unwrap());
    }
    let mut m_died = Vec::new();
    for i in 1..=STALLS {
        clock.advance(cycle(i));
        let rep = Maintenance::sweep(&m).await.unwrap();
        m_died.push(rep.died.clone());
        if i == 40 {
            for &f in &mfill {
                WorkerRegistry::heartbeat(&m, f).await.unwrap();
            }
        }
    }
    assert!(m_died[..STALLS - 1].iter().all(|d| d.is_empty()));
    assert_eq!(m_died[STALLS - 1], vec![(mw, DeadReason::MissedHeartbeats)]);

    // The same on Redis.
    let r = harness::registry(&url, "rescan", config()).await;
    r.sweep().await.unwrap();
    let w = r.register().await.unwrap();
    r.heartbeat(w).await.unwrap();
    let mut fill = Vec::new();
    for _ in 0..FILLERS {
        fill.push(r.register().await.unwrap());
    }
    let mut raw = harness::raw(&url).await;
    let mut died: Vec<Vec<(WorkerId, DeadReason)>> = Vec::new();
    let mut fcalls = 0;
    for i in 1..=STALLS {
        r.advance_time_for_tests(cycle(i)).await.unwrap();
        let before = fcall_calls(&mut raw).await;
        let rep = r.sweep().await.unwrap();
        fcalls = fcall_calls(&mut raw).await - before;
        died.push(rep.died.clone());
        if i == 40 {
            for &f in &fill {
                r.heartbeat(f).await.unwrap();
            }
        }
    }
    assert!(died[..STALLS - 1].iter().all(|d| d.is_empty()), "{died:?}");
    assert_eq!(died[STALLS - 1], vec![(w, DeadReason::MissedHeartbeats)]);
    // The walk took several steps (301 workers at about 3 commands each, a step's budget 200):
    // at least 4 sweep calls beyond the publish steps, counted server-wide (other tests may add).
    assert!(
        fcalls >= 5,
        "the sweep after the drop made {fcalls} function calls"
    );
    assert!(matches!(
        r.worker(w).await.unwrap().unwrap().status,
        Status::Dead(_)
    ));
    for f in fill {
        assert!(!matches!(
            r.worker(f).await.unwrap().unwrap().status,
            Status::Dead(_)
        ));
    }
    // The walk finished: its cursor is gone.
    let prefix = r.key_pattern();
    let key = format!("{}rescan", prefix.trim_end_matches('*'));
    let left: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(left, None);
}

/// `cmdstat_fcall`'s call count (server-wide).
async fn fcall_calls(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The same for a delivery in flight: `max_in_flight` 120 s, and a claim made before the first
/// stall on a worker that beats every cycle. By the 65th it has run 65 s; without the dropped 99 s
/// of credit, 164 s: stuck. Its score in `{n}:flight` was last set in cycle 46 (to its claim time
/// plus 189 s of credit), so at the 65th it is no candidate: only the rescan's walk of `flight`,
/// after the fillers' chunks of `live`, finds it there. The in-memory registry has no such walk
/// for claims: it judges them again at the time its last judgement named (cycle 46's: 75 s of
/// running time left, reached in cycle 71), so it finds the delivery stuck later, not never.
#[tokio::test]
async fn a_dropped_stalls_lost_credit_finds_a_stuck_delivery_through_the_rescan() {
    let Some(url) = harness::shared("rescan") else {
        return;
    };
    let config = || {
        settings()
            .max_in_flight(Duration::from_secs(120))
            .build()
            .unwrap()
    };
    let target = Target::new("octo/rescan", 1).unwrap();
    let delivery = DeliveryId::new("before-the-stalls").unwrap();
    let stuck_of = |rep: &SweepReport| -> Vec<(WorkerId, DeliveryId)> {
        rep.released
            .iter()
            .filter(|e| e.reason == ReleaseReason::Stuck)
            .map(|e| (e.holder.unwrap(), e.delivery.clone()))
            .collect()
    };

    // In memory: found when its next judgement comes, in cycle 71.
    let clock = ManualClock::new();
    let m = InMemoryRegistry::with_clock(config(), clock.clone());
    Maintenance::sweep(&m).await.unwrap();
    let Admission::Assigned(ma) = WorkerRegistryExt::admit(&m, &target, &delivery)
        .await
        .unwrap()
    else {
        panic!("admit")
    };
    let mut mfill = Vec::new();
    for _ in 0..FILLERS {
        mfill.push(WorkerRegistry::register(&m).await.unwrap());
    }
    let mut m_found = Vec::new();
    for i in 1..=75 {
        clock.advance(cycle(i));
        WorkerRegistry::heartbeat(&m, ma.worker).await.unwrap();
        if i == 40 || i == 70 {
            for &f in &mfill {
                WorkerRegistry::heartbeat(&m, f).await.unwrap();
            }
        }
        let rep = Maintenance::sweep(&m).await.unwrap();
        if !stuck_of(&rep).is_empty() {
            m_found.push((i, stuck_of(&rep)));
        }
    }
    assert_eq!(m_found, vec![(71, vec![(ma.worker, delivery.clone())])]);

    // On Redis: found in the 65th, by the rescan.
    let r = harness::registry(&url, "rescan-flight", config()).await;
    r.sweep().await.unwrap();
    let Admission::Assigned(a) = r.admit(&target, &delivery).await.unwrap() else {
        panic!("admit")
    };
    let mut fill = Vec::new();
    for _ in 0..FILLERS {
        fill.push(r.register().await.unwrap());
    }
    let mut found = Vec::new();
    for i in 1..=STALLS {
        r.advance_time_for_tests(cycle(i)).await.unwrap();
        r.heartbeat(a.worker).await.unwrap();
        if i == 40 {
            for &f in &fill {
                r.heartbeat(f).await.unwrap();
            }
        }
        let rep = r.sweep().await.unwrap();
        assert!(rep.died.is_empty(), "cycle {i}: {:?}", rep.died);
        if !stuck_of(&rep).is_empty() {
            found.push((i, stuck_of(&rep)));
        }
    }
    assert_eq!(found, vec![(STALLS, vec![(a.worker, delivery)])]);
}
