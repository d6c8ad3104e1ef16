//! A delivery traceable end to end: the `tracing` spans every delivery runs in, the W3C
//! `traceparent` handed to its worker with the event, and (with the `otel` feature) their export
//! to an OpenTelemetry collector over OTLP.
//!
//! One trace per delivery:
//!
//! ```text
//! webhook                     POST /webhook (delivery, event, status)
//! └── dispatch                one pull request of it (target, source, outcome, worker, token)
//!     ├── admit               the registry's decision (decision, worker, token, new)
//!     └── loop                the worker's loop, in its container (worker, token, outcome),
//!         └── complete        its completion; its parent is the `traceparent` of the job
//! ```
//!
//! A released delivery placed again by the sweeper callback starts a trace of its own, rooted in
//! a `redispatch` span that is **linked** to the `dispatch` span of the placement it replaces
//! (the [`Traces`] of this process remember the `traceparent` of every event handed to one of its
//! containers until it completes or is placed again). Across processes the link is made when the
//! process that places it again is the one whose container had it.
//!
//! Without the `otel` feature (or without a tracer configured) no layer records the spans, so
//! creating one costs a check of its callsite's interest; [`TraceParent`]s are empty and
//! [`Traces`] stores nothing. The log ([`log`]) never formats a span.

use crate::outcome::{Dispatch, Source};

use std::fmt;

use dashmap::DashMap;
use tracing::field::Empty;
use tracing::Span;
use worker_registry::{Assignment, DeliveryId, Target, WorkerId};

pub mod log;
#[cfg(feature = "otel")]
mod otlp;

pub use log::LogFormat;

/// The binary's log and traces, from [`init`]: flushes the traces not exported yet when shut down.
///
/// # Examples
///
/// ```no_run
/// use webhook_router::telemetry::{init, LogFormat};
///
/// let telemetry = init("info", LogFormat::Text).expect("the OTEL_* settings are valid");
/// // ... run the router ...
/// telemetry.shutdown();
/// ```
#[derive(Debug)]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered and stops the exporter (nothing to do without `otel`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use webhook_router::telemetry::{init, LogFormat};
    ///
    /// init("info", LogFormat::Text).unwrap().shutdown();
    /// ```
    pub fn shutdown(self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider {
            if let Err(e) = provider.shutdown() {
                eprintln!("webhook-router: flushing the traces at exit: {e}");
            }
        }
    }
}

/// Installs the process's `tracing` subscriber: the log on stderr in `format`, filtered by
/// `RUST_LOG` (else `default_filter`; see [`log`]), and with the `otel` feature the router's spans
/// exported over OTLP as the `OTEL_*` variables say (see the README's "Tracing"). `Err` for
/// settings it cannot honour, or a subscriber installed already.
///
/// # Examples
///
/// ```no_run
/// use webhook_router::telemetry::{init, LogFormat};
///
/// let telemetry = init("info,webhook_router=debug", LogFormat::Json).unwrap();
/// # telemetry.shutdown();
/// ```
pub fn init(default_filter: &str, format: LogFormat) -> Result<Telemetry, String> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let registry = tracing_subscriber::registry().with(log::layer(format, default_filter));
    #[cfg(feature = "otel")]
    {
        use tracing_subscriber::Layer;
        let (layer, provider) = match otlp::tracer()? {
            Some((tracer, provider)) => {
                // The router's own spans and events, whatever the log shows.
                let only_ours = tracing_subscriber::filter::Targets::new()
                    .with_target("webhook_router", tracing::Level::INFO);
                let layer = tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(only_ours);
                (Some(layer), Some(provider))
            }
            None => (None, None),
        };
        registry.with(layer).try_init().map_err(|e| e.to_string())?;
        Ok(Telemetry { provider })
    }
    #[cfg(not(feature = "otel"))]
    {
        registry.try_init().map_err(|e| e.to_string())?;
        Ok(Telemetry {})
    }
}

