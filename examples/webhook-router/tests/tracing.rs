//! The `otel` feature: a delivery traceable end to end. Every span the router makes is collected
//! in memory (`InMemorySpanExporter`) through the same `tracing-opentelemetry` layer the binary
//! installs, and the tests assert the shape of each delivery's trace: one trace per delivery,
//! `webhook > dispatch > admit` and `dispatch > loop > complete` (the loop's parent handed to the
//! worker as a W3C `traceparent`), the registry's decision, worker id and token as attributes, a
//! request's own `traceparent` honoured, and a re-dispatched delivery's trace linked to the
//! original.
//!
//! Each test runs on tokio's current-thread runtime, so the thread-local subscriber set here sees
//! every task of the router (the HTTP server, the worker containers, the sweeper).

mod common;

use common::{eventually, pr, start, worker_of, Setup};

use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use reqwest::StatusCode;
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::layer::SubscriberExt;

/// The spans the router ends, as the exporter receives them.
struct Collector {
    exporter: InMemorySpanExporter,
    _provider: SdkTracerProvider,
    _guard: DefaultGuard,
}

fn collect() -> Collector {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("webhook-router-test")));
    Collector {
        exporter,
        _provider: provider,
        _guard: tracing::subscriber::set_default(subscriber),
    }
}

impl Collector {
    fn spans(&self) -> Vec<SpanData> {
        self.exporter.get_finished_spans().unwrap()
    }

    fn named(&self, name: &str) -> Vec<SpanData> {
        self.spans()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }

    /// Waits until `n` spans named `name` have ended.
    async fn until(&self, name: &str, n: usize) {
        eventually(|| async { (self.named(name).len() >= n).then_some(()) }).await;
    }

    /// The `webhook` spans of delivery `id`, in the order they ended.
    fn webhooks_of(&self, id: &str) -> Vec<SpanData> {
        self.named("webhook")
            .into_iter()
            .filter(|s| attr(s, "delivery") == Some(Value::from(id.to_owned())))
            .collect()
    }

    /// Every span of one trace.
    fn trace(&self, trace: TraceId) -> Vec<SpanData> {
        self.spans()
            .into_iter()
            .filter(|s| s.span_context.trace_id() == trace)
            .collect()
    }
}

