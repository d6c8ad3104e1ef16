//! Prometheus metrics for any registry backend (feature `http`): [`Metrics`] and its scrape-time
//! [`RegistryCollector`], in the OpenMetrics text format or the classic Prometheus text format
//! (0.0.4), whichever the scraper asks for ([`Format::from_accept`]).
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
//! | `worker_registry_sweeps_total`, `_suspected_total`, `_brake_engaged_total`, `_workers_purged_total` | counter | | stats |
//! | `worker_registry_brake_active` | gauge (0/1) | | snapshot |
//! | `worker_registry_sweep_duration_seconds` | histogram | | sweeps |
//! | `worker_registry_snapshot_version`, `_snapshot_age_seconds` | gauge | | snapshot |
//! | `worker_registry_events_missed_total` | counter | | subscribers |
//! | `worker_registry_sweeper_running` | gauge (0/1) | | [`SweeperMonitor`] ([`Metrics::sweeper`]) |
//! | `worker_registry_sweeper_errors_total`, `_sweeper_panics_total` | counter | | [`SweeperMonitor`] |
//!
//! Every label value is present from the first scrape, at zero. Help texts follow one style, the
//! one prometheus-client gives the metrics an application registers (it appends the period): a
//! noun phrase in sentence case ending in one period, `, by <label>.` for a labelled family, and
//! saying "in the last snapshot" for a value read from the published status snapshot.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use crate::api::contract::WorkerRegistry;
use crate::api::outcome::Assignment;
use crate::api::stats::SWEEP_DURATION_BUCKETS;
use crate::api::status::DeadReason;
use crate::sweeper::SweeperMonitor;

/// The `Content-Type` of [`Metrics::encode`]'s output (OpenMetrics text, which Prometheus scrapes).
///
/// # Examples
///
/// ```
/// assert!(worker_registry::metrics::CONTENT_TYPE.starts_with("application/openmetrics-text"));
/// ```
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of the classic Prometheus text format ([`Metrics::encode_text`]).
///
/// # Examples
///
/// ```
/// assert!(worker_registry::metrics::TEXT_CONTENT_TYPE.contains("version=0.0.4"));
/// ```
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An exposition format of `/metrics`.
///
/// # Examples
///
/// ```
/// use worker_registry::metrics::Format;
///
/// let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
/// assert_eq!(Format::from_accept(Some(prometheus)), Format::OpenMetrics);
/// assert_eq!(Format::from_accept(Some("text/plain; version=0.0.4")), Format::Text);
/// assert_eq!(Format::from_accept(None), Format::Text);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// OpenMetrics 1.0 text ([`CONTENT_TYPE`]).
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4 ([`TEXT_CONTENT_TYPE`]), which every scraper reads.
    Text,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` with a higher quality than `text/plain` (Prometheus does),
    /// the classic text format otherwise (no header, `*/*`, `text/plain`, or nothing acceptable).
    ///
    /// # Examples
    ///
    /// See [`Format`].
    pub fn from_accept(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::Text;
        };
        let mut best: Option<(u32, Self)> = None;
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let mut q = 1000;
            for p in parts {
                if let Some((k, v)) = p.split_once('=') {
                    if k.trim().eq_ignore_ascii_case("q") {
                        q = parse_q(v.trim()).unwrap_or(0);
                    }
                }
            }
            let format = if media.eq_ignore_ascii_case("application/openmetrics-text") {
                Self::OpenMetrics
            } else if media.eq_ignore_ascii_case("text/plain")
                || media.eq_ignore_ascii_case("text/*")
                || media == "*/*"
            {
                Self::Text
            } else {
                continue;
            };
            // On equal quality, the classic format wins unless OpenMetrics came first.
            if q > 0 && best.is_none_or(|(bq, _)| q > bq) {
                best = Some((q, format));
            }
        }
        best.map_or(Self::Text, |(_, f)| f)
    }

    /// The `Content-Type` to answer with.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::metrics::{Format, CONTENT_TYPE, TEXT_CONTENT_TYPE};
    ///
    /// assert_eq!(Format::OpenMetrics.content_type(), CONTENT_TYPE);
    /// assert_eq!(Format::Text.content_type(), TEXT_CONTENT_TYPE);
    /// ```
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => CONTENT_TYPE,
            Self::Text => TEXT_CONTENT_TYPE,
        }
    }
}

/// An HTTP quality value (`0` .. `1` with up to three decimals) in thousandths.
fn parse_q(v: &str) -> Option<u32> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac: u32 = format!("{frac:0<3}").parse().ok()?;
    match int {
        "0" => Some(frac),
        "1" if frac == 0 => Some(1000),
        _ => None,
    }
}

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
    /// See [`Returned`].
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
    /// See [`Metrics`].
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
    /// See [`Returned`].
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

/// The byte offset just past a sample line's label set (`name{...}`), quotes and escapes
/// respected; `None` if it has no labels.
fn labels_end(line: &str) -> Option<usize> {
    let open = line.find(['{', ' '])?;
    if line.as_bytes()[open] != b'{' {
        return None;
    }
    let (mut quoted, mut escaped) = (false, false);
    for (i, b) in line.bytes().enumerate().skip(open + 1) {
        match (quoted, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (_, false, b'"') => quoted = !quoted,
            (false, _, b'}') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// Rewrites OpenMetrics text (as prometheus-client writes it) in the classic text format 0.0.4.
fn openmetrics_to_text(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    let mut help: Option<(&str, String)> = None;
    // The family being written: its OpenMetrics name and type.
    let mut family: (&str, &str) = ("", "");
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            // OpenMetrics escapes `"` in help texts; the classic format does not.
            help = Some((name, text.replace("\\\"", "\"")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            family = (name, kind);
            let (text_name, text_kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                "stateset" => (name.to_owned(), "gauge"),
                "gaugehistogram" => (name.to_owned(), "histogram"),
                _ => (name.to_owned(), "untyped"),
            };
            if let Some((h, text)) = help.take() {
                if h == name {
                    out.push_str(&format!("# HELP {text_name} {text}\n"));
                }
            }
            out.push_str(&format!("# TYPE {text_name} {text_kind}\n"));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, _) = line.split_at(line.find(['{', ' ']).unwrap_or(line.len()));
        if family.1 == "counter" && name.strip_prefix(family.0) == Some("_created") {
            continue;
        }
        // An exemplar follows ` # ` after the value; the classic format has none.
        let labels_end = labels_end(line).unwrap_or(0);
        let sample = match line[labels_end..].find(" # ") {
            Some(i) => &line[..labels_end + i],
            None => line,
        };
        out.push_str(sample);
        out.push('\n');
    }
    out
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
    returned: Returned,
}

impl<R: WorkerRegistry> RegistryCollector<R> {
    /// A collector for `registry`.
    ///
    /// # Examples
    ///
    /// See [`RegistryCollector`].
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
            "Deliveries and assignments refused, by reason.",
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
                let bound = SWEEP_DURATION_BUCKETS.get(i).copied().unwrap_or(f64::MAX);
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
        Ok(())
    }
}

/// The [`Collector`] behind [`Metrics::sweeper`].
#[derive(Debug)]
struct SweeperCollector(SweeperMonitor);

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

#[cfg(test)]
mod tests {
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
