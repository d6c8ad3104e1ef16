//! Races through the seam on a multi-thread runtime, each racer on its own replica
//! ([`Fixture::replica`]), started together by a barrier, 20 rounds each on a fresh registry. What they check is that each call is one atomic step: the
//! outcomes must be explainable by some order of the calls.

use crate::WorkerRegistryExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;
use tokio::task::JoinHandle;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{
    Admission, AssignOutcome, ClaimOutcome, ClaimState, DeadReason, HeartbeatAck, Maintenance,
    RegistryError, Rejection, ReleaseReason, Status, WorkerId, WorkerRegistry,
};

async fn join_all<T>(tasks: Vec<JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("a racer panicked"));
    }
    out
}

/// One delivery raced by many replicas is assigned exactly once; every other racer gets a
/// duplicate naming the winner; one worker exists. The same for a bare claim.
pub async fn one_delivery_raced_by_many_replicas_is_assigned_once<F: Fixture>(fixture: &F) {
    for round in 0..ROUNDS {
        let r = registry(fixture, config().max_workers(RACERS)).await;
        let barrier = Arc::new(Barrier::new(RACERS));
        let (target, delivery) = (t(1), d(&format!("race-{round}")));
        let mut tasks = Vec::new();
        for h in replicas(fixture, &r, RACERS).await {
            let (barrier, target, delivery) = (barrier.clone(), target.clone(), delivery.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let admitted = h.admit(&target, &delivery).await.expect("admit");
                let claimed = h.claim(&target, &d("bare")).await.expect("claim");
                (admitted, claimed)
            }));
        }
        let outcomes = join_all(tasks).await;
        let winners: Vec<_> = outcomes
            .iter()
            .filter_map(|(a, _)| match a {
                Admission::Assigned(a) => Some(*a),
                _ => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        assert!(winners[0].new);
        for (a, _) in &outcomes {
            if let Admission::Duplicate(dup) = a {
                assert_eq!(dup.holder, Some(winners[0].worker), "round {round}");
                assert_eq!(dup.state, ClaimState::InFlight);
            }
        }
        let claimed = outcomes
            .iter()
            .filter(|(_, c)| *c == ClaimOutcome::Claimed)
            .count();
        assert_eq!(
            claimed, 1,
            "round {round}: one bare claim wins: {outcomes:?}"
        );

        sweep(&r).await;
        assert_eq!(r.status().capacity.used, 1, "round {round}");
        assert_eq!(info(&r, winners[0].worker).await.status, Status::Active);
    }
}

/// New targets racing for the last free slots from many replicas (by `admit`, `assign` and
/// `register`) get exactly as many workers as there were slots; every other one is refused with
/// `CapacityFull`; afterwards exactly `max_workers` are alive.
pub async fn racing_new_targets_never_exceed_capacity<F: Fixture>(fixture: &F) {
    const LIMIT: usize = 5;
    const TAKEN: usize = 3;
    const PER_RACER: u64 = 6;
    let full = Rejection::CapacityFull { limit: LIMIT };
    for round in 0..ROUNDS {
        let r = registry(fixture, config().max_workers(LIMIT)).await;
        for n in 0..TAKEN as u64 {
            assigned(r.admit(&t(1000 + n), &d("taken")).await);
        }
        let barrier = Arc::new(Barrier::new(RACERS));
        let mut tasks = Vec::new();
        for (k, h) in replicas(fixture, &r, RACERS).await.into_iter().enumerate() {
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let mut created: Vec<WorkerId> = Vec::new();
                for i in 0..PER_RACER {
                    let target = t(1 + k as u64 * 100 + i);
                    let made = match (k as u64 + i) % 3 {
                        0 => match h.admit(&target, &d("new")).await.expect("admit") {
                            Admission::Assigned(a) if a.new => Some(a.worker),
                            Admission::Rejected(rej) => {
                                assert_eq!(rej, full);
                                None
                            }
                            other => panic!("a new target: {other:?}"),
                        },
                        1 => match h.assign(&target).await.expect("assign") {
                            AssignOutcome::Assigned(a) if a.new => Some(a.worker),
                            AssignOutcome::Rejected(rej) => {
                                assert_eq!(rej, full);
                                None
                            }
                            other => panic!("a new target: {other:?}"),
                        },
                        _ => match h.register().await {
                            Ok(w) => Some(w),
                            Err(e) => {
                                assert_eq!(e, RegistryError::Rejected(full));
                                None
                            }
                        },
                    };
                    created.extend(made);
                }
                created
            }));
        }
        let created: Vec<WorkerId> = join_all(tasks).await.into_iter().flatten().collect();
        assert_eq!(created.len(), LIMIT - TAKEN, "round {round}: {created:?}");
        for w in &created {
            assert!(info(&r, *w).await.status.is_alive());
        }
        sweep(&r).await;
        let s = r.status();
        assert_eq!(s.capacity.used, LIMIT, "round {round}");
        assert_eq!(
            s.workers.iter().filter(|w| w.status.is_alive()).count(),
            LIMIT
        );
    }
}

