//! Acceptance criteria AC1-AC6 and the DoD1 unit-test list, on a `ManualClock` (no sleeps).

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use worker_registry::{
    Activity, Admission, AssignOutcome, ClaimOutcome, ClaimState, DeadReason, DeliveryId,
    HeartbeatAck, InMemoryRegistry, ManualClock, PoolStatus, RegistryConfig, RegistryError,
    Rejection, ReleaseReason, Status, Target, WorkerId, WorkerKind,
};

const HB: Duration = Duration::from_secs(30);
const MISSED: u32 = 4;
const TIMEOUT: Duration = Duration::from_secs(120);
const MS: Duration = Duration::from_millis(1);

fn config() -> RegistryConfig {
    RegistryConfig::builder()
        .heartbeat_interval(HB)
        .missed_heartbeats(MISSED)
        .startup_grace(Duration::ZERO)
        .max_workers(3)
        .build()
        .unwrap()
}

fn registry() -> (InMemoryRegistry<ManualClock>, ManualClock) {
    registry_with(config())
}

fn registry_with(config: RegistryConfig) -> (InMemoryRegistry<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (InMemoryRegistry::with_clock(config, clock.clone()), clock)
}

fn t(repo: &str, n: u64) -> Target {
    Target::new(repo, n).unwrap()
}

fn e(id: &str) -> DeliveryId {
    DeliveryId::new(id).unwrap()
}

fn assigned(a: Admission) -> worker_registry::Assignment {
    match a {
        Admission::Assigned(a) => a,
        other => panic!("expected Assigned, got {other:?}"),
    }
}

// ---- AC1: per-worker record ---------------------------------------------------------------------

#[test]
fn ac1_record_holds_id_target_start_heartbeat_and_status() {
    let (r, clock) = registry();
    clock.advance(Duration::from_secs(10));
    let a = assigned(r.admit(&t("o/r", 5), &e("d1")));
    clock.advance(Duration::from_secs(3));
    r.heartbeat(a.worker).unwrap();
    clock.advance(Duration::from_secs(2));

    let w = r.worker(a.worker).expect("record exists");
    assert_eq!(w.id, a.worker);
    assert_eq!(w.target, Some(t("o/r", 5)));
    assert_eq!(w.kind, WorkerKind::Spawned);
    assert_eq!(w.status, Status::Active);
    assert_eq!(w.activity, Activity::Busy, "created for an event");
    assert_eq!(w.pool_status(), PoolStatus::Busy);
    assert!(w.has_heartbeated);
    assert_eq!(w.heartbeat_age, Duration::from_secs(2));
    assert_eq!(w.uptime, Duration::from_secs(5));
    assert_eq!(
        w.last_heartbeat.duration_since(w.started_at).unwrap(),
        Duration::from_secs(3),
        "wall-clock display times derive from the monotonic clock"
    );
    assert_eq!(w.token, a.token);
    assert_eq!(w.died_at, None);
}

#[test]
fn ac1_worker_ids_are_never_reused() {
    let (r, clock) = registry();
    let mut seen = HashSet::new();
    for round in 0..5 {
        let a = assigned(r.admit(&t("o/r", 1), &e(&format!("d{round}"))));
        assert!(seen.insert(a.worker), "id {} reused", a.worker);
        r.deregister(a.worker).unwrap();
        clock.advance(Duration::from_secs(3600));
        r.sweep(); // purges the dead record: its id must still not come back
    }
}

#[test]
fn ac1_status_is_forward_only_and_dead_is_terminal() {
    let (r, _clock) = registry();
    let a = assigned(r.admit(&t("o/r", 1), &e("d")));
    assert_eq!(r.drain(a.worker), Ok(Status::Draining));
    assert_eq!(
        r.loop_started(a.worker),
        Ok(Status::Draining),
        "no way back"
    );
    assert_eq!(
        r.loop_finished(a.worker),
        Ok(Status::Dead(DeadReason::Exited))
    );
    let dead = Err(RegistryError::WorkerDead {
        id: a.worker,
        reason: DeadReason::Exited,
    });
    assert_eq!(r.heartbeat(a.worker).map(|_| ()), dead.clone());
    assert_eq!(r.loop_started(a.worker).map(|_| ()), dead.clone());
    assert_eq!(r.drain(a.worker).map(|_| ()), dead.clone());
    assert_eq!(r.deregister(a.worker).map(|_| ()), dead);
}

