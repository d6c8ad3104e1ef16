//! The waiting room: parking of admissions that find no room, its bounds, promotion in arrival
//! order (round-robin across owners), a draining target's successor, expiry, and the room turned
//! off (`max_waiting` 0).

use crate::WorkerRegistryExt;
use std::collections::BTreeSet;
use std::time::Duration;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{
    Admission, ClaimState, DeadReason, DeliveryId, Event, ExpireReason, Maintenance, Rejection,
    ReleaseReason, ReleasedEvent, Status, Subscribe, Target, WorkerRegistry,
};

/// A registry that parks up to `max` deliveries, on two workers.
fn parking(max: usize) -> crate::config::RegistryConfigBuilder {
    config().max_workers(2).max_waiting(max)
}

/// Target `owner/repo#n`.
fn of(owner: &str, n: u64) -> Target {
    Target::new(&format!("{owner}/repo"), n).expect("a valid target")
}

/// The promoted events of a report, as (target, delivery), in report order; each is checked to
/// carry its assignment.
#[track_caller]
fn promoted(events: &[ReleasedEvent]) -> Vec<(Target, DeliveryId)> {
    events
        .iter()
        .filter(|e| e.reason == ReleaseReason::Promoted)
        .map(|e| {
            let a = e
                .assignment
                .expect("a promoted event carries its assignment");
            assert_eq!(e.holder, Some(a.worker), "{e:?}");
            (e.target.clone(), e.delivery.clone())
        })
        .collect()
}

/// The waiting position of an admission that must be parked.
#[track_caller]
fn waiting(a: Result<Admission, crate::RegistryError>) -> crate::Waiting {
    match a {
        Ok(Admission::Waiting(w)) => w,
        other => panic!("expected Waiting, got {other:?}"),
    }
}

/// With capacity full, new targets are parked in order (a redelivery of a parked one is a
/// `Waiting` duplicate); a completion promotes nothing; each death promotes the oldest waiting
/// target, with all of its deliveries, onto a new worker, handed over once with its assignment
/// (a redelivery of it is then an in-flight duplicate on that worker); counts and stats follow.
pub async fn a_full_registry_parks_and_deaths_promote_the_oldest_in_order<F: Fixture>(fixture: &F) {
    let r = registry(fixture, parking(8)).await;
    let w1 = assigned(r.admit(&t(1), &d("a")).await).worker;
    let w2 = assigned(r.admit(&t(2), &d("b")).await).worker;
    let first = waiting(r.admit(&t(3), &d("c")).await);
    assert_eq!(first.position, 1);
    assert_eq!(first.reason, Rejection::CapacityFull { limit: 2 });
    assert_eq!(waiting(r.admit(&t(4), &d("e")).await).position, 2);
    assert_eq!(waiting(r.admit(&t(3), &d("f")).await).position, 3);
    let dup = duplicate(r.admit(&t(3), &d("c")).await);
    assert_eq!((dup.holder, dup.state), (None, ClaimState::Waiting));
    // A sticky admission is not affected by the waiting room.
    assert_eq!(assigned(r.admit(&t(1), &d("g")).await).worker, w1);

    r.complete(&t(1), &d("a")).await.unwrap();
    let report = sweep(&r).await;
    assert!(
        promoted(&report.released).is_empty(),
        "a completion frees no slot"
    );
    assert_eq!((report.waiting, r.status().waiting), (3, 3));

    assert_eq!(r.deregister(w1).await, Ok(DeadReason::Deregistered));
    let report = sweep(&r).await;
    assert_eq!(
        promoted(&report.released),
        vec![(t(3), d("c")), (t(3), d("f"))],
        "the oldest target, with all of its deliveries in order: {report:?}"
    );
    let a = report.released[report.released.len() - 1]
        .assignment
        .expect("assignment");
    assert!(report
        .released
        .iter()
        .filter(|e| e.reason == ReleaseReason::Promoted)
        .all(|e| e.holder == Some(a.worker)));
    assert_eq!(report.waiting, 1);
    let dup = duplicate(r.admit(&t(3), &d("c")).await);
    assert_eq!(
        (dup.holder, dup.state),
        (Some(a.worker), ClaimState::InFlight)
    );
    assert!(
        promoted(&sweep(&r).await.released).is_empty(),
        "handed over once"
    );

    r.deregister(w2).await.unwrap();
    let report = sweep(&r).await;
    assert_eq!(promoted(&report.released), vec![(t(4), d("e"))]);
    assert_eq!(report.waiting, 0);
    assert_eq!(r.status().waiting, 0);
    let s = r.stats();
    assert_eq!(
        (s.parked, s.promoted, s.waiting_expired, s.waiting),
        (3, 3, 0, 0)
    );
}

