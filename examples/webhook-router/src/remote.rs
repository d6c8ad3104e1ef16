//! Replicas in separate processes: handing an event to a worker whose container another router
//! process runs.
//!
//! Each worker's container belongs to the replica whose admission created the worker
//! (`new: true`). That replica starts it, then records its own address (`--advertise-url`) as the
//! worker's owner in the [`Store`] next to the registry. Any replica whose admission places an
//! event on a worker it does not run looks the owner up and forwards the event to
//! `POST /internal/workers/{id}/jobs` there, with the admin token. What can go wrong, and what
//! the replica answers GitHub:
//!
//! | the owner | handover | answer |
//! |---|---|---|
//! | queued it (202) | [`Handover::Queued`] | 202 assigned |
//! | queued it behind its full mailbox (202, `overflowed` with a position) | [`Handover::Overflowed`] | 202 waiting, with the position |
//! | has a full mailbox and overflow for it (429) | [`Handover::Full`] | the claim is released, 503 capacity |
//! | has no running container for it (410, 404) | [`Handover::Held`] | 202: the worker has no container anywhere, so it never heartbeats again; the sweep declares it dead and the registry releases its events for re-dispatch |
//! | refuses the connection (its process is gone) | [`Handover::Held`] | 202, the same: its containers died with it |
//! | no owner recorded within [`MAX_OWNER_WAIT`] (or the lookup failed), another failure, a timeout | [`Handover::Unreachable`] | the claim is released, 503 unavailable (if the release fails too, 202: the claim stays with the worker, which releases it when it dies or exits) |
//!
//! This module is the network half only: the owner records (`Remote::owner`,
//! `Remote::publish`) and the request to another replica (`Remote::post`). It knows nothing of
//! this process's containers; [`crate::dispatch`] decides when to look locally and when to forward.
//!
//! So no worker ever gets a second container (only the creating admission starts one), and an
//! accepted event is either in its container's queue or held by a worker that will die, in which
//! case the sweep of a surviving replica re-dispatches it.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::sleep;
use utoipa::ToSchema;
use worker_registry::WorkerId;

use crate::secrets::Secret;
use crate::store::Store;
use crate::worker::Job;

/// How long a forwarded event may take to be answered.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long connecting to another replica may take.
pub const FORWARD_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// The longest wait for a new worker's owner to publish its address (the owner publishes right
/// after its admission returns; the wait is also at most one heartbeat interval).
pub const MAX_OWNER_WAIT: Duration = Duration::from_secs(1);

/// What became of an event handed to a worker (by this process or by its owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handover {
    /// In the container's queue.
    Queued,
    /// Behind the container's full queue, in its overflow, `position` deep (from 1).
    Overflowed {
        /// Its place in the overflow.
        position: usize,
    },
    /// The container's queue and its overflow are full.
    Full,
    /// Not delivered, and left with the worker in the registry: its container is gone, so it will
    /// be declared dead and the event released for re-dispatch.
    Held,
    /// Not delivered for this reason; the worker may well be alive.
    Unreachable(String),
}

/// Which replica runs a worker's container, as its owner record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This one.
    This,
    /// The replica at this address.
    Other(String),
    /// None has published a record (yet).
    Unknown,
}

/// A forwarded event, as `POST /internal/workers/{id}/jobs` takes it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ForwardedJob {
    /// The worker's target, `owner/repo#number`.
    pub target: String,
    /// The delivery id.
    pub delivery: String,
    /// The fencing token of the assignment.
    pub token: u64,
    /// The W3C `traceparent` of the span the event was dispatched under, if it is traced: the
    /// parent of the worker's loop span.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// How `POST /internal/workers/{id}/jobs` answered.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ForwardAnswer {
    /// The worker.
    pub worker: u64,
    /// `queued`, `overflowed` (behind its full mailbox, see `position`), `full` (mailbox and
    /// overflow), `stopped` (its container here has stopped) or `unknown` (no container here).
    pub result: String,
    /// Overflowed: its place in the worker's overflow (from 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub position: Option<u64>,
}

struct Inner {
    store: Store,
    advertise: String,
    http: reqwest::Client,
    token: Secret,
    owner_wait: Duration,
    publish_retry: Duration,
}

/// This replica's way to the containers of the others (cheap to clone).
#[derive(Clone)]
pub struct Remote(Arc<Inner>);

