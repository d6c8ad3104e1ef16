//! The differential harness of the networked backends: one call of a random history run on a
//! backend and on the in-memory registry (the semantic reference), each answer written as a
//! string with worker ids by the order the history created them (`ids.rs`), so that a test
//! compares the two strings. `tests/redis/differential.rs` (proptest histories) and
//! `tests/postgres.rs` (seeded histories) each choose their configuration, their histories and
//! how time moves; what a call is and how its answer is compared is here, once.

#![allow(dead_code)]

use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use worker_registry::{
    Admission, ClaimOutcome, DeliveryId, Event, Maintenance, StatusSnapshot, SweepReport, Target,
    WorkerInfo, WorkerRegistry,
};

use crate::ids::Ids;

/// One step of a history. Targets and deliveries are small indices ([`target`], [`delivery`]);
/// workers are the history's ordinals (the `k`-th worker it created, [`Ids::arg`]).
#[derive(Debug, Clone)]
pub enum Op {
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
    /// `drain_within` so many seconds; 0: `drain`, the configured deadline.
    Drain(u64, u8),
    /// `drain_all_within` so many seconds.
    DrainAll(u8),
    Worker(u64),
    /// A sweep, its released events acknowledged, and the snapshot it left.
    Sweep,
    /// Time moves on (by what the test says a step is): not a call, the driver's to apply.
    Advance(u8),
}

/// What a sweep's answer shows besides what every backend must agree on.
#[derive(Debug, Clone, Copy, Default)]
pub struct SweepView {
    /// The report's and the snapshot's versions (a backend whose version moves only when
    /// something changed publishes fewer than the in-memory registry).
    pub version: bool,
    /// The stall credited in whole seconds (else only whether one was measured).
    pub stall_seconds: bool,
    /// The handle's count of stuck deliveries after the sweep.
    pub stuck_count: bool,
}

pub fn target(i: u8) -> Target {
    Target::new("octo/repo", u64::from(i) + 1).unwrap()
}

pub fn delivery(i: u8) -> DeliveryId {
    DeliveryId::new(&format!("d-{i}")).unwrap()
}

/// What is compared of a worker (its wall-clock times and ages differ between the two time
/// bases).
pub fn info(w: &WorkerInfo) -> String {
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

fn snapshot(s: &StatusSnapshot, ids: &mut Ids, view: SweepView) -> String {
    let mut workers: Vec<_> = s.workers.iter().collect();
    workers.sort_by_key(|w| w.id);
    let workers: Vec<String> = workers.into_iter().map(|w| ids.norm(&info(w))).collect();
    let version = if view.version {
        format!("v{} ", s.version)
    } else {
        String::new()
    };
    format!(
        "{version}{:?} {:?} {:?} brake={} {workers:#?}",
        s.counts, s.capacity, s.claims, s.brake_engaged
    )
}

fn report(r: &SweepReport, ids: &mut Ids, view: SweepView) -> String {
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
    let version = if view.version {
        format!(" v{}", r.version)
    } else {
        String::new()
    };
    // The stall's length includes the server's own milliseconds.
    let stalled = if view.stall_seconds {
        format!("{}s", r.stall_credited.as_secs())
    } else {
        (!r.stall_credited.is_zero()).to_string()
    };
    format!(
        "swept={}{version} died={died:?} suspected={suspected:?} brake={} targets={targets:?} \
         released={released:?} expired={} evicted={} purged={} stalled={stalled} \
         drained_stuck={drained:?}",
        r.swept, r.brake_engaged, r.expired_claims, r.evicted_claims, r.purged_workers
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
pub async fn apply<R: WorkerRegistry + Maintenance>(
    r: &R,
    op: &Op,
    ids: &mut Ids,
    view: SweepView,
) -> String {
    let answer = apply_raw(r, op, ids, view).await;
    ids.norm(&answer)
}

async fn apply_raw<R: WorkerRegistry + Maintenance>(
    r: &R,
    op: &Op,
    ids: &mut Ids,
    view: SweepView,
) -> String {
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
        Op::Drain(id, 0) => format!("{:?}", r.drain(w(id)).await),
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
                let rep_s = report(&rep, ids, view);
                let stuck = if view.stuck_count {
                    format!(" stuck={}", r.stats().claims_stuck)
                } else {
                    String::new()
                };
                format!("{rep_s}{stuck}\n{}", snapshot(&r.status(), ids, view))
            }
            Err(e) => format!("{e:?}"),
        },
        Op::Advance(_) => String::new(),
    }
}

/// The handle's statistics, without what differs by design (durations, the snapshot's age, the
/// retained gauge's freshness, missed events).
pub fn counters(r: &impl WorkerRegistry) -> String {
    let mut s = r.stats();
    s.sweep_durations = Default::default();
    s.snapshot_age = Duration::ZERO;
    s.retained_claims = 0; // a gauge whose freshness differs by design; snapshots compare it
    s.events_missed = 0;
    format!("{s:#?}")
}

/// An event as compared (a target's deliveries in sorted order: the in-memory registry lists
/// them in its map's order).
pub fn event(e: &Event) -> String {
    match e {
        Event::TargetReleased { target, deliveries } => {
            let mut d: Vec<&str> = deliveries.iter().map(DeliveryId::as_str).collect();
            d.sort_unstable();
            format!("TargetReleased({target}, {d:?})")
        }
        other => format!("{other:?}"),
    }
}
