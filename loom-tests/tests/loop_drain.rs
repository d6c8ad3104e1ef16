//! Race 6: a worker's "loop finished" against its drain.
//!
//! Invariant `dies-once-exited`: whichever comes first, the worker ends dead exactly once, with
//! reason `Exited`: exactly one of the two calls returns `Dead(Exited)` (the other `Draining` if
//! drain was first, `Active` if the loop finished first), the deaths counter is 1, its capacity
//! slot is free and its target unmapped (the next delivery gets a new worker).
//! Guard: both are one CAS on the state word; only the CAS that makes it dead does the death
//! bookkeeping.
//! A second model adds a deregister to the race: still exactly one call kills it, its reason is the
//! one the worker ends with, and the death is counted once.
//! Twin: `twins/transition-load-store.patch` (a lost update leaves it draining forever, or kills it twice).
#![cfg(worker_registry_loom)]

use loom_tests::{check, event, invariant, registry, spawn, target, BOUNDED, EXHAUSTIVE};
use worker_registry::{Admission, DeadReason, RegistryError, Status};

fn loop_finished_against_drain() {
    let (reg, _clock) = registry(4);
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

fn three_way_death() {
    let (reg, _clock) = registry(4);
    let Admission::Assigned(a) = reg.admit(&target(1), &event(1)) else {
        panic!("first delivery is assigned");
    };
    let w = a.worker;
    let drainer = {
        let reg = reg.clone();
        spawn(move || reg.drain(w))
    };
    let leaver = {
        let reg = reg.clone();
        spawn(move || reg.deregister(w))
    };
    let finished = reg.loop_finished(w);
    let drained = drainer.join().unwrap();
    let left = leaver.join().unwrap();

    // Who made it dead, with which reason.
    let mut killers = Vec::new();
    for r in [&drained, &finished] {
        if let Ok(Status::Dead(reason)) = r {
            killers.push(*reason);
        }
    }
    if let Ok(reason) = left {
        killers.push(reason);
    }
    let status = reg.worker(w).map(|i| i.status);
    invariant!(
        "dies-once-exited",
        killers.len() == 1 && status == Some(Status::Dead(killers[0])),
        "killers {killers:?}, ends {status:?}: drain {drained:?}, loop_finished {finished:?}, \
         deregister {left:?}"
    );
    let refused_ok = |r: &Result<Status, RegistryError>| match r {
        Ok(s) => s.is_alive() || *s == Status::Dead(killers[0]),
        Err(RegistryError::WorkerDead { reason, .. }) => *reason == killers[0],
        Err(_) => false,
    };
    invariant!(
        "dies-once-exited",
        refused_ok(&drained) && refused_ok(&finished),
        "the losers must see the winner's death: drain {drained:?}, loop_finished {finished:?}"
    );
    let s = reg.stats();
    let deaths = s.deaths_exited + s.deaths_deregistered + s.deaths_missed_heartbeats;
    invariant!(
        "dies-once-exited",
        deaths == 1 && s.live_workers == 0,
        "one death, no live worker: {s:?}"
    );
}

#[test]
fn loop_finished_against_drain_concurrently() {
    check(
        "loop_finished_against_drain_concurrently",
        EXHAUSTIVE,
        || loop_finished_against_drain(),
    );
}

#[test]
fn loop_finished_drain_and_deregister_concurrently() {
    check(
        "loop_finished_drain_and_deregister_concurrently",
        BOUNDED,
        || three_way_death(),
    );
}
