//! Race 9: a drained worker's drain deadline passes while its loop ends and it heartbeats.
//!
//! Invariant `drain-deadline-dies-once`: the sweep's `DrainTimedOut` and the worker's own
//! `loop_finished` (`Exited`) race for one death: exactly one wins, the worker ends dead with the
//! winner's reason, one death is counted and the capacity slot is freed once; the loser is refused
//! with the winner's reason; the racing heartbeat is answered `Draining` or refused with that
//! reason, never `Active`; and the worker's in-flight delivery is released for re-dispatch exactly
//! once over two sweeps.
//! Guard: the deadline kill and the loop's end are each one CAS on the state word, and only the
//! CAS that makes the worker dead does the death bookkeeping.
//! Three racers: explored up to 3 preemptions (exhaustively it takes about three minutes).
//! Twins: `twins/transition-load-store.patch` (load, decide, store) and
//! `twins/overdue-kill-without-cas.patch` (the sweep does the bookkeeping even when its transition
//! changed nothing).
#![cfg(worker_registry_loom)]

use std::time::Duration;

use loom_tests::{check, event, invariant, registry, spawn, target, BOUNDED};
use worker_registry::{Admission, DeadReason, HeartbeatAck, RegistryError, ReleaseReason, Status};

fn deadline_against_loop_end_and_heartbeat() {
    let (reg, clock) = registry(4);
    let (t, e) = (target(1), event(1));
    let Admission::Assigned(a) = reg.admit(&t, &e) else {
        panic!("first delivery is assigned");
    };
    let w = a.worker;
    assert_eq!(
        reg.drain_within(w, Duration::from_millis(500)),
        Ok(Status::Draining)
    );
    // Past the drain deadline, well within the heartbeat timeout.
    clock.advance(Duration::from_millis(501));

    let sweeper = {
        let reg = reg.clone();
        spawn(move || reg.sweep())
    };
    let looper = {
        let reg = reg.clone();
        spawn(move || reg.loop_finished(w))
    };
    let beat = reg.heartbeat(w);
    let report = sweeper.join().unwrap();
    let finished = looper.join().unwrap();

    let timed_out = report.died.contains(&(w, DeadReason::DrainTimedOut));
    let exited = finished == Ok(Status::Dead(DeadReason::Exited));
    invariant!(
        "drain-deadline-dies-once",
        timed_out != exited,
        "sweep died {:?}, loop_finished {finished:?}",
        report.died
    );
    let winner = if timed_out {
        DeadReason::DrainTimedOut
    } else {
        DeadReason::Exited
    };
    if timed_out {
        invariant!(
            "drain-deadline-dies-once",
            finished
                == Err(RegistryError::WorkerDead {
                    id: w,
                    reason: winner
                }),
            "the loop's end lost to the deadline but got {finished:?}"
        );
    }
    invariant!(
        "drain-deadline-dies-once",
        matches!(beat, Ok(HeartbeatAck::Draining))
            || beat
                == Err(RegistryError::WorkerDead {
                    id: w,
                    reason: winner
                }),
        "heartbeat answered {beat:?} (winner {winner:?})"
    );
    let status = reg.worker(w).map(|i| i.status);
    let s = reg.stats();
    invariant!(
        "drain-deadline-dies-once",
        status == Some(Status::Dead(winner))
            && s.deaths(winner) == 1
            && s.deaths_exited + s.deaths_drain_timed_out == 1
            && s.live_workers == 0,
        "ends {status:?} with {s:?}"
    );
    let mut released = report.released.clone();
    released.extend(reg.sweep().released);
    let mine: Vec<_> = released.iter().filter(|r| r.delivery == e).collect();
    invariant!(
        "drain-deadline-dies-once",
        mine.len() == 1 && mine[0].reason == ReleaseReason::WorkerDied(winner),
        "the delivery must be released once, for the winner's reason: {released:?}"
    );
}

#[test]
fn drain_deadline_against_loop_end_and_heartbeat() {
    check(
        "drain_deadline_against_loop_end_and_heartbeat",
        BOUNDED,
        || deadline_against_loop_end_and_heartbeat(),
    );
}
