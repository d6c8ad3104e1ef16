//! The `otel` feature's half of [`crate::telemetry`]: the W3C trace context read from and written
//! to `tracing` spans, and the OTLP exporter the `OTEL_*` environment variables configure.
//!
//! The exporter is OTLP over HTTP/protobuf, on the reqwest 0.12 the router already links (its
//! blocking client: the SDK's batch processor exports from a thread of its own, outside tokio).
//! The standard variables apply as the OpenTelemetry SDK reads them:
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (default
//! `http://localhost:4318/v1/traces`), `..._HEADERS`, `..._TIMEOUT`, `..._COMPRESSION`,
//! `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (the service name defaults to
//! `webhook-router`), `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, `OTEL_BSP_*`.
//! `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn the export off; another
//! exporter, or an `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` other than `http/protobuf`, is refused
//! at start.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use opentelemetry_sdk::Resource;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";

/// The `traceparent` of `span`, if it is exported (an OpenTelemetry layer records it).
pub(super) fn traceparent_of(span: &Span) -> Option<String> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove(TRACEPARENT)
}

fn extract(traceparent: &str) -> opentelemetry::Context {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// Makes the span of `traceparent` the (remote) parent of `span`, which has not started yet.
pub(super) fn set_parent(span: &Span, traceparent: &str) {
    let cx = extract(traceparent);
    if cx.span().span_context().is_valid() {
        // Err only without an OpenTelemetry layer (nothing is exported then) or once started.
        let _ = span.set_parent(cx);
    }
}

/// Links `span`, which has not started yet, to the span of `traceparent`.
pub(super) fn link(span: &Span, traceparent: &str) {
    let cx = extract(traceparent);
    let linked = cx.span().span_context().clone();
    if linked.is_valid() {
        span.add_link(linked);
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
}

/// The tracer exporting over OTLP as the `OTEL_*` variables say (see the
/// [module documentation](self)) and its provider (to flush at exit); `None` if they turn it off.
pub(super) fn tracer() -> Result<Option<(Tracer, SdkTracerProvider)>, String> {
    if var("OTEL_SDK_DISABLED").as_deref() == Some("true") {
        return Ok(None);
    }
    match var("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => {
            return Err(format!(
                "OTEL_TRACES_EXPORTER={other}: this router exports traces with \"otlp\" only (or \"none\")"
            ))
        }
    }
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = var(name).filter(|p| p != "http/protobuf") {
            return Err(format!(
                "{name}={p}: this router is built with the HTTP/protobuf OTLP exporter only (\"http/protobuf\")"
            ));
        }
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("the OTLP span exporter: {e}"))?;
    let mut resource = Resource::builder();
    let named = var("OTEL_SERVICE_NAME").is_some()
        || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name("webhook-router");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("webhook-router");
    Ok(Some((tracer, provider)))
}
