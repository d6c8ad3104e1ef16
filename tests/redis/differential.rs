//! Random call sequences give the same answers on Redis as on the in-memory registry (the
//! semantic reference): every answer, every sweep report, every snapshot, the counters and the
//! lifecycle events, with time advanced on both (a `ManualClock` there, the registry's test
//! offset here).
//!
//! Real time also passes on the server during a sequence (milliseconds). Every configured
//! duration is a whole number of seconds and every advance a whole number of seconds plus 1 ms,
//! so no comparison in either backend is decided by those milliseconds: the sum of advances
//! between two instants is always `1000 k + n` ms with `1 <= n < 1000`, never on a boundary.
//!
//! The sweep interval is the exception, 1.1 s: the stall rule counts a stalled gap between two
//! sweeps as one interval of running time, which would eat the `n` above (with a 1 s interval a
//! worker silent across a stall could be judged silent for exactly its timeout, and the server's
//! own milliseconds would decide). With 1.1 s every judged duration is `100 a + n` ms past a
//! whole second, `a` the stalled gaps it spans (at most 4 before any threshold here is reached),
//! and a gap of 2 s plus `n` is still no stall (it would take more than 2.2 s).

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use worker_registry::redis::RedisRegistry;
use worker_registry::{
    Admission, ClaimOutcome, DeliveryId, Event, InMemoryRegistry, Maintenance, ManualClock,
    RegistryConfig, StatusSnapshot, Subscribe, SweepReport, Target, WorkerInfo, WorkerRegistry,
};

use crate::harness;
use crate::ids::Ids;

#[derive(Debug, Clone)]
enum Op {
    Admit(u8, u8),
    Claim(u8, u8),
    Release(u8, u8),
    Complete(u8, u8),
    CompleteBy(u64, u8, u8),
    Assign(u8),
    Heartbeat(u64),
    LoopStarted(u64),
    LoopFinished(u64),
    Register,
    Deregister(u64),
    Drain(u64, u8),
    DrainAll(u8),
    Worker(u64),
    Sweep,
    Advance(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let t = 0u8..3;
    let d = 0u8..3;
    let w = 1u64..8;
    prop_oneof![
        6 => (t.clone(), d.clone()).prop_map(|(t, d)| Op::Admit(t, d)),
        2 => (t.clone(), d.clone()).prop_map(|(t, d)| Op::Claim(t, d)),
        1 => (t.clone(), d.clone()).prop_map(|(t, d)| Op::Release(t, d)),
        2 => (t.clone(), d.clone()).prop_map(|(t, d)| Op::Complete(t, d)),
        2 => (w.clone(), t.clone(), d.clone()).prop_map(|(w, t, d)| Op::CompleteBy(w, t, d)),
        1 => t.clone().prop_map(Op::Assign),
        4 => w.clone().prop_map(Op::Heartbeat),
        1 => w.clone().prop_map(Op::LoopStarted),
        2 => w.clone().prop_map(Op::LoopFinished),
        2 => Just(Op::Register),
        1 => w.clone().prop_map(Op::Deregister),
        1 => (w.clone(), 1u8..4).prop_map(|(w, s)| Op::Drain(w, s)),
        1 => (1u8..4).prop_map(Op::DrainAll),
        1 => w.prop_map(Op::Worker),
        3 => Just(Op::Sweep),
        4 => (0u8..4).prop_map(Op::Advance),
    ]
}

fn config() -> RegistryConfig {
    let s = Duration::from_secs;
    RegistryConfig::builder()
        .heartbeat_interval(s(1))
        .missed_heartbeats(2)
        .sweep_interval(Duration::from_millis(1100))
        .startup_grace(s(1))
        .max_workers(3)
        .claim_retention(s(3))
        .max_retained_claims(3)
        .dead_retention(s(2))
        .suspect_grace(s(2))
        .brake_min_workers(3)
        .brake_fraction(0.5)
        .drain_deadline(s(3))
        .release_ack_timeout(s(1))
        .max_in_flight(s(5))
        .build()
        .unwrap()
}

fn target(i: u8) -> Target {
    Target::new("octo/repo", u64::from(i) + 1).unwrap()
}

fn delivery(i: u8) -> DeliveryId {
    DeliveryId::new(&format!("d-{i}")).unwrap()
}

fn info(w: &WorkerInfo) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} suspect={} beaten={} token={:?} draining_until={} died={}",
        w.id,
        w.target,
        w.kind,
        w.status,
        w.activity,
        w.suspect,
        w.has_heartbeated,
        w.token,
        w.drain_deadline.is_some(),
        w.died_at.is_some()
    )
}

