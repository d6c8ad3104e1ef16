//! The router's own Prometheus metrics, served on `/metrics` next to the registry's.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `webhook_router_deliveries_total` | counter | `outcome`: how `POST /webhook` was answered |
//! | `webhook_router_admissions_total` | counter | `source` = webhook, redispatch; `outcome` = assigned, duplicate, capacity, draining, closing, unavailable |
//! | `webhook_router_worker_exits_total` | counter | `how` = exited, fenced, crashed, stopped |
//! | `webhook_router_redispatched_total` | counter | |
//! | `webhook_router_shutdown_unfinished_total` | counter | |
//! | `webhook_router_overflow_queued` | gauge | deliveries queued now behind full mailboxes (this process's containers) |
//! | `webhook_router_overflowed_total` | counter | deliveries ever queued behind a full mailbox |
//! | `webhook_router_reconcile_total` | counter | `what` = passes, pages, redelivered, redelivered_again, caught, known, ignored, permanent, gave_up, errors, rate_limited (see [`crate::reconcile`]) |
//! | `webhook_router_reconcile_chasing` | gauge | GUIDs the reconciler redelivered and the registry does not know yet (the lease holder's count after its last pass; 0 on the other replicas) |
//!
//! Every label value is present from the start, at zero. The registry's
//! `worker_registry_admitted_total`, `_duplicates_total` and `_rejected_total` add up to
//! `webhook_router_admissions_total` by outcome: a delivery the router gave back because its
//! worker's queue was full is counted as rejected for capacity, as the router answered it. A
//! delivery queued behind a full mailbox (answered `202 waiting`) was admitted: it counts as
//! `assigned` in the admissions and as `waiting` in the deliveries.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use worker_registry::metrics::{Metrics, Returned};

use crate::mailbox::OverflowMetrics;
use crate::outcome::{Dispatch, Source};
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
pub const DELIVERY_OUTCOMES: [&str; 14] = [
    "assigned",
    "duplicate",
    "waiting",
    "capacity",
    "draining",
    "waiting_room_full",
    "overflow_full",
    "closing",
    "unavailable",
    "ignored",
    "drained",
    "unauthorized",
    "invalid",
    "overloaded",
];

/// The router's counters (cheap `Arc` handles).
#[derive(Clone)]
pub struct RouterMetrics {
    deliveries: Family<Labels, Counter>,
    admissions: Family<Labels, Counter>,
    exits: Family<Labels, Counter>,
    reconcile: Family<Labels, Counter>,
    reconcile_chasing: Gauge,
    pub(crate) redispatched: Counter,
    pub(crate) shutdown_unfinished: Counter,
    /// Admissions given back because the worker's queue was full (the library's collector counts
    /// them as rejected rather than admitted).
    pub(crate) returned: Returned,
}

impl RouterMetrics {
    /// The counters, every label value at zero; `returned` is the handle of the library's
    /// [`Metrics`] these are registered with ([`Metrics::returned`]).
    pub fn new(returned: Returned) -> Self {
        let m = Self {
            deliveries: Family::default(),
            admissions: Family::default(),
            exits: Family::default(),
            reconcile: Family::default(),
            reconcile_chasing: Gauge::default(),
            redispatched: Counter::default(),
            shutdown_unfinished: Counter::default(),
            returned,
        };
        for outcome in DELIVERY_OUTCOMES {
            let _ = m.deliveries.get_or_create(&vec![("outcome", outcome)]);
        }
        for source in [Source::Webhook, Source::Redispatch, Source::Promotion] {
            for outcome in Dispatch::OUTCOMES {
                let _ = m
                    .admissions
                    .get_or_create(&vec![("source", source.as_str()), ("outcome", outcome)]);
            }
        }
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

    /// Counts one answer to `POST /webhook`.
    pub fn delivery(&self, outcome: &'static str) {
        self.deliveries
            .get_or_create(&vec![("outcome", outcome)])
            .inc();
    }

    /// Counts one admission attempt.
    pub fn admission(&self, source: Source, outcome: &'static str) {
        self.admissions
            .get_or_create(&vec![("source", source.as_str()), ("outcome", outcome)])
            .inc();
    }

    /// Counts one worker task's end.
    pub fn exit(&self, how: &'static str) {
        self.exits.get_or_create(&vec![("how", how)]).inc();
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

    /// Adds the router's metrics to `metrics`.
    pub fn register(&self, metrics: &mut Metrics) {
        let p = metrics.prometheus_mut();
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
