//! Prometheus metrics for any registry backend (feature `metrics`, which `http` builds on; no HTTP
//! framework): [`Metrics`] and its scrape-time [`RegistryCollector`], in the OpenMetrics text
//! format or the classic Prometheus text format (0.0.4), whichever the scraper asks for
//! ([`Format::from_accept`]). Serve [`Metrics::encode_as`] from any HTTP server, or mount
//! [`admin_router`](crate::http::admin_router) (feature `http`), which serves it on `/metrics`.
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
//! | `worker_registry_admitted_total` | counter | `worker` = new, existing | stats, less [`Returned`] |
//! | `worker_registry_duplicates_total` | counter | | stats |
//! | `worker_registry_rejected_total` | counter | `reason` = capacity, draining | stats, plus [`Returned`] |
//! | `worker_registry_claims_in_flight` | gauge | | snapshot |
//! | `worker_registry_claims_retained` | gauge | | live counter |
//! | `worker_registry_claims_completed_total`, `_released_total`, `_stuck_total`, `_expired_total`, `_evicted_total` | counter | | stats |
//! | `worker_registry_deaths_total` | counter | `reason` = missed_heartbeats, exited, deregistered, drain_timed_out | stats |
//! | `worker_registry_heartbeats_total` | counter | `result` = accepted, refused | stats |
//! | `worker_registry_sweeps_total`, `_suspected_total`, `_brake_engaged_total`, `_workers_purged_total`, `_released_expired_total` | counter | | stats |
//! | `worker_registry_brake_active` | gauge (0/1) | | snapshot |
//! | `worker_registry_sweep_duration_seconds` | histogram | | sweeps |
//! | `worker_registry_snapshot_version`, `_snapshot_age_seconds` | gauge | | snapshot |
//! | `worker_registry_events_missed_total` | counter | | subscribers |
//! | `worker_registry_data_losses_total` | counter | | stats (shared backends: data lost or rewound on the server) |
//! | `worker_registry_sweeper_running` | gauge (0/1) | | [`SweeperMonitor`] ([`Metrics::sweeper`]) |
//! | `worker_registry_sweeper_errors_total`, `_sweeper_panics_total` | counter | | [`SweeperMonitor`] |
//!
//! Every label value is present from the first scrape, at zero. Help texts follow one style, the
//! one prometheus-client gives the metrics an application registers (it appends the period): a
//! noun phrase in sentence case ending in one period, `, by <label>.` for a labelled family, and
//! saying "in the last snapshot" for a value read from the published status snapshot.

mod collector;
mod format;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::api::contract::WorkerRegistry;
use crate::api::outcome::Assignment;
use crate::sweeper::SweeperMonitor;

pub use collector::RegistryCollector;
use collector::SweeperCollector;
use format::openmetrics_to_text;
pub use format::{Format, CONTENT_TYPE, TEXT_CONTENT_TYPE};

/// Admissions an application gave back with [`release`](crate::WorkerRegistry::release) after
/// the registry had placed them (the worker's queue was full, say), and so answered as refused:
/// the collector counts them as `rejected_total{reason="capacity"}` instead of `admitted_total`,
/// so the counters add up to what the application answered. Cheap to clone; get it from
/// [`Metrics::returned`].
///
/// # Examples
///
/// ```
/// use worker_registry::{metrics::Metrics, Assignment, FencingToken, InMemoryRegistry, WorkerId};
///
/// let registry = InMemoryRegistry::default();
/// let metrics = Metrics::new(&registry);
/// let a = Assignment::new(WorkerId::new(1), FencingToken::new(WorkerId::new(1), 2).unwrap(), false);
/// metrics.returned().record(&a);
/// assert!(metrics.encode().contains("worker_registry_rejected_total{reason=\"capacity\"} 1"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Returned(Arc<[AtomicU64; 2]>);

impl Returned {
    /// Counts one assignment given back.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::metrics::Metrics;
    /// use worker_registry::{Admission, DeliveryId, InMemoryRegistry, Target, WorkerRegistry, WorkerRegistryExt};
    ///
    /// let registry = InMemoryRegistry::default();
    /// let metrics = Metrics::new(&registry);
    /// let returned = metrics.returned();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
    /// let Ok(Admission::Assigned(a)) = registry.admit(&t, &d).await else { panic!() };
    /// // The worker's queue is full: give the delivery back, answer 503, and count it as refused.
    /// registry.release(&t, &d).await.unwrap();
    /// returned.record(&a);
    /// assert!(metrics.encode().contains("worker_registry_rejected_total{reason=\"capacity\"} 1"));
    /// # }
    /// ```
    pub fn record(&self, a: &Assignment) {
        // Relaxed: a statistic read at scrape time.
        self.0[usize::from(!a.new)].fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, u64) {
        // Relaxed: a statistic.
        (
            self.0[0].load(Ordering::Relaxed),
            self.0[1].load(Ordering::Relaxed),
        )
    }
}

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
    returned: Returned,
}