/// A target whose worker drains parks its deliveries behind that worker: no sweep promotes them
/// while it lives (never two live workers for one target); once it has exited, the next sweep
/// promotes them onto a new worker, its successor, ahead of targets waiting for capacity.
pub async fn a_draining_targets_waiting_deliveries_go_to_its_successor<F: Fixture>(fixture: &F) {
    let r = registry(fixture, parking(8)).await;
    let old = assigned(r.admit(&t(1), &d("open")).await).worker;
    assigned(r.admit(&t(2), &d("other")).await);
    assert_eq!(r.drain(old).await, Ok(Status::Draining));
    let w = waiting(r.admit(&t(1), &d("reopened")).await);
    assert_eq!(w.reason, Rejection::TargetDraining { worker: old });
    waiting(r.admit(&t(3), &d("new")).await);
    waiting(r.admit(&t(1), &d("synchronize")).await);

    for _ in 0..2 {
        let report = sweep(&r).await;
        assert!(
            promoted(&report.released).is_empty(),
            "nothing promoted while the old worker lives: {report:?}"
        );
    }
    r.complete(&t(1), &d("open")).await.unwrap();
    assert_eq!(
        r.loop_finished(old).await,
        Ok(Status::Dead(DeadReason::Exited))
    );
    let report = sweep(&r).await;
    assert_eq!(
        promoted(&report.released),
        vec![(t(1), d("reopened")), (t(1), d("synchronize"))],
        "the successor first, with its deliveries in order: {report:?}"
    );
    let successor = report.released[0].assignment.expect("assignment");
    assert!(successor.new);
    assert_ne!(successor.worker, old);
    assert_eq!(info(&r, successor.worker).await.target, Some(t(1)));
    assert_eq!(report.waiting, 1, "t3 still waits for capacity");
}

/// The bounds: at most `max_waiting` deliveries wait, at most `max_waiting_per_owner` of one
/// owner; past them the answer is today's rejection with no claim left behind.
pub async fn the_waiting_rooms_bounds_hold<F: Fixture>(fixture: &F) {
    let r = registry(fixture, parking(3).max_waiting_per_owner(2)).await;
    assigned(r.admit(&t(1), &d("a")).await);
    assigned(r.admit(&t(2), &d("b")).await);
    waiting(r.admit(&of("big", 1), &d("1")).await);
    waiting(r.admit(&of("big", 2), &d("2")).await);
    assert_eq!(
        r.admit(&of("big", 3), &d("3")).await,
        Ok(Admission::Rejected(Rejection::CapacityFull { limit: 2 })),
        "the owner's share is full"
    );
    assert_eq!(waiting(r.admit(&of("small", 1), &d("4")).await).position, 3);
    assert_eq!(
        r.admit(&of("small", 2), &d("5")).await,
        Ok(Admission::Rejected(Rejection::CapacityFull { limit: 2 })),
        "the room is full"
    );
    assert_eq!(sweep(&r).await.waiting, 3);
    assert_eq!(r.stats().parked, 3);
    // No claim was left behind by the rejections: once there is room, they are admitted.
    assert!(matches!(
        r.admit(&of("big", 3), &d("3")).await,
        Ok(Admission::Rejected(_))
    ));
}

