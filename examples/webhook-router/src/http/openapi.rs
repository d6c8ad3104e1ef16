//! The router's OpenAPI document: the library's admin API with `POST /webhook`, the debug
//! endpoint and the replicas' internal endpoint merged in, generated from the handlers' `#[utoipa::path]` attributes and the answer
//! types' `ToSchema` derives, served on `/openapi.json`.

use utoipa::OpenApi;

use super::answer::{
    ClaimStateName, CrashAnswer, DeliveryAnswer, ErrorAnswer, Outcome, TargetAnswer,
};
use super::probes::ProbeAnswer;
use super::webhook::FormDelivery;
use super::{debug, internal, probes, webhook};
use crate::policy::Decision;
use crate::remote::{ForwardAnswer, ForwardedJob, ForwardedPayload};

#[derive(OpenApi)]
#[openapi(
    paths(webhook::webhook, debug::crash, internal::internal_jobs, probes::readyz),
    components(schemas(
        DeliveryAnswer, TargetAnswer, Outcome, ClaimStateName, Decision, ErrorAnswer, CrashAnswer,
        FormDelivery, ForwardedJob, ForwardedPayload, ForwardAnswer, ProbeAnswer,
    )),
    tags(
        (name = "webhook", description = "GitHub webhook deliveries"),
        (name = "debug", description = "Fault injection for demonstrations"),
        (name = "internal", description = "Between replicas of the router (with a shared registry)"),
        (name = "probes", description = "Liveness and readiness, unauthenticated"),
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
