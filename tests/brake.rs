//! The mass-staleness brake and the start-up grace, on a `ManualClock` (no sleeps, no wall clock):
//! the exact boundaries (to the millisecond) that only a manual clock can pin down, and what needs
//! the in-memory registry itself (`claim_count`, `WorkerHandle`, the default configuration).
//! The same behaviours, with a margin on each boundary, are conformance cases every backend runs
//! (`src/testkit/cases/brake.rs`, `startup.rs`), and so are the brake's cases that need no exact
//! boundary (the router stall, the fraction and minimum rules, `brake_fraction = 1`, draining
//! workers under the brake).
//!
//! Timing used throughout (see `config`): heartbeats every 1 s, 3 may be missed (timeout 3 s),
//! start-up grace 2 s, suspect grace 5 s, the default brake (more than half of at least 3 live
//! workers silent at once). Staleness is strict: a worker whose last heartbeat is exactly the timeout
//! old is still alive.

use std::collections::BTreeSet;
use std::time::Duration;

use worker_registry::config::{
    RegistryConfigBuilder, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_MISSED_HEARTBEATS,
    DEFAULT_STARTUP_GRACE,
};
use worker_registry::{
    memory::Direct, Admission, ClaimState, DeadReason, DeliveryId, HeartbeatAck, ManualClock,
    RegistryConfig, RegistryError, Status, SweepReport, Target, WorkerId,
};

const SECOND: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);
const TIMEOUT: Duration = Duration::from_secs(3);
const STARTUP_GRACE: Duration = Duration::from_secs(2);
const SUSPECT_GRACE: Duration = Duration::from_secs(5);

fn builder() -> RegistryConfigBuilder {
    RegistryConfig::builder()
        .heartbeat_interval(SECOND)
        .missed_heartbeats(3)
        .sweep_interval(SECOND)
        .startup_grace(STARTUP_GRACE)
        .suspect_grace(SUSPECT_GRACE)
        .dead_retention(Duration::from_secs(3600))
}

fn config() -> RegistryConfig {
    builder().build().unwrap()
}

fn target(i: usize) -> Target {
    Target::new("octo/repo", i as u64 + 1).unwrap()
}

fn event(i: usize) -> DeliveryId {
    DeliveryId::new(&format!("delivery-{i}")).unwrap()
}

/// A registry with `n` workers, each created by admitting one delivery for its own target and each
/// having heartbeated once (so the start-up grace no longer applies), all at time zero.
struct Fleet {
    clock: ManualClock,
    registry: Direct<ManualClock>,
    workers: Vec<WorkerId>,
}

impl Fleet {
    fn new(n: usize, config: RegistryConfig) -> Self {
        let clock = ManualClock::new();
        let registry = Direct::with_clock(config, clock.clone());
        let workers = (0..n)
            .map(|i| match registry.admit(&target(i), &event(i)) {
                Admission::Assigned(a) => {
                    assert!(a.new);
                    assert_eq!(registry.heartbeat(a.worker), Ok(HeartbeatAck::Active));
                    a.worker
                }
                other => panic!("setup admit {i}: {other:?}"),
            })
            .collect();
        Self {
            clock,
            registry,
            workers,
        }
    }

    fn beat(&self, which: impl IntoIterator<Item = usize>) {
        for i in which {
            assert_eq!(
                self.registry.heartbeat(self.workers[i]),
                Ok(HeartbeatAck::Active),
                "worker #{i} must still be alive and active"
            );
        }
    }

    fn ids(&self, which: impl IntoIterator<Item = usize>) -> BTreeSet<WorkerId> {
        which.into_iter().map(|i| self.workers[i]).collect()
    }

    fn status_of(&self, i: usize) -> Status {
        self.registry.worker(self.workers[i]).unwrap().status
    }
}