/// A delivery still waiting `max_wait` after it was parked is dropped by a sweep, with its
/// reason, listed in the report, counted, and published; its claim is gone (a redelivery is
/// parked anew).
pub async fn a_delivery_waiting_past_max_wait_is_dropped_and_published<F: Fixture>(fixture: &F) {
    let max_wait = Duration::from_secs(20);
    let r = registry(fixture, parking(8).max_wait(max_wait)).await;
    let mut events = r.subscribe();
    let w1 = assigned(r.admit(&t(1), &d("a")).await).worker;
    let w2 = assigned(r.admit(&t(2), &d("b")).await).worker;
    waiting(r.admit(&t(3), &d("late")).await);
    fixture.advance(&r, max_wait - MARGIN).await;
    r.heartbeat(w1).await.unwrap();
    r.heartbeat(w2).await.unwrap();
    assert!(sweep(&r).await.expired_waiting.is_empty(), "not yet");
    fixture.advance(&r, MARGIN + PAST).await;
    r.heartbeat(w1).await.unwrap();
    r.heartbeat(w2).await.unwrap();
    let report = sweep(&r).await;
    assert_eq!(report.expired_waiting.len(), 1, "{report:?}");
    let e = &report.expired_waiting[0];
    assert_eq!((&e.target, &e.delivery), (&t(3), &d("late")));
    assert_eq!(e.reason, ExpireReason::WaitedTooLong { limit: max_wait });
    assert!(e.waited > max_wait);
    assert_eq!((report.waiting, r.stats().waiting_expired), (0, 1));
    loop {
        match next_event(&mut events).await {
            Event::WaitingExpired {
                target,
                delivery,
                reason,
            } => {
                assert_eq!((target, delivery), (t(3), d("late")));
                assert_eq!(reason, ExpireReason::WaitedTooLong { limit: max_wait });
                break;
            }
            _ => continue,
        }
    }
    assert_eq!(waiting(r.admit(&t(3), &d("late")).await).position, 1);
}

/// Promotion takes one target per owner in turn, and a per-owner cap on live workers holds: a
/// busy owner's burst does not starve a quiet one, and the cap holds for admissions racing on
/// several handles.
pub async fn promotion_is_round_robin_and_the_owner_cap_holds<F: Fixture>(fixture: &F) {
    let r = registry(
        fixture,
        config()
            .max_workers(4)
            .max_waiting(64)
            .max_workers_per_owner(3),
    )
    .await;
    let others = replicas(fixture, &r, RACERS).await;
    // Racing new targets of one owner: at most 3 get a worker, the rest wait.
    let mut tasks = Vec::new();
    for (i, h) in others.iter().cloned().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for j in 0..3u64 {
                let n = (i as u64) * 10 + j + 1;
                out.push(h.admit(&of("big", n), &d(&format!("big-{n}"))).await);
            }
            out
        }));
    }
    let mut placed = Vec::new();
    for task in tasks {
        for a in task.await.expect("racer") {
            match a {
                Ok(Admission::Assigned(a)) => placed.push(a.worker),
                Ok(Admission::Waiting(_)) => {}
                other => panic!("expected Assigned or Waiting, got {other:?}"),
            }
        }
    }
    assert_eq!(placed.len(), 3, "the owner cap: {placed:?}");
    // A quiet owner waits behind the big one's parked targets (arrivals do not overtake the
    // waiting), but the sweep passes over the big owner, at its cap, and promotes it into the
    // fourth slot.
    waiting(r.admit(&of("quiet", 1), &d("q1")).await);
    waiting(r.admit(&of("quiet", 2), &d("q2")).await);
    waiting(r.admit(&of("quiet", 3), &d("q3")).await);
    let report = sweep(&r).await;
    assert_eq!(promoted(&report.released), vec![(of("quiet", 1), d("q1"))]);
    let quiet = report.released[0].assignment.expect("assignment").worker;

    // Two slots free up: the quiet owner's worker and one of the big owner's. Round-robin gives
    // one to each owner (big's 3-cap allows one more; quiet's first waiting target).
    r.deregister(quiet).await.unwrap();
    r.deregister(placed[0]).await.unwrap();
    let report = sweep(&r).await;
    let owners: BTreeSet<String> = promoted(&report.released)
        .iter()
        .map(|(t, _)| t.repo().to_owned())
        .collect();
    assert_eq!(
        owners,
        BTreeSet::from(["big/repo".to_owned(), "quiet/repo".to_owned()]),
        "{report:?}"
    );
    let live: usize = r.status().capacity.used;
    assert!(live <= 4);
}