// ---- AC2: idempotency ---------------------------------------------------------------------------

#[test]
fn ac2_duplicate_claim_is_rejected_with_holder_and_time() {
    let (r, clock) = registry();
    let (target, event) = (t("o/r", 9), e("delivery-1"));
    let a = assigned(r.admit(&target, &event));
    clock.advance(Duration::from_secs(1));
    let Admission::Duplicate(d) = r.admit(&target, &event) else {
        panic!("redelivery must be a duplicate")
    };
    assert_eq!(d.holder, Some(a.worker));
    assert_eq!(d.state, ClaimState::InFlight);
    assert_eq!(r.stats().admitted_new, 1, "no second worker spawned");
    assert_eq!(r.live_workers(), 1);

    // The same delivery id on another target is a different claim.
    assert!(matches!(
        r.admit(&t("o/other", 9), &event),
        Admission::Assigned(_)
    ));
}

#[test]
fn ac2_bare_claim_is_idempotent_and_releasable() {
    let (r, _clock) = registry();
    let (target, event) = (t("o/r", 1), e("x"));
    assert_eq!(r.claim(&target, &event), ClaimOutcome::Claimed);
    let ClaimOutcome::AlreadyClaimed(d) = r.claim(&target, &event) else {
        panic!()
    };
    assert_eq!(d.holder, None, "a bare claim is bound to no worker");
    r.release(&target, &event).unwrap();
    assert_eq!(r.claim(&target, &event), ClaimOutcome::Claimed);
    assert!(matches!(
        r.release(&t("o/r", 2), &event),
        Err(RegistryError::UnknownClaim { .. })
    ));
}

#[test]
fn ac2_unbound_claim_is_released_after_the_heartbeat_timeout() {
    let (r, clock) = registry();
    let (target, event) = (t("o/r", 1), e("x"));
    r.claim(&target, &event);
    clock.advance(TIMEOUT);
    assert!(matches!(
        r.claim(&target, &event),
        ClaimOutcome::AlreadyClaimed(_)
    ));
    clock.advance(MS);
    let report = r.sweep();
    assert_eq!(
        report.released_pairs(),
        vec![(target.clone(), event.clone())]
    );
    assert_eq!(r.claim(&target, &event), ClaimOutcome::Claimed);
}

