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
//!
//! The server's own milliseconds are what this argument leaves out, and on a busy machine they
//! are not few: a run once saw Redis find a stall (2,002 ms of advances between two sweeps, plus
//! the real time of the 19 calls between them, past 2,200 ms) that the in-memory registry, on
//! its manual clock, rightly did not. A case is therefore only evidence while the server's real
//! time stays inside the margins: between two sweeps at most [`SWEEP_GAP_MARGIN`] (the stall
//! rule's margin is 200 ms less the `n` of that gap), over the whole case at most
//! [`CASE_MARGIN`] (every other threshold is a whole number of seconds, at least
//! `1000 - 100 a - n` ms away). A case that takes longer is rejected (`prop_assume`), not
//! failed: it says nothing either way; proptest draws another in its place.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use worker_registry::redis::RedisRegistry;
use worker_registry::{InMemoryRegistry, ManualClock, RegistryConfig, Subscribe};

use crate::harness;
use crate::histories::{apply, counters, event, Op, SweepView};
use crate::ids::Ids;

/// The most real time between two sweeps for a case to count (see the module's doc).
const SWEEP_GAP_MARGIN: Duration = Duration::from_millis(120);
/// The most real time a whole case may take to count (see the module's doc).
const CASE_MARGIN: Duration = Duration::from_millis(450);

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
    let started = Instant::now();
    let mut last_sweep: Option<Instant> = None;
    for (i, op) in ops.iter().enumerate() {
        prop_assume!(
            started.elapsed() <= CASE_MARGIN,
            "the server's real time ({:?}) left the case's margin",
            started.elapsed()
        );
        if let Op::Sweep = op {
            let gap = last_sweep.map_or(Duration::ZERO, |t| t.elapsed());
            prop_assume!(
                gap <= SWEEP_GAP_MARGIN,
                "the server's real time between two sweeps ({:?}) left the stall rule's margin",
                gap
            );
            last_sweep = Some(Instant::now());
        }
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
        // Cases a busy machine makes too slow to count are drawn again (see the module's doc).
        max_global_rejects: 4096,
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

/// Replays `ops` through [`run`] until a run counts: a run the server's real time pushed out
/// of the margins (rejected, see the module's doc) is tried again, at most 20 times.
async fn replay(ops: &[Op]) {
    let Some(url) = harness::shared("differential") else {
        return;
    };
    for _ in 0..20 {
        match run(&url, ops).await {
            Ok(()) => return,
            Err(TestCaseError::Reject(_)) => continue,
            Err(e) => panic!("{e}"),
        }
    }
    panic!("20 runs of {ops:?} all left the real-time margins: the machine is too busy");
}

/// A case the proptest drew (shrunk): repo#2 has a bare claim (d-1) and a worker holding d-0;
/// every worker is drained, and the sweep past the deadlines kills three and releases both of
/// repo#2's deliveries. Redis's sweep did so in two steps (its step budget went on the first
/// deaths) and published one `TargetReleased` per step, `[d-1]` then `[d-0]`, where a sweep
/// publishes one per target: `[d-0, d-1]`.
#[tokio::test]
async fn a_target_released_over_two_sweep_steps_is_one_event() {
    use Op::*;
    replay(&[
        Claim(1, 1),
        Assign(2),
        Register,
        Register,
        Heartbeat(1),
        DrainAll(1),
        Admit(0, 0),
        Admit(1, 0),
        DrainAll(1),
        Heartbeat(4),
        Advance(2),
        Sweep,
    ])
    .await;
}