impl Remote {
    /// Forwarding through `store`, this replica reachable at `advertise` (`http://host:port`),
    /// with `token` (the admin token, which the internal endpoint requires: its current value is
    /// sent); `heartbeat` bounds the waits.
    pub fn new(
        store: Store,
        advertise: &str,
        token: Secret,
        heartbeat: Duration,
    ) -> Result<Self, String> {
        let advertise = advertise.trim_end_matches('/').to_owned();
        if !(advertise.starts_with("http://") || advertise.starts_with("https://"))
            || advertise.len() <= "https://".len()
        {
            return Err(format!(
                "--advertise-url {advertise:?}: expected http://host:port"
            ));
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            // A fresh connection per forward: an owner that died since the last forward is then
            // always a refused connect (Held, 202), never a send on a pooled socket it left behind,
            // which fails after the request was written and reads as Unreachable (503: a lost
            // delivery). Forwarding is the minority path; one loopback or LAN handshake is cheap.
            .pool_max_idle_per_host(0)
            .connect_timeout(FORWARD_CONNECT_TIMEOUT)
            .timeout(FORWARD_TIMEOUT)
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Self(Arc::new(Inner {
            store,
            advertise,
            http,
            token,
            owner_wait: heartbeat.min(MAX_OWNER_WAIT),
            publish_retry: heartbeat.clamp(Duration::from_millis(10), Duration::from_secs(5)),
        })))
    }

    /// Where the other replicas reach this one.
    pub fn advertise(&self) -> &str {
        &self.0.advertise
    }

    /// The store of owner records.
    pub fn store(&self) -> &Store {
        &self.0.store
    }

    /// How long a dispatch waits for a new worker's owner to publish its record.
    pub fn owner_wait(&self) -> Duration {
        self.0.owner_wait
    }

    /// Records this replica as the owner of `worker`'s container; if the backend cannot answer,
    /// tries again in the background for as long as `running` (whether the container still runs)
    /// says so.
    pub(crate) async fn publish(
        &self,
        worker: WorkerId,
        running: impl Fn() -> bool + Send + 'static,
    ) {
        let Err(e) = self.0.store.publish(worker, &self.0.advertise).await else {
            return;
        };
        tracing::warn!(%worker, "could not record this replica as the container's owner, retrying: {e}");
        let this = self.clone();
        tokio::spawn(async move {
            let mut delay = this.0.publish_retry / 4;
            while running() {
                sleep(delay).await;
                if this
                    .0
                    .store
                    .publish(worker, &this.0.advertise)
                    .await
                    .is_ok()
                {
                    return;
                }
                delay = (delay * 2).min(this.0.publish_retry);
            }
        });
    }

    /// Forgets the owner records of `workers` (best effort: a stale record only leads a forwarded
    /// event to a "no container here" answer, which is handled).
    pub(crate) async fn forget(&self, workers: &[WorkerId]) {
        if let Err(e) = self.0.store.forget(workers).await {
            tracing::debug!("could not forget {} owner records: {e}", workers.len());
        }
    }

    /// Which replica runs `worker`'s container, as its record says; `Err` (why) if the record
    /// cannot be read.
    pub(crate) async fn owner(&self, worker: WorkerId) -> Result<Owner, String> {
        match self.0.store.owner(worker).await {
            Err(e) => Err(format!("owner lookup failed: {e}")),
            Ok(Some(address)) if address == self.0.advertise => Ok(Owner::This),
            Ok(Some(address)) => Ok(Owner::Other(address)),
            Ok(None) => Ok(Owner::Unknown),
        }
    }

    /// Forwards `job` to `worker`'s container on the replica at `address`.
    pub(crate) async fn post(&self, address: &str, worker: WorkerId, job: Job) -> Handover {
        let body = ForwardedJob {
            target: job.target.to_string(),
            delivery: job.event.to_string(),
            token: job.token.get(),
            traceparent: job.trace.as_str().map(str::to_owned),
        };
        let mut req = self
            .0
            .http
            .post(format!("{address}/internal/workers/{worker}/jobs"))
            .json(&body);
        if let Some(t) = self.0.token.current_text() {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(res) => match res.status().as_u16() {
                202 => match res.json::<ForwardAnswer>().await {
                    Ok(ForwardAnswer {
                        position: Some(p), ..
                    }) => Handover::Overflowed {
                        position: usize::try_from(p).unwrap_or(usize::MAX),
                    },
                    // Queued (an answer that cannot be read still says 202: it was taken).
                    _ => Handover::Queued,
                },
                429 => Handover::Full,
                404 | 410 => Handover::Held,
                status => {
                    Handover::Unreachable(format!("the owner replica {address} answered {status}"))
                }
            },
            Err(e) if refused(&e) => {
                tracing::info!(%worker, owner = address, "the owner replica refuses connections: its containers are gone; the sweep will release the worker's events");
                Handover::Held
            }
            Err(e) => Handover::Unreachable(format!("forwarding to {address} failed: {e}")),
        }
    }
}

/// Whether the connection was refused (nobody listens: the process is gone), as opposed to a
/// timeout or a failure after the request was sent, which leave its fate unknown.
fn refused(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        source = s.source();
    }
    false
}
