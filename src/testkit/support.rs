//! What the cases share: the suite's timings, a base configuration, names, and helpers that unwrap
//! outcomes with a message saying what was expected.
//!
//! # Timings
//!
//! A networked backend's time is its server's clock plus the fixture's offset, so real time passes
//! during a case as well as what it advances. Every decision a case expects to *not yet* have
//! happened therefore leaves [`MARGIN`] of registry time before the boundary (a case takes far less
//! real time than that); decisions expected to have happened are checked [`PAST`] after it, which
//! real time only helps.

use crate::WorkerRegistryExt;
use std::collections::BTreeSet;
use std::time::Duration;

use super::fixture::Fixture;
use crate::api::contract::{Maintenance, WorkerRegistry};
use crate::api::error::RegistryError;
use crate::api::events::{Event, Subscription};
use crate::api::ids::{DeliveryId, Target, WorkerId};
use crate::api::outcome::{Admission, AlreadyClaimed, Assignment, HeartbeatAck};
use crate::api::report::SweepReport;
use crate::api::snapshot::WorkerInfo;
use crate::api::status::DeadReason;
use crate::config::{RegistryConfig, RegistryConfigBuilder};

/// How often workers heartbeat in the base configuration.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(10);
/// Missed intervals before a worker is dead.
pub(crate) const MISSED: u32 = 3;
/// `HEARTBEAT x MISSED`.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);
/// How long a suspect may stay silent.
pub(crate) const SUSPECT_GRACE: Duration = Duration::from_secs(60);
/// Registry time left before a boundary that must not have been crossed yet.
pub(crate) const MARGIN: Duration = Duration::from_secs(5);
/// How far past a boundary a case looks for the decision.
pub(crate) const PAST: Duration = Duration::from_secs(1);
/// How long a case waits for a lifecycle event before it fails (a guard against hanging, not a
/// timing: an event either arrives or is missing).
pub(crate) const EVENT_WAIT: Duration = Duration::from_secs(30);
/// Rounds of each race.
pub(crate) const ROUNDS: usize = 20;
/// Handles racing in each round.
pub(crate) const RACERS: usize = 4;

/// The base configuration: every timing explicit and small (seconds, not the production minutes),
/// the start-up grace off and retention long, so that each case states what it changes.
/// `max_in_flight` is out of reach of every case that does not set it.
pub(crate) fn config() -> RegistryConfigBuilder {
    RegistryConfig::builder()
        .heartbeat_interval(HEARTBEAT)
        .missed_heartbeats(MISSED)
        .sweep_interval(Duration::from_secs(1))
        .max_workers(16)
        .startup_grace(Duration::ZERO)
        .suspect_grace(SUSPECT_GRACE)
        .brake_fraction(0.5)
        .brake_min_workers(3)
        .claim_retention(Duration::from_secs(3600))
        .max_retained_claims(1000)
        .dead_retention(Duration::from_secs(3600))
        .drain_deadline(Duration::from_secs(600))
        .max_in_flight(Duration::from_secs(30 * 24 * 3600))
        .release_ack_timeout(Duration::from_secs(60))
}

/// A fresh registry from `fixture` with `config`.
pub(crate) async fn registry<F: Fixture>(
    fixture: &F,
    config: RegistryConfigBuilder,
) -> F::Registry {
    fixture
        .registry(
            config
                .build()
                .expect("the suite's configurations are valid"),
        )
        .await
}

/// `n` more handles on `r`, each on its own connection.
pub(crate) async fn replicas<F: Fixture>(
    fixture: &F,
    r: &F::Registry,
    n: usize,
) -> Vec<F::Registry> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(fixture.replica(r).await);
    }
    out
}

/// Target `conformance/repo#n`.
pub(crate) fn t(n: u64) -> Target {
    Target::new("conformance/repo", n).expect("a valid target")
}

/// A delivery id.
pub(crate) fn d(s: &str) -> DeliveryId {
    DeliveryId::new(s).expect("a valid delivery id")
}

/// An id no registry in the suite has handed out: the largest there is (a fresh registry hands
/// out small ones first); checked by the cases that use it.
pub(crate) fn unknown_id() -> WorkerId {
    WorkerId::new(WorkerId::MAX)
}

