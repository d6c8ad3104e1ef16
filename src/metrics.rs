//! Prometheus metrics for any registry backend (feature `http`): [`Metrics`] and its scrape-time
//! [`RegistryCollector`].
//!
//! Nothing here is on the registry's hot path: the registry already counts what it decides in
//! counters, which every backend supplies through [`WorkerRegistry::stats`], so the collector reads
//! those (and the published [`status`](WorkerRegistry::status) snapshot) when a scrape asks, instead of keeping a second set of
//! counters that every delivery would have to bump.
//!
//! | metric | type | labels | from |
//! |---|---|---|---|
//! | `worker_registry_workers` | gauge | `status` = active, draining, dead | snapshot |
//! | `worker_registry_workers_activity` | gauge | `activity` = idle, busy | snapshot |
//! | `worker_registry_workers_suspect` | gauge | | snapshot |
//! | `worker_registry_capacity_used` / `_limit` | gauge | | live counter / config |
//! | `worker_registry_admitted_total` | counter | `worker` = new, existing | stats |
//! | `worker_registry_duplicates_total` | counter | | stats |
//! | `worker_registry_rejected_total` | counter | `reason` = capacity, draining | stats |
//! | `worker_registry_claims_in_flight` | gauge | | snapshot |
//! | `worker_registry_claims_retained` | gauge | | live counter |
//! | `worker_registry_claims_completed_total`, `_released_total`, `_expired_total`, `_evicted_total` | counter | | stats |
//! | `worker_registry_deaths_total` | counter | `reason` = missed_heartbeats, exited, deregistered | stats |
//! | `worker_registry_heartbeats_total` | counter | `result` = accepted, refused | stats |
//! | `worker_registry_sweeps_total`, `_suspected_total`, `_brake_engaged_total`, `_workers_purged_total` | counter | | stats |
//! | `worker_registry_brake_active` | gauge (0/1) | | snapshot |
//! | `worker_registry_sweep_duration_seconds` | histogram | | sweeps |
//! | `worker_registry_snapshot_version`, `_snapshot_age_seconds` | gauge | | snapshot |
//! | `worker_registry_events_missed_total` | counter | | subscribers |

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use crate::api::contract::WorkerRegistry;
use crate::api::stats::SWEEP_DURATION_BUCKETS;
use crate::api::status::DeadReason;

/// The `Content-Type` of [`Metrics::encode`]'s output (OpenMetrics text, which Prometheus scrapes).
///
/// # Examples
///
/// ```
/// assert!(worker_registry::metrics::CONTENT_TYPE.starts_with("application/openmetrics-text"));
/// ```
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A Prometheus registry holding the worker registry's metrics, to which an application adds its
/// own before handing it to [`admin_router`](crate::http::admin_router) (which serves it on
/// `GET /metrics`).
///
/// prometheus-client metrics (`Counter`, `Family`, `Histogram`) are cheap `Arc` handles: register a
/// clone here and keep the other to update.
///
/// # Examples
///
/// ```
/// use prometheus_client::metrics::counter::Counter;
/// use worker_registry::{metrics::Metrics, InMemoryRegistry};
///
/// let registry = InMemoryRegistry::default();
/// let mut metrics = Metrics::new(&registry);
/// let webhooks = Counter::<u64>::default();
/// metrics.prometheus_mut().register("router_webhooks", "Webhooks received", webhooks.clone());
/// webhooks.inc();
///
/// let text = metrics.encode();
/// assert!(text.contains("router_webhooks_total 1"));
/// assert!(text.contains("worker_registry_capacity_limit 64"));
/// assert!(text.ends_with("# EOF\n"));
/// ```
#[derive(Debug)]
pub struct Metrics {
    prometheus: prometheus_client::registry::Registry,
}

impl Metrics {
    /// A Prometheus registry with a [`RegistryCollector`] for `registry` already in it.
    ///
    /// # Examples
    ///
    /// See [`Metrics`].
    pub fn new<R: WorkerRegistry + Clone + 'static>(registry: &R) -> Self {
        let mut prometheus = prometheus_client::registry::Registry::default();
        prometheus.register_collector(Box::new(RegistryCollector::new(registry.clone())));
        Self { prometheus }
    }

    /// The Prometheus registry, to register more metrics or collectors.
    ///
    /// # Examples
    ///
    /// See [`Metrics`].
    pub fn prometheus_mut(&mut self) -> &mut prometheus_client::registry::Registry {
        &mut self.prometheus
    }

    /// The Prometheus registry.
    ///
    /// # Examples
    ///
    /// ```
    /// let metrics = worker_registry::metrics::Metrics::new(&worker_registry::InMemoryRegistry::default());
    /// let mut out = String::new();
    /// prometheus_client::encoding::text::encode(&mut out, metrics.prometheus()).unwrap();
    /// assert!(out.contains("worker_registry_workers"));
    /// ```
    pub fn prometheus(&self) -> &prometheus_client::registry::Registry {
        &self.prometheus
    }

    /// Everything registered, in the OpenMetrics text format (serve it with [`CONTENT_TYPE`]).
    ///
    /// **Locking behaviour:** reads striped counters and the published snapshot; takes no map lock.
    ///
    /// # Examples
    ///
    /// See [`Metrics`].
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        // Writing into a String cannot fail, and the collectors only fail on writer errors.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.prometheus);
        out
    }
}

