//! What the router would claim for a logged delivery ([`Claims::of`]: the key and the pull
//! requests, recomputed from the request GitHub logged), and whether the registry knows it
//! ([`known`]).

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use worker_registry::{
    ClaimOutcome, DeliveryId, DynRegistry, RegistryError, Target, WorkerRegistry,
};

use super::api::Detail;
use crate::github::{self, Route};
use crate::policy::{Decision, Policy};

/// The (pull request, key) pairs the router claims for one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The claim key: the delivery's GUID with its hook's identity.
    pub key: DeliveryId,
    /// The pull requests it names (at least one).
    pub targets: Vec<Target>,
}

impl Claims {
    /// What the router would claim for `detail`'s request under `policy`: `None` if it would claim nothing (an
    /// event the policy ignores, one that names no pull request, a request that does not read).
    pub fn of(policy: &Policy, detail: &Detail) -> Option<Self> {
        let (headers, payload) = request_of(detail)?;
        let delivery = github::delivery(&headers).ok()?;
        let Ok(Route::Targets { action, targets }) = github::route(&delivery.event, &payload)
        else {
            return None;
        };
        let decision = policy.decide(&delivery.event, action.as_deref());
        if decision == Decision::Ignore || targets.is_empty() {
            return None;
        }
        Some(Self {
            key: delivery.key,
            targets,
        })
    }
}

/// What the registry knows of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// Every pair is in flight, waiting or retained.
    Yes,
    /// Some pair is not: it needs a redelivery.
    No,
}

/// Whether the registry knows every pair of `claims`: a [`claim`](WorkerRegistry::claim) of each,
/// which is a duplicate if the pair is in flight or retained, and otherwise is a bare claim removed
/// again at once ([`release`](WorkerRegistry::release)). Between those two calls a copy of the
/// delivery arriving at a replica is answered as a duplicate; the reconciler keeps chasing the
/// GUID, so its next redelivery admits it.
///
/// A parked (waiting) pair is not one `claim` sees on Redis and PostgreSQL: it reads as unknown,
/// and a promotion between the two calls leaves the delivery to the probe's bare claim, which the
/// release then removes. The reconciler therefore does not probe a GUID the router accepted
/// (answered 202, which a parked delivery is): see `scan.rs`.
pub async fn known(registry: &DynRegistry, claims: &Claims) -> Result<Known, RegistryError> {
    for target in &claims.targets {
        match registry.claim(target, &claims.key).await? {
            ClaimOutcome::AlreadyClaimed(_) => {}
            ClaimOutcome::Claimed => {
                // Our probe's bare claim: removed, so the redelivery is admitted. Should this
                // fail, the bare claim is released after the heartbeat timeout; the GUID is still
                // chased, and a redelivery after that release admits it.
                if let Err(e) = registry.release(target, &claims.key).await {
                    tracing::warn!(%target, delivery = %claims.key, "reconcile: the probe's claim stays until it expires: {e}");
                }
                return Ok(Known::No);
            }
        }
    }
    Ok(Known::Yes)
}

/// The request of a logged attempt as the router received it: its headers (with
/// `Content-Type: application/json`, as the log holds the JSON payload whichever content type
/// was sent) and its JSON payload.
fn request_of(detail: &Detail) -> Option<(HeaderMap, Vec<u8>)> {
    let logged = detail.request.headers.as_ref()?;
    let mut headers = HeaderMap::new();
    for (k, v) in logged {
        let (Ok(name), Some(value)) = (
            HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()),
            v.as_str().and_then(|v| HeaderValue::from_str(v).ok()),
        ) else {
            continue;
        };
        headers.insert(name, value);
    }
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let payload = serde_json::to_vec(detail.request.payload.as_ref()?).ok()?;
    Some((headers, payload))
}
