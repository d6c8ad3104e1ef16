//! The router's own Prometheus metrics, served on `/metrics` next to the registry's. Their names,
//! types and labels are listed once, with the registry's, in
//! [`worker_registry::docs::admin`]; [`DELIVERY_OUTCOMES`], [`RECONCILE_COUNTS`] and
//! [`timed::CALLS`] are the label values in code.
//!
//! Every label value is present from the start, at zero. The registry's
//! `worker_registry_admitted_total`, `_duplicates_total` and `_rejected_total` add up to
//! `webhook_router_admissions_total` by outcome: a delivery the router gave back because its
//! worker's queue was full is counted as rejected for capacity, as the router answered it. A
//! delivery queued behind a full mailbox (answered `202 waiting`) was admitted: it counts as
//! `assigned` in the admissions and as `waiting` in the deliveries.
//!
//! The histograms are lock-free ([`histogram`]); the counters on the webhook path are looked up
//! once, at start, so counting an answer is an atomic addition.

pub mod histogram;
pub mod timed;

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use worker_registry::metrics::{Metrics, Returned};

use histogram::{Histogram, Histograms, BUCKETS};
use timed::RegistryCalls;

use crate::mailbox::OverflowMetrics;
use crate::outcome::{Outcome, Source};
use crate::worker::Exit;

type Labels = Vec<(&'static str, &'static str)>;

/// Every `what` label of `webhook_router_reconcile_total`.
pub const RECONCILE_COUNTS: [&str; 11] = [
    "passes",
    "pages",
    "redelivered",
    "redelivered_again",
    "caught",
    "known",
    "ignored",
    "permanent",
    "gave_up",
    "errors",
    "rate_limited",
];

/// Every outcome label of `webhook_router_deliveries_total`.
pub const DELIVERY_OUTCOMES: [&str; 15] = [
    "assigned",
    "duplicate",
    "waiting",
    "capacity",
    "draining",
    "waiting_room_full",
    "overflow_full",
    "payload_budget",
    "closing",
    "unavailable",
    "ignored",
    "drained",
    "unauthorized",
    "invalid",
    "overloaded",
];

/// The HTTP status class of each of [`DELIVERY_OUTCOMES`].
fn status_class(outcome: &str) -> &'static str {
    match outcome {
        "assigned" | "duplicate" | "waiting" | "ignored" | "drained" => "2xx",
        "unauthorized" | "invalid" => "4xx",
        _ => "5xx",
    }
}

/// The outcomes of `webhook_router_admissions_total`, in label order.
fn admission_outcomes() -> impl Iterator<Item = Outcome> + Clone {
    Outcome::ALL.into_iter().filter(|o| o.is_admission())
}

/// The sources of `webhook_router_admissions_total`, in label order.
const SOURCES: [Source; 3] = [Source::Webhook, Source::Redispatch, Source::Promotion];

/// The router's counters and histograms (cheap `Arc` handles).
#[derive(Clone)]
pub struct RouterMetrics {
    deliveries: Family<Labels, Counter>,
    /// `deliveries`' counters, in [`DELIVERY_OUTCOMES`] order.
    delivered: Arc<[Counter]>,
    /// `webhook_router_webhook_duration_seconds`, in [`DELIVERY_OUTCOMES`] order.
    webhook_seconds: Arc<histogram::Family>,
    admissions: Family<Labels, Counter>,
    /// `admissions`' counters, [`SOURCES`] by [`admission_outcomes`].
    admitted: Arc<[Counter]>,
    /// The registry's calls' durations.
    calls: RegistryCalls,
    exits: Family<Labels, Counter>,
    reconcile: Family<Labels, Counter>,
    reconcile_chasing: Gauge,
    pub(crate) redispatched: Counter,
    pub(crate) shutdown_unfinished: Counter,
    /// Events whose command failed every attempt (reported over the worker protocol).
    worker_failed: Counter,
    /// Admissions given back because the worker's queue was full (the library's collector counts
    /// them as rejected rather than admitted).
    pub(crate) returned: Returned,
}