#[test]
fn ac2_duplicate_claim_from_many_threads_has_exactly_one_winner() {
    for round in 0..50 {
        let (r, _clock) = registry();
        let target = t("o/r", 1);
        let event = e(&format!("race-{round}"));
        let threads = 4;
        let barrier = Arc::new(Barrier::new(threads));
        let outcomes: Vec<Admission> = (0..threads)
            .map(|_| {
                let (r, target, event, barrier) =
                    (r.clone(), target.clone(), event.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    r.admit(&target, &event)
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let winners: Vec<_> = outcomes
            .iter()
            .filter_map(|o| match o {
                Admission::Assigned(a) => Some(a.worker),
                _ => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        for o in &outcomes {
            if let Admission::Duplicate(d) = o {
                assert_eq!(d.holder, Some(winners[0]));
            }
        }
        assert_eq!(r.live_workers(), 1);
        assert_eq!(r.stats().duplicates, threads as u64 - 1);
    }
}

#[test]
fn ac2_completed_claim_is_retained_for_late_redeliveries_then_forgotten() {
    let config = RegistryConfig::builder()
        .claim_retention(Duration::from_secs(3600))
        .build()
        .unwrap();
    let (r, clock) = registry_with(config);
    let (target, event) = (t("o/r", 1), e("d"));
    let a = assigned(r.admit(&target, &event));
    r.complete(&target, &event).unwrap();
    r.complete(&target, &event).unwrap(); // idempotent
    r.deregister(a.worker).unwrap(); // the worker is gone; the claim stays
    clock.advance(Duration::from_secs(3600));
    r.sweep();
    let Admission::Duplicate(d) = r.admit(&target, &event) else {
        panic!("still within retention")
    };
    assert_eq!(d.state, ClaimState::Completed);
    clock.advance(MS);
    let report = r.sweep();
    assert_eq!(report.expired_claims, 1);
    assert!(matches!(r.admit(&target, &event), Admission::Assigned(_)));
}

#[test]
fn ac2_retained_claims_are_bounded_oldest_evicted_first() {
    let config = RegistryConfig::builder()
        .max_retained_claims(3)
        .max_workers(10)
        .build()
        .unwrap();
    let (r, clock) = registry_with(config);
    let target = t("o/r", 1);
    for i in 0..5 {
        r.admit(&target, &e(&format!("d{i}")));
        r.complete(&target, &e(&format!("d{i}"))).unwrap();
        clock.advance(Duration::from_secs(1));
    }
    // Eviction happens at completion time when far over the limit, and at every sweep otherwise.
    r.sweep();
    assert_eq!(r.stats().claims_evicted, 2);
    assert_eq!(r.stats().retained_claims, 3);
    assert_eq!(r.status().claims.retained, 3);
    for i in 0..2 {
        assert!(
            matches!(
                r.claim(&target, &e(&format!("d{i}"))),
                ClaimOutcome::Claimed
            ),
            "d{i} is among the oldest and was evicted"
        );
    }
    for i in 2..5 {
        assert!(
            matches!(
                r.claim(&target, &e(&format!("d{i}"))),
                ClaimOutcome::AlreadyClaimed(_)
            ),
            "d{i} is among the newest and is kept"
        );
    }
}

#[test]
fn ac2_admit_rejected_leaves_no_claim_behind() {
    let config = RegistryConfig::builder().max_workers(1).build().unwrap();
    let (r, _clock) = registry_with(config);
    let first = assigned(r.admit(&t("o/a", 1), &e("a")));
    let (target, event) = (t("o/b", 1), e("b"));
    assert_eq!(
        r.admit(&target, &event),
        Admission::Rejected(Rejection::CapacityFull { limit: 1 })
    );
    assert_eq!(r.claim_count(), 1, "only the first delivery's claim");
    assert!(matches!(
        r.complete(&target, &event),
        Err(RegistryError::UnknownClaim { .. })
    ));
    // Capacity frees up: the redelivery is admitted, not treated as a duplicate.
    r.deregister(first.worker).unwrap();
    assert!(matches!(r.admit(&target, &event), Admission::Assigned(_)));
}

// ---- AC3: assignment ----------------------------------------------------------------------------

#[test]
fn ac3_same_target_maps_to_same_worker_while_active() {
    let (r, _clock) = registry();
    let target = t("o/r", 1);
    let first = assigned(r.admit(&target, &e("1")));
    assert!(first.new);
    let mut last = first.token;
    for i in 2..10 {
        let a = assigned(r.admit(&target, &e(&i.to_string())));
        assert_eq!(a.worker, first.worker);
        assert!(!a.new);
        assert!(a.token > last, "fencing token increases");
        last = a.token;
    }
    let AssignOutcome::Assigned(a) = r.assign(&target) else {
        panic!()
    };
    assert_eq!(a.worker, first.worker);
    assert_eq!(r.live_workers(), 1);
}

#[test]
fn ac3_capacity_rejects_new_targets_but_not_existing_ones() {
    let (r, _clock) = registry(); // max 3
    for n in 1..=3 {
        assigned(r.admit(&t("o/r", n), &e(&format!("e{n}"))));
    }
    assert_eq!(
        r.assign(&t("o/r", 4)),
        AssignOutcome::Rejected(Rejection::CapacityFull { limit: 3 })
    );
    assert!(matches!(r.assign(&t("o/r", 2)), AssignOutcome::Assigned(_)));
    assert!(matches!(
        r.register(),
        Err(RegistryError::Rejected(Rejection::CapacityFull {
            limit: 3
        }))
    ));
    assert_eq!(r.stats().rejected_capacity, 1);
}

#[test]
fn ac3_capacity_is_never_exceeded_by_racing_threads() {
    for round in 0..20 {
        let config = RegistryConfig::builder().max_workers(5).build().unwrap();
        let (r, _clock) = registry_with(config);
        let barrier = Arc::new(Barrier::new(4));
        let created: usize = (0..4)
            .map(|th| {
                let (r, barrier) = (r.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    (0..10)
                        .filter(|i| {
                            let target = Target::new("o/r", 1 + th * 100 + i).unwrap();
                            matches!(r.assign(&target), AssignOutcome::Assigned(a) if a.new)
                        })
                        .count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(created, 5, "round {round}");
        assert_eq!(r.live_workers(), 5);
        r.sweep();
        assert_eq!(r.status().capacity.used, 5);
    }
}

#[test]
fn ac3_draining_target_gets_no_second_worker_until_the_first_is_dead() {
    let (r, _clock) = registry();
    let target = t("o/r", 1);
    let a = assigned(r.admit(&target, &e("1")));
    r.drain(a.worker).unwrap();
    assert_eq!(
        r.admit(&target, &e("2")),
        Admission::Rejected(Rejection::TargetDraining { worker: a.worker })
    );
    assert_eq!(r.claim_count(), 1, "the rejected delivery left no claim");
    r.loop_finished(a.worker).unwrap();
    let b = assigned(r.admit(&target, &e("2")));
    assert!(b.new);
    assert_ne!(b.worker, a.worker);
    assert!(b.token > a.token, "the new owner's tokens are higher");
}

// ---- AC4: stale detection -----------------------------------------------------------------------

#[test]
fn ac4_missing_n_intervals_is_dead_and_releases_target_and_claims() {
    let (r, clock) = registry();
    let target = t("o/r", 1);
    let event = e("in-flight");
    let a = assigned(r.admit(&target, &event));
    r.heartbeat(a.worker).unwrap();

    clock.advance(TIMEOUT); // exactly N intervals: not yet
    assert!(r.sweep().died.is_empty());
    assert_eq!(r.heartbeat(a.worker), Ok(HeartbeatAck::Active));

    clock.advance(TIMEOUT + MS);
    let report = r.sweep();
    assert_eq!(report.died, vec![(a.worker, DeadReason::MissedHeartbeats)]);
    assert_eq!(report.released_targets, vec![target.clone()]);
    assert_eq!(
        report.released_pairs(),
        vec![(target.clone(), event.clone())]
    );
    assert_eq!(r.live_workers(), 0);
    assert_eq!(
        r.heartbeat(a.worker),
        Err(RegistryError::WorkerDead {
            id: a.worker,
            reason: DeadReason::MissedHeartbeats
        }),
        "a dead worker's heartbeat is refused: it is fenced"
    );
    // Target unassigned: the redelivery of the released event runs on a new worker.
    let b = assigned(r.admit(&target, &event));
    assert!(b.new);
    assert_ne!(b.worker, a.worker);
    assert_eq!(r.stats().deaths_missed_heartbeats, 1);
    assert_eq!(r.stats().claims_released, 1);
}

#[test]
fn ac4_heartbeats_keep_a_worker_alive_indefinitely() {
    let (r, clock) = registry();
    let w = r.register().unwrap();
    for _ in 0..100 {
        clock.advance(HB);
        assert_eq!(w.heartbeat(), Ok(HeartbeatAck::Active));
        assert!(r.sweep().died.is_empty());
    }
}

#[test]
fn ac4_new_worker_is_measured_from_its_assignment_with_startup_grace() {
    let config = RegistryConfig::builder()
        .startup_grace(Duration::from_secs(30))
        .build()
        .unwrap();
    let (r, clock) = registry_with(config);
    clock.advance(Duration::from_secs(1000)); // time before creation does not count
    let a = assigned(r.admit(&t("o/r", 1), &e("d")));
    clock.advance(TIMEOUT + Duration::from_secs(30));
    assert!(r.sweep().died.is_empty(), "within timeout + start-up grace");
    clock.advance(MS);
    assert_eq!(r.sweep().died.len(), 1);
    assert!(r.heartbeat(a.worker).is_err());
}

#[test]
fn ac4_dead_record_is_purged_after_retention() {
    let config = RegistryConfig::builder()
        .dead_retention(Duration::from_secs(60))
        .build()
        .unwrap();
    let (r, clock) = registry_with(config);
    let w = r.register().unwrap();
    w.deregister().unwrap();
    r.sweep();
    assert_eq!(r.status().counts.dead, 1);
    clock.advance(Duration::from_secs(61));
    assert_eq!(r.sweep().purged_workers, 1);
    assert_eq!(r.status().workers.len(), 0);
    assert_eq!(
        r.heartbeat(w.id()),
        Err(RegistryError::UnknownWorker { id: w.id() })
    );
}

// ---- AC5: drain ---------------------------------------------------------------------------------

#[test]
fn ac5_drain_then_loop_finishes_then_dead_exited() {
    let (r, _clock) = registry();
    let target = t("o/r", 1);
    let a = assigned(r.admit(&target, &e("1")));
    assert_eq!(r.drain(a.worker), Ok(Status::Draining));
    assert_eq!(r.drain(a.worker), Ok(Status::Draining), "idempotent");
    assert_eq!(
        r.heartbeat(a.worker),
        Ok(HeartbeatAck::Draining),
        "heartbeats still accepted, and tell the worker to wind down"
    );
    assert!(matches!(
        r.admit(&target, &e("2")),
        Admission::Rejected(Rejection::TargetDraining { .. })
    ));
    // The in-flight event can still be completed.
    r.complete(&target, &e("1")).unwrap();
    assert_eq!(
        r.loop_finished(a.worker),
        Ok(Status::Dead(DeadReason::Exited))
    );
    assert_eq!(r.live_workers(), 0);
    assert_eq!(
        r.drain(a.worker),
        Err(RegistryError::WorkerDead {
            id: a.worker,
            reason: DeadReason::Exited
        }),
        "draining a dead worker returns its status"
    );
    assert_eq!(r.stats().deaths_exited, 1);
}

#[test]
fn ac5_idle_worker_has_no_loop_to_finish_and_exits_on_drain() {
    let (r, _clock) = registry();
    let w = r.register().unwrap(); // pool workers start idle
    assert_eq!(r.drain(w.id()), Ok(Status::Dead(DeadReason::Exited)));
    let a = assigned(r.admit(&t("o/r", 1), &e("1")));
    r.loop_finished(a.worker).unwrap(); // idle now
    assert_eq!(r.drain(a.worker), Ok(Status::Dead(DeadReason::Exited)));
}

#[test]
fn ac5_drained_worker_exiting_releases_its_unfinished_events() {
    let (r, _clock) = registry();
    let (target, event) = (t("o/r", 1), e("unfinished"));
    let a = assigned(r.admit(&target, &event));
    r.drain(a.worker).unwrap();
    assert_eq!(r.deregister(a.worker), Ok(DeadReason::Exited));
    let report = r.sweep();
    assert_eq!(
        report.released_pairs(),
        vec![(target.clone(), event.clone())]
    );
    assert!(matches!(r.admit(&target, &event), Admission::Assigned(_)));
}

#[test]
fn ac5_drain_all_drains_busy_and_retires_idle() {
    let (r, _clock) = registry();
    let busy = assigned(r.admit(&t("o/r", 1), &e("1")));
    let idle = r.register().unwrap();
    let all = r.drain_all();
    assert_eq!((all.draining, all.exited), (1, 1));
    assert_eq!(r.worker(busy.worker).unwrap().status, Status::Draining);
    assert_eq!(
        r.worker(idle.id()).unwrap().status,
        Status::Dead(DeadReason::Exited)
    );
}

// ---- AC6: status snapshot -----------------------------------------------------------------------

#[test]
fn ac6_snapshot_lists_every_worker_and_counts_agree() {
    let (r, clock) = registry_with(
        RegistryConfig::builder()
            .max_workers(10)
            .startup_grace(Duration::ZERO)
            .build()
            .unwrap(),
    );
    let a = assigned(r.admit(&t("o/r", 1), &e("1")));
    let b = assigned(r.admit(&t("o/r", 2), &e("2")));
    let c = r.register().unwrap();
    let d = r.register().unwrap();
    r.drain(b.worker).unwrap();
    d.deregister().unwrap();
    clock.advance(Duration::from_secs(1));
    let before = r.status();
    let report = r.sweep();
    let s = r.status();
    assert!(s.version > before.version);
    assert_eq!(s.version, report.version);
    assert_eq!(s.workers.len(), 4);
    assert_eq!(
        (s.counts.active, s.counts.draining, s.counts.dead),
        (2, 1, 1)
    );
    assert_eq!(s.counts.busy, 2, "a (new) and b (draining, busy)");
    assert_eq!(s.counts.idle, 1, "c (registered)");
    assert_eq!(s.capacity.used, 3);
    assert_eq!(s.capacity.limit, 10);
    assert_eq!(s.worker(a.worker).unwrap().status, Status::Active);
    assert_eq!(s.worker(c.id()).unwrap().kind, WorkerKind::Registered);
    assert_eq!(
        s.worker(d.id()).unwrap().status,
        Status::Dead(DeadReason::Deregistered)
    );
    assert_eq!(s.claims.in_flight, 2);
    assert_eq!(
        s.counts,
        worker_registry::StatusCounts::of(&s.workers),
        "counts are derived from the list"
    );
}

#[test]
fn ac6_snapshot_is_immutable_for_its_readers() {
    let (r, _clock) = registry();
    r.sweep();
    let held = r.status();
    assigned(r.admit(&t("o/r", 1), &e("1")));
    r.sweep();
    assert!(held.workers.is_empty(), "a reader's snapshot never changes");
    assert_eq!(r.status().workers.len(), 1);
}

// ---- errors -------------------------------------------------------------------------------------

#[test]
fn unknown_worker_is_a_typed_error_for_every_worker_call() {
    let (r, _clock) = registry();
    let id = WorkerId::new(12345);
    let unknown = RegistryError::UnknownWorker { id };
    assert_eq!(r.heartbeat(id), Err(unknown.clone()));
    assert_eq!(r.drain(id), Err(unknown.clone()));
    assert_eq!(r.loop_started(id), Err(unknown.clone()));
    assert_eq!(r.loop_finished(id), Err(unknown.clone()));
    assert_eq!(r.deregister(id), Err(unknown.clone()));
    assert_eq!(r.handle(id).map(|_| ()), Err(unknown));
    assert!(r.worker(id).is_none());
    assert_eq!(r.stats().heartbeats_refused, 1);
}

#[test]
fn complete_after_the_worker_died_is_refused_as_released() {
    let (r, clock) = registry();
    let (target, event) = (t("o/r", 1), e("d"));
    let a = assigned(r.admit(&target, &event));
    clock.advance(TIMEOUT + MS);
    r.sweep();
    assert_eq!(
        r.complete(&target, &event),
        Err(RegistryError::UnknownClaim {
            target: target.clone(),
            delivery: event.clone()
        }),
        "the sweep released and removed it"
    );
    // Released but not yet swept: refused with the holder named.
    let b = assigned(r.admit(&target, &event));
    r.deregister(b.worker).unwrap();
    assert_eq!(
        r.complete(&target, &event),
        Err(RegistryError::ClaimReleased {
            target,
            delivery: event,
            holder: Some(b.worker),
            reason: ReleaseReason::WorkerDied(DeadReason::Deregistered),
        })
    );
    assert_ne!(a.worker, b.worker);
}

#[test]
fn a_fenced_worker_cannot_complete_the_claim_of_its_successor() {
    let (r, clock) = registry();
    let (target, event) = (t("o/r", 1), e("d"));
    let old = assigned(r.admit(&target, &event));
    let old_handle = r.handle(old.worker).unwrap();
    clock.advance(TIMEOUT + MS);
    let report = r.sweep(); // old dies; its event is released and re-admitted
    assert_eq!(
        report.released_pairs(),
        vec![(target.clone(), event.clone())]
    );
    let new = assigned(r.admit(&target, &event));
    assert_ne!(new.worker, old.worker);

    // The dead worker's late completion must not complete the new worker's claim.
    assert_eq!(
        old_handle.complete(&target, &event),
        Err(RegistryError::NotHolder {
            target: target.clone(),
            delivery: event.clone(),
            holder: Some(new.worker),
            worker: old.worker,
        })
    );
    let Admission::Duplicate(d) = r.admit(&target, &event) else {
        panic!()
    };
    assert_eq!(d.holder, Some(new.worker));
    assert_eq!(
        d.state,
        ClaimState::InFlight,
        "still the new worker's, in flight"
    );
    r.handle(new.worker)
        .unwrap()
        .complete(&target, &event)
        .unwrap();
    let Admission::Duplicate(d) = r.admit(&target, &event) else {
        panic!()
    };
    assert_eq!(d.state, ClaimState::Completed);
}
