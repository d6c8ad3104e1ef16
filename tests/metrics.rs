//! The Prometheus metrics (`worker_registry::metrics`): the exposition is valid OpenMetrics text
//! and every value agrees with what the test did to the registry.
#![cfg(feature = "http")]

mod metrics_format;

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use worker_registry::metrics::Metrics;
use worker_registry::{
    memory::Direct, Admission, DeliveryId, InMemoryRegistry, ManualClock, RegistryConfig, Target,
};

fn t(n: u64) -> Target {
    Target::new("octo/repo", n).unwrap()
}

fn e(s: &str) -> DeliveryId {
    DeliveryId::new(s).unwrap()
}

#[test]
fn every_metric_matches_what_the_registry_did() {
    let clock = ManualClock::new();
    let config = RegistryConfig::builder()
        .max_workers(3)
        .startup_grace(Duration::ZERO)
        .brake_fraction(1.0)
        .build()
        .unwrap();
    let registry = Direct::with_clock(config, clock.clone());
    let timeout = registry.config().heartbeat_timeout();

    // Two new workers, one sticky admission, one duplicate.
    let Admission::Assigned(a) = registry.admit(&t(1), &e("d1")) else {
        panic!()
    };
    let Admission::Assigned(b) = registry.admit(&t(2), &e("d2")) else {
        panic!()
    };
    assert!(matches!(
        registry.admit(&t(1), &e("d3")),
        Admission::Assigned(_)
    ));
    assert!(matches!(
        registry.admit(&t(1), &e("d1")),
        Admission::Duplicate(_)
    ));
    // A pool worker fills capacity: one capacity rejection.
    let pool = registry.register().unwrap();
    assert!(matches!(
        registry.admit(&t(3), &e("d4")),
        Admission::Rejected(_)
    ));
    // Drain `a` (busy): a redelivery to its target is rejected as draining.
    registry.drain(a.worker).unwrap();
    assert!(matches!(
        registry.admit(&t(1), &e("d5")),
        Admission::Rejected(_)
    ));
    // Complete d1 and d3 on `a`, then `a` exits.
    registry.complete(&t(1), &e("d1")).unwrap();
    registry.complete(&t(1), &e("d3")).unwrap();
    registry.loop_finished(a.worker).unwrap();
    // Heartbeats: 3 accepted (pool x2, b x1), 1 refused (a is dead).
    pool.heartbeat().unwrap();
    registry.heartbeat(b.worker).unwrap();
    clock.advance(timeout / 2);
    pool.heartbeat().unwrap();
    assert!(registry.heartbeat(a.worker).is_err());
    // `b` goes silent and dies in the sweep, releasing d2.
    clock.advance(timeout / 2 + Duration::from_millis(1));
    let report = registry.sweep();
    assert_eq!(report.died.len(), 1);
    assert_eq!(report.released_pairs(), vec![(t(2), e("d2"))]);
    clock.advance(Duration::from_secs(2));

    let mut metrics = Metrics::new(&InMemoryRegistry::from(registry.clone()));
    let mine = Counter::<u64>::default();
    metrics
        .prometheus_mut()
        .register("router_webhooks", "Webhooks received", mine.clone());
    mine.inc_by(5);

    let text = metrics.encode();
    let m = metrics_format::parse(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));

    assert_eq!(m.get("router_webhooks_total"), 5.0);
    assert_eq!(m.get("worker_registry_admitted_total{worker=\"new\"}"), 2.0);
    assert_eq!(
        m.get("worker_registry_admitted_total{worker=\"existing\"}"),
        1.0
    );
    assert_eq!(m.get("worker_registry_duplicates_total"), 1.0);
    assert_eq!(
        m.get("worker_registry_rejected_total{reason=\"capacity\"}"),
        1.0
    );
    assert_eq!(
        m.get("worker_registry_rejected_total{reason=\"draining\"}"),
        1.0
    );
    assert_eq!(
        m.get("worker_registry_heartbeats_total{result=\"accepted\"}"),
        3.0
    );
    assert_eq!(
        m.get("worker_registry_heartbeats_total{result=\"refused\"}"),
        1.0
    );
    assert_eq!(
        m.get("worker_registry_deaths_total{reason=\"exited\"}"),
        1.0
    );
    assert_eq!(
        m.get("worker_registry_deaths_total{reason=\"missed_heartbeats\"}"),
        1.0
    );
    assert_eq!(
        m.get("worker_registry_deaths_total{reason=\"deregistered\"}"),
        0.0
    );
    assert_eq!(m.get("worker_registry_claims_completed_total"), 2.0);
    assert_eq!(m.get("worker_registry_claims_retained"), 2.0);
    assert_eq!(m.get("worker_registry_claims_released_total"), 1.0);
    assert_eq!(m.get("worker_registry_claims_in_flight"), 0.0);
    assert_eq!(m.get("worker_registry_claims_expired_total"), 0.0);
    assert_eq!(m.get("worker_registry_claims_evicted_total"), 0.0);
    // Snapshot of the sweep: the pool worker active (idle), a and b dead.
    assert_eq!(m.get("worker_registry_workers{status=\"active\"}"), 1.0);
    assert_eq!(m.get("worker_registry_workers{status=\"draining\"}"), 0.0);
    assert_eq!(m.get("worker_registry_workers{status=\"dead\"}"), 2.0);
    assert_eq!(
        m.get("worker_registry_workers_activity{activity=\"idle\"}"),
        1.0
    );
    assert_eq!(
        m.get("worker_registry_workers_activity{activity=\"busy\"}"),
        0.0
    );
    assert_eq!(m.get("worker_registry_workers_suspect"), 0.0);
    assert_eq!(m.get("worker_registry_capacity_used"), 1.0);
    assert_eq!(m.get("worker_registry_capacity_limit"), 3.0);
    assert_eq!(m.get("worker_registry_sweeps_total"), 1.0);
    assert_eq!(m.get("worker_registry_brake_active"), 0.0);
    assert_eq!(m.get("worker_registry_snapshot_version"), 1.0);
    assert_eq!(m.get("worker_registry_snapshot_age_seconds"), 2.0);
    assert_eq!(m.get("worker_registry_events_missed_total"), 0.0);
    assert_eq!(m.get("worker_registry_data_losses_total"), 0.0);
    assert_eq!(
        metrics_format::check_histogram(&m, "worker_registry_sweep_duration_seconds"),
        Ok(1)
    );
    assert_eq!(
        m.types["worker_registry_sweep_duration_seconds"],
        "histogram"
    );
    assert_eq!(m.types["worker_registry_deaths"], "counter");
    assert_eq!(m.types["worker_registry_workers"], "gauge");
}