/// The assignment in an admission that must be one.
#[track_caller]
pub(crate) fn assigned(a: Result<Admission, RegistryError>) -> Assignment {
    match a {
        Ok(Admission::Assigned(a)) => a,
        other => panic!("expected Assigned, got {other:?}"),
    }
}

/// The duplicate in an admission that must be one.
#[track_caller]
pub(crate) fn duplicate(a: Result<Admission, RegistryError>) -> AlreadyClaimed {
    match a {
        Ok(Admission::Duplicate(d)) => d,
        other => panic!("expected Duplicate, got {other:?}"),
    }
}

/// A sweep by the registry's only sweeper, which therefore does the work (`swept`).
#[track_caller]
pub(crate) fn swept(report: Result<SweepReport, RegistryError>) -> SweepReport {
    let report = report.expect("sweep");
    assert!(
        report.swept,
        "the only sweeper must do the work: {report:?}"
    );
    report
}

/// [`swept`] of `r.sweep()`.
pub(crate) async fn sweep<R: Maintenance>(r: &R) -> SweepReport {
    swept(r.sweep().await)
}

/// Moves `r`'s time forward by `by` as a running registry lives it: a sweep at least every two
/// sweep intervals on the way (a sweep any later would measure a stall of the registry itself,
/// which the stall rule does not count against anyone), none at the very end, which is the
/// caller's. Returns the reports of the sweeps on the way.
pub(crate) async fn run_for<F: Fixture>(
    fixture: &F,
    r: &F::Registry,
    by: Duration,
) -> Vec<SweepReport> {
    // One interval, not two: a clock that moves by itself (a server's) must not push a step over.
    let step = r.config().sweep_interval();
    let mut left = by;
    let mut reports = Vec::new();
    while left > step {
        fixture.advance(r, step).await;
        left -= step;
        reports.push(sweep(r).await);
    }
    fixture.advance(r, left).await;
    reports
}

/// Moves `r`'s time forward by `by` with the registry running and `beating` heartbeating: every
/// sweep interval, each of them beats and a sweep runs (the last at the end of `by`). Returns
/// every sweep's report.
pub(crate) async fn run_beating<F: Fixture>(
    fixture: &F,
    r: &F::Registry,
    beating: &[WorkerId],
    by: Duration,
) -> Vec<SweepReport> {
    let step = r.config().sweep_interval();
    let mut left = by;
    let mut reports = Vec::new();
    while !left.is_zero() {
        let dt = left.min(step);
        fixture.advance(r, dt).await;
        left -= dt;
        for w in beating {
            let _ = r.heartbeat(*w).await;
        }
        reports.push(sweep(r).await);
    }
    reports
}

/// [`run_for`], then the caller's sweep at the end: the reports of every sweep on the way and of
/// the last, for decisions that fall in the last stretch (a clock that moves by itself may take
/// one a sweep early).
pub(crate) async fn sweeps_over<F: Fixture>(
    fixture: &F,
    r: &F::Registry,
    by: Duration,
) -> Vec<SweepReport> {
    let mut reports = run_for(fixture, r, by).await;
    reports.push(sweep(r).await);
    reports
}

/// Every death any of `reports` declared, in order.
pub(crate) fn deaths(reports: &[SweepReport]) -> Vec<(WorkerId, DeadReason)> {
    reports
        .iter()
        .flat_map(|r| r.died.iter().copied())
        .collect()
}

/// The one report of `reports` that declared deaths.
#[track_caller]
pub(crate) fn the_deadly(reports: Vec<SweepReport>) -> SweepReport {
    let mut deadly: Vec<SweepReport> = reports.into_iter().filter(|r| !r.died.is_empty()).collect();
    assert_eq!(deadly.len(), 1, "one sweep declares the deaths: {deadly:?}");
    deadly.remove(0)
}

/// The workers any of `reports` declared dead for missed heartbeats.
#[track_caller]
pub(crate) fn died_in(reports: &[SweepReport]) -> BTreeSet<WorkerId> {
    reports.iter().flat_map(died).collect()
}

