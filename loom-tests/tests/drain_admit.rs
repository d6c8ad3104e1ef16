//! Race 5: draining a worker against a delivery for its target.
//!
//! Invariant `no-assignment-after-drain`: once `drain` has returned (seen through a flag the
//! draining thread sets afterwards), no delivery is assigned to that worker; and an assignment that
//! does land on it was first, so drain saw it busy: drain answered `Draining`, not `Exited`, and
//! the worker ends draining with the assignment rather than dead.
//! Guard: drain and assign are each one CAS on the state word.
//! Twins: `twins/transition-load-store.patch` (drain decides "idle: exit now" on a load, then stores it over
//! the assignment that made the worker busy) for the idle model; `twins/assign-onto-draining.patch`
//! (the assignment refuses only a dead worker, so a busy one being drained still takes deliveries)
//! for the busy model.
#![cfg(worker_registry_loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom_tests::{check, event, invariant, registry, spawn, target, EXHAUSTIVE};
use worker_registry::{Admission, DeadReason, Rejection, Status};

fn drain_against_admit(idle: bool) {
    let (reg, _clock) = registry(4);
    let t = target(1);
    let Admission::Assigned(first) = reg.admit(&t, &event(1)) else {
        panic!("first delivery is assigned");
    };
    let w = first.worker;
    if idle {
        // Its loop finished: the worker is active and idle, so drain would exit it at once.
        assert_eq!(reg.loop_finished(w), Ok(Status::Active));
    }
    let drained = Arc::new(AtomicBool::new(false));

    let drainer = {
        let (reg, drained) = (reg.clone(), drained.clone());
        spawn(move || {
            let r = reg.drain(w);
            // Release: whoever sees the flag sees everything drain did.
            drained.store(true, Ordering::Release);
            r
        })
    };
    // Acquire: pairs with the Release above.
    let after_drain = drained.load(Ordering::Acquire);
    let admitted = reg.admit(&t, &event(2));
    let drain = drainer.join().unwrap();

    let on_w = matches!(&admitted, Admission::Assigned(a) if a.worker == w);
    invariant!(
        "no-assignment-after-drain",
        !(after_drain && on_w),
        "assigned to {w} after drain returned {drain:?}: {admitted:?}"
    );
    let status = reg.worker(w).map(|i| i.status);
    if on_w {
        invariant!(
            "no-assignment-after-drain",
            drain == Ok(Status::Draining) && status == Some(Status::Draining),
            "an assignment landed on {w}, but drain returned {drain:?} and it ends {status:?}"
        );
    } else {
        let expected_drain = if idle {
            Status::Dead(DeadReason::Exited)
        } else {
            Status::Draining
        };
        invariant!(
            "no-assignment-after-drain",
            drain == Ok(expected_drain) && status == Some(expected_drain),
            "not assigned to {w}, so drain ({drain:?}) decided alone; it ends {status:?}"
        );
        let ok = match &admitted {
            // Idle: drain exited it at once and unmapped the target; a new worker takes it.
            Admission::Assigned(a) => idle && a.new && a.worker != w,
            Admission::Rejected(Rejection::TargetDraining { worker }) => !idle && *worker == w,
            _ => false,
        };
        invariant!(
            "no-assignment-after-drain",
            ok,
            "unexpected admission {admitted:?} (idle={idle}, drain {drain:?})"
        );
    }
    // Whatever the order, one worker is alive: `w` (busy or draining) or its replacement.
    invariant!(
        "no-assignment-after-drain",
        reg.live_workers() == 1,
        "live_workers() is {}, expected 1",
        reg.live_workers()
    );
}

#[test]
fn drain_idle_worker_against_admit() {
    check("drain_idle_worker_against_admit", EXHAUSTIVE, || {
        drain_against_admit(true)
    });
}

#[test]
fn drain_busy_worker_against_admit() {
    check("drain_busy_worker_against_admit", EXHAUSTIVE, || {
        drain_against_admit(false)
    });
}