/// Moves time forward by `by` as a running registry sees it: a sweep every `sweep_interval` on the
/// way (a sweep later than that would be a stall of the registry itself, which the stall rule does
/// not count against the workers), but not at the end, which is the caller's. Returns the reports
/// of the sweeps on the way.
fn advance_with_sweeps(
    registry: &Direct<ManualClock>,
    clock: &ManualClock,
    by: Duration,
) -> Vec<SweepReport> {
    let step = registry.config().sweep_interval();
    let mut left = by;
    let mut reports = Vec::new();
    while left > step {
        clock.advance(step);
        left -= step;
        reports.push(registry.sweep());
    }
    clock.advance(left);
    reports
}

fn died(report: &SweepReport) -> BTreeSet<WorkerId> {
    report
        .died
        .iter()
        .map(|(id, reason)| {
            assert_eq!(*reason, DeadReason::MissedHeartbeats);
            *id
        })
        .collect()
}

fn suspected(report: &SweepReport) -> BTreeSet<WorkerId> {
    report.suspected.iter().copied().collect()
}

// ---- (a) the router stalls -------------------------------------------------------------------

/// A stall long enough that every worker is also past the suspect grace by the time the router
/// resumes still suspects them first: the grace counts from when they were suspected, not from
/// their last heartbeat.
#[test]
fn suspect_grace_counts_from_the_first_suspicion_not_from_the_last_heartbeat() {
    let f = Fleet::new(5, config());
    f.clock
        .advance(TIMEOUT + SUSPECT_GRACE + Duration::from_secs(60));
    let r = f.registry.sweep();
    assert!(r.died.is_empty());
    assert_eq!(suspected(&r), f.ids(0..5));
    f.clock.advance(SUSPECT_GRACE - MS);
    let r = f.registry.sweep();
    assert!(r.died.is_empty(), "still within the grace: {r:?}");
    f.beat(0..5);
    f.clock.advance(SECOND);
    let r = f.registry.sweep();
    assert!(r.died.is_empty() && !r.brake_engaged);
    assert_eq!(f.registry.live_workers(), 5);
}

// ---- (b) a genuine single crash ----------------------------------------------------------------

/// One worker among ten stops heartbeating. It dies at the first sweep after its timeout (not one
/// sweep earlier), the brake does not engage, its target is released and the next delivery for it
/// gets a new worker.
#[test]
fn a_single_crash_among_many_dies_at_once_without_the_brake() {
    let f = Fleet::new(10, config());
    let crashed = 3;
    let mut death = None;
    for step in 1..=5 {
        f.clock.advance(SECOND);
        f.beat((0..10).filter(|i| *i != crashed));
        let r = f.registry.sweep();
        assert!(!r.brake_engaged && r.suspected.is_empty(), "{r:?}");
        if !r.died.is_empty() {
            death = Some((step, r));
            break;
        }
    }
    let (step, r) = death.expect("the crashed worker must die");
    assert_eq!(
        step, 4,
        "dies at 4 s: 3 s of silence is exactly the timeout, not past it"
    );
    assert_eq!(died(&r), f.ids([crashed]));
    assert_eq!(r.released_targets, vec![target(crashed)]);
    assert_eq!(r.released_pairs(), vec![(target(crashed), event(crashed))]);
    assert!(!f.registry.status().brake_engaged);
    assert_eq!(f.registry.status().counts.suspect, 0);
    assert_eq!(
        f.registry.heartbeat(f.workers[crashed]),
        Err(RegistryError::WorkerDead {
            id: f.workers[crashed],
            reason: DeadReason::MissedHeartbeats
        })
    );
    assert_eq!(f.registry.live_workers(), 9);
    // Redelivery of the released event: admitted again, on a new worker.
    match f.registry.admit(&target(crashed), &event(crashed)) {
        Admission::Assigned(a) => {
            assert!(a.new);
            assert_ne!(a.worker, f.workers[crashed]);
        }
        other => panic!("{other:?}"),
    }
    let stats = f.registry.stats();
    assert_eq!((stats.brake_engaged, stats.suspected), (0, 0));
    assert_eq!(stats.deaths_missed_heartbeats, 1);
    assert_eq!(stats.claims_released, 1);
}