/// One worker's live record, which must exist.
pub(crate) async fn info<R: WorkerRegistry>(r: &R, id: WorkerId) -> WorkerInfo {
    r.worker(id)
        .await
        .expect("worker()")
        .unwrap_or_else(|| panic!("worker {id} must be known"))
}

/// The workers a sweep declared dead for missed heartbeats (any other reason fails).
#[track_caller]
pub(crate) fn died(report: &SweepReport) -> BTreeSet<WorkerId> {
    report
        .died
        .iter()
        .map(|(id, reason)| {
            assert_eq!(*reason, DeadReason::MissedHeartbeats, "{report:?}");
            *id
        })
        .collect()
}

/// The workers a sweep marked suspect.
pub(crate) fn suspected(report: &SweepReport) -> BTreeSet<WorkerId> {
    report.suspected.iter().copied().collect()
}

/// The released (target, delivery) pairs of a report, sorted (duplicates kept, so that an event
/// handed over twice shows).
pub(crate) fn released(report: &SweepReport) -> Vec<(Target, DeliveryId)> {
    let mut pairs = report.released_pairs();
    pairs.sort();
    pairs
}

/// `n` workers, each created by admitting one delivery for its own target, each having heartbeated
/// once (so no start-up grace applies), at the same instant.
pub(crate) struct Fleet<R> {
    pub(crate) r: R,
    pub(crate) workers: Vec<WorkerId>,
}

impl<R: WorkerRegistry + Maintenance> Fleet<R> {
    pub(crate) async fn new<F: Fixture<Registry = R>>(
        fixture: &F,
        n: usize,
        config: RegistryConfigBuilder,
    ) -> Self {
        let r = registry(fixture, config).await;
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let a = assigned(r.admit(&Self::target(i), &Self::delivery(i)).await);
            assert!(a.new, "fleet worker #{i} is new");
            assert_eq!(r.heartbeat(a.worker).await, Ok(HeartbeatAck::Active));
            workers.push(a.worker);
        }
        Self { r, workers }
    }

    /// Worker #i's target.
    pub(crate) fn target(i: usize) -> Target {
        t(i as u64 + 1)
    }

    /// Worker #i's in-flight delivery.
    pub(crate) fn delivery(i: usize) -> DeliveryId {
        d(&format!("fleet-{i}"))
    }

    /// Heartbeats from the given workers, which must be alive and active.
    pub(crate) async fn beat(&self, which: impl IntoIterator<Item = usize>) {
        for i in which {
            assert_eq!(
                self.r.heartbeat(self.workers[i]).await,
                Ok(HeartbeatAck::Active),
                "worker #{i} must be alive and active"
            );
        }
    }

    pub(crate) fn ids(&self, which: impl IntoIterator<Item = usize>) -> BTreeSet<WorkerId> {
        which.into_iter().map(|i| self.workers[i]).collect()
    }

    pub(crate) async fn info(&self, i: usize) -> WorkerInfo {
        info(&self.r, self.workers[i]).await
    }
}

/// The next lifecycle event, waiting at most [`EVENT_WAIT`].
pub(crate) async fn next_event(events: &mut Subscription) -> Event {
    match tokio::time::timeout(EVENT_WAIT, events.recv()).await {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => panic!("receiving an event: {e}"),
        Err(_) => panic!("no event arrived within {EVENT_WAIT:?}"),
    }
}

/// Every event published before a marker: registers and deregisters a worker of its own, then
/// receives until that worker's death, returning everything else it received. (The contract
/// orders events per worker only; a backend that publishes in call order, as every one here does,
/// delivers everything published before the marker first.)
pub(crate) async fn events_before_marker<R: WorkerRegistry>(
    r: &R,
    events: &mut Subscription,
) -> Vec<Event> {
    let marker = r.register().await.expect("room for the marker worker");
    r.deregister(marker).await.expect("deregister the marker");
    let mut out = Vec::new();
    loop {
        let e = next_event(events).await;
        if e.worker() == Some(marker) {
            if matches!(e, Event::WorkerDied { .. }) {
                return out;
            }
            continue;
        }
        out.push(e);
    }
}
