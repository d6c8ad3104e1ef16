//! The mass-staleness brake and the suspect grace: too many silent workers at once are suspected,
//! not killed; a suspect that heartbeats recovers; one still silent after the grace dies.
//!
//! Timings: heartbeats every 10 s, three may be missed (30 s), suspect grace 60 s, the brake at
//! more than half of at least three live workers.

use crate::WorkerRegistryExt;
use std::collections::BTreeSet;
use std::time::Duration;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{
    Admission, ClaimState, DeadReason, DeliveryId, HeartbeatAck, RegistryError, Status, Target,
    WorkerRegistry,
};

type Fl<F> = Fleet<<F as Fixture>::Registry>;

/// The router stalls past the timeout: the first sweep after it suspects every worker and kills
/// none; the suspects keep their targets and deliveries; heartbeats trickle back and nobody dies,
/// not even the stragglers once the silent ones are no longer a majority.
pub async fn a_router_stall_suspects_everyone_and_nobody_dies_when_heartbeats_resume<F: Fixture>(
    fixture: &F,
) {
    let f = Fl::<F>::new(fixture, 10, config()).await;
    fixture.advance(&f.r, TIMEOUT + PAST).await;

    let r = sweep(&f.r).await;
    assert!(r.brake_engaged, "{r:?}");
    assert!(r.died.is_empty(), "{r:?}");
    assert_eq!(suspected(&r), f.ids(0..10));
    assert!(r.released_targets.is_empty() && r.released.is_empty());
    let s = f.r.status();
    assert!(s.brake_engaged);
    assert_eq!(
        (s.counts.active, s.counts.suspect, s.counts.dead),
        (10, 10, 0)
    );
    assert!(s.workers.iter().all(|w| w.suspect));
    for i in 0..10 {
        let w = f.info(i).await;
        assert!(w.suspect && w.status == Status::Active, "{w:?}");
    }
    let stats = f.r.stats();
    assert_eq!((stats.brake_engaged, stats.suspected), (1, 10));
    assert_eq!(stats.live_workers, 10);

    // A suspect still owns its target and its in-flight deliveries: the registry doubts itself.
    let dup = duplicate(f.r.admit(&Fl::<F>::target(0), &Fl::<F>::delivery(0)).await);
    assert_eq!(
        (dup.holder, dup.state),
        (Some(f.workers[0]), ClaimState::InFlight)
    );
    let sticky = assigned(f.r.admit(&Fl::<F>::target(0), &d("after-the-stall")).await);
    assert_eq!((sticky.worker, sticky.new), (f.workers[0], false));

    // Six of them beat again: they recover at once.
    fixture.advance(&f.r, PAST).await;
    f.beat(0..6).await;
    for i in 0..6 {
        assert!(!f.info(i).await.suspect, "a heartbeat clears suspicion");
    }
    let r = sweep(&f.r).await;
    // Four silent of ten is no longer more than half, but those four are suspects within their
    // grace: held, not killed.
    assert!(r.died.is_empty(), "stragglers must not die: {r:?}");
    assert!(r.suspected.is_empty(), "nobody is newly suspected: {r:?}");
    assert!(r.brake_engaged, "deaths are still being held back: {r:?}");
    let s = f.r.status();
    assert_eq!(
        (s.counts.active, s.counts.suspect, s.counts.dead),
        (10, 4, 0)
    );
    assert!(s.brake_engaged);

    // The last four beat, well within the suspect grace.
    fixture.advance(&f.r, PAST).await;
    f.beat(6..10).await;
    let r = sweep(&f.r).await;
    assert!(
        r.died.is_empty() && r.suspected.is_empty() && !r.brake_engaged,
        "{r:?}"
    );
    let s = f.r.status();
    assert_eq!(
        (s.counts.active, s.counts.suspect, s.counts.dead),
        (10, 0, 0)
    );
    assert!(!s.brake_engaged);

    // Long after the suspect grace, with everyone beating normally, nothing happens.
    for _ in 0..10 {
        fixture.advance(&f.r, HEARTBEAT).await;
        f.beat(0..10).await;
        let r = sweep(&f.r).await;
        assert!(
            r.died.is_empty() && r.suspected.is_empty() && !r.brake_engaged,
            "{r:?}"
        );
    }
    let stats = f.r.stats();
    assert_eq!(stats.deaths_missed_heartbeats, 0);
    assert_eq!(stats.live_workers, 10);
    assert_eq!(
        stats.brake_engaged, 2,
        "the two sweeps that held deaths back"
    );
}

