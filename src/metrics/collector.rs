//! The scrape-time collectors: a registry's counters and snapshot, and a `Sweeper`'s health.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::Returned;
use crate::api::contract::WorkerRegistry;
use crate::api::stats::SWEEP_DURATION_BUCKETS;
use crate::api::status::DeadReason;
use crate::sweeper::SweeperMonitor;

/// A prometheus-client [`Collector`] that reads a registry's counters and snapshot at each
/// scrape. [`Metrics::new`](super::Metrics::new) registers one; register it yourself to expose the registry through a
/// Prometheus registry of your own.
///
/// # Examples
///
/// ```
/// use worker_registry::{metrics::RegistryCollector, InMemoryRegistry};
///
/// let registry = InMemoryRegistry::default();
/// let mut prom = prometheus_client::registry::Registry::default();
/// prom.register_collector(Box::new(RegistryCollector::new(registry.clone())));
/// let mut out = String::new();
/// prometheus_client::encoding::text::encode(&mut out, &prom).unwrap();
/// assert!(out.contains("worker_registry_deaths_total{reason=\"exited\"} 0"));
/// ```
pub struct RegistryCollector<R> {
    registry: R,
    returned: Returned,
}

impl<R: WorkerRegistry> RegistryCollector<R> {
    /// A collector for `registry`.
    pub fn new(registry: R) -> Self {
        Self {
            registry,
            returned: Returned::default(),
        }
    }

    /// Counts the admissions reported through `returned` as rejected instead of admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::metrics::{RegistryCollector, Returned};
    ///
    /// let c = RegistryCollector::new(worker_registry::InMemoryRegistry::default())
    ///     .with_returned(Returned::default());
    /// # let _ = c;
    /// ```
    #[must_use]
    pub fn with_returned(mut self, returned: Returned) -> Self {
        self.returned = returned;
        self
    }
}