/// A prometheus-client [`Collector`] that reads a registry's counters and snapshot at each
/// scrape. [`Metrics::new`] registers one; register it yourself to expose the registry through a
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
}

impl<R: WorkerRegistry> RegistryCollector<R> {
    /// A collector for `registry`.
    ///
    /// # Examples
    ///
    /// See [`RegistryCollector`].
    pub fn new(registry: R) -> Self {
        Self { registry }
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
        let c = snap.counts;
        let e = &mut e;

        family(
            e,
            "worker_registry_workers",
            "Workers by status, as of the last sweep's snapshot",
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
            "Live workers by activity, as of the last sweep's snapshot",
            "activity",
            &[
                ("idle", ConstGauge::new(int(c.idle))),
                ("busy", ConstGauge::new(int(c.busy))),
            ],
        )?;
        gauge(
            e,
            "worker_registry_workers_suspect",
            "Live workers marked suspect by the mass-staleness brake, as of the last snapshot",
            int(c.suspect),
        )?;
        gauge(
            e,
            "worker_registry_capacity_used",
            "Live (active or draining) workers now",
            int(stats.live_workers),
        )?;
        gauge(
            e,
            "worker_registry_capacity_limit",
            "The configured maximum of live workers",
            int(r.config().max_workers()),
        )?;

        family(
            e,
            "worker_registry_admitted",
            "Deliveries or assignments placed, on a new worker or the target's existing one",
            "worker",
            &[
                ("new", ConstCounter::new(stats.admitted_new)),
                ("existing", ConstCounter::new(stats.admitted_sticky)),
            ],
        )?;
        counter(
            e,
            "worker_registry_duplicates",
            "Deliveries refused as duplicates of an in-flight or retained claim",
            stats.duplicates,
        )?;
        family(
            e,
            "worker_registry_rejected",
            "Deliveries or assignments rejected, by reason",
            "reason",
            &[
                ("capacity", ConstCounter::new(stats.rejected_capacity)),
                ("draining", ConstCounter::new(stats.rejected_draining)),
            ],
        )?;

        gauge(
            e,
            "worker_registry_claims_in_flight",
            "Claims held by live workers, as of the last snapshot",
            int(snap.claims.in_flight),
        )?;
        gauge(
            e,
            "worker_registry_claims_retained",
            "Completed claims retained for redelivery detection now",
            int(stats.retained_claims),
        )?;
        counter(
            e,
            "worker_registry_claims_completed",
            "Claims completed",
            stats.claims_completed,
        )?;
        counter(
            e,
            "worker_registry_claims_released",
            "In-flight claims released for re-dispatch because their worker died",
            stats.claims_released,
        )?;
        counter(
            e,
            "worker_registry_claims_expired",
            "Retained claims forgotten after the retention window",
            stats.claims_expired,
        )?;
        counter(
            e,
            "worker_registry_claims_evicted",
            "Retained claims evicted early to stay under max_retained_claims",
            stats.claims_evicted,
        )?;

        let deaths = DeadReason::ALL
            .map(|reason| (reason.as_str(), ConstCounter::new(stats.deaths(reason))));
        family(
            e,
            "worker_registry_deaths",
            "Workers that died, by reason",
            "reason",
            &deaths,
        )?;
        family(
            e,
            "worker_registry_heartbeats",
            "Heartbeats, accepted or refused (dead or unknown worker)",
            "result",
            &[
                ("accepted", ConstCounter::new(stats.heartbeats)),
                ("refused", ConstCounter::new(stats.heartbeats_refused)),
            ],
        )?;

        counter(e, "worker_registry_sweeps", "Sweeps run", stats.sweeps)?;
        counter(
            e,
            "worker_registry_suspected",
            "Times a worker was marked suspect",
            stats.suspected,
        )?;
        counter(
            e,
            "worker_registry_brake_engaged",
            "Sweeps in which the mass-staleness brake held back deaths",
            stats.brake_engaged,
        )?;
        counter(
            e,
            "worker_registry_workers_purged",
            "Dead worker records purged after their retention",
            stats.workers_purged,
        )?;
        gauge(
            e,
            "worker_registry_brake_active",
            "1 if the mass-staleness brake was engaged in the last sweep",
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
                let bound = SWEEP_DURATION_BUCKETS.get(i).copied().unwrap_or(f64::MAX);
                (bound, *n)
            })
            .collect();
        e.encode_descriptor(
            "worker_registry_sweep_duration",
            "How long sweeps took",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(h.sum.as_secs_f64(), count, &buckets, None)?;

        gauge(
            e,
            "worker_registry_snapshot_version",
            "Version of the published status snapshot",
            i64::try_from(snap.version).unwrap_or(i64::MAX),
        )?;
        let m = ConstGauge::new(stats.snapshot_age.as_secs_f64());
        m.encode(e.encode_descriptor(
            "worker_registry_snapshot_age",
            "Age of the published status snapshot",
            Some(&Unit::Seconds),
            m.metric_type(),
        )?)?;

        counter(
            e,
            "worker_registry_events_missed",
            "Lifecycle events dropped for subscribers that fell behind",
            stats.events_missed,
        )?;
        Ok(())
    }
}