/// The suspect grace counts from the first suspicion, not from the last heartbeat: workers silent
/// for far longer than timeout plus grace when the registry resumes are suspected first.
pub async fn the_suspect_grace_counts_from_the_first_suspicion<F: Fixture>(fixture: &F) {
    let f = Fl::<F>::new(fixture, 5, config()).await;
    fixture
        .advance(&f.r, TIMEOUT + SUSPECT_GRACE + Duration::from_secs(600))
        .await;
    let r = sweep(&f.r).await;
    assert!(r.died.is_empty(), "{r:?}");
    assert_eq!(suspected(&r), f.ids(0..5));
    fixture.advance(&f.r, SUSPECT_GRACE - MARGIN).await;
    let r = sweep(&f.r).await;
    assert!(
        r.died.is_empty() && r.brake_engaged,
        "still within the grace: {r:?}"
    );
    f.beat(0..5).await;
    fixture.advance(&f.r, PAST).await;
    let r = sweep(&f.r).await;
    assert!(r.died.is_empty() && !r.brake_engaged, "{r:?}");
    assert_eq!(f.r.status().capacity.used, 5);
}

/// One worker of ten stops heartbeating: it dies after its timeout without the brake, its target
/// and delivery are released, and the redelivery gets a new worker.
pub async fn a_single_crash_among_many_dies_without_the_brake<F: Fixture>(fixture: &F) {
    let f = Fl::<F>::new(fixture, 10, config()).await;
    let crashed = 3;
    let others = || (0..10).filter(move |i| *i != crashed);

    fixture.advance(&f.r, TIMEOUT - MARGIN).await;
    f.beat(others()).await;
    let r = sweep(&f.r).await;
    assert!(
        r.died.is_empty() && !r.brake_engaged && r.suspected.is_empty(),
        "{r:?}"
    );

    // The others beat on schedule while the crashed one's timeout runs out.
    let mut reports = Vec::new();
    for _ in 0..(MARGIN + PAST).as_secs() {
        reports.extend(run_for(fixture, &f.r, Duration::from_secs(1)).await);
        f.beat(others()).await;
        reports.push(sweep(&f.r).await);
    }
    assert!(
        reports
            .iter()
            .all(|r| !r.brake_engaged && r.suspected.is_empty()),
        "{reports:?}"
    );
    let r = the_deadly(reports);
    assert_eq!(died(&r), f.ids([crashed]));
    assert_eq!(r.released_targets, vec![Fl::<F>::target(crashed)]);
    assert_eq!(
        released(&r),
        vec![(Fl::<F>::target(crashed), Fl::<F>::delivery(crashed))]
    );
    let s = f.r.status();
    assert!(!s.brake_engaged);
    assert_eq!((s.counts.suspect, s.capacity.used), (0, 9));
    assert_eq!(
        f.r.heartbeat(f.workers[crashed]).await,
        Err(RegistryError::WorkerDead {
            id: f.workers[crashed],
            reason: DeadReason::MissedHeartbeats
        })
    );
    let a = assigned(
        f.r.admit(&Fl::<F>::target(crashed), &Fl::<F>::delivery(crashed))
            .await,
    );
    assert!(a.new && a.worker != f.workers[crashed]);
    let stats = f.r.stats();
    assert_eq!((stats.brake_engaged, stats.suspected), (0, 0));
    assert_eq!(stats.deaths_missed_heartbeats, 1);
    assert_eq!(stats.claims_released, 1);
}

/// The fraction rule is "more than": of ten live workers, five silent at once die and six silent
/// at once engage the brake.
pub async fn the_brake_engages_above_the_fraction_not_at_it<F: Fixture>(fixture: &F) {
    let half = Fl::<F>::new(fixture, 10, config()).await;
    fixture.advance(&half.r, TIMEOUT + PAST).await;
    half.beat(5..10).await;
    let r = sweep(&half.r).await;
    assert!(!r.brake_engaged && r.suspected.is_empty(), "{r:?}");
    assert_eq!(died(&r), half.ids(0..5));

    let more = Fl::<F>::new(fixture, 10, config()).await;
    fixture.advance(&more.r, TIMEOUT + PAST).await;
    more.beat(6..10).await;
    let r = sweep(&more.r).await;
    assert!(r.brake_engaged && r.died.is_empty(), "{r:?}");
    assert_eq!(suspected(&r), more.ids(0..6));
}

/// Below `brake_min_workers` live workers the brake never engages: two of two silent die; two of
/// three silent are suspected.
pub async fn the_brake_needs_a_minimum_number_of_live_workers<F: Fixture>(fixture: &F) {
    let two = Fl::<F>::new(fixture, 2, config()).await;
    fixture.advance(&two.r, TIMEOUT + PAST).await;
    let r = sweep(&two.r).await;
    assert!(!r.brake_engaged, "{r:?}");
    assert_eq!(died(&r), two.ids(0..2));

    let three = Fl::<F>::new(fixture, 3, config()).await;
    fixture.advance(&three.r, TIMEOUT + PAST).await;
    three.beat([2]).await;
    let r = sweep(&three.r).await;
    assert!(
        r.brake_engaged,
        "two of three silent is more than half of at least three"
    );
    assert_eq!(suspected(&r), three.ids(0..2));
}