/// The brake's parameters are validated.
#[test]
fn brake_parameters_are_validated() {
    for bad in [0.0, -0.5, 1.01, f64::NAN, f64::INFINITY] {
        let err = RegistryConfig::builder()
            .brake_fraction(bad)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("brake_fraction"), "{err}");
    }
    let err = RegistryConfig::builder()
        .brake_min_workers(0)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("brake_min_workers"), "{err}");
    let err = RegistryConfig::builder()
        .sweep_interval(SECOND * 2)
        .suspect_grace(SECOND)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("suspect_grace"), "{err}");
}

// ---- (c) a genuine mass crash -------------------------------------------------------------------

/// Every worker really crashes, each holding an in-flight delivery. The first sweep only suspects
/// them (the claims stay in flight, the targets stay assigned); sweeps within the suspect grace
/// change nothing; the first sweep at the end of the grace kills them all, releases every target
/// and every in-flight delivery, and frees the capacity.
#[test]
fn a_genuine_mass_crash_is_suspected_first_then_dies_after_the_suspect_grace() {
    let f = Fleet::new(10, config());
    f.clock.advance(TIMEOUT + MS);
    let r = f.registry.sweep();
    assert!(r.brake_engaged && r.died.is_empty());
    assert_eq!(suspected(&r), f.ids(0..10));
    assert!(r.released.is_empty());
    assert_eq!(f.registry.status().claims.in_flight, 10);
    assert_eq!(f.registry.live_workers(), 10);

    // Within the grace: held.
    for _ in 0..4 {
        f.clock.advance(SECOND);
        let r = f.registry.sweep();
        assert!(r.brake_engaged, "{r:?}");
        assert!(r.died.is_empty() && r.suspected.is_empty(), "{r:?}");
        assert!(r.released_targets.is_empty() && r.released.is_empty());
        assert_eq!(f.registry.status().counts.suspect, 10);
    }
    // A redelivery while they are suspect is still a duplicate (nothing is dispatched twice).
    assert!(matches!(
        f.registry.admit(&target(7), &event(7)),
        Admission::Duplicate(d) if d.state == ClaimState::InFlight
    ));

    // Exactly at the end of the grace (5 s after they were suspected): dead.
    f.clock.advance(SECOND - MS);
    let r = f.registry.sweep();
    assert!(r.died.is_empty(), "one ms before the grace ends: {r:?}");
    f.clock.advance(MS);
    let r = f.registry.sweep();
    assert_eq!(died(&r), f.ids(0..10));
    assert!(
        !r.brake_engaged,
        "nothing was held back in this sweep: {r:?}"
    );
    let released: BTreeSet<Target> = r.released_targets.iter().cloned().collect();
    assert_eq!(released, (0..10).map(target).collect());
    let events: BTreeSet<(Target, DeliveryId)> = r.released_pairs().into_iter().collect();
    assert_eq!(events, (0..10).map(|i| (target(i), event(i))).collect());

    let s = f.registry.status();
    assert!(!s.brake_engaged);
    assert_eq!(
        (s.counts.active, s.counts.suspect, s.counts.dead),
        (0, 0, 10)
    );
    assert_eq!(s.claims.in_flight, 0);
    assert_eq!(f.registry.live_workers(), 0);
    assert_eq!(f.registry.claim_count(), 0);
    for (i, id) in f.workers.iter().enumerate() {
        let info = f.registry.worker(*id).unwrap();
        assert_eq!(info.status, Status::Dead(DeadReason::MissedHeartbeats));
        assert!(!info.suspect, "a dead worker is no longer suspect");
        assert_eq!(
            f.registry.heartbeat(*id),
            Err(RegistryError::WorkerDead {
                id: *id,
                reason: DeadReason::MissedHeartbeats
            }),
            "worker #{i} is fenced"
        );
    }
    // Every released delivery is admitted again, on new workers.
    for i in 0..10 {
        assert!(matches!(
            f.registry.admit(&target(i), &event(i)),
            Admission::Assigned(a) if a.new && !f.workers.contains(&a.worker)
        ));
    }
    let stats = f.registry.stats();
    assert_eq!(stats.deaths_missed_heartbeats, 10);
    assert_eq!(stats.claims_released, 10);
    assert_eq!(stats.suspected, 10);
    assert_eq!(
        stats.brake_engaged, 6,
        "the first sweep and the five that held them"
    );
}