/// Heartbeats racing the sweep that would kill their (silent) workers: each worker either lives,
/// and every heartbeat to it was accepted, or died in that sweep, and every heartbeat to it was
/// refused as dead; never an accepted heartbeat from a worker the sweep declared dead.
pub async fn a_heartbeat_racing_the_sweep_is_accepted_or_dead_never_both<F: Fixture>(fixture: &F) {
    const WORKERS: usize = 8;
    const BEATERS: usize = 2;
    for round in 0..ROUNDS {
        // No brake: the sweep kills every worker it finds silent.
        let f = Fleet::new(fixture, WORKERS, config().brake_fraction(1.0)).await;
        fixture.advance(&f.r, TIMEOUT + PAST).await;
        let barrier = Arc::new(Barrier::new(1 + BEATERS));
        let sweeper = fixture.replica(&f.r).await;
        let sweep_task = {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                swept(sweeper.sweep().await)
            })
        };
        let mut beat_tasks = Vec::new();
        for (k, h) in replicas(fixture, &f.r, BEATERS)
            .await
            .into_iter()
            .enumerate()
        {
            let (barrier, mut ids) = (barrier.clone(), f.workers.clone());
            if k % 2 == 1 {
                ids.reverse();
            }
            beat_tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let mut out = Vec::new();
                for id in ids {
                    out.push((id, h.heartbeat(id).await));
                    tokio::task::yield_now().await;
                }
                out
            }));
        }
        let report = sweep_task.await.expect("the sweeper panicked");
        let beats: Vec<(WorkerId, Result<HeartbeatAck, RegistryError>)> =
            join_all(beat_tasks).await.into_iter().flatten().collect();
        for id in &f.workers {
            let died = report.died.contains(&(*id, DeadReason::MissedHeartbeats));
            let dead = Err(RegistryError::WorkerDead {
                id: *id,
                reason: DeadReason::MissedHeartbeats,
            });
            for (_, beat) in beats.iter().filter(|(w, _)| w == id) {
                if died {
                    assert_eq!(beat, &dead, "round {round}: declared dead, yet: {beat:?}");
                } else {
                    assert_eq!(
                        beat,
                        &Ok(HeartbeatAck::Active),
                        "round {round}: alive, yet: {beat:?}"
                    );
                }
            }
            let status = info(&f.r, *id).await.status;
            let expected = if died {
                Status::Dead(DeadReason::MissedHeartbeats)
            } else {
                Status::Active
            };
            assert_eq!(status, expected, "round {round}: worker {id}");
        }
    }
}