fn snapshot(s: &StatusSnapshot, ids: &mut Ids) -> String {
    let mut workers: Vec<_> = s.workers.iter().collect();
    workers.sort_by_key(|w| w.id);
    let workers: Vec<String> = workers.into_iter().map(|w| ids.norm(&info(w))).collect();
    format!(
        "v{} {:?} {:?} {:?} brake={} {workers:#?}",
        s.version, s.counts, s.capacity, s.claims, s.brake_engaged
    )
}

fn report(r: &SweepReport, ids: &mut Ids) -> String {
    let mut died = r.died.clone();
    died.sort_by_key(|(w, _)| *w);
    let mut suspected = r.suspected.clone();
    suspected.sort();
    let mut targets = r.released_targets.clone();
    targets.sort();
    let mut released: Vec<String> = r
        .released
        .iter()
        .map(|e| {
            ids.norm(&format!(
                "{} {} {:?} {:?}",
                e.target, e.delivery, e.holder, e.reason
            ))
        })
        .collect();
    released.sort();
    let mut drained = r.drained_stuck.clone();
    drained.sort();
    // Whether a stall was measured (its length includes the server's own milliseconds).
    let stalled = !r.stall_credited.is_zero();
    format!(
        "swept={} v{} died={died:?} suspected={suspected:?} brake={} targets={targets:?} \
         released={released:?} expired={} evicted={} purged={} stalled={stalled} \
         drained_stuck={drained:?}",
        r.swept, r.version, r.brake_engaged, r.expired_claims, r.evicted_claims, r.purged_workers
    )
}

fn admission(a: Admission) -> String {
    match a {
        Admission::Duplicate(d) => format!(
            "Duplicate({:?}, {:?}, unstarted={})",
            d.holder, d.state, d.unstarted
        ),
        other => format!("{other:?}"),
    }
}

/// Runs one call on `r`; the normalized answer (ids by the order `ids` saw them).
async fn apply<R: WorkerRegistry + Maintenance>(r: &R, op: &Op, ids: &mut Ids) -> String {
    let answer = apply_raw(r, op, ids).await;
    ids.norm(&answer)
}

async fn apply_raw<R: WorkerRegistry + Maintenance>(r: &R, op: &Op, ids: &mut Ids) -> String {
    let w = |id: u64| ids.arg(id);
    match *op {
        Op::Admit(t, d) => match r.admit(&target(t), &delivery(d)).await {
            Ok(a) => admission(a),
            Err(e) => format!("{e:?}"),
        },
        Op::Claim(t, d) => match r.claim(&target(t), &delivery(d)).await {
            Ok(ClaimOutcome::AlreadyClaimed(c)) => {
                format!(
                    "Already({:?}, {:?}, unstarted={})",
                    c.holder, c.state, c.unstarted
                )
            }
            other => format!("{other:?}"),
        },
        Op::Release(t, d) => format!("{:?}", r.release(&target(t), &delivery(d)).await),
        Op::Complete(t, d) => format!("{:?}", r.complete(&target(t), &delivery(d)).await),
        Op::CompleteBy(id, t, d) => {
            format!("{:?}", r.complete_by(w(id), &target(t), &delivery(d)).await)
        }
        Op::Assign(t) => format!("{:?}", r.assign(&target(t)).await),
        Op::Heartbeat(id) => format!("{:?}", r.heartbeat(w(id)).await),
        Op::LoopStarted(id) => format!("{:?}", r.loop_started(w(id)).await),
        Op::LoopFinished(id) => format!("{:?}", r.loop_finished(w(id)).await),
        Op::Register => format!("{:?}", r.register().await),
        Op::Deregister(id) => format!("{:?}", r.deregister(w(id)).await),
        Op::Drain(id, s) => format!(
            "{:?}",
            r.drain_within(w(id), Duration::from_secs(u64::from(s)))
                .await
        ),
        Op::DrainAll(s) => format!(
            "{:?}",
            r.drain_all_within(Duration::from_secs(u64::from(s))).await
        ),
        Op::Worker(id) => match r.worker(w(id)).await {
            Ok(Some(i)) => info(&i),
            other => format!("{other:?}"),
        },
        Op::Sweep => match r.sweep().await {
            Ok(rep) => {
                r.acknowledge(&rep.released).await.unwrap();
                let rep_s = report(&rep, ids);
                format!("{rep_s}\n{}", snapshot(&r.status(), ids))
            }
            Err(e) => format!("{e:?}"),
        },
        Op::Advance(_) => String::new(),
    }
}

