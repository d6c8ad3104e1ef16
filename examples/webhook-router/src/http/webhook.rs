//! `POST /webhook`: a GitHub delivery read (headers first, then the body under its limits),
//! routed to the pull requests it names, the policy's decision carried out for each
//! ([`Routing::apply`]) and answered as one [`Reply`].

use super::answer::{DeliveryAnswer, ErrorAnswer, TargetAnswer};
use super::reply::{refused, retry_after_secs, Reply};
use crate::app::App;
use crate::body::{self, BodyError};
use crate::github::{self, Delivery, Route, SignatureError, Verifier};
use crate::outcome::{Dispatch, Outcome};
use crate::policy::Decision;
use crate::routing::Routing;

use crate::telemetry::{self, TraceParent};

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tracing::Instrument;
use worker_registry::{Payload, RegistryError, Rejection, WorkerRegistry};

/// The whole handling of one `POST /webhook`.
pub async fn handle(app: &App, request: Request) -> Reply {
    let (delivery, raw, headers) = match read(app, request).await {
        Ok(read) => read,
        Err(reply) => return reply,
    };
    let span = tracing::Span::current();
    span.record("delivery", delivery.id.as_str());
    span.record("event", delivery.event.as_str());
    let payload = match github::json_payload(delivery.content_type, &raw.bytes) {
        Ok(payload) => payload,
        Err(e) => return Reply::error(StatusCode::BAD_REQUEST, e),
    };
    let (action, targets) = match github::route(&delivery.event, &payload) {
        Ok(Route::Targets { action, targets }) => (action, targets),
        Ok(Route::Ignored(reason)) => return ignored(delivery.event, reason),
        Err(e) => return Reply::error(StatusCode::BAD_REQUEST, e),
    };
    drop(payload);
    let decision = app
        .options()
        .policy
        .decide(&delivery.event, action.as_deref());
    // The body's share of the read budget is given back here; the registry's payload budget
    // bounds it from now on (or, on a backend that keeps no payloads, it is dropped).
    let event = if decision == Decision::Ignore {
        drop(raw);
        None
    } else {
        match event_payload(app, &delivery, action.as_deref(), &headers, raw) {
            Ok(event) => event,
            Err((status, e)) => return Reply::error(status, e),
        }
    };
    let mut answers = Vec::with_capacity(targets.len());
    let mut wait: Option<Duration> = None;
    // The part that carries the decision out for each pull request.
    let routing: &Routing = app.routing();
    for target in &targets {
        let outcome = routing
            .apply(decision, target, &delivery.key, event.as_ref())
            .await;
        tracing::debug!(%target, delivery = %delivery.key, event = %delivery.event, %decision, ?outcome, "delivery");
        if outcome.outcome().is_refusal() {
            wait = wait.max(Some(wait_for(app, &outcome)));
        }
        let event = (delivery.event.as_str(), action.as_deref());
        answers.push(TargetAnswer::new(target, &outcome, event));
    }
    answer(decision, delivery.event, action, answers, wait)
}

/// What GitHub sent, as the registry keeps it with the delivery's claims and the worker gets it
/// ([`github::payload`]); `None` if the registry keeps no payloads. A payload the registry's
/// [`max_payload_bytes`](worker_registry::RegistryConfig::max_payload_bytes) refuses is a 413
/// here, before any registry call (GitHub would send it again unchanged).
fn event_payload(
    app: &App,
    delivery: &Delivery,
    action: Option<&str>,
    headers: &HeaderMap,
    raw: body::ReadBody,
) -> Result<Option<Payload>, (StatusCode, String)> {
    let registry = app.registry();
    let payload = github::payload(delivery, action, headers, raw.into_bytes())
        .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
    let limit = registry.config().max_payload_bytes();
    if payload.size() > limit {
        let e = RegistryError::PayloadTooLarge {
            size: payload.size(),
            limit,
        };
        return Err((StatusCode::PAYLOAD_TOO_LARGE, e.to_string()));
    }
    Ok(Some(payload))
}