/// A mass crash that some workers survive: the survivors beat within the grace and live, the rest die
/// when the grace ends.
#[test]
fn in_a_mass_crash_survivors_that_beat_within_the_grace_live() {
    let f = Fleet::new(10, config());
    f.clock.advance(TIMEOUT + MS);
    assert_eq!(suspected(&f.registry.sweep()), f.ids(0..10));
    f.clock.advance(SECOND * 2);
    f.beat([1, 4]);
    assert!(f.registry.sweep().died.is_empty());
    for r in advance_with_sweeps(&f.registry, &f.clock, SECOND * 3) {
        assert!(r.died.is_empty(), "within the suspect grace: {r:?}");
    }
    f.beat([1, 4]);
    let r = f.registry.sweep();
    assert_eq!(died(&r), f.ids([0, 2, 3, 5, 6, 7, 8, 9]));
    assert_eq!(f.status_of(1), Status::Active);
    assert_eq!(f.status_of(4), Status::Active);
    assert_eq!(f.registry.live_workers(), 2);
}

/// A worker that recovered from suspicion and later goes silent on its own is judged afresh: it dies
/// at its normal timeout (the old suspicion gives it no extra time and no less).
#[test]
fn a_recovered_suspect_that_crashes_later_dies_normally() {
    let f = Fleet::new(4, config());
    f.clock.advance(TIMEOUT + MS);
    assert_eq!(suspected(&f.registry.sweep()).len(), 4);
    f.beat(0..4);
    for step in 1..=4 {
        f.clock.advance(SECOND);
        f.beat(1..4);
        let r = f.registry.sweep();
        assert!(!r.brake_engaged);
        assert_eq!(r.died.is_empty(), step < 4, "step {step}: {r:?}");
    }
    assert!(matches!(
        f.status_of(0),
        Status::Dead(DeadReason::MissedHeartbeats)
    ));
}

// ---- start-up grace ------------------------------------------------------------------------------

/// A new worker's first heartbeat may come as late as timeout + start-up grace after its creation;
/// after that first beat it gets only the plain timeout.
#[test]
fn a_new_workers_first_heartbeat_may_come_late() {
    let clock = ManualClock::new();
    let registry = Direct::with_clock(config(), clock.clone());
    let Admission::Assigned(a) = registry.admit(&target(0), &event(0)) else {
        panic!()
    };
    // Past the plain timeout, within the grace: alive.
    clock.advance(TIMEOUT + STARTUP_GRACE);
    assert!(
        registry.sweep().died.is_empty(),
        "exactly at the end of the grace"
    );
    assert!(!registry.worker(a.worker).unwrap().has_heartbeated);
    // The late first heartbeat is accepted.
    assert_eq!(registry.heartbeat(a.worker), Ok(HeartbeatAck::Active));
    assert!(registry.worker(a.worker).unwrap().has_heartbeated);
    // From now on, the plain timeout.
    advance_with_sweeps(&registry, &clock, TIMEOUT);
    assert!(registry.sweep().died.is_empty());
    clock.advance(MS);
    assert_eq!(
        registry.sweep().died,
        vec![(a.worker, DeadReason::MissedHeartbeats)]
    );
}