impl RouterMetrics {
    /// The counters, every label value at zero; `returned` is the handle of the library's
    /// [`Metrics`] these are registered with ([`Metrics::returned`]); `calls`, the registry's
    /// calls' histograms ([`timed::Timed`] records into them).
    pub fn new(returned: Returned, calls: RegistryCalls) -> Self {
        let deliveries = Family::<Labels, Counter>::default();
        let delivered = DELIVERY_OUTCOMES
            .iter()
            .map(|o| deliveries.get_or_create(&vec![("outcome", *o)]).clone())
            .collect();
        let mut webhook_seconds = histogram::Family::new(
            "webhook_router_webhook_duration",
            "Time from a webhook request's head to its answer, by outcome and status.",
        );
        for outcome in DELIVERY_OUTCOMES {
            let labels = vec![("outcome", outcome), ("status", status_class(outcome))];
            webhook_seconds.series(labels, BUCKETS);
        }
        let admissions = Family::<Labels, Counter>::default();
        let admitted = SOURCES
            .iter()
            .flat_map(|s| admission_outcomes().map(move |o| (s.as_str(), o.as_str())))
            .map(|(s, o)| {
                admissions
                    .get_or_create(&vec![("source", s), ("outcome", o)])
                    .clone()
            })
            .collect();
        let m = Self {
            deliveries,
            delivered,
            webhook_seconds: Arc::new(webhook_seconds),
            admissions,
            admitted,
            calls,
            exits: Family::default(),
            reconcile: Family::default(),
            reconcile_chasing: Gauge::default(),
            redispatched: Counter::default(),
            shutdown_unfinished: Counter::default(),
            worker_failed: Counter::default(),
            returned,
        };
        for how in Exit::ALL {
            let _ = m.exits.get_or_create(&vec![("how", how)]);
        }
        for what in RECONCILE_COUNTS {
            let _ = m.reconcile.get_or_create(&vec![("what", what)]);
        }
        m
    }

    /// `webhook_router_shutdown_unfinished_total` now.
    pub fn shutdown_unfinished(&self) -> u64 {
        self.shutdown_unfinished.get()
    }

    /// Counts one answer to `POST /webhook` (`outcome`: one of [`DELIVERY_OUTCOMES`]).
    pub fn delivery(&self, outcome: &'static str) {
        match DELIVERY_OUTCOMES.iter().position(|o| *o == outcome) {
            Some(i) => {
                self.delivered[i].inc();
            }
            None => {
                self.deliveries
                    .get_or_create(&vec![("outcome", outcome)])
                    .inc();
            }
        }
    }

    /// Counts one answer to `POST /webhook` and how long it took.
    pub fn webhook(&self, outcome: &'static str, took: std::time::Duration) {
        self.delivery(outcome);
        if let Some(h) = self.webhook_histogram(outcome) {
            h.observe(took);
        }
    }

    /// The webhook duration histogram of `outcome`.
    fn webhook_histogram(&self, outcome: &str) -> Option<&Histogram> {
        let i = DELIVERY_OUTCOMES.iter().position(|o| *o == outcome)?;
        self.webhook_seconds.get(i)
    }

    /// `webhook_router_webhook_duration_seconds`' count for `outcome` now.
    pub fn webhook_count(&self, outcome: &str) -> u64 {
        self.webhook_histogram(outcome).map_or(0, Histogram::count)
    }

    /// The registry's calls' histograms.
    pub fn registry_calls(&self) -> &RegistryCalls {
        &self.calls
    }

    /// Counts one admission attempt.
    pub fn admission(&self, source: Source, outcome: Outcome) {
        let s = SOURCES.iter().position(|s| *s == source);
        let o = admission_outcomes().position(|o| o == outcome);
        match (s, o) {
            (Some(s), Some(o)) => {
                self.admitted[s * admission_outcomes().count() + o].inc();
            }
            _ => {
                let labels = vec![("source", source.as_str()), ("outcome", outcome.as_str())];
                self.admissions.get_or_create(&labels).inc();
            }
        }
    }

    /// Counts one worker task's end.
    pub fn exit(&self, how: &'static str) {
        self.exits.get_or_create(&vec![("how", how)]).inc();
    }