/// The delivery's identity, its body (holding its share of the memory budget) and its headers, or
/// the refusal of the request: everything that rules it out without its body is checked before
/// the body is read.
async fn read(app: &App, request: Request) -> Result<(Delivery, body::ReadBody, HeaderMap), Reply> {
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    if app.closing().is_set() {
        let wait = app.registry().config().heartbeat_timeout();
        let event = event_header(headers);
        return Err(refused(
            event,
            Outcome::Closing,
            "the router is shutting down",
            wait,
        ));
    }
    let delivery = github::delivery(headers).map_err(|e| Reply::error(e.status(), e))?;
    // A signature header must be well-formed even without a secret (GitHub never sends a
    // malformed one); with a secret it must be there, and match.
    let keys = app.options().webhook_secret.keys();
    let verify = match (keys.macs(), github::signature(headers)) {
        ((Some(mac), previous), Ok(digest)) => Some((Verifier::keyed(mac, previous), digest)),
        ((None, _), Ok(_) | Err(SignatureError::Missing)) => None,
        (_, Err(e)) => return Err(Reply::error(StatusCode::UNAUTHORIZED, e)),
    };
    drop(keys);
    let limits = &app.options().body;
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limits.max as u64) {
        return Err(Reply::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::TooLarge { max: limits.max },
        ));
    }
    let raw = match body::read(body, limits, verify).await {
        Ok(b) => b,
        Err(e @ BodyError::Overloaded) => {
            return Err(refused(
                Some(delivery.event),
                Outcome::Unavailable,
                &e.to_string(),
                Duration::from_secs(1),
            ))
        }
        Err(e) => {
            let status = match e {
                BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                BodyError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
                BodyError::Signature(_) => StatusCode::UNAUTHORIZED,
                _ => StatusCode::BAD_REQUEST,
            };
            return Err(Reply::error(status, e));
        }
    };
    Ok((delivery, raw, parts.headers))
}

/// The `X-GitHub-Event` header as far as it can be echoed (visible, at most 64 characters).
pub(crate) fn event_header(headers: &HeaderMap) -> Option<String> {
    headers
        .get(github::EVENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|e| e.chars().take(64).collect::<String>())
}

/// A delivery whose event names no pull request the router serves.
fn ignored(event: String, reason: String) -> Reply {
    Reply::Answer {
        status: StatusCode::ACCEPTED,
        retry_after: None,
        body: DeliveryAnswer {
            outcome: Outcome::Ignored,
            decision: None,
            event: Some(event),
            action: None,
            worker: None,
            new: None,
            token: None,
            state: None,
            limit: None,
            reason: Some(reason),
            position: None,
            targets: Vec::new(),
        },
    }
}