fn counters(r: &impl WorkerRegistry) -> String {
    let mut s = r.stats();
    s.sweep_durations = Default::default();
    s.snapshot_age = Duration::ZERO;
    s.retained_claims = 0; // a gauge whose freshness differs by design; snapshots compare it
    s.events_missed = 0;
    format!("{s:#?}")
}

fn event(e: &Event) -> String {
    match e {
        // The in-memory registry lists a target's deliveries in its map's order.
        Event::TargetReleased { target, deliveries } => {
            let mut d: Vec<&str> = deliveries.iter().map(DeliveryId::as_str).collect();
            d.sort_unstable();
            format!("TargetReleased({target}, {d:?})")
        }
        other => format!("{other:?}"),
    }
}

async fn run(url: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let mem = InMemoryRegistry::with_clock(config(), clock.clone());
    let red: RedisRegistry = harness::registry(url, "diff", config()).await;
    let mut mem_events = Subscribe::subscribe(&mem);
    let mut red_events = Subscribe::subscribe(&red);
    let (mut mem_ids, mut red_ids) = (Ids::default(), Ids::default());
    for (i, op) in ops.iter().enumerate() {
        if let Op::Advance(s) = op {
            let by = Duration::from_millis(u64::from(*s) * 1000 + 1);
            clock.advance(by);
            red.advance_time_for_tests(by).await.unwrap();
            continue;
        }
        let a = apply(&mem, op, &mut mem_ids).await;
        let b = apply(&red, op, &mut red_ids).await;
        prop_assert_eq!(&a, &b, "call {} {:?} of {:#?}", i, op, ops);
        if matches!(op, Op::Complete(..) | Op::CompleteBy(..)) {
            // Completion times stay distinct, so "oldest first" eviction has no ties.
            clock.advance(Duration::from_millis(1));
            red.advance_time_for_tests(Duration::from_millis(1))
                .await
                .unwrap();
        }
    }
    prop_assert_eq!(counters(&mem), counters(&red));

    // Every event the in-memory registry published reaches the Redis subscriber too (they
    // travel through the server; wait a bounded while for them).
    let mut want: Vec<String> = Vec::new();
    while let Ok(Some(e)) = mem_events.try_recv() {
        want.push(mem_ids.norm(&event(&e)));
    }
    let mut got: Vec<String> = Vec::new();
    while got.len() < want.len() {
        match tokio::time::timeout(Duration::from_secs(5), red_events.recv()).await {
            Ok(Ok(e)) => got.push(red_ids.norm(&event(&e))),
            _ => break,
        }
    }
    // Per-worker order is kept; across workers of one sweep the two backends visit workers in
    // different orders, so compare as multisets.
    let by_count = |v: &[String]| {
        let mut m = BTreeMap::new();
        for e in v {
            *m.entry(e.clone()).or_insert(0) += 1;
        }
        m
    };
    prop_assert_eq!(by_count(&want), by_count(&got));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn redis_answers_like_the_in_memory_registry(ops in prop::collection::vec(op(), 1..60)) {
        let Some(url) = harness::shared("differential") else { return Ok(()) };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(&url, &ops))?;
    }
}
