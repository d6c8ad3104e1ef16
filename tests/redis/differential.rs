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
use worker_registry::{InMemoryRegistry, ManualClock, RegistryConfig, Subscribe};

use crate::harness;
use crate::histories::{apply, counters, event, Op, SweepView};
use crate::ids::Ids;

/// Redis publishes a version every sweep, as memory does: versions are compared too.
const VIEW: SweepView = SweepView {
    version: true,
    stall_seconds: false,
    stuck_count: false,
};

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
        let a = apply(&mem, op, &mut mem_ids, VIEW).await;
        let b = apply(&red, op, &mut red_ids, VIEW).await;
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