    /// Workers that ended `how` (one of [`Exit::ALL`]) so far.
    pub fn exits(&self, how: &'static str) -> u64 {
        self.exits.get_or_create(&vec![("how", how)]).get()
    }

    /// Counts an event whose command failed every attempt (completed as failed).
    pub fn worker_failed(&self) {
        self.worker_failed.inc();
    }

    /// Events completed as failed so far.
    pub fn failed_events(&self) -> u64 {
        self.worker_failed.get()
    }

    /// Adds `n` to the reconciler's count `what` (one of [`RECONCILE_COUNTS`]).
    pub fn reconcile(&self, what: &'static str, n: u64) {
        self.reconcile
            .get_or_create(&vec![("what", what)])
            .inc_by(n);
    }

    /// The reconciler's count `what` now.
    pub fn reconciled(&self, what: &'static str) -> u64 {
        self.reconcile.get_or_create(&vec![("what", what)]).get()
    }

    /// Sets `webhook_router_reconcile_chasing`: GUIDs the reconciler is still chasing.
    pub fn set_reconcile_chasing(&self, n: u64) {
        self.reconcile_chasing
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// `webhook_router_reconcile_chasing` now.
    pub fn reconcile_chasing(&self) -> u64 {
        u64::try_from(self.reconcile_chasing.get()).unwrap_or(0)
    }

    /// Adds the overflows' gauge and counter (the platform's, shared by the replicas of a
    /// process) to `metrics`.
    pub fn register_overflow(&self, metrics: &mut Metrics, overflow: &OverflowMetrics) {
        let p = metrics.prometheus_mut();
        p.register(
            "webhook_router_overflow_queued",
            "Deliveries queued in order behind a worker's full mailbox now",
            overflow.queued.clone(),
        );
        p.register(
            "webhook_router_overflowed",
            "Deliveries queued behind a worker's full mailbox, answered 202 waiting",
            overflow.total.clone(),
        );
    }

    /// Adds the router's metrics to `metrics`, with the registry calls' histograms `calls` (the
    /// family [`RegistryCalls`] were made in).
    pub fn register(&self, metrics: &mut Metrics, calls: histogram::Family) {
        let p = metrics.prometheus_mut();
        p.register_collector(Box::new(Histograms(vec![
            self.webhook_seconds.clone(),
            Arc::new(calls),
        ])));
        p.register(
            "webhook_router_build",
            "The router's build, by version and features and profile",
            build_info(),
        );
        p.register(
            "webhook_router_deliveries",
            "Webhook deliveries answered, by outcome",
            self.deliveries.clone(),
        );
        p.register(
            "webhook_router_admissions",
            "Admissions the router asked the registry for, by source and outcome",
            self.admissions.clone(),
        );
        p.register(
            "webhook_router_worker_exits",
            "Simulated worker containers that stopped, by how",
            self.exits.clone(),
        );
        p.register(
            "webhook_router_redispatched",
            "Released events placed on a worker again",
            self.redispatched.clone(),
        );
        p.register(
            "webhook_router_shutdown_unfinished",
            "Accepted deliveries not completed at shutdown, released through the registry",
            self.shutdown_unfinished.clone(),
        );
        p.register(
            "webhook_router_worker_failed",
            "Events whose command failed every attempt, completed as failed (worker protocol)",
            self.worker_failed.clone(),
        );
        p.register(
            "webhook_router_reconcile",
            "What the reconciler of failed deliveries did, by what",
            self.reconcile.clone(),
        );
        p.register(
            "webhook_router_reconcile_chasing",
            "GUIDs the reconciler redelivered that the registry does not know yet",
            self.reconcile_chasing.clone(),
        );
    }
}

/// `webhook_router_build_info`'s labels.
fn build_info() -> Info<Vec<(&'static str, &'static str)>> {
    let features = if cfg!(feature = "otel") { "otel" } else { "" };
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    Info::new(vec![
        ("version", env!("CARGO_PKG_VERSION")),
        ("features", features),
        ("profile", profile),
    ])
}