/// The most events whose `traceparent` [`Traces`] keeps (for the links of re-dispatched ones);
/// past it, an event re-dispatched later starts an unlinked trace.
pub const MAX_TRACES: usize = 65_536;

/// The W3C `traceparent` of the span an event was dispatched under (`00-<trace>-<span>-<flags>`),
/// handed to its worker with the event; empty when nothing is traced.
///
/// # Examples
///
/// ```
/// use webhook_router::telemetry::TraceParent;
///
/// let none = TraceParent::default();
/// assert_eq!(none.as_str(), None);
/// let tp = TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
/// assert_eq!(tp.as_str(), Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
/// assert!(TraceParent::parse("00-zz").is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceParent(Option<Box<str>>);

impl TraceParent {
    /// A `traceparent` as it came (from another replica): `None` unless it has the W3C form
    /// (version `00`, 32 and 16 lowercase hex digits, 2 of flags).
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::telemetry::TraceParent;
    ///
    /// assert!(TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00").is_some());
    /// assert!(TraceParent::parse("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-00").is_none());
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        let parts: Vec<&str> = s.split('-').collect();
        let hex = |p: &str, n: usize| {
            p.len() == n && p.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        match parts.as_slice() {
            [v, t, id, f] if *v == "00" && hex(t, 32) && hex(id, 16) && hex(f, 2) => {
                Some(Self(Some(s.into())))
            }
            _ => None,
        }
    }

    /// The `traceparent` of the current span, if it is exported (always empty without `otel`).
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::telemetry::TraceParent;
    ///
    /// // No OpenTelemetry layer is installed here: nothing to hand on.
    /// assert_eq!(TraceParent::current(), TraceParent::default());
    /// ```
    pub fn current() -> Self {
        #[cfg(feature = "otel")]
        {
            Self(otlp::traceparent_of(&Span::current()).map(String::into_boxed_str))
        }
        #[cfg(not(feature = "otel"))]
        {
            Self(None)
        }
    }

    /// The header value, if there is one.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::telemetry::TraceParent;
    ///
    /// assert!(TraceParent::default().as_str().is_none());
    /// ```
    pub fn as_str(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// Whether there is one.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::telemetry::TraceParent;
    ///
    /// assert!(TraceParent::default().is_none());
    /// ```
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str().unwrap_or("-"))
    }
}

/// The `traceparent` of every event handed to one of this process's containers and not completed
/// yet, by (target, delivery): what a re-dispatched event's trace links to. Holds at most
/// [`MAX_TRACES`]; stores nothing for untraced events.
///
/// # Examples
///
/// ```
/// use webhook_router::telemetry::{TraceParent, Traces};
/// use worker_registry::{DeliveryId, Target};
///
/// let traces = Traces::default();
/// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d1").unwrap());
/// let tp = TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
/// traces.handed(&t, &d, &tp);
/// assert_eq!(traces.take(&t, &d), Some(tp));
/// assert_eq!(traces.take(&t, &d), None);
/// ```
#[derive(Debug, Default)]
pub struct Traces {
    by_event: DashMap<(Target, DeliveryId), TraceParent>,
}

impl Traces {
    /// An event was queued for a container here under `trace`.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::telemetry::{TraceParent, Traces};
    /// use worker_registry::{DeliveryId, Target};
    ///
    /// let traces = Traces::default();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d1").unwrap());
    /// traces.handed(&t, &d, &TraceParent::default());
    /// assert!(traces.is_empty(), "an untraced event is not kept");
    /// ```
    pub fn handed(&self, target: &Target, delivery: &DeliveryId, trace: &TraceParent) {
        if trace.is_none() || self.by_event.len() >= MAX_TRACES {
            return;
        }
        self.by_event
            .insert((target.clone(), delivery.clone()), trace.clone());
    }