/// `brake_fraction = 1.0` disables the brake: all workers silent at once all die.
pub async fn brake_fraction_one_disables_the_brake<F: Fixture>(fixture: &F) {
    let f = Fl::<F>::new(fixture, 6, config().brake_fraction(1.0)).await;
    fixture.advance(&f.r, TIMEOUT + PAST).await;
    let r = sweep(&f.r).await;
    assert!(!r.brake_engaged && r.suspected.is_empty(), "{r:?}");
    assert_eq!(died(&r), f.ids(0..6));
    assert_eq!(f.r.status().capacity.used, 0);
}

/// Every worker really crashes, each holding a delivery: the first sweep only suspects them (their
/// deliveries stay in flight, redeliveries are duplicates); sweeps within the grace change
/// nothing; the first sweep after it kills them all, releases every target and delivery, and the
/// redeliveries get new workers.
pub async fn a_genuine_mass_crash_is_suspected_first_then_dies_after_the_grace<F: Fixture>(
    fixture: &F,
) {
    let f = Fl::<F>::new(fixture, 10, config()).await;
    fixture.advance(&f.r, TIMEOUT + PAST).await;
    let r = sweep(&f.r).await;
    assert!(r.brake_engaged && r.died.is_empty(), "{r:?}");
    assert_eq!(suspected(&r), f.ids(0..10));
    assert!(r.released.is_empty());
    let s = f.r.status();
    assert_eq!((s.claims.in_flight, s.capacity.used), (10, 10));

    let mut held = 0;
    while held * HEARTBEAT < SUSPECT_GRACE - MARGIN - HEARTBEAT {
        for r in run_for(fixture, &f.r, HEARTBEAT).await {
            assert!(r.died.is_empty() && r.suspected.is_empty(), "{r:?}");
        }
        let r = sweep(&f.r).await;
        assert!(r.brake_engaged, "{r:?}");
        assert!(r.died.is_empty() && r.suspected.is_empty(), "{r:?}");
        assert!(r.released_targets.is_empty() && r.released.is_empty());
        assert_eq!(f.r.status().counts.suspect, 10);
        held += 1;
    }
    assert!(held >= 4);
    // A redelivery while they are suspect is still a duplicate: nothing is dispatched twice.
    let dup = duplicate(f.r.admit(&Fl::<F>::target(7), &Fl::<F>::delivery(7)).await);
    assert_eq!(dup.state, ClaimState::InFlight);

    // The rest of the grace (the registry running), and past it.
    let left = SUSPECT_GRACE - HEARTBEAT * held;
    let mut on_the_way = run_for(fixture, &f.r, left - MARGIN).await;
    // The registry keeps sweeping: no gap of two intervals before `sweeps_over` (a stall, on a
    // clock that moves by itself).
    on_the_way.push(sweep(&f.r).await);
    for r in on_the_way {
        assert!(r.died.is_empty() && r.brake_engaged, "{r:?}");
    }
    let reports = sweeps_over(fixture, &f.r, MARGIN + PAST).await;
    let after_grace = reports.iter().skip_while(|r| r.died.is_empty()).count() as u64;
    let r = the_deadly(reports);
    assert_eq!(died(&r), f.ids(0..10));
    assert!(
        !r.brake_engaged,
        "nothing was held back in this sweep: {r:?}"
    );
    let targets: BTreeSet<Target> = r.released_targets.iter().cloned().collect();
    assert_eq!(targets, (0..10).map(Fl::<F>::target).collect());
    let pairs: Vec<(Target, DeliveryId)> = (0..10)
        .map(|i| (Fl::<F>::target(i), Fl::<F>::delivery(i)))
        .collect();
    assert_eq!(released(&r), pairs);

    let s = f.r.status();
    assert!(!s.brake_engaged);
    assert_eq!(
        (s.counts.active, s.counts.suspect, s.counts.dead),
        (0, 0, 10)
    );
    assert_eq!(s.claims.in_flight, 0);
    for (i, id) in f.workers.iter().enumerate() {
        let w = f.info(i).await;
        assert_eq!(w.status, Status::Dead(DeadReason::MissedHeartbeats));
        assert!(!w.suspect, "a dead worker is no longer suspect");
        assert_eq!(
            f.r.heartbeat(*id).await,
            Err(RegistryError::WorkerDead {
                id: *id,
                reason: DeadReason::MissedHeartbeats
            }),
            "worker #{i} is fenced"
        );
    }
    for (t, d) in pairs {
        assert!(matches!(
            f.r.admit(&t, &d).await,
            Ok(Admission::Assigned(a)) if a.new && !f.workers.contains(&a.worker)
        ));
    }
    let stats = f.r.stats();
    assert_eq!(stats.deaths_missed_heartbeats, 10);
    assert_eq!(stats.claims_released, 10);
    assert_eq!(stats.suspected, 10);
    assert_eq!(
        stats.brake_engaged,
        stats.sweeps - after_grace,
        "the first sweep and every one that held them, none after: {stats:?}"
    );
}