/// One slot at a time: a busy owner that parked three targets first and a quiet one that parked
/// one after them are served in turn (busy, quiet, busy, busy), not in arrival order alone.
pub async fn one_slot_at_a_time_serves_the_owners_in_turn<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_workers(1).max_waiting(8)).await;
    let mut holder = assigned(r.admit(&t(1), &d("a")).await).worker;
    for n in 1..=3 {
        waiting(r.admit(&of("busy", n), &d(&format!("b{n}"))).await);
    }
    waiting(r.admit(&of("quiet", 1), &d("q1")).await);
    let mut order = Vec::new();
    for _ in 0..4 {
        r.deregister(holder).await.unwrap();
        let report = sweep(&r).await;
        let got = promoted(&report.released);
        assert_eq!(got.len(), 1, "one slot, one target: {report:?}");
        order.push(got[0].0.clone());
        // The promoted event's worker (the report's order of released events is not specified:
        // the deregistered holder's own claim is released in the same report).
        holder = report
            .released
            .iter()
            .find(|e| e.reason == ReleaseReason::Promoted)
            .and_then(|e| e.assignment)
            .expect("assignment")
            .worker;
        r.acknowledge(&report.released).await.unwrap();
    }
    assert_eq!(
        order,
        vec![of("busy", 1), of("quiet", 1), of("busy", 2), of("busy", 3)],
        "round-robin across owners"
    );
}

/// Live workers per owner in `r`'s snapshot (after a sweep).
fn live_per_owner<R: WorkerRegistry>(r: &R) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for w in &r.status().workers {
        if let (Some(t), false) = (&w.target, matches!(w.status, Status::Dead(_))) {
            let owner = t.repo().split('/').next().unwrap_or_default().to_owned();
            *out.entry(owner).or_default() += 1;
        }
    }
    out
}

/// The per-owner cap on live workers holds when several replicas race new targets of two owners
/// at once (each handle's admission is one atomic decision), and again when replicas race the
/// deaths that free their slots: each freed slot goes back to a waiting target of an owner below
/// its cap, never past it.
pub async fn the_owner_cap_holds_under_races_between_replicas<F: Fixture>(fixture: &F) {
    let cap = 2;
    let r = registry(
        fixture,
        config()
            .max_workers(8)
            .max_waiting(64)
            .max_workers_per_owner(cap),
    )
    .await;
    let handles = replicas(fixture, &r, RACERS).await;
    let mut placed: Vec<(String, crate::WorkerId)> = Vec::new();
    for round in 0..3u64 {
        let mut tasks = Vec::new();
        for (i, h) in handles.iter().cloned().enumerate() {
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                for owner in ["busy", "other"] {
                    let n = round * 100 + i as u64 + 1;
                    let a = h.admit(&of(owner, n), &d(&format!("{owner}-{n}"))).await;
                    out.push((owner.to_owned(), a));
                }
                out
            }));
        }
        for task in tasks {
            for (owner, a) in task.await.expect("racer") {
                match a {
                    Ok(Admission::Assigned(a)) => placed.push((owner, a.worker)),
                    Ok(Admission::Waiting(_)) => {}
                    other => panic!("expected Assigned or Waiting, got {other:?}"),
                }
            }
        }
    }
    let busy = placed.iter().filter(|(o, _)| o == "busy").count();
    assert_eq!(
        busy, cap,
        "the first owner holds exactly its cap: {placed:?}"
    );
    // The other owner's arrivals queued behind the first one's waiting targets; the sweep passes
    // over the owner at its cap and promotes the other one up to its own cap, and no further.
    let report = sweep(&r).await;
    let owners: BTreeSet<String> = promoted(&report.released)
        .iter()
        .map(|(t, _)| t.repo().to_owned())
        .collect();
    assert!(
        owners.iter().all(|o| o == "other/repo"),
        "only the owner below its cap: {report:?}"
    );
    r.acknowledge(&report.released).await.expect("acknowledge");
    let want =
        std::collections::BTreeMap::from([("busy".to_owned(), cap), ("other".to_owned(), cap)]);
    assert_eq!(live_per_owner(&r), want);
    assert!(
        promoted(&sweep(&r).await.released).is_empty(),
        "both at their cap"
    );
    assert_eq!(
        r.assign(&of("busy", 999)).await,
        Ok(crate::AssignOutcome::Rejected(Rejection::CapacityFull {
            limit: 8
        })),
        "an assignment is held to the cap too"
    );

    // Two replicas free one slot of each owner at once; every handle sweeps. Each owner gets its
    // slot back from its own waiting targets, and never more.
    let live_of = |owner: &str| {
        r.status()
            .workers
            .iter()
            .find(|w| {
                !matches!(w.status, Status::Dead(_))
                    && w.target
                        .as_ref()
                        .is_some_and(|t| t.repo() == format!("{owner}/repo"))
            })
            .map(|w| w.id)
            .expect("a live worker of the owner")
    };
    let (wa, wb) = (live_of("busy"), live_of("other"));
    let (a, b) = (handles[0].clone(), handles[1].clone());
    let (da, db) = tokio::join!(a.deregister(wa), b.deregister(wb));
    assert_eq!(
        (da, db),
        (Ok(DeadReason::Deregistered), Ok(DeadReason::Deregistered))
    );
    let mut got = Vec::new();
    for h in &handles {
        let report = h.sweep().await.expect("sweep");
        got.extend(promoted(&report.released));
        h.acknowledge(&report.released).await.expect("acknowledge");
    }
    let report = sweep(&r).await;
    got.extend(promoted(&report.released));
    let mut owners: Vec<String> = got.iter().map(|(t, _)| t.repo().to_owned()).collect();
    owners.sort();
    assert_eq!(
        owners,
        vec!["busy/repo".to_owned(), "other/repo".to_owned()],
        "{got:?}"
    );
    assert_eq!(live_per_owner(&r), want);
}

