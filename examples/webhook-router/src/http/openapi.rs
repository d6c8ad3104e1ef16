//! The router's OpenAPI document: the library's admin API with `POST /webhook`, the debug
//! endpoint, `GET /deliveries/failed`, the replicas' internal endpoint and the worker protocol
//! (`/worker/v1/...`, served on its own listener) merged in, generated from the handlers'
//! `#[utoipa::path]` attributes and the answer types' `ToSchema` derives, served on
//! `/openapi.json`.

use utoipa::OpenApi;

use super::answer::{ClaimStateName, CrashAnswer, DeliveryAnswer, ErrorAnswer, TargetAnswer};
use super::deliveries::{FailedDeliveriesAnswer, FailedDeliveryAnswer};
use super::probes::ProbeAnswer;
use super::webhook::FormDelivery;
use super::worker::{
    Complete, CompleteOutcome, FencedAnswer, HeartbeatAnswer, LoopFinishedAnswer, LoopStarted,
};
use super::{debug, deliveries, internal, probes, webhook, worker};
use crate::outcome::Outcome;
use crate::policy::Decision;
use crate::remote::{ForwardAnswer, ForwardedJob, ForwardedPayload};

#[derive(OpenApi)]
#[openapi(
    paths(
        webhook::webhook, debug::crash, deliveries::failed, internal::internal_jobs, probes::readyz,
        worker::heartbeat, worker::next, worker::loop_started, worker::complete,
        worker::loop_finished, worker::exit,
    ),
    components(schemas(
        DeliveryAnswer, TargetAnswer, Outcome, ClaimStateName, Decision, ErrorAnswer, CrashAnswer,
        FormDelivery, ForwardedJob, ForwardedPayload, ForwardAnswer, ProbeAnswer,
        HeartbeatAnswer, FencedAnswer, LoopStarted, Complete, CompleteOutcome, LoopFinishedAnswer,
        FailedDeliveriesAnswer, FailedDeliveryAnswer,
    )),
    tags(
        (name = "webhook", description = "GitHub webhook deliveries"),
        (name = "debug", description = "Fault injection for demonstrations"),
        (name = "deliveries", description = "Deliveries whose command failed every attempt"),
        (name = "internal", description = "Between replicas of the router (with a shared registry)"),
        (name = "probes", description = "Liveness and readiness, unauthenticated"),
        (name = "worker", description = "The worker protocol, on its own listener (--worker-bind), each call authenticated by the worker's credential"),
    ),
)]
struct RouterDoc;

/// The whole document: admin API, webhook and debug endpoint.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = worker_registry::http::openapi();
    doc.merge(RouterDoc::openapi());
    doc.info.title = "webhook-router".to_owned();
    doc.info.description = Some(
        "The reference GitHub webhook router built on worker-registry: deliveries in, one worker \
         per pull request, and the registry's admin API."
            .to_owned(),
    );
    doc
}