fn attr(span: &SpanData, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

fn int(span: &SpanData, key: &str) -> i64 {
    match attr(span, key) {
        Some(Value::I64(v)) => v,
        other => panic!("{}: {key} = {other:?}", span.name),
    }
}

fn text(span: &SpanData, key: &str) -> String {
    match attr(span, key) {
        Some(Value::String(v)) => v.as_str().to_owned(),
        other => panic!("{}: {key} = {other:?}", span.name),
    }
}

/// The one span named `name` in `spans`.
fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found: Vec<&SpanData> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one {name} span in {spans:#?}");
    found[0]
}

fn id(span: &SpanData) -> SpanId {
    span.span_context.span_id()
}

/// The spans of a placement under `dispatch` (in `trace`): its admission, the worker's loop and
/// the completion, checked for their parents and attributes; the worker id.
fn placed(trace: &[SpanData], dispatch: &SpanData) -> i64 {
    let admit = one(trace, "admit");
    assert_eq!(admit.parent_span_id, id(dispatch));
    assert_eq!(text(admit, "decision"), "assigned");
    let (worker, token) = (int(admit, "worker"), text(admit, "token"));
    assert_eq!(text(dispatch, "outcome"), "assigned");
    assert_eq!(
        (int(dispatch, "worker"), text(dispatch, "token")),
        (worker, token.clone())
    );

    // The worker's loop, in its container's task: a child of the dispatch span through the
    // traceparent handed over with the event.
    let looped = one(trace, "loop");
    assert_eq!(looped.parent_span_id, id(dispatch));
    assert!(
        looped.parent_span_is_remote,
        "the parent came as a traceparent"
    );
    assert_eq!(
        text(looped, "traceparent"),
        format!(
            "00-{}-{}-01",
            dispatch.span_context.trace_id(),
            id(dispatch)
        )
    );
    assert_eq!(
        (int(looped, "worker"), text(looped, "token")),
        (worker, token)
    );
    assert_eq!(text(looped, "outcome"), "completed");
    let complete = one(trace, "complete");
    assert_eq!(complete.parent_span_id, id(looped));
    assert_eq!(attr(complete, "recorded"), Some(Value::Bool(true)));
    worker
}

#[tokio::test(start_paused = true)]
async fn one_trace_per_delivery_from_the_webhook_to_the_completion() {
    let spans = collect();
    let h = start(Setup::default()).await;
    let a = h.deliver("pull_request", "d-1", &pr("o/r", 1)).await;
    let b = h.deliver("pull_request", "d-2", &pr("o/r", 2)).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::ACCEPTED, StatusCode::ACCEPTED)
    );
    spans.until("complete", 2).await;

    let mut traces = Vec::new();
    for (delivery, answer) in [("d-1", &a), ("d-2", &b)] {
        let webhook = spans.webhooks_of(delivery);
        assert_eq!(webhook.len(), 1);
        let webhook = &webhook[0];
        assert_eq!(webhook.parent_span_id, SpanId::INVALID, "a trace's root");
        assert_eq!(int(webhook, "status"), 202);
        assert_eq!(text(webhook, "event"), "pull_request");
        let trace = spans.trace(webhook.span_context.trace_id());
        let mut names: Vec<&str> = trace.iter().map(|s| &*s.name).collect();
        names.sort_unstable();
        assert_eq!(names, ["admit", "complete", "dispatch", "loop", "webhook"]);
        let dispatch = one(&trace, "dispatch");
        assert_eq!(dispatch.parent_span_id, id(webhook));
        assert_eq!(text(dispatch, "delivery"), delivery);
        assert_eq!(text(dispatch, "source"), "webhook");
        let worker = placed(&trace, dispatch);
        assert_eq!(worker as u64, worker_of(answer));
        traces.push(webhook.span_context.trace_id());
    }
    assert_ne!(traces[0], traces[1], "one trace per delivery");

    // GitHub redelivering d-1: a trace of its own, the registry's decision "duplicate", no loop.
    let dup = h.deliver("pull_request", "d-1", &pr("o/r", 1)).await;
    assert_eq!(dup.body["outcome"], "duplicate");
    let webhook = spans.webhooks_of("d-1");
    assert_eq!(webhook.len(), 2);
    let trace = spans.trace(webhook[1].span_context.trace_id());
    assert!(!traces.contains(&webhook[1].span_context.trace_id()));
    let mut names: Vec<&str> = trace.iter().map(|s| &*s.name).collect();
    names.sort_unstable();
    assert_eq!(names, ["admit", "dispatch", "webhook"]);
    assert_eq!(text(one(&trace, "admit"), "decision"), "duplicate");
    assert_eq!(text(one(&trace, "dispatch"), "outcome"), "duplicate");
    assert_eq!(text(&webhook[1], "outcome"), "duplicate");
    // Completed events are forgotten by the process's trace contexts.
    assert!(h.server.app().containers().traces().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_request_traceparent_is_the_deliverys_parent() {
    let spans = collect();
    let h = start(Setup::default()).await;
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let payload = serde_json::to_vec(&pr("o/r", 5)).unwrap();
    for (id, traceparent) in [
        ("t-1", format!("00-{trace}-{parent}-01")),
        ("t-2", "not-a-traceparent".to_owned()),
    ] {
        let res = h
            .http
            .post(format!("{}/webhook", h.base))
            .header("content-type", "application/json")
            .header(webhook_router::github::EVENT_HEADER, "pull_request")
            .header(webhook_router::github::DELIVERY_HEADER, id)
            .header("traceparent", traceparent)
            .body(payload.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED);
    }
    spans.until("complete", 2).await;
    let proxied = spans.webhooks_of("t-1").remove(0);
    assert_eq!(
        proxied.span_context.trace_id(),
        TraceId::from_hex(trace).unwrap()
    );
    assert_eq!(proxied.parent_span_id, SpanId::from_hex(parent).unwrap());
    assert!(proxied.parent_span_is_remote);
    // The delivery's spans, the worker's loop included, are in the caller's trace.
    let names: Vec<String> = spans
        .trace(proxied.span_context.trace_id())
        .iter()
        .map(|s| s.name.to_string())
        .collect();
    assert_eq!(names.len(), 5, "{names:?}");
    // A malformed header is ignored: a trace of its own.
    let own = spans.webhooks_of("t-2").remove(0);
    assert_eq!(own.parent_span_id, SpanId::INVALID);
    assert_ne!(own.span_context.trace_id(), proxied.span_context.trace_id());
}

#[tokio::test(start_paused = true)]
async fn a_redispatched_delivery_is_a_trace_linked_to_the_original() {
    let spans = collect();
    let h = start(Setup {
        work: Duration::from_secs(5),
        ..Setup::default()
    })
    .await;
    let a = h.deliver("pull_request", "c-1", &pr("o/r", 3)).await;
    let w1 = worker_of(&a);
    h.until_status(w1, "active").await;
    spans.until("webhook", 1).await;
    let original = spans.trace(spans.webhooks_of("c-1")[0].span_context.trace_id());
    let first = one(&original, "dispatch").clone();
    assert_eq!(h.server.app().containers().traces().len(), 1);

    // The container crashes mid-loop; the sweep declares the worker dead and the sweeper callback
    // places the released delivery again, on a new worker.
    let crashed = h.post(&format!("/debug/workers/{w1}/crash")).await;
    assert_eq!(crashed.status, StatusCode::ACCEPTED);
    spans.until("redispatch", 1).await;
    spans.until("complete", 1).await;
    assert_eq!(h.server.app().redispatcher().redispatched(), 1);

    // The original trace: its loop ended with the crash, and nothing more happened in it.
    let original = spans.trace(first.span_context.trace_id());
    let looped = one(&original, "loop");
    assert_eq!(looped.parent_span_id, id(&first));
    assert_eq!(text(looped, "outcome"), "crashed");
    assert!(original.iter().all(|s| s.name != "complete"));

    // The re-dispatch: a new trace, rooted in a span linked to the original dispatch.
    let redispatch = one(&spans.named("redispatch"), "redispatch").clone();
    assert_eq!(redispatch.parent_span_id, SpanId::INVALID);
    let trace = spans.trace(redispatch.span_context.trace_id());
    assert_ne!(
        redispatch.span_context.trace_id(),
        first.span_context.trace_id()
    );
    assert_eq!(redispatch.links.len(), 1, "linked to the original");
    let link = &redispatch.links[0].span_context;
    assert_eq!(
        (link.trace_id(), link.span_id()),
        (first.span_context.trace_id(), id(&first))
    );
    assert_eq!(attr(&redispatch, "linked"), Some(Value::Bool(true)));
    let dispatch = one(&trace, "dispatch");
    assert_eq!(dispatch.parent_span_id, id(&redispatch));
    assert_eq!(text(dispatch, "source"), "redispatch");
    let w2 = placed(&trace, dispatch);
    assert_ne!(w2 as u64, w1, "placed on a new worker");
    assert!(h.server.app().containers().traces().is_empty());
}