/// A promoted delivery handed to a replica that then crashes (drops its handle without
/// acknowledging) is not lost: after `release_ack_timeout` another replica's sweep is offered it
/// again, with the same assignment, and once acknowledged it is not offered again. Runs on a
/// backend whose released events carry a receipt (a shared outbox); one that hands them over
/// in-process has no replica to lose.
pub async fn a_promoted_delivery_survives_the_crash_of_its_replica<F: Fixture>(fixture: &F) {
    let ack = Duration::from_secs(10);
    let r = registry(fixture, parking(8).release_ack_timeout(ack)).await;
    let other = fixture.replica(&r).await;
    let crashed = fixture.replica(&r).await;
    let w1 = assigned(r.admit(&t(1), &d("a")).await).worker;
    assigned(r.admit(&t(2), &d("b")).await);
    waiting(r.admit(&t(3), &d("c")).await);
    assert_eq!(r.deregister(w1).await, Ok(DeadReason::Deregistered));
    let first = crashed.sweep().await.expect("sweep");
    assert_eq!(promoted(&first.released), vec![(t(3), d("c"))], "{first:?}");
    let handed = first
        .released
        .iter()
        .find(|e| e.reason == ReleaseReason::Promoted)
        .cloned()
        .expect("promoted");
    if handed.receipt().is_none() {
        return;
    }
    drop(crashed); // never acknowledged
    let report = other.sweep().await.expect("sweep");
    assert!(
        promoted(&report.released).is_empty(),
        "not offered again before release_ack_timeout: {report:?}"
    );
    other
        .acknowledge(&report.released)
        .await
        .expect("acknowledge");
    fixture.advance(&r, ack + PAST).await;
    let again = other.sweep().await.expect("sweep");
    assert_eq!(promoted(&again.released), vec![(t(3), d("c"))], "{again:?}");
    let e = again
        .released
        .iter()
        .find(|e| e.reason == ReleaseReason::Promoted)
        .expect("promoted");
    assert_eq!(e.assignment, handed.assignment, "the same placement");
    other
        .acknowledge(&again.released)
        .await
        .expect("acknowledge");
    fixture.advance(&r, ack + PAST).await;
    let a = handed.assignment.expect("assignment").worker;
    other.heartbeat(a).await.expect("the promoted worker lives");
    assert!(
        promoted(&other.sweep().await.expect("sweep").released).is_empty(),
        "acknowledged: not offered again"
    );
    let dup = duplicate(other.admit(&t(3), &d("c")).await);
    assert_eq!((dup.holder, dup.state), (Some(a), ClaimState::InFlight));
}