impl Metrics {
    /// A Prometheus registry with a [`RegistryCollector`] for `registry` already in it.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{metrics::Metrics, InMemoryRegistry, RegistryConfig};
    ///
    /// let config = RegistryConfig::builder().max_workers(8).build().unwrap();
    /// let metrics = Metrics::new(&InMemoryRegistry::new(config));
    /// assert!(metrics.encode().contains("worker_registry_capacity_limit 8"));
    /// ```
    pub fn new<R: WorkerRegistry + Clone + 'static>(registry: &R) -> Self {
        let mut prometheus = prometheus_client::registry::Registry::default();
        let returned = Returned::default();
        prometheus.register_collector(Box::new(
            RegistryCollector::new(registry.clone()).with_returned(returned.clone()),
        ));
        Self {
            prometheus,
            returned,
        }
    }

    /// The handle through which the application reports admissions it gave back (see
    /// [`Returned`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{metrics::Metrics, InMemoryRegistry};
    ///
    /// let metrics = Metrics::new(&InMemoryRegistry::default());
    /// // A clone for the code that answers webhooks; the count is the same one.
    /// let for_the_handler = metrics.returned();
    /// # let _ = for_the_handler;
    /// ```
    pub fn returned(&self) -> Returned {
        self.returned.clone()
    }

    /// Exports a [`Sweeper`](crate::Sweeper)'s health: `worker_registry_sweeper_running`,
    /// `_sweeper_errors_total` and `_sweeper_panics_total`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use worker_registry::{metrics::Metrics, InMemoryRegistry, Sweeper};
    ///
    /// let registry = InMemoryRegistry::default();
    /// let sweeper = Sweeper::spawn(registry.clone(), |_| {});
    /// let mut metrics = Metrics::new(&registry);
    /// metrics.sweeper(sweeper.monitor());
    /// assert!(metrics.encode().contains("worker_registry_sweeper_running 1"));
    /// sweeper.shutdown().await;
    /// assert!(metrics.encode().contains("worker_registry_sweeper_running 0"));
    /// # }
    /// ```
    pub fn sweeper(&mut self, monitor: SweeperMonitor) {
        self.prometheus
            .register_collector(Box::new(SweeperCollector(monitor)));
    }

    /// The Prometheus registry, to register more metrics or collectors.
    ///
    /// # Examples
    ///
    /// ```
    /// use prometheus_client::metrics::gauge::Gauge;
    /// use worker_registry::{metrics::Metrics, InMemoryRegistry};
    ///
    /// let mut metrics = Metrics::new(&InMemoryRegistry::default());
    /// let queued = Gauge::<i64>::default();
    /// metrics.prometheus_mut().register("router_queued", "Deliveries queued", queued.clone());
    /// queued.set(3);
    /// assert!(metrics.encode().contains("router_queued 3"));
    /// ```
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
    /// ```
    /// use worker_registry::metrics::{Metrics, CONTENT_TYPE};
    /// use worker_registry::InMemoryRegistry;
    ///
    /// let metrics = Metrics::new(&InMemoryRegistry::default());
    /// let (content_type, body) = (CONTENT_TYPE, metrics.encode()); // the answer to a scrape
    /// assert!(content_type.starts_with("application/openmetrics-text"));
    /// assert!(body.ends_with("# EOF\n"));
    /// ```
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        // Writing into a String cannot fail, and the collectors only fail on writer errors.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.prometheus);
        out
    }

    /// Everything registered, in the classic Prometheus text format 0.0.4 (serve it with
    /// [`TEXT_CONTENT_TYPE`]): what [`encode`](Self::encode) writes, with each counter family named
    /// by its `_total` samples, no `# UNIT` lines, no `_created` samples or exemplars, and no
    /// `# EOF`.
    ///
    /// **Locking behaviour:** as [`encode`](Self::encode).
    ///
    /// # Examples
    ///
    /// ```
    /// let metrics = worker_registry::metrics::Metrics::new(&worker_registry::InMemoryRegistry::default());
    /// let text = metrics.encode_text();
    /// assert!(text.contains("# TYPE worker_registry_sweeps_total counter\nworker_registry_sweeps_total 0\n"));
    /// assert!(!text.contains("# EOF"));
    /// ```
    pub fn encode_text(&self) -> String {
        openmetrics_to_text(&self.encode())
    }

    /// [`encode`](Self::encode) or [`encode_text`](Self::encode_text).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::metrics::{Format, Metrics};
    ///
    /// let metrics = Metrics::new(&worker_registry::InMemoryRegistry::default());
    /// assert!(metrics.encode_as(Format::OpenMetrics).ends_with("# EOF\n"));
    /// ```
    pub fn encode_as(&self, format: Format) -> String {
        match format {
            Format::OpenMetrics => self.encode(),
            Format::Text => self.encode_text(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::format::parse_q;
    use super::*;
    use crate::InMemoryRegistry;

    /// The help-text style of the module documentation, checked on an exposition: sentence case,
    /// one final period, `, by <labels>.` exactly for labelled families, no "as of" variants.
    pub(crate) fn help_style_violations(om: &str) -> Vec<String> {
        let mut helps: Vec<(String, String)> = Vec::new();
        let mut labels: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let mut families: Vec<String> = Vec::new();
        for line in om.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
                helps.push((name.to_owned(), text.to_owned()));
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                families.push(rest.split(' ').next().unwrap_or("").to_owned());
            } else if !line.starts_with('#') {
                let family = families.last().cloned().unwrap_or_default();
                let entry = labels.entry(family).or_default();
                if let (Some(open), Some(close)) = (line.find('{'), line.find('}')) {
                    for pair in line[open + 1..close].split(',') {
                        let key = pair.split('=').next().unwrap_or("").to_owned();
                        if key != "le" && !key.is_empty() && !entry.contains(&key) {
                            entry.push(key);
                        }
                    }
                }
            }
        }
        let mut bad = Vec::new();
        for (name, text) in helps {
            let first_upper = text.chars().next().is_some_and(char::is_uppercase);
            let want = labels.get(&name).cloned().unwrap_or_default();
            let by_ok = if want.is_empty() {
                !text.contains(", by ")
            } else {
                text.ends_with(&format!(", by {}.", want.join(" and ")))
            };
            let one_period = text.ends_with('.') && !text.ends_with("..");
            if !first_upper || !one_period || !by_ok || text.contains("as of") {
                bad.push(format!("{name}: {text:?} (labels {want:?})"));
            }
        }
        bad
    }

    #[test]
    fn every_help_text_follows_the_style() {
        let registry = InMemoryRegistry::default();
        let mut metrics = Metrics::new(&registry);
        metrics.sweeper(SweeperMonitor::default());
        let bad = help_style_violations(&metrics.encode());
        assert!(bad.is_empty(), "{bad:#?}");
        // The checker itself catches the old style.
        let old = "# HELP h Heartbeats, accepted or refused.\n# TYPE h counter\nh_total{result=\"accepted\"} 1\n# EOF\n";
        assert_eq!(help_style_violations(old).len(), 1);
    }

    #[test]
    fn the_text_format_names_counters_by_their_samples_and_drops_openmetrics_only_lines() {
        let om = "# HELP a_seconds Age.\n# TYPE a_seconds gauge\n# UNIT a_seconds seconds\na_seconds 1.5\n\
                  # HELP c Things \\\"quoted\\\".\n# TYPE c counter\nc_total{l=\"x # {y}\"} 2 # {trace=\"t\"} 1.0\nc_created 17\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(om),
            "# HELP a_seconds Age.\n# TYPE a_seconds gauge\na_seconds 1.5\n\
             # HELP c_total Things \"quoted\".\n# TYPE c_total counter\nc_total{l=\"x # {y}\"} 2\n"
        );
    }

    #[test]
    fn accept_headers_are_negotiated_by_quality() {
        use Format::*;
        for (accept, want) in [
            (None, Text),
            (Some(""), Text),
            (Some("*/*"), Text),
            (Some("text/plain"), Text),
            (
                Some("Application/OpenMetrics-Text; version=1.0.0"),
                OpenMetrics,
            ),
            (
                Some("application/openmetrics-text;q=0.2, text/plain;q=0.9"),
                Text,
            ),
            (
                Some("text/plain;q=0.3, application/openmetrics-text;version=0.0.1;q=0.4"),
                OpenMetrics,
            ),
            (Some("application/openmetrics-text;q=0"), Text),
            (Some("application/json"), Text),
        ] {
            assert_eq!(Format::from_accept(accept), want, "{accept:?}");
        }
        assert_eq!(parse_q("0.5"), Some(500));
        assert_eq!(parse_q("1.000"), Some(1000));
        assert_eq!(parse_q("1.5"), None);
        assert_eq!(parse_q("0.1234"), None);
    }
}