/// The answer to a delivery from its pull requests' `answers`; `wait` is the longest wait a
/// refused one asks for.
fn answer(
    decision: Decision,
    event: String,
    action: Option<String>,
    answers: Vec<TargetAnswer>,
    wait: Option<Duration>,
) -> Reply {
    let outcome = summary(&answers);
    let status = if outcome.is_refusal() {
        StatusCode::SERVICE_UNAVAILABLE
    } else if outcome == Outcome::Duplicate {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let single = (answers.len() == 1).then(|| &answers[0]);
    let pick = |f: fn(&TargetAnswer) -> Option<u64>| single.and_then(f);
    let mut body = DeliveryAnswer {
        outcome,
        decision: Some(decision),
        event: Some(event),
        action,
        worker: pick(|a| a.worker),
        new: single.and_then(|a| a.new),
        token: pick(|a| a.token),
        state: single.and_then(|a| a.state),
        limit: pick(|a| a.limit),
        reason: single.and_then(|a| a.reason.clone()),
        position: single.and_then(|a| a.position),
        targets: Vec::new(),
    };
    body.targets = answers;
    Reply::Answer {
        status,
        retry_after: outcome
            .is_refusal()
            .then(|| retry_after_secs(wait.unwrap_or_default())),
        body,
    }
}

/// How long a client should wait before sending a refused delivery again.
fn wait_for(app: &App, d: &Dispatch) -> Duration {
    let cfg = app.registry().config();
    match d {
        // Room appears as workers complete loops (a completion frees its payload too).
        Dispatch::Rejected(Rejection::TargetDraining { .. } | Rejection::PayloadBudget { .. })
        | Dispatch::RoomFull(Rejection::TargetDraining { .. })
        | Dispatch::Backlog { .. } => app.options().work,
        Dispatch::Closing => cfg.heartbeat_timeout(),
        _ => cfg.sweep_interval(),
    }
}

/// The outcome of a delivery from its pull requests': the first refusal (send it again), else
/// assigned, drained, duplicate (all of them) or ignored.
fn summary(answers: &[TargetAnswer]) -> Outcome {
    if let Some(r) = answers.iter().find(|a| a.outcome.is_refusal()) {
        return r.outcome;
    }
    for o in [Outcome::Assigned, Outcome::Drained, Outcome::Waiting] {
        if answers.iter().any(|a| a.outcome == o) {
            return o;
        }
    }
    if !answers.is_empty() && answers.iter().all(|a| a.outcome == Outcome::Duplicate) {
        Outcome::Duplicate
    } else {
        Outcome::Ignored
    }
}

/// Receives a GitHub webhook delivery.
#[utoipa::path(
    post,
    path = "/webhook",
    tag = "webhook",
    description = "A GitHub webhook delivery. The router finds the pull requests it concerns \
                   (`pull_request*`, `issue_comment` and `issues` on a pull request, `check_run`, \
                   `check_suite` and `workflow_run` through `pull_requests[]`, `merge_group` \
                   through its queue branch), applies the routing policy (`decision`: start, reach, \
                   drain or ignore) and admits the delivery to each one's worker. A redelivery (same \
                   `X-GitHub-Delivery` from the same hook) is a duplicate; two hooks' copies of one \
                   event are two deliveries. Headers are checked before the body is read.",
    params(
        ("X-GitHub-Event" = String, Header, pattern = r"^[!-~]{1,64}$",
         description = "The event name, e.g. `pull_request` (visible ASCII, at most 64 bytes)"),
        ("X-GitHub-Delivery" = String, Header, pattern = r"^[!-~]{1,255}$",
         description = "The delivery id (visible ASCII, at most 255 bytes); a redelivery repeats it"),
        ("X-GitHub-Hook-ID" = Option<String>, Header, pattern = r"^[0-9]{1,32}$",
         description = "The hook that sent it; part of the deduplication key when present"),
        ("X-GitHub-Hook-Installation-Target-Type" = Option<String>, Header, pattern = r"^[a-z_]{1,32}$",
         description = "What the hook is installed on (`repository`, `organization`, `integration`); with the next, the key's hook identity when there is no hook id"),
        ("X-GitHub-Hook-Installation-Target-ID" = Option<String>, Header, pattern = r"^[0-9]{1,32}$",
         description = "The id of what the hook is installed on"),
        ("X-Hub-Signature-256" = Option<String>, Header, pattern = r"^sha256=[0-9a-fA-F]{64}$",
         description = "`sha256=` and the hex HMAC-SHA256 of the body under the webhook secret (required when the router has one)"),
    ),
    request_body(
        description = "The event's payload as JSON, or form-encoded with the JSON in its `payload` field (GitHub's two content types); at most 25 MiB",
        content(
            (Object = "application/json"),
            (FormDelivery = "application/x-www-form-urlencoded"),
        ),
    ),
    responses(
        (status = 200, description = "Every pull request it concerns already has it (a redelivery)", body = DeliveryAnswer),
        (status = 202, description = "Assigned, drained or ignored", body = DeliveryAnswer),
        (status = 400, description = "A missing, repeated or invalid header, or a payload that is not what its event promises", body = ErrorAnswer),
        (status = 401, description = "A malformed X-Hub-Signature-256, or (when the router has a secret) a missing or wrong one", body = ErrorAnswer),
        (status = 408, description = "The body was not received in time", body = ErrorAnswer),
        (status = 413, description = "Larger than GitHub's 25 MiB, or than the registry's `max_payload_bytes` (nothing was claimed)", body = ErrorAnswer),
        (status = 415, description = "Not application/json nor application/x-www-form-urlencoded", body = ErrorAnswer),
        (status = 503, description = "Not accepted now (no capacity, the worker drains or its queue is full, the registry's payload budget is full, shutting down, the registry's backend is away, or too many deliveries at once): send it again after Retry-After; nothing was left behind",
         body = DeliveryAnswer,
         headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(crate) async fn webhook(State(webhooks): State<Webhooks>, request: Request) -> Response {
    let started = std::time::Instant::now();
    let Ok(_slot) = webhooks.slots.try_acquire() else {
        return super::overloaded(&webhooks.app, request.headers());
    };
    let app = webhooks.app;
    // One trace per delivery, from here through admission, dispatch and the worker's loop.
    let parent = request
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    let span = telemetry::webhook_span(parent.as_ref());
    let reply = handle(&app, request).instrument(span.clone()).await;
    span.record("outcome", reply.label());
    let label = reply.label();
    let response = reply.into_response();
    span.record("status", i64::from(response.status().as_u16()));
    app.metrics().webhook(label, started.elapsed());
    response
}

/// The webhook route's state: the router, and the slots of the requests handled at once
/// (`--max-concurrent-webhooks`; a request finding none is refused at once).
#[derive(Clone)]
pub(crate) struct Webhooks {
    pub(crate) app: App,
    pub(crate) slots: std::sync::Arc<tokio::sync::Semaphore>,
}

/// GitHub's form-encoded delivery.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // a schema only
pub(crate) struct FormDelivery {
    /// The event's JSON payload, as the `application/json` body would be.
    #[schema(content_media_type = "application/json")]
    payload: String,
}