/// A mass death with many targets waiting: the registry's whole capacity dies at once (the brake
/// off) while as many targets wait, from several owners. The sweeps that work the death off (in
/// bounded steps on a networked backend) promote every waiting delivery exactly once, each target
/// onto one worker, never more live workers than the capacity, and leave nothing waiting.
pub async fn a_mass_death_promotes_every_waiting_delivery_once<F: Fixture>(fixture: &F) {
    let n: usize = 200;
    let r = registry(
        fixture,
        config()
            .max_workers(n)
            .max_waiting(2 * n)
            .max_waiting_per_owner(2 * n)
            .brake_fraction(1.0),
    )
    .await;
    for i in 0..n as u64 {
        assigned(r.admit(&of("fleet", i + 1), &d(&format!("f{i}"))).await);
    }
    let mut want = Vec::new();
    for i in 0..n as u64 {
        let target = of(["a", "b", "c", "d"][i as usize % 4], i + 1);
        let delivery = d(&format!("w{i}"));
        waiting(r.admit(&target, &delivery).await);
        want.push((target, delivery));
    }
    fixture.advance(&r, TIMEOUT + PAST).await;
    let mut got = Vec::new();
    let mut died = 0;
    for _ in 0..8 {
        let report = sweep(&r).await;
        died += report.died.len();
        got.extend(promoted(&report.released));
        for e in report
            .released
            .iter()
            .filter(|e| e.reason == ReleaseReason::Promoted)
        {
            // Keep the promoted workers alive through the sweeps.
            r.heartbeat(e.assignment.expect("assignment").worker)
                .await
                .expect("alive");
        }
        r.acknowledge(&report.released).await.expect("acknowledge");
        assert!(r.status().capacity.used <= n, "{:?}", r.status().capacity);
        if report.waiting == 0 && got.len() >= want.len() {
            break;
        }
    }
    assert_eq!(died, n, "the whole fleet died");
    got.sort();
    want.sort();
    assert_eq!(got, want, "every waiting delivery promoted exactly once");
    assert_eq!((r.status().waiting, r.stats().waiting), (0, 0));
    assert_eq!(r.stats().promoted, n as u64);
}

/// The snapshot a sweep publishes shows the registry after that sweep, its promotion included: a
/// worker the sweep's promotion created (into the slot of a worker the same sweep declared dead)
/// is listed, live and busy, and counted in the capacity and the claims in flight; a worker that
/// received a promoted delivery is listed busy. (A case that reads the snapshot right after a
/// promoting sweep must not depend on which admissions were placed directly and which were
/// promoted: this is what makes that so.)
pub async fn a_sweeps_snapshot_lists_the_workers_its_promotion_placed<F: Fixture>(fixture: &F) {
    let r = registry(fixture, parking(8)).await;
    let w1 = assigned(r.admit(&t(1), &d("a")).await).worker;
    let w2 = assigned(r.admit(&t(2), &d("b")).await).worker;
    waiting(r.admit(&t(3), &d("c")).await);
    // w2 stays alive; w1 falls silent and dies in the sweep, whose promotion takes its slot.
    let reports = run_beating(fixture, &r, &[w2], TIMEOUT + PAST).await;
    let deadly = reports
        .iter()
        .find(|rep| !rep.died.is_empty())
        .expect("a sweep declares w1 dead");
    assert_eq!(deadly.died, vec![(w1, DeadReason::MissedHeartbeats)]);
    let placed: Vec<_> = deadly
        .released
        .iter()
        .filter(|e| e.reason == ReleaseReason::Promoted)
        .collect();
    assert_eq!(placed.len(), 1, "{deadly:?}");
    let a = placed[0].assignment.expect("assignment");
    assert!(a.new);
    // The snapshot the deadly sweep published (later sweeps publish the same workers).
    let s = r.status();
    let promoted = s
        .worker(a.worker)
        .unwrap_or_else(|| panic!("the promoted worker {} is listed: {s:?}", a.worker));
    assert_eq!(
        (promoted.status, promoted.activity, promoted.target.clone()),
        (Status::Active, crate::Activity::Busy, Some(t(3)))
    );
    assert_eq!(s.capacity.used, 2, "w2 and the promoted worker: {s:?}");
    assert_eq!(s.claims.in_flight, 2, "b and the promoted c: {s:?}");
    assert!(s.worker(w1).is_some_and(|w| !w.status.is_alive()));
}

