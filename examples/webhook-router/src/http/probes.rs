//! The orchestrator's probes, unauthenticated: `GET /healthz` (liveness: the process serves) and
//! `GET /readyz` (readiness: not shutting down, and the registry's backend answered a cheap read
//! within [`READINESS_TIMEOUT`]). A probe's verdict is reused for [`READINESS_TTL`], so however
//! many load balancers ask, the backend sees at most one probe read a second per replica.

use crate::app::App;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tokio::sync::Mutex;
use tokio::time::Instant;
use utoipa::ToSchema;
use worker_registry::{WorkerId, WorkerRegistry};

/// How long the backend may take to answer the readiness read (under Kubernetes' default probe
/// timeout of one second).
pub const READINESS_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a readiness verdict is reused.
pub const READINESS_TTL: Duration = Duration::from_secs(1);

/// The answer of `/healthz` and `/readyz`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProbeAnswer {
    /// `ok` (`/healthz`), `ready`, `shutting_down` or `unavailable`.
    pub status: &'static str,
    /// Why it is not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The last readiness read of the backend: when, and its failure if it failed.
type Verdict = (Instant, Result<(), String>);

/// What `/readyz` needs: the router, and its last verdict on the backend.
#[derive(Clone)]
pub struct Readiness {
    app: App,
    last: Arc<Mutex<Option<Verdict>>>,
}

impl Readiness {
    /// Readiness of `app`.
    pub fn new(app: App) -> Self {
        Self {
            app,
            last: Arc::new(Mutex::new(None)),
        }
    }

    /// The backend's verdict: the last one if younger than [`READINESS_TTL`], else a new read
    /// (one at a time: concurrent probes wait for it and share it).
    ///
    /// **Locking behaviour:** an async mutex held across the read (at most
    /// [`READINESS_TIMEOUT`]); nothing on the webhook path takes it.
    async fn backend(&self) -> Result<(), String> {
        let mut last = self.last.lock().await;
        if let Some((at, verdict)) = last.as_ref() {
            if at.elapsed() < READINESS_TTL {
                return verdict.clone();
            }
        }
        // A read of a worker id that is never handed out (ids start at the registry's start
        // time): one key or row lookup on a shared backend, a shard read in memory.
        let read = self.app.registry().worker(WorkerId::new(0));
        let verdict = match tokio::time::timeout(READINESS_TIMEOUT, read).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("the registry's backend cannot answer: {e}")),
            Err(_) => Err(format!(
                "the registry's backend did not answer within {READINESS_TIMEOUT:?}"
            )),
        };
        *last = Some((Instant::now(), verdict.clone()));
        verdict
    }
}

/// Liveness: the process serves HTTP.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "probes",
    description = "Liveness: answered while the process serves (also while it shuts down).",
    responses((status = 200, description = "Serving", body = ProbeAnswer)),
)]
pub(crate) async fn healthz() -> Json<ProbeAnswer> {
    Json(ProbeAnswer {
        status: "ok",
        reason: None,
    })
}

/// Readiness: whether to send this replica deliveries.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "probes",
    description = "Readiness: 200 while the router takes deliveries and the registry's backend \
                   answers a read within 500 ms (a verdict is reused for a second); 503 from the \
                   moment it begins to shut down, or while the backend does not answer.",
    responses(
        (status = 200, description = "Ready", body = ProbeAnswer),
        (status = 503, description = "Shutting down, or the backend does not answer", body = ProbeAnswer,
         headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
)]
pub(crate) async fn readyz(State(ready): State<Readiness>) -> Response {
    let (status, reason) = if ready.app.closing().is_set() {
        (
            "shutting_down",
            Some("the router is shutting down".to_owned()),
        )
    } else {
        match ready.backend().await {
            Ok(()) => ("ready", None),
            Err(reason) => ("unavailable", Some(reason)),
        }
    };
    let code = if reason.is_none() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut response = (code, Json(ProbeAnswer { status, reason })).into_response();
    if code != StatusCode::OK {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}