/// Admissions racing the drain of their target's worker: each is assigned to the worker (it came
/// first) or refused with `TargetDraining`; none that started after the drain returned is assigned;
/// every assigned delivery is in flight on the worker, every refused one left no claim.
pub async fn nothing_is_assigned_to_a_worker_after_its_drain_returned<F: Fixture>(fixture: &F) {
    const ADMITTERS: usize = 2;
    const AFTER: usize = 3;
    const CAP: usize = 10_000;
    for round in 0..ROUNDS {
        let r = registry(fixture, config()).await;
        let target = t(1);
        let w = assigned(r.admit(&target, &d("first")).await).worker;
        let drained = Arc::new(AtomicBool::new(false));
        let barrier = Arc::new(Barrier::new(1 + ADMITTERS));
        let drainer = {
            let (h, barrier, drained) =
                (fixture.replica(&r).await, barrier.clone(), drained.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let status = h.drain_within(w, Duration::from_secs(3600)).await;
                // SeqCst: an admission that reads `true` started after the drain returned.
                drained.store(true, Ordering::SeqCst);
                status
            })
        };
        let mut tasks = Vec::new();
        for (k, h) in replicas(fixture, &r, ADMITTERS)
            .await
            .into_iter()
            .enumerate()
        {
            let (barrier, drained, target) = (barrier.clone(), drained.clone(), target.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let mut out = Vec::new();
                let mut after = 0;
                for i in 0..CAP {
                    // SeqCst: see the drainer.
                    let started_after = drained.load(Ordering::SeqCst);
                    let delivery = d(&format!("r{k}-{i}"));
                    let outcome = h.admit(&target, &delivery).await.expect("admit");
                    out.push((started_after, delivery, outcome));
                    if started_after {
                        after += 1;
                        if after == AFTER {
                            break;
                        }
                    }
                    tokio::task::yield_now().await;
                }
                out
            }));
        }
        assert_eq!(drainer.await.expect("drainer"), Ok(Status::Draining));
        let outcomes: Vec<_> = join_all(tasks).await.into_iter().flatten().collect();
        assert!(
            outcomes.iter().filter(|(after, ..)| *after).count() >= ADMITTERS * AFTER,
            "round {round}: the admitters kept going after the drain"
        );
        for (after, delivery, outcome) in &outcomes {
            match outcome {
                Admission::Assigned(a) => {
                    assert!(
                        !after,
                        "round {round}: {delivery:?} assigned after the drain"
                    );
                    assert_eq!((a.worker, a.new), (w, false));
                    let dup = duplicate(r.admit(&target, delivery).await);
                    assert_eq!((dup.holder, dup.state), (Some(w), ClaimState::InFlight));
                }
                Admission::Rejected(rej) => {
                    assert_eq!(*rej, Rejection::TargetDraining { worker: w });
                    assert_eq!(
                        r.release(&target, delivery).await,
                        Err(RegistryError::UnknownClaim {
                            target: target.clone(),
                            delivery: delivery.clone()
                        }),
                        "round {round}: a refused delivery left a claim"
                    );
                }
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(info(&r, w).await.status, Status::Draining);
        assert_eq!(r.heartbeat(w).await, Ok(HeartbeatAck::Draining));
    }
}

/// A worker's completion racing its death (it deregisters from another replica): exactly one wins.
/// Either the completion landed (the delivery is a completed duplicate and is not released) or it
/// was refused as released (and the sweep hands the delivery over for re-dispatch).
pub async fn a_completion_racing_the_workers_death_either_completes_or_is_released<F: Fixture>(
    fixture: &F,
) {
    // Which of the two wins a round is the scheduler's choice, so the case checks that each round
    // is exactly one of them, consistently, and nothing about how often each won (a count of the
    // two would add up to ROUNDS by construction).
    for round in 0..ROUNDS {
        let r = registry(fixture, config()).await;
        let (target, delivery) = (t(1), d("d"));
        let w = assigned(r.admit(&target, &delivery).await).worker;
        let barrier = Arc::new(Barrier::new(2));
        let [finisher, killer]: [F::Registry; 2] = replicas(fixture, &r, 2)
            .await
            .try_into()
            .unwrap_or_else(|_| unreachable!());
        let complete = {
            let (barrier, target, delivery) = (barrier.clone(), target.clone(), delivery.clone());
            async move {
                barrier.wait().await;
                finisher.complete_by(w, &target, &delivery).await
            }
        };
        let die = async move {
            barrier.wait().await;
            killer.deregister(w).await
        };
        // The task that reaches the barrier last runs on first: alternate who that is.
        let (complete, die) = if round % 2 == 0 {
            let complete = tokio::spawn(complete);
            (complete, tokio::spawn(die))
        } else {
            let die = tokio::spawn(die);
            (tokio::spawn(complete), die)
        };
        let completion = complete.await.expect("completer");
        assert_eq!(die.await.expect("killer"), Ok(DeadReason::Deregistered));
        let report = sweep(&r).await;
        match completion {
            Ok(()) => {
                assert!(
                    report.released.is_empty(),
                    "round {round}: completed and released"
                );
                assert_eq!(
                    duplicate(r.admit(&target, &delivery).await).state,
                    ClaimState::Completed
                );
            }
            Err(RegistryError::ClaimReleased { holder, reason, .. }) => {
                assert_eq!(holder, Some(w));
                assert_eq!(reason, ReleaseReason::WorkerDied(DeadReason::Deregistered));
                assert_eq!(released(&report), vec![(target.clone(), delivery.clone())]);
                assert!(assigned(r.admit(&target, &delivery).await).new);
            }
            Err(other) => panic!("round {round}: {other:?}"),
        }
    }
}
