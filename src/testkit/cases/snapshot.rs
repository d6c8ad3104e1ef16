//! Snapshot consistency: what `status()` returns, when it changes, and that its counts, versions
//! and entries agree with each other and with live reads.

use crate::WorkerRegistryExt;
use std::time::Duration;

use crate::testkit::support::*;
use crate::testkit::Fixture;
use crate::{Activity, DeadReason, Maintenance, Status, StatusCounts, WorkerKind, WorkerRegistry};

/// The snapshot a sweep publishes lists every worker, live and dead, with counts and capacity
/// computed from that list, a larger version than before, and the claims in flight.
pub async fn ac6_the_snapshot_lists_every_worker_and_its_counts_agree<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_workers(10)).await;
    let a = assigned(r.admit(&t(1), &d("1")).await);
    let b = assigned(r.admit(&t(2), &d("2")).await);
    let c = r.register().await.unwrap();
    let gone = r.register().await.unwrap();
    assert_eq!(r.drain(b.worker).await, Ok(Status::Draining));
    r.deregister(gone).await.unwrap();
    fixture.advance(&r, Duration::from_secs(1)).await;

    let before = r.status();
    let report = sweep(&r).await;
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
    assert_eq!(s.counts.suspect, 0);
    assert_eq!((s.capacity.used, s.capacity.limit), (3, 10));
    assert_eq!(
        s.counts,
        StatusCounts::of(&s.workers),
        "counts come from the list"
    );
    assert_eq!(s.worker(a.worker).map(|w| w.status), Some(Status::Active));
    assert_eq!(s.worker(b.worker).map(|w| w.status), Some(Status::Draining));
    assert_eq!(s.worker(c).map(|w| w.kind), Some(WorkerKind::Registered));
    assert_eq!(
        s.worker(gone).map(|w| w.status),
        Some(Status::Dead(DeadReason::Deregistered))
    );
    assert_eq!((s.claims.in_flight, s.claims.retained), (2, 0));
    assert!(!s.brake_engaged);
}

/// A snapshot never changes under its reader; the next sweep publishes a new one.
pub async fn ac6_a_snapshot_never_changes_under_its_reader<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    sweep(&r).await;
    let held = r.status();
    assigned(r.admit(&t(1), &d("1")).await);
    sweep(&r).await;
    assert!(held.workers.is_empty(), "a reader's snapshot never changes");
    assert_eq!(r.status().workers.len(), 1);
    assert!(r.status().version > held.version);
}

/// `status()` is what the last sweep published: empty with version 0 before the first sweep, even
/// once workers exist; a sweep publishes them.
pub async fn status_is_what_the_last_sweep_published<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config().max_workers(7)).await;
    let empty = r.status();
    assert_eq!(empty.version, 0, "nothing swept yet");
    assert!(empty.workers.is_empty());
    assert_eq!((empty.capacity.used, empty.capacity.limit), (0, 7));
    let a = assigned(r.admit(&t(1), &d("1")).await);
    assert_eq!(r.status().version, 0, "calls do not publish");
    assert!(r.status().workers.is_empty());
    let report = sweep(&r).await;
    let s = r.status();
    assert_eq!(s.version, report.version);
    assert!(s.version >= 1);
    assert_eq!(
        s.worker(a.worker).map(|w| w.target.clone()),
        Some(Some(t(1)))
    );
}

/// Versions never go backwards on any handle, and a replica's `sweep` brings its snapshot up to
/// at least what another replica published before.
pub async fn versions_never_go_backwards_on_any_handle<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let other = fixture.replica(&r).await;
    let (mut seen_r, mut seen_other) = (0, 0);
    for i in 0..5 {
        assigned(r.admit(&t(i + 1), &d("d")).await);
        let published = sweep(&r).await.version;
        assert!(published > seen_r, "a sweep publishes a newer version");
        seen_r = published;
        assert!(r.status().version >= published);

        let report = other.sweep().await.unwrap();
        let s = other.status();
        assert!(
            s.version >= published,
            "the replica caught up: {} < {published}",
            s.version
        );
        assert!(report.version >= published);
        assert!(s.version >= seen_other, "never backwards");
        seen_other = s.version;
        worker_for(&s, i + 1); // the replica's snapshot shows the newest worker
        assert!(r.status().version >= seen_r, "never backwards");
    }
}

fn worker_for(s: &crate::StatusSnapshot, n: u64) -> crate::WorkerId {
    s.workers
        .iter()
        .find(|w| w.target == Some(t(n)))
        .map(|w| w.id)
        .unwrap_or_else(|| panic!("target {n} is in the snapshot"))
}

/// After a sweep, with nothing changed since, each snapshot entry agrees with the live record, the
/// gauges agree with the snapshot, and successive sweeps' times differ by at least the time that
/// passed.
pub async fn snapshot_entries_and_gauges_agree_with_live_reads<F: Fixture>(fixture: &F) {
    let r = registry(fixture, config()).await;
    let a = assigned(r.admit(&t(1), &d("1")).await);
    r.complete(&t(1), &d("1")).await.unwrap();
    assert_eq!(r.loop_finished(a.worker).await, Ok(Status::Active));
    let b = assigned(r.admit(&t(2), &d("2")).await);
    r.heartbeat(b.worker).await.unwrap();
    let p = r.register().await.unwrap();
    let first = sweep(&r).await;
    fixture.advance(&r, Duration::from_secs(7)).await;
    let second = sweep(&r).await;
    assert!(second.at.saturating_sub(first.at) >= Duration::from_secs(7));

    let s = r.status();
    for id in [a.worker, b.worker, p] {
        let snap = s.worker(id).expect("in the snapshot");
        let live = info(&r, id).await;
        assert_eq!(
            (snap.id, &snap.target, snap.kind, snap.status, snap.activity),
            (live.id, &live.target, live.kind, live.status, live.activity)
        );
        assert_eq!(
            (snap.token, snap.has_heartbeated),
            (live.token, live.has_heartbeated)
        );
        assert_eq!(snap.started_at, live.started_at);
        assert!(live.uptime >= snap.uptime, "the live record is newer");
        assert!(snap.uptime >= Duration::from_secs(7));
    }
    assert_eq!(s.worker(a.worker).map(|w| w.activity), Some(Activity::Idle));
    let stats = r.stats();
    assert_eq!(stats.live_workers, s.capacity.used);
    assert_eq!(stats.retained_claims, s.claims.retained);
    assert_eq!((s.claims.in_flight, s.claims.retained), (1, 1));
    assert_eq!(stats.sweeps, 2);
}

/// A registry runs with the configuration it was made with.
pub async fn the_registry_runs_with_the_configuration_given<F: Fixture>(fixture: &F) {
    let config = config()
        .max_workers(5)
        .heartbeat_interval(Duration::from_secs(7))
        .build()
        .unwrap();
    let r = fixture.registry(config.clone()).await;
    assert_eq!(r.config(), &config);
    assert_eq!(r.status().capacity.limit, 5);
    assert_eq!(fixture.replica(&r).await.config(), &config);
}
