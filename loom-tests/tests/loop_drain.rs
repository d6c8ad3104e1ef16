//! Race 6: a worker's "loop finished" against its drain.
//!
//! Invariant `dies-once-exited`: whichever comes first, the worker ends dead exactly once, with
//! reason `Exited`: exactly one of the two calls returns `Dead(Exited)` (the other `Draining` if
//! drain was first, `Active` if the loop finished first), the deaths counter is 1, its capacity
//! slot is free and its target unmapped (the next delivery gets a new worker).
//! Guard: both are one CAS on the state word; only the CAS that makes it dead does the death
//! bookkeeping.
//! Twin: `Fault::TransitionLoadStore` (a lost update leaves it draining forever, or kills it twice).
#![cfg(worker_registry_loom)]

use loom_tests::{check, check_fails, event, invariant, registry, spawn, target, PREEMPTION_BOUND};
use worker_registry::{Admission, DeadReason, Fault, Status};

fn loop_finished_against_drain(faults: &'static [Fault]) {
    let (reg, _clock) = registry(4, faults);
    let t = target(1);
    let Admission::Assigned(a) = reg.admit(&t, &event(1)) else {
        panic!("first delivery is assigned");
    };
    let w = a.worker; // busy: it was created for this delivery

    let drainer = {
        let reg = reg.clone();
        spawn(move || reg.drain(w))
    };
    let finished = reg.loop_finished(w);
    let drained = drainer.join().unwrap();

    let exited = Ok(Status::Dead(DeadReason::Exited));
    let order_ok = (drained == Ok(Status::Draining) && finished == exited)
        || (finished == Ok(Status::Active) && drained == exited);
    invariant!(
        "dies-once-exited",
        order_ok,
        "drain {drained:?}, loop_finished {finished:?}"
    );
    let status = reg.worker(w).map(|i| i.status);
    let s = reg.stats();
    let deaths = s.deaths_exited + s.deaths_deregistered + s.deaths_missed_heartbeats;
    invariant!(
        "dies-once-exited",
        status == Some(Status::Dead(DeadReason::Exited))
            && (deaths, s.deaths_exited, s.live_workers) == (1, 1, 0),
        "ends {status:?} with {s:?}"
    );
    let next = reg.admit(&t, &event(2));
    invariant!(
        "dies-once-exited",
        matches!(&next, Admission::Assigned(n) if n.new && n.worker != w),
        "the dead worker's target must be free: {next:?}"
    );
}

#[test]
fn loop_finished_against_drain_concurrently() {
    check(
        "loop_finished_against_drain_concurrently",
        PREEMPTION_BOUND,
        || loop_finished_against_drain(&[]),
    );
}

#[test]
fn twin_transition_load_store_is_caught_by_loop_drain_model() {
    check_fails(
        "loop_finished_vs_drain_load_store",
        PREEMPTION_BOUND,
        "dies-once-exited",
        || loop_finished_against_drain(&[Fault::TransitionLoadStore]),
    );
}
