//! The router's HTTP apps, the edge of the router: `POST /webhook` ([`webhook`]), the probes
//! ([`probes`]: `/healthz`, `/readyz`), the debug endpoint ([`debug`]), the failed deliveries
//! ([`deliveries`]), the replicas' internal endpoint ([`internal`]) and the library's admin API
//! (`/workers`, `/metrics`, `/openapi.json` from [`openapi`]), on one address or (`--admin-bind`)
//! the webhook's and the admin's apart ([`apps`]); JSON errors everywhere ([`reply`]), unknown
//! paths and wrong methods included.
//! Below it: the routing policy carried out ([`crate::routing`]) and dispatch
//! ([`crate::dispatch`]).
//!
//! A delivery is refused before its body is read when its headers already rule it out (the router
//! is shutting down, a missing or repeated identity header, a content type GitHub does not send, a
//! missing or malformed signature, a `Content-Length` above the cap); its body is then read under
//! the limits of [`crate::body`], its HMAC computed as it arrives.

pub mod answer;
pub mod debug;
pub mod deliveries;
mod guard;
pub mod internal;
pub mod openapi;
pub mod probes;
pub mod reply;
pub mod webhook;
pub mod worker;

pub use reply::{retry_after_secs, Reply};

use crate::app::App;
use crate::outcome::Outcome;
use crate::remote::MAX_FORWARDED_BYTES;
use probes::Readiness;
use reply::{error_response, refused, OVERLOADED};

use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;
use tokio::sync::Semaphore;
use worker_registry::http::{admin_router, AdminOptions};
use worker_registry::metrics::Metrics;

/// The router's HTTP apps (see [`apps`]).
pub struct Apps {
    /// The webhook's: `POST /webhook`, and everything else too unless `admin` is apart.
    pub webhook: Router,
    /// The admin's, when it has an address of its own (`--admin-bind`).
    pub admin: Option<Router>,
}

/// The HTTP app on one address: webhook, probes, debug endpoint and the library's admin API,
/// serving `metrics` (see [`apps`]).
pub fn router(app: &App, metrics: Metrics, max_concurrent_webhooks: usize) -> Router {
    apps(app, metrics, max_concurrent_webhooks, false).webhook
}

/// The HTTP apps: with `split`, the webhook's (`POST /webhook`, `/healthz` and `/readyz`: what
/// an edge needs) apart from the admin's (the admin API, `/metrics`, `/openapi.json`, the debug
/// and internal endpoints, `/deliveries/failed`, and the probes); without, one app with all of
/// them.
///
/// With an admin token, every admin endpoint but the probes needs it, reads included (the worker
/// list names repositories and pull requests, private ones too).
///
/// At most `max_concurrent_webhooks` webhook requests are handled at once (a semaphore's permit,
/// taken without waiting); beyond that the answer is 503 with `Retry-After` at once, before any
/// body is read.
pub fn apps(app: &App, metrics: Metrics, max_concurrent_webhooks: usize, split: bool) -> Apps {
    let readyz = Router::new()
        .route("/readyz", get(probes::readyz))
        .with_state(Readiness::new(app.clone()));
    let webhook = webhook_route(app, max_concurrent_webhooks);
    let admin = admin_routes(app, metrics).merge(readyz.clone());
    if split {
        let edge = webhook
            .route("/healthz", get(probes::healthz))
            .merge(readyz);
        Apps {
            webhook: with_fallbacks(edge),
            admin: Some(with_fallbacks(admin)),
        }
    } else {
        Apps {
            webhook: with_fallbacks(webhook.merge(admin)),
            admin: None,
        }
    }
}

/// The worker protocol's app (`/worker/v1/...`, see [`worker`]), for its own listener.
pub fn worker_app(app: &App) -> Router {
    with_fallbacks(worker::router(app))
}

/// `POST /webhook`, behind its concurrency limit (a permit taken without waiting, in the handler:
/// a tower `ConcurrencyLimit` behind a `LoadShed` did the same with a boxed future and two
/// allocations per request).
fn webhook_route(app: &App, max_concurrent_webhooks: usize) -> Router {
    let state = webhook::Webhooks {
        app: app.clone(),
        slots: Arc::new(Semaphore::new(max_concurrent_webhooks.max(1))),
    };
    Router::new()
        .route("/webhook", post(webhook::webhook))
        .with_state(state)
}

/// The library's admin API (`/healthz` among it), the debug endpoint, the failed deliveries and
/// the replicas' internal endpoint, behind the admin token if there is one (see [`guard`]; the
/// 405 of a wrong method comes first, from [`with_fallbacks`]).
fn admin_routes(app: &App, metrics: Metrics) -> Router {
    let admin = AdminOptions::new()
        .metrics(metrics)
        .openapi(openapi::document());
    let router = Router::new();
    // Replicas in other processes forward events for this router's containers here.
    let router = match app.remote() {
        Some(_) => router.route(
            "/internal/workers/{id}/jobs",
            // A forwarded payload is as large as GitHub sends (axum's default limit is 2 MB).
            post(internal::internal_jobs).layer(DefaultBodyLimit::max(MAX_FORWARDED_BYTES)),
        ),
        None => router,
    };
    let routes = router
        .route("/debug/workers/{id}/crash", post(debug::crash))
        .route("/deliveries/failed", get(deliveries::failed))
        .with_state(app.clone())
        .merge(admin_router(app.registry().clone(), admin));
    let token = &app.options().admin_token;
    if token.is_set() {
        guard::guarded(routes, token.clone())
    } else {
        routes
    }
}

/// JSON for unknown paths and wrong methods.
fn with_fallbacks(router: Router) -> Router {
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

/// The webhook route is at its concurrency limit: 503 at once, before anything is read.
pub(crate) fn overloaded(app: &App, headers: &HeaderMap) -> Response {
    tracing::debug!("webhook request shed: too many at once");
    let event = webhook::event_header(headers);
    let reply = refused(
        event,
        Outcome::Unavailable,
        OVERLOADED,
        Duration::from_secs(1),
    );
    // Refused at once, before anything was read.
    app.metrics().webhook(reply.label(), Duration::ZERO);
    reply.into_response()
}

async fn not_found(request: Request) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        format!("no such path: {}", request.uri().path()),
    )
}

async fn method_not_allowed(request: Request) -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}