    /// The event completed: nothing will link to it.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::telemetry::{TraceParent, Traces};
    /// use worker_registry::{DeliveryId, Target};
    ///
    /// let traces = Traces::default();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d1").unwrap());
    /// let tp = TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
    /// traces.handed(&t, &d, &tp);
    /// traces.completed(&t, &d);
    /// assert!(traces.is_empty());
    /// ```
    pub fn completed(&self, target: &Target, delivery: &DeliveryId) {
        if !self.by_event.is_empty() {
            self.by_event.remove(&(target.clone(), delivery.clone()));
        }
    }

    /// The `traceparent` the event was last handed over under, taken out (it is being placed
    /// again).
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::telemetry::Traces;
    /// use worker_registry::{DeliveryId, Target};
    ///
    /// let traces = Traces::default();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d1").unwrap());
    /// assert_eq!(traces.take(&t, &d), None);
    /// ```
    pub fn take(&self, target: &Target, delivery: &DeliveryId) -> Option<TraceParent> {
        if self.by_event.is_empty() {
            return None;
        }
        self.by_event
            .remove(&(target.clone(), delivery.clone()))
            .map(|(_, t)| t)
    }

    /// Events remembered.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::telemetry::Traces;
    ///
    /// assert_eq!(Traces::default().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.by_event.len()
    }

    /// Whether none is.
    ///
    /// # Examples
    ///
    /// ```
    /// use webhook_router::telemetry::Traces;
    ///
    /// assert!(Traces::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.by_event.is_empty()
    }
}

/// A worker id as a span attribute: an integer (ids have 44 bits; OpenTelemetry's integers are
/// `i64`). Fencing tokens use all 64 bits, so they are recorded as their decimal text.
fn worker_attr(w: WorkerId) -> i64 {
    i64::try_from(w.get()).unwrap_or(i64::MAX)
}

/// The span of one `POST /webhook`, a child of the request's own `traceparent` header if it
/// has a valid one (a tracing proxy in front; GitHub sends none); `delivery`, `event`, `outcome`
/// (the `webhook_router_deliveries_total` label) and `status` are recorded as they are known.
///
/// # Examples
///
/// ```
/// let span = webhook_router::telemetry::webhook_span(None);
/// span.record("status", 202);
/// ```
pub fn webhook_span(parent: Option<&TraceParent>) -> Span {
    let span = tracing::info_span!(
        "webhook",
        otel.kind = "server",
        http.request.method = "POST",
        http.route = "/webhook",
        delivery = Empty,
        event = Empty,
        outcome = Empty,
        status = Empty,
    );
    #[cfg(feature = "otel")]
    if let Some(tp) = parent.and_then(TraceParent::as_str) {
        otlp::set_parent(&span, tp);
    }
    #[cfg(not(feature = "otel"))]
    let _ = parent;
    span
}

/// The span of one (target, delivery) pair's dispatch; [`record_dispatch`] fills in what became
/// of it.
///
/// # Examples
///
/// ```
/// use webhook_router::outcome::Source;
/// use webhook_router::telemetry::dispatch_span;
/// use worker_registry::{DeliveryId, Target};
///
/// let span = dispatch_span(&Target::new("o/r", 1).unwrap(), &DeliveryId::new("d1").unwrap(), Source::Webhook);
/// # drop(span);
/// ```
pub fn dispatch_span(target: &Target, delivery: &DeliveryId, source: Source) -> Span {
    tracing::info_span!(
        "dispatch",
        %target,
        %delivery,
        source = source.as_str(),
        outcome = Empty,
        worker = Empty,
        token = Empty,
    )
}