/// Hot-path counters are striped per thread; the scrape sums the stripes, so concurrent heartbeats
/// from many threads are all counted exactly once.
#[test]
fn striped_counters_sum_exactly_across_threads() {
    let registry = Direct::default();
    let workers: Vec<_> = (0..4).map(|_| registry.register().unwrap()).collect();
    std::thread::scope(|s| {
        for w in &workers {
            s.spawn(move || {
                for _ in 0..1000 {
                    w.heartbeat().unwrap();
                }
            });
        }
    });
    let m =
        metrics_format::parse(&Metrics::new(&InMemoryRegistry::from(registry.clone())).encode())
            .unwrap();
    assert_eq!(
        m.get("worker_registry_heartbeats_total{result=\"accepted\"}"),
        4000.0
    );
    assert_eq!(m.get("worker_registry_capacity_used"), 4.0);
}

#[test]
fn sweeps_fill_the_duration_histogram() {
    let registry = Direct::default();
    for _ in 0..5 {
        registry.sweep();
    }
    let m =
        metrics_format::parse(&Metrics::new(&InMemoryRegistry::from(registry.clone())).encode())
            .unwrap();
    assert_eq!(
        metrics_format::check_histogram(&m, "worker_registry_sweep_duration_seconds"),
        Ok(5)
    );
    assert_eq!(m.get("worker_registry_sweeps_total"), 5.0);
}

/// A delivery stuck in flight past `max_in_flight` is counted as stuck, apart from the claims
/// released because their worker died, and is no longer in flight.
#[test]
fn a_stuck_delivery_is_counted() {
    let clock = ManualClock::new();
    let config = RegistryConfig::builder()
        .startup_grace(Duration::ZERO)
        .sweep_interval(Duration::from_secs(1))
        .max_in_flight(Duration::from_secs(10))
        .build()
        .unwrap();
    let registry = Direct::with_clock(config, clock.clone());
    let Admission::Assigned(a) = registry.admit(&t(1), &e("stuck")) else {
        panic!()
    };
    // The worker heartbeats and the registry sweeps every interval (no stall), for longer than
    // max_in_flight.
    for _ in 0..12 {
        clock.advance(Duration::from_secs(1));
        registry.heartbeat(a.worker).unwrap();
        registry.sweep();
    }
    let m =
        metrics_format::parse(&Metrics::new(&InMemoryRegistry::from(registry.clone())).encode())
            .unwrap();
    assert_eq!(m.get("worker_registry_claims_stuck_total"), 1.0);
    assert_eq!(m.get("worker_registry_claims_released_total"), 0.0);
    assert_eq!(m.get("worker_registry_claims_in_flight"), 0.0);
    assert_eq!(m.types["worker_registry_claims_stuck"], "counter");
}

#[test]
fn payload_metrics_count_what_is_held_and_what_was_refused() {
    use worker_registry::{Payload, RegistryError, Rejection};

    let p = |n: usize| Payload::builder("ping", vec![0u8; n]).build().unwrap();
    let size = p(1000).size();
    let config = RegistryConfig::builder()
        .max_payload_bytes(size)
        .payload_budget(2 * size)
        .build()
        .unwrap();
    let registry = Direct::with_clock(config, ManualClock::new());
    for n in 1..=2 {
        let a = registry.admit_with(&t(n), &e("d"), Some(&p(1000))).unwrap();
        assert!(matches!(a, Admission::Assigned(_)));
    }
    assert!(matches!(
        registry.admit_with(&t(3), &e("d"), Some(&p(1000))),
        Ok(Admission::Rejected(Rejection::PayloadBudget { .. }))
    ));
    assert!(matches!(
        registry.admit_with(&t(3), &e("d"), Some(&p(1001))),
        Err(RegistryError::PayloadTooLarge { .. })
    ));
    registry.complete(&t(1), &e("d")).unwrap();

    let metrics = Metrics::new(&InMemoryRegistry::from(registry.clone()));
    let text = metrics.encode();
    let m = metrics_format::parse(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    assert_eq!(m.get("worker_registry_payloads_held"), 1.0);
    assert_eq!(m.get("worker_registry_payload_bytes_held"), size as f64);
    assert_eq!(
        m.get("worker_registry_payload_budget_bytes"),
        (2 * size) as f64
    );
    assert_eq!(
        m.get("worker_registry_rejected_total{reason=\"payload_budget\"}"),
        1.0
    );
    assert_eq!(m.get("worker_registry_payloads_too_large_total"), 1.0);
}