/// In a mass crash, the survivors that heartbeat within the grace live; the rest die after it.
pub async fn in_a_mass_crash_survivors_that_beat_within_the_grace_live<F: Fixture>(fixture: &F) {
    let f = Fl::<F>::new(fixture, 10, config()).await;
    fixture.advance(&f.r, TIMEOUT + PAST).await;
    assert_eq!(suspected(&sweep(&f.r).await), f.ids(0..10));
    assert!(died_in(&run_for(fixture, &f.r, Duration::from_secs(20)).await).is_empty());
    f.beat([1, 4]).await;
    assert!(sweep(&f.r).await.died.is_empty());
    // The survivors keep beating while the registry runs on past the grace of the rest.
    let mut dead = BTreeSet::new();
    for _ in 0..(SUSPECT_GRACE.as_secs() / HEARTBEAT.as_secs()) {
        dead.extend(died_in(&run_for(fixture, &f.r, HEARTBEAT).await));
        f.beat([1, 4]).await;
        dead.extend(died(&sweep(&f.r).await));
    }
    assert_eq!(dead, f.ids([0, 2, 3, 5, 6, 7, 8, 9]));
    assert_eq!(f.info(1).await.status, Status::Active);
    assert_eq!(f.info(4).await.status, Status::Active);
    assert_eq!(f.r.status().capacity.used, 2);
}

/// A worker that recovered from suspicion and later goes silent on its own is judged afresh: it
/// dies after its normal timeout, without the brake.
pub async fn a_recovered_suspect_that_goes_silent_later_dies_normally<F: Fixture>(fixture: &F) {
    let f = Fl::<F>::new(fixture, 4, config()).await;
    fixture.advance(&f.r, TIMEOUT + PAST).await;
    assert_eq!(suspected(&sweep(&f.r).await).len(), 4);
    f.beat(0..4).await;
    // The other three beat on schedule; the first stays silent from now on.
    for _ in 0..((TIMEOUT - MARGIN).as_secs() / HEARTBEAT.as_secs()) {
        for r in run_for(fixture, &f.r, HEARTBEAT).await {
            assert!(r.died.is_empty(), "{r:?}");
        }
        f.beat(1..4).await;
    }
    let r = sweep(&f.r).await;
    assert!(r.died.is_empty() && !r.brake_engaged, "{r:?}");
    let beats = ((TIMEOUT - MARGIN).as_secs() / HEARTBEAT.as_secs()) as u32;
    let mut reports = Vec::new();
    let mut left = TIMEOUT + PAST - HEARTBEAT * beats;
    while !left.is_zero() {
        let step = left.min(Duration::from_secs(1));
        reports.extend(run_for(fixture, &f.r, step).await);
        f.beat(1..4).await;
        reports.push(sweep(&f.r).await);
        left -= step;
    }
    assert!(reports.iter().all(|r| !r.brake_engaged), "{reports:?}");
    let r = the_deadly(reports);
    assert!(!r.brake_engaged && r.suspected.is_empty(), "{r:?}");
    assert_eq!(died(&r), f.ids([0]));
}

/// A draining worker is live: it can be suspected, and it keeps draining when it recovers.
pub async fn draining_workers_take_part_in_the_brake<F: Fixture>(fixture: &F) {
    let f = Fl::<F>::new(fixture, 4, config()).await;
    assert_eq!(f.r.drain(f.workers[0]).await, Ok(Status::Draining));
    fixture.advance(&f.r, TIMEOUT + PAST).await;
    let r = sweep(&f.r).await;
    assert_eq!(suspected(&r), f.ids(0..4));
    assert_eq!(f.r.status().counts.draining, 1);
    assert_eq!(
        f.r.heartbeat(f.workers[0]).await,
        Ok(HeartbeatAck::Draining)
    );
    let w = f.info(0).await;
    assert!(!w.suspect && w.status == Status::Draining, "{w:?}");
}
