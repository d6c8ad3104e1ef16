//! The log half of [`crate::telemetry`]: the `tracing` layer that writes log lines to stderr, as
//! text or JSON lines ([`LogFormat`]), filtered by `RUST_LOG`.
//!
//! It sees events only, never spans: a span's fields would be formatted when the span is created
//! (on every delivery's path) whether or not a line is printed in it, so the delivery path's
//! lines name what they concern in their own fields, and a per-delivery span costs nothing
//! unless an OpenTelemetry tracer wants it (`otel`). Colours only on a terminal, and never with
//! `NO_COLOR` set.

use std::io::IsTerminal;
use std::str::FromStr;

use tracing::Subscriber;
use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One line of text per event (`2026-12-05T22:26:43.546Z  INFO target: message k=v`).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's
    /// fields at the top level.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(format!("{s:?} is not a log format (text or json)")),
        }
    }
}

/// Whether to colour text on stderr: a terminal, and no `NO_COLOR` (<https://no-color.org>).
fn colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The log layer: `format` on stderr, events that `RUST_LOG` (else `default_filter`) enables.
pub(super) fn layer<S>(format: LogFormat, default_filter: &str) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let events_only = filter_fn(|meta| meta.is_event());
    match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(colours())
            .with_filter(filter)
            .with_filter(events_only)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .with_filter(events_only)
            .boxed(),
    }
}