/// A bare [`claim`](WorkerRegistry::claim) of a parked pair is the duplicate `admit` answers
/// (`AlreadyClaimed`, no holder, [`ClaimState::Waiting`], since the parking) and leaves the parked
/// delivery as it is: it still waits, a redelivery is still a waiting duplicate, and the death that
/// frees a slot promotes it onto a worker, handed over once (a bare claim must not take it out of
/// the room, nor the promotion drop it for the claim's sake). A pair that does not wait is claimed
/// as before.
pub async fn a_bare_claim_of_a_parked_pair_is_a_duplicate_and_leaves_it_waiting<F: Fixture>(
    fixture: &F,
) {
    let r = registry(fixture, parking(8)).await;
    let w1 = assigned(r.admit(&t(1), &d("a")).await).worker;
    let w2 = assigned(r.admit(&t(2), &d("b")).await).worker;
    waiting(r.admit(&t(3), &d("c")).await);
    let parked = duplicate(r.admit(&t(3), &d("c")).await);
    let duplicates = r.stats().duplicates;

    match r.claim(&t(3), &d("c")).await {
        Ok(crate::ClaimOutcome::AlreadyClaimed(dup)) => {
            assert_eq!((dup.holder, dup.state), (None, ClaimState::Waiting));
            assert_eq!(dup.since(), parked.since(), "claimed since the parking");
        }
        other => panic!("a bare claim of a parked pair is a duplicate, got {other:?}"),
    }
    assert_eq!(
        r.stats().duplicates,
        duplicates + 1,
        "counted as a duplicate"
    );
    assert_eq!(sweep(&r).await.waiting, 1, "still parked");
    let again = duplicate(r.admit(&t(3), &d("c")).await);
    assert_eq!((again.holder, again.state), (None, ClaimState::Waiting));
    // A pair that does not wait is claimed as before.
    assert_eq!(
        r.claim(&t(4), &d("z")).await,
        Ok(crate::ClaimOutcome::Claimed)
    );
    r.release(&t(4), &d("z"))
        .await
        .expect("the bare claim exists");

    // w1 falls silent and dies: its slot goes to the parked delivery.
    let reports = run_beating(fixture, &r, &[w2], TIMEOUT + PAST).await;
    assert!(died_in(&reports).contains(&w1), "{reports:?}");
    let handed: BTreeSet<_> = reports
        .iter()
        .flat_map(|rep| promoted(&rep.released))
        .collect();
    assert_eq!(handed, BTreeSet::from([(t(3), d("c"))]), "{reports:?}");
    assert_eq!(r.stats().promoted, 1);
    let placed = reports
        .iter()
        .flat_map(|rep| rep.released.iter())
        .find(|e| e.reason == ReleaseReason::Promoted)
        .and_then(|e| e.assignment)
        .expect("the promotion's assignment");
    let dup = duplicate(r.admit(&t(3), &d("c")).await);
    assert_eq!(
        (dup.holder, dup.state),
        (Some(placed.worker), ClaimState::InFlight)
    );
    assert_eq!((r.status().waiting, r.stats().waiting), (0, 0));
}

/// With the waiting room off (`max_waiting` 0), an admission that cannot be placed is rejected
/// as it always was, and nothing waits.
pub async fn without_parking_a_refused_admission_is_rejected<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_workers(1).max_waiting(0)).await;
    assigned(r.admit(&t(1), &d("a")).await);
    assert_eq!(
        r.admit(&t(2), &d("b")).await,
        Ok(Admission::Rejected(Rejection::CapacityFull { limit: 1 }))
    );
    let report = sweep(&r).await;
    assert_eq!((report.waiting, r.status().waiting), (0, 0));
    assert!(report.expired_waiting.is_empty());
    assert_eq!(r.stats().parked, 0);
}