/// A new worker that never heartbeats dies one millisecond after timeout + start-up grace.
#[test]
fn a_new_worker_that_never_heartbeats_dies_after_the_grace() {
    let clock = ManualClock::new();
    let registry = Direct::with_clock(config(), clock.clone());
    clock.advance(Duration::from_secs(100)); // the grace counts from creation, not from zero
    let Admission::Assigned(a) = registry.admit(&target(0), &event(0)) else {
        panic!()
    };
    clock.advance(TIMEOUT + STARTUP_GRACE);
    assert!(registry.sweep().died.is_empty());
    clock.advance(MS);
    let r = registry.sweep();
    assert_eq!(r.died, vec![(a.worker, DeadReason::MissedHeartbeats)]);
    assert_eq!(r.released_pairs(), vec![(target(0), event(0))]);
}

/// Self-registered pool workers get the same start-up grace.
#[test]
fn registered_workers_get_the_startup_grace_too() {
    let clock = ManualClock::new();
    let registry = Direct::with_clock(config(), clock.clone());
    let w = registry.register().unwrap();
    clock.advance(TIMEOUT + STARTUP_GRACE);
    assert!(registry.sweep().died.is_empty());
    assert_eq!(w.heartbeat(), Ok(HeartbeatAck::Active));
    advance_with_sweeps(&registry, &clock, TIMEOUT + MS);
    assert_eq!(registry.sweep().died.len(), 1);
    assert!(w.heartbeat().is_err());
}

/// With a zero start-up grace a new worker gets exactly the plain timeout.
#[test]
fn zero_startup_grace_means_the_plain_timeout() {
    let clock = ManualClock::new();
    let registry = Direct::with_clock(
        builder().startup_grace(Duration::ZERO).build().unwrap(),
        clock.clone(),
    );
    registry.admit(&target(0), &event(0));
    clock.advance(TIMEOUT);
    assert!(registry.sweep().died.is_empty());
    clock.advance(MS);
    assert_eq!(registry.sweep().died.len(), 1);
}

/// Workers still in their start-up grace are not silent: a burst of new workers that have not beaten
/// yet neither dies nor engages the brake, and the grace is the documented default.
#[test]
fn workers_in_their_startup_grace_do_not_engage_the_brake() {
    let clock = ManualClock::new();
    let registry = Direct::with_clock(RegistryConfig::default(), clock.clone());
    for i in 0..10 {
        registry.admit(&target(i), &event(i));
    }
    let timeout = DEFAULT_HEARTBEAT_INTERVAL * DEFAULT_MISSED_HEARTBEATS;
    clock.advance(timeout + DEFAULT_STARTUP_GRACE);
    let r = registry.sweep();
    assert!(r.died.is_empty() && r.suspected.is_empty() && !r.brake_engaged);
    clock.advance(MS);
    let r = registry.sweep();
    assert!(
        r.brake_engaged,
        "all ten silent past the grace: suspected, not killed"
    );
    assert_eq!(r.suspected.len(), 10);
}

/// A start-up burst where the brake holds: ten new workers of which only three ever beat. After the
/// grace they are suspected together; the seven silent ones die after the suspect grace.
#[test]
fn a_failed_rollout_is_suspected_then_killed() {
    let clock = ManualClock::new();
    let registry = Direct::with_clock(config(), clock.clone());
    let ids: Vec<WorkerId> = (0..10)
        .map(|i| match registry.admit(&target(i), &event(i)) {
            Admission::Assigned(a) => a.worker,
            other => panic!("{other:?}"),
        })
        .collect();
    clock.advance(TIMEOUT + STARTUP_GRACE + MS);
    let r = registry.sweep();
    assert!(r.brake_engaged);
    assert_eq!(r.suspected.len(), 10);
    for id in &ids[..3] {
        registry.heartbeat(*id).unwrap();
    }
    for r in advance_with_sweeps(&registry, &clock, SUSPECT_GRACE) {
        assert!(r.died.is_empty(), "within the suspect grace: {r:?}");
    }
    for id in &ids[..3] {
        registry.heartbeat(*id).unwrap();
    }
    let r = registry.sweep();
    assert_eq!(r.died.len(), 7);
    assert_eq!(registry.live_workers(), 3);
}