/// Records on a [`dispatch_span`] what dispatch made of the pair.
///
/// # Examples
///
/// ```
/// use webhook_router::outcome::{Dispatch, Source};
/// use webhook_router::telemetry::{dispatch_span, record_dispatch};
/// use worker_registry::{DeliveryId, Target};
///
/// let span = dispatch_span(&Target::new("o/r", 1).unwrap(), &DeliveryId::new("d1").unwrap(), Source::Webhook);
/// record_dispatch(&span, &Dispatch::Closing);
/// ```
pub fn record_dispatch(span: &Span, d: &Dispatch) {
    span.record("outcome", d.admission().as_str());
    let worker = match d {
        Dispatch::Assigned(a) | Dispatch::Overflowed { assignment: a, .. } => {
            span.record("token", tracing::field::display(a.token));
            Some(a.worker)
        }
        Dispatch::Backlog { worker } | Dispatch::Unreachable { worker, .. } => Some(*worker),
        _ => None,
    };
    if let Some(w) = worker {
        span.record("worker", worker_attr(w));
    }
}

/// The span of the registry's admission of a pair; [`record_admission`] records its decision.
///
/// # Examples
///
/// ```
/// let span = webhook_router::telemetry::admit_span();
/// span.record("decision", "duplicate");
/// ```
pub fn admit_span() -> Span {
    tracing::info_span!(
        "admit",
        decision = Empty,
        worker = Empty,
        token = Empty,
        new = Empty,
    )
}

/// Records an assignment on an [`admit_span`] (the other decisions record only `decision`).
///
/// # Examples
///
/// ```
/// use worker_registry::{memory::Direct, RegistryConfig, Target, DeliveryId, Admission};
///
/// let r = Direct::new(RegistryConfig::default());
/// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d1").unwrap());
/// let Admission::Assigned(a) = r.admit(&t, &d) else { unreachable!() };
/// let span = webhook_router::telemetry::admit_span();
/// webhook_router::telemetry::record_admission(&span, &a);
/// ```
pub fn record_admission(span: &Span, a: &Assignment) {
    span.record("decision", "assigned");
    span.record("worker", worker_attr(a.worker));
    span.record("token", tracing::field::display(a.token));
    span.record("new", a.new);
}

/// The root span of a released event placed again, linked to the span it was last handed over
/// under (`original`, if this process knows it).
///
/// # Examples
///
/// ```
/// use webhook_router::telemetry::redispatch_span;
/// use worker_registry::{DeliveryId, Target};
///
/// let span = redispatch_span(&Target::new("o/r", 1).unwrap(), &DeliveryId::new("d1").unwrap(), None);
/// # drop(span);
/// ```
pub fn redispatch_span(
    target: &Target,
    delivery: &DeliveryId,
    original: Option<&TraceParent>,
) -> Span {
    let span = tracing::info_span!(parent: None, "redispatch", %target, %delivery, linked = original.is_some());
    #[cfg(feature = "otel")]
    if let Some(tp) = original.and_then(TraceParent::as_str) {
        otlp::link(&span, tp);
    }
    #[cfg(not(feature = "otel"))]
    let _ = original;
    span
}

/// The span of a worker's loop for one event, a child of the span the event was dispatched
/// under (its `traceparent`, handed over with the event); `outcome` is recorded at its end.
///
/// # Examples
///
/// ```
/// use webhook_router::telemetry::{loop_span, TraceParent};
/// use worker_registry::{FencingToken, WorkerId};
///
/// let span = loop_span(WorkerId::new(7), FencingToken::from_raw(3), &TraceParent::default());
/// span.record("outcome", "completed");
/// ```
pub fn loop_span(
    worker: WorkerId,
    token: worker_registry::FencingToken,
    parent: &TraceParent,
) -> Span {
    let span = tracing::info_span!(
        parent: None,
        "loop",
        otel.kind = "consumer",
        worker = worker_attr(worker),
        %token,
        traceparent = %parent,
        outcome = Empty,
    );
    #[cfg(feature = "otel")]
    if let Some(tp) = parent.as_str() {
        otlp::set_parent(&span, tp);
    }
    span
}

/// The span of a worker's completion call.
///
/// # Examples
///
/// ```
/// let span = webhook_router::telemetry::complete_span();
/// span.record("recorded", true);
/// ```
pub fn complete_span() -> Span {
    tracing::info_span!("complete", recorded = Empty)
}