impl<R: WorkerRegistry> fmt::Debug for RegistryCollector<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryCollector").finish_non_exhaustive()
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    let m = ConstCounter::new(v);
    m.encode(e.encode_descriptor(name, help, None, m.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> fmt::Result {
    let m = ConstGauge::new(v);
    m.encode(e.encode_descriptor(name, help, None, m.metric_type())?)
}

fn family<M: EncodeMetric>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    samples: &[(&str, M)],
) -> fmt::Result {
    let Some((_, first)) = samples.first() else {
        return Ok(());
    };
    let mut me = e.encode_descriptor(name, help, None, first.metric_type())?;
    for (value, m) in samples {
        let labels = [(label, *value)];
        m.encode(me.encode_family(&labels)?)?;
    }
    Ok(())
}

fn int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl<R: WorkerRegistry + 'static> Collector for RegistryCollector<R> {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let r = &self.registry;
        let stats = r.stats();
        let snap = r.status();
        let (returned_new, returned_existing) = self.returned.get();
        let c = snap.counts;
        let e = &mut e;

        family(
            e,
            "worker_registry_workers",
            "Workers in the last snapshot, by status.",
            "status",
            &[
                ("active", ConstGauge::new(int(c.active))),
                ("draining", ConstGauge::new(int(c.draining))),
                ("dead", ConstGauge::new(int(c.dead))),
            ],
        )?;
        family(
            e,
            "worker_registry_workers_activity",
            "Live workers in the last snapshot, by activity.",
            "activity",
            &[
                ("idle", ConstGauge::new(int(c.idle))),
                ("busy", ConstGauge::new(int(c.busy))),
            ],
        )?;
        gauge(
            e,
            "worker_registry_workers_suspect",
            "Live workers marked suspect by the mass-staleness brake in the last snapshot.",
            int(c.suspect),
        )?;
        gauge(
            e,
            "worker_registry_capacity_used",
            "Live (active or draining) workers.",
            int(stats.live_workers),
        )?;
        gauge(
            e,
            "worker_registry_capacity_limit",
            "Configured maximum of live workers.",
            int(r.config().max_workers()),
        )?;

        family(
            e,
            "worker_registry_admitted",
            "Deliveries and assignments placed on a new or the target's existing worker, by worker.",
            "worker",
            &[
                ("new", ConstCounter::new(stats.admitted_new.saturating_sub(returned_new))),
                (
                    "existing",
                    ConstCounter::new(stats.admitted_sticky.saturating_sub(returned_existing)),
                ),
            ],
        )?;
        counter(
            e,
            "worker_registry_duplicates",
            "Deliveries refused as duplicates of an in-flight or retained claim.",
            stats.duplicates,
        )?;
        family(
            e,
            "worker_registry_rejected",
            "Deliveries and assignments refused (a parked delivery is not), by reason.",
            "reason",
            &[
                (
                    "capacity",
                    ConstCounter::new(
                        stats
                            .rejected_capacity
                            .saturating_add(returned_new)
                            .saturating_add(returned_existing),
                    ),
                ),
                ("draining", ConstCounter::new(stats.rejected_draining)),
                (
                    "payload_budget",
                    ConstCounter::new(stats.rejected_payload_budget),
                ),
            ],
        )?;

        gauge(
            e,
            "worker_registry_claims_in_flight",
            "Claims held by live workers in the last snapshot.",
            int(snap.claims.in_flight),
        )?;
        gauge(
            e,
            "worker_registry_claims_retained",
            "Completed claims retained for redelivery detection.",
            int(stats.retained_claims),
        )?;
        counter(
            e,
            "worker_registry_claims_completed",
            "Claims completed.",
            stats.claims_completed,
        )?;
        counter(
            e,
            "worker_registry_claims_released",
            "In-flight claims released for re-dispatch.",
            stats.claims_released,
        )?;
        counter(
            e,
            "worker_registry_claims_stuck",
            "In-flight claims released because they stayed in flight longer than max_in_flight (not in claims_released).",
            stats.claims_stuck,
        )?;
        counter(
            e,
            "worker_registry_claims_expired",
            "Retained claims forgotten after the retention window.",
            stats.claims_expired,
        )?;
        counter(
            e,
            "worker_registry_claims_evicted",
            "Retained claims evicted early to stay under max_retained_claims.",
            stats.claims_evicted,
        )?;
        counter(
            e,
            "worker_registry_released_expired",
            "Released deliveries never acknowledged, dropped after claim_retention.",
            stats.released_expired,
        )?;

        gauge(
            e,
            "worker_registry_waiting",
            "Deliveries parked in the waiting room (always 0 with the room off).",
            int(stats.waiting),
        )?;
        counter(
            e,
            "worker_registry_waiting_parked",
            "Deliveries parked in the waiting room (not counted in worker_registry_rejected).",
            stats.parked,
        )?;
        counter(
            e,
            "worker_registry_waiting_promoted",
            "Parked deliveries promoted onto a worker and handed over.",
            stats.promoted,
        )?;
        counter(
            e,
            "worker_registry_waiting_expired",
            "Parked deliveries dropped after max_wait without being promoted.",
            stats.waiting_expired,
        )?;

        gauge(
            e,
            "worker_registry_payloads_held",
            "Payloads held with deliveries in flight, waiting, or released and not yet admitted again.",
            int(stats.payloads_held),
        )?;
        gauge(
            e,
            "worker_registry_payload_bytes_held",
            "Bytes of those payloads (body plus metadata), what payload_budget limits.",
            i64::try_from(stats.payload_bytes_held).unwrap_or(i64::MAX),
        )?;
        gauge(
            e,
            "worker_registry_payload_budget_bytes",
            "Configured payload_budget.",
            i64::try_from(r.config().payload_budget()).unwrap_or(i64::MAX),
        )?;
        counter(
            e,
            "worker_registry_payloads_too_large",
            "Admissions refused because their payload was larger than max_payload_bytes.",
            stats.payloads_too_large,
        )?;

        let deaths = DeadReason::ALL
            .map(|reason| (reason.as_str(), ConstCounter::new(stats.deaths(reason))));
        family(
            e,
            "worker_registry_deaths",
            "Workers that died, by reason.",
            "reason",
            &deaths,
        )?;
        family(
            e,
            "worker_registry_heartbeats",
            "Heartbeats (refused: from a dead or unknown worker), by result.",
            "result",
            &[
                ("accepted", ConstCounter::new(stats.heartbeats)),
                ("refused", ConstCounter::new(stats.heartbeats_refused)),
            ],
        )?;

        counter(e, "worker_registry_sweeps", "Sweeps run.", stats.sweeps)?;
        counter(
            e,
            "worker_registry_suspected",
            "Times a worker was marked suspect.",
            stats.suspected,
        )?;
        counter(
            e,
            "worker_registry_brake_engaged",
            "Sweeps in which the mass-staleness brake held back deaths.",
            stats.brake_engaged,
        )?;
        counter(
            e,
            "worker_registry_workers_purged",
            "Dead worker records purged after their retention.",
            stats.workers_purged,
        )?;
        gauge(
            e,
            "worker_registry_brake_active",
            "Whether the mass-staleness brake was engaged in the last sweep (1) or not (0).",
            i64::from(snap.brake_engaged),
        )?;

        let h = &stats.sweep_durations;
        let mut count = 0;
        let buckets: Vec<(f64, u64)> = h
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| {
                count += n;
                // The last bucket is unbounded: prometheus-client 0.26 writes `le="+Inf"`
                // for an infinite bound (0.23 took f64::MAX for it).
                let bound = SWEEP_DURATION_BUCKETS
                    .get(i)
                    .copied()
                    .unwrap_or(f64::INFINITY);
                (bound, *n)
            })
            .collect();
        e.encode_descriptor(
            "worker_registry_sweep_duration",
            "Duration of sweeps.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(h.sum.as_secs_f64(), count, &buckets, None)?;

        gauge(
            e,
            "worker_registry_snapshot_version",
            "Version of the published status snapshot.",
            i64::try_from(snap.version).unwrap_or(i64::MAX),
        )?;
        let m = ConstGauge::new(stats.snapshot_age.as_secs_f64());
        m.encode(e.encode_descriptor(
            "worker_registry_snapshot_age",
            "Age of the published status snapshot.",
            Some(&Unit::Seconds),
            m.metric_type(),
        )?)?;

        counter(
            e,
            "worker_registry_events_missed",
            "Lifecycle events dropped for subscribers that fell behind.",
            stats.events_missed,
        )?;
        counter(
            e,
            "worker_registry_data_losses",
            "Times the shared backend's server was found to have lost or rewound the registry's data.",
            stats.data_losses,
        )?;
        Ok(())
    }
}

/// The [`Collector`] behind [`Metrics::sweeper`](super::Metrics::sweeper).
#[derive(Debug)]
pub(super) struct SweeperCollector(pub(super) SweeperMonitor);

impl Collector for SweeperCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let m = &self.0;
        gauge(
            &mut e,
            "worker_registry_sweeper_running",
            "Whether the sweeper task runs (1) or has stopped (0).",
            i64::from(m.is_running()),
        )?;
        counter(
            &mut e,
            "worker_registry_sweeper_errors",
            "Sweeps and acknowledgements that failed because the backend could not answer.",
            m.errors(),
        )?;
        counter(
            &mut e,
            "worker_registry_sweeper_panics",
            "Panics caught in the sweep callback or the backend.",
            m.callback_panics(),
        )
    }
}
