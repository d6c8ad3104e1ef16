//! Replicas in separate processes: claiming the start of a worker's container, and handing an
//! event to a worker whose container another router process runs.
//!
//! Each worker's container belongs to the replica that won its *start claim*: before it starts
//! the container, a replica writes its own address (`--advertise-url`) as the worker's owner
//! record in the [`Store`] next to the registry, in one atomic step that writes nothing if a
//! record exists (`Remote::claim_start`). Both paths that start a worker claim first: the
//! admission that created it (`new: true`) and the retry of one whose reply was lost
//! ([`AlreadyClaimed::needs_start`](worker_registry::AlreadyClaimed::needs_start)); whichever
//! loses hands its event over like any other (see [`crate::lifecycle`]). Any replica whose
//! admission places an event on a worker it does not run looks the owner up and forwards the
//! event to `POST /internal/workers/{id}/jobs` there, with the admin token (and with the event's
//! payload, its body as GitHub sent it: see [`JOB_WITH_BODY`]); the owner queues it, or parks it
//! for the container it is about to start (its record is written first). What can go
//! wrong, and what the replica answers GitHub:
//!
//! | the owner | handover | answer |
//! |---|---|---|
//! | queued (or parked) it (202) | [`Handover::Queued`] | 202 assigned |
//! | queued it behind its full mailbox (202, `overflowed` with a position) | [`Handover::Overflowed`] | 202 waiting, with the position |
//! | has a full mailbox and overflow for it (429) | [`Handover::Full`] | the claim is released, 503 overflow_full |
//! | has a stopped container for it (410) | [`Handover::Stopped`] | 202: the worker has no container anywhere, so it never heartbeats again; the sweep declares it dead and the registry releases its events for re-dispatch |
//! | refuses the connection (its process is gone) | [`Handover::Stopped`] | 202, the same: its containers died with it (or it died between its claim and the start) |
//! | no owner recorded within [`MAX_OWNER_WAIT`] (or the lookup failed), another failure, a timeout | [`Handover::Unreachable`] | the claim is released, 503 unavailable (if the release fails too, 202: the claim stays with the worker, which releases it when it dies or exits) |
//!
//! A record lives as long as its worker: it is removed when the container ends with the worker
//! dead, by the replica whose sweep declares the worker dead (its owner may be gone, or may have
//! died between its claim and the start), or by a claim's winner that finds the worker no longer
//! one to start. It has no expiry: a record that expired while its worker lived would let a second
//! replica claim, and start, the same worker.
//!
//! This module is the network half only: the owner records (`Remote::claim_start`,
//! `Remote::owner`, `Remote::forget`) and the request to another replica (`Remote::post`). It
//! knows nothing of this process's containers; [`crate::lifecycle`] and [`crate::dispatch`]
//! decide when to start, when to look locally and when to forward.
//!
//! So no worker ever gets a second container (only a claim's winner starts one), and an accepted
//! event is either in its container's queue (or parked for it) or held by a worker that will die,
//! in which case the sweep of a surviving replica re-dispatches it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tokio::time::sleep;
use utoipa::ToSchema;
use worker_registry::{DeliveryId, FencingToken, Payload, TargetError, WorkerId};

use crate::mailbox::Handover;
use crate::secrets::Secret;
use crate::store::Store;
use crate::telemetry::TraceParent;
use crate::worker::Job;

/// How many times a start claim is tried while the backend cannot answer.
pub const CLAIM_ATTEMPTS: u32 = 3;
/// How long a forwarded event may take to be answered.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long connecting to another replica may take.
pub const FORWARD_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// The longest wait for a new worker's owner to claim it (the owner claims right after its
/// admission returns; the wait is also at most one heartbeat interval).
pub const MAX_OWNER_WAIT: Duration = Duration::from_secs(1);

/// What came of a claim of a worker's start (`Remote::claim_start`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartClaim {
    /// This claim holds: start the container.
    Won,
    /// Another claim holds: this replica's own (another task of this process is starting the
    /// container), or another replica's.
    Lost {
        /// Whose.
        owner: Owner,
        /// The delivery whose admission made it (none in a record without one).
        cause: Option<DeliveryId>,
    },
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

/// The media type of a forwarded event that carries its payload: the [`ForwardedJob`] as compact
/// JSON (with its `payload` metadata) on one line, a line feed, then the payload's body exactly as
/// GitHub sent it. The body is not re-encoded (base64 in JSON would make a 25 MiB body 33 MiB and
/// cost two passes over it): the receiving replica parses the one short line and keeps the rest
/// of the request's buffer as the body, without a copy. An event without a payload is sent as
/// plain `application/json`, as replicas of earlier versions send and take it.
pub const JOB_WITH_BODY: &str = "application/vnd.webhook-router.job+body";

/// The most bytes a forwarded event's request may have: the largest body GitHub sends, its
/// largest metadata, and room for the job's JSON line.
pub const MAX_FORWARDED_BYTES: usize = crate::github::MAX_PAYLOAD_BYTES
    + worker_registry::limits::MAX_PAYLOAD_META_LEN * 2
    + 64 * 1024;

/// A forwarded event's payload metadata (its body follows the JSON line, see [`JOB_WITH_BODY`]).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ForwardedPayload {
    /// The event name (`X-GitHub-Event`).
    pub event: String,
    /// The action, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The body's content type.
    pub content_type: String,
    /// The extra headers, as `[name, value]` pairs in order.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// The body's length: what follows the JSON line must be exactly this long.
    pub body_len: u64,
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
    /// What GitHub sent with the delivery, without its body (sent as [`JOB_WITH_BODY`] only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<ForwardedPayload>,
}

/// `job` as a forwarding request's content type and body: [`JOB_WITH_BODY`] if it carries a
/// payload (one copy of the body, into the request), else `application/json`.
///
/// # Examples
///
/// ```
/// use webhook_router::remote::{decode_job, encode_job, JOB_WITH_BODY};
/// use webhook_router::worker::Job;
/// use worker_registry::{DeliveryId, FencingToken, Payload, Target};
///
/// let payload = Payload::builder("pull_request", &b"{\n \"action\": \"opened\"}"[..])
///     .action("opened")
///     .header("X-GitHub-Delivery", "d-1")
///     .build()
///     .unwrap();
/// let job = Job {
///     target: Target::new("o/r", 1).unwrap(),
///     event: DeliveryId::new("d-1").unwrap(),
///     token: FencingToken::from_raw(7),
///     trace: Default::default(),
///     payload: Some(payload),
/// };
/// let (content_type, body) = encode_job(&job);
/// assert_eq!(content_type, JOB_WITH_BODY);
/// assert_eq!(decode_job(content_type, body).unwrap(), job);
/// ```
pub fn encode_job(job: &Job) -> (&'static str, Bytes) {
    let forwarded = ForwardedJob {
        target: job.target.to_string(),
        delivery: job.event.to_string(),
        token: job.token.get(),
        traceparent: job.trace.as_str().map(str::to_owned),
        payload: job.payload.as_ref().map(|p| ForwardedPayload {
            event: p.event().to_owned(),
            action: p.action().map(str::to_owned),
            content_type: p.content_type().to_owned(),
            headers: p
                .headers()
                .map(|(n, v)| (n.to_owned(), v.to_owned()))
                .collect(),
            body_len: p.body().len() as u64,
        }),
    };
    // Serialising these plain structs cannot fail; compact JSON has no raw line feed.
    let line = serde_json::to_vec(&forwarded).unwrap_or_default();
    match &job.payload {
        None => ("application/json", Bytes::from(line)),
        Some(p) => {
            let mut buf = Vec::with_capacity(line.len() + 1 + p.body().len());
            buf.extend_from_slice(&line);
            buf.push(b'\n');
            buf.extend_from_slice(p.body());
            (JOB_WITH_BODY, Bytes::from(buf))
        }
    }
}

/// A forwarding request's job, from its content type (`application/json` or [`JOB_WITH_BODY`],
/// parameters ignored) and body; the payload's body is a slice of `body` (no copy). `Err` says
/// what is wrong (a 400).
pub fn decode_job(content_type: &str, body: Bytes) -> Result<Job, String> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    let (line, rest) = if media.eq_ignore_ascii_case(JOB_WITH_BODY) {
        let end = body
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| format!("{JOB_WITH_BODY}: no line feed after the job's JSON"))?;
        (body.slice(..end), Some(body.slice(end + 1..)))
    } else if media.eq_ignore_ascii_case("application/json") {
        (body, None)
    } else {
        return Err(format!(
            "content type {content_type:?}: expected application/json or {JOB_WITH_BODY}"
        ));
    };
    let job: ForwardedJob =
        serde_json::from_slice(&line).map_err(|e| format!("the job's JSON: {e}"))?;
    let payload = match (job.payload, rest) {
        (None, _) => None,
        (Some(_), None) => return Err(format!("a payload is sent as {JOB_WITH_BODY}")),
        (Some(p), Some(rest)) => {
            if rest.len() as u64 != p.body_len {
                return Err(format!(
                    "the payload's body is {} bytes, its body_len says {}",
                    rest.len(),
                    p.body_len
                ));
            }
            let mut b = Payload::builder(p.event, rest).content_type(p.content_type);
            if let Some(a) = p.action {
                b = b.action(a);
            }
            for (n, v) in p.headers {
                b = b.header(n, v);
            }
            Some(b.build().map_err(|e| e.to_string())?)
        }
    };
    Ok(Job {
        target: job.target.parse().map_err(|e: TargetError| e.to_string())?,
        event: DeliveryId::new(&job.delivery).map_err(|e| e.to_string())?,
        token: FencingToken::from_raw(job.token),
        // A malformed one is dropped: the event is still delivered, in a trace of its own.
        trace: job
            .traceparent
            .as_deref()
            .and_then(TraceParent::parse)
            .unwrap_or_default(),
        payload,
    })
}

/// How `POST /internal/workers/{id}/jobs` answered.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ForwardAnswer {
    /// The worker.
    pub worker: u64,
    /// `queued` (in its mailbox, or parked for the container this replica is starting),
    /// `overflowed` (behind its full mailbox, see `position`), `full` (mailbox and overflow) or
    /// `stopped` (its container here has stopped).
    pub result: String,
    /// Overflowed: its place in the worker's overflow (from 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub position: Option<u64>,
}

impl ForwardAnswer {
    /// The answer of `POST /internal/workers/{id}/jobs`, with its status, to what became of the
    /// event here (`Err`: no container here, and the event was not parked). [`Remote::post`]
    /// reads it back on the forwarding replica; replicas of two versions may meet during a
    /// rolling update, so neither side changes alone.
    pub fn of(worker: WorkerId, handed: &Result<Handover, Job>) -> (StatusCode, Self) {
        let mut position = None;
        let (status, result) = match handed {
            Ok(Handover::Queued) => (StatusCode::ACCEPTED, "queued"),
            Ok(Handover::Overflowed { position: p }) => {
                position = Some(*p as u64);
                (StatusCode::ACCEPTED, "overflowed")
            }
            Ok(Handover::Full) => (StatusCode::TOO_MANY_REQUESTS, "full"),
            Ok(Handover::Stopped) => (StatusCode::GONE, "stopped"),
            // Not reached: this process's containers are never out of reach.
            Ok(Handover::Unreachable(_)) => (StatusCode::SERVICE_UNAVAILABLE, "unreachable"),
            Err(_) => (StatusCode::NOT_FOUND, "unknown"),
        };
        let answer = Self {
            worker: worker.get(),
            result: result.to_owned(),
            position,
        };
        (status, answer)
    }
}

struct Inner {
    store: Store,
    advertise: String,
    http: reqwest::Client,
    token: Secret,
    owner_wait: Duration,
    claim_retry: Duration,
    /// The next start claim's id: unique in this process, and seeded from the clock so that a
    /// restarted process on the same address does not reuse its predecessor's ids.
    next_claim: AtomicU64,
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
            // always a refused connect (Stopped, 202), never a send on a pooled socket it left behind,
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
            claim_retry: heartbeat.clamp(Duration::from_millis(10), Duration::from_secs(5)),
            next_claim: AtomicU64::new(claim_seed()),
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

    /// How long a dispatch waits for a new worker's owner to claim it.
    pub fn owner_wait(&self) -> Duration {
        self.0.owner_wait
    }

    /// Claims the start of `worker`'s container for this replica, whose admission of `cause`
    /// placed an event on it: writes this replica's owner record, under a claim id of its own,
    /// unless a record exists ([`Store::claim`], one atomic step on the server), and says whose
    /// record holds, and for which delivery. Exactly one claim wins, whichever
    /// replicas race, and however many tasks of this process do. A backend that cannot answer is
    /// tried [`CLAIM_ATTEMPTS`] times in all (the same claim id each time: a claim written by an
    /// attempt whose answer was lost is recognised as this one's); `Err` (why) if none answers.
    pub(crate) async fn claim_start(
        &self,
        worker: WorkerId,
        cause: &DeliveryId,
    ) -> Result<StartClaim, String> {
        // Relaxed: only uniqueness matters, which the read-modify-write gives.
        let claim = self.0.next_claim.fetch_add(1, Ordering::Relaxed);
        let mut delay = self.0.claim_retry / 4;
        let mut attempt = 1;
        loop {
            let held = self
                .0
                .store
                .claim(worker, &self.0.advertise, claim, cause.as_str())
                .await;
            match held {
                Ok(r) if r.address == self.0.advertise && r.claim == claim => {
                    return Ok(StartClaim::Won)
                }
                Ok(r) => {
                    let owner = if r.address == self.0.advertise {
                        Owner::This
                    } else {
                        Owner::Other(r.address)
                    };
                    let cause = DeliveryId::new(&r.delivery).ok();
                    return Ok(StartClaim::Lost { owner, cause });
                }
                Err(e) if attempt < CLAIM_ATTEMPTS => {
                    tracing::debug!(%worker, attempt, "start claim not answered, trying again: {e}");
                }
                Err(e) => {
                    return Err(format!(
                        "its start claim was not answered in {CLAIM_ATTEMPTS} attempts: {e}"
                    ))
                }
            }
            sleep(delay).await;
            delay = (delay * 2).min(self.0.claim_retry);
            attempt += 1;
        }
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

    /// Forwards `job` (with its payload, if it carries one: see [`encode_job`]) to `worker`'s
    /// container on the replica at `address`.
    pub async fn post(&self, address: &str, worker: WorkerId, job: Job) -> Handover {
        let (content_type, body) = encode_job(&job);
        let mut req = self
            .0
            .http
            .post(format!("{address}/internal/workers/{worker}/jobs"))
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body);
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
                404 | 410 => Handover::Stopped,
                status => {
                    Handover::Unreachable(format!("the owner replica {address} answered {status}"))
                }
            },
            Err(e) if refused(&e) => {
                tracing::info!(%worker, owner = address, "the owner replica refuses connections: its containers are gone; the sweep will release the worker's events");
                Handover::Stopped
            }
            Err(e) => Handover::Unreachable(format!("forwarding to {address} failed: {e}")),
        }
    }
}

/// A first claim id: the clock's nanoseconds, kept below 2^62 so that a claim id fits a
/// PostgreSQL `bigint` however many claims follow.
fn claim_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    u64::try_from(nanos % (1 << 62)).unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use worker_registry::Target;

    fn job(body: &'static [u8]) -> Job {
        Job {
            target: Target::new("o/r", 1).unwrap(),
            event: DeliveryId::new("d").unwrap(),
            token: FencingToken::from_raw(3),
            trace: Default::default(),
            payload: Some(
                Payload::builder("pull_request", body)
                    .header("x-github-hook-id", "9")
                    .build()
                    .unwrap(),
            ),
        }
    }

    #[test]
    fn a_payload_round_trips_byte_for_byte_and_its_body_is_not_copied() {
        let j = job(b"line\none\n\0\xff");
        let (ct, wire) = encode_job(&j);
        let decoded = decode_job(&format!("{ct}; charset=binary"), wire.clone()).unwrap();
        assert_eq!(decoded, j);
        let body = decoded.payload.unwrap().body().clone();
        assert_eq!(
            body.as_ptr(),
            wire[wire.len() - body.len()..].as_ptr(),
            "a slice of the request's buffer"
        );
        // Without a payload: plain JSON, as earlier versions send it.
        let bare = Job { payload: None, ..j };
        let (ct, wire) = encode_job(&bare);
        assert_eq!(ct, "application/json");
        assert_eq!(decode_job(ct, wire).unwrap(), bare);
    }

    #[test]
    fn a_truncated_or_unframed_payload_is_refused_with_a_reason() {
        let (ct, wire) = encode_job(&job(b"0123456789"));
        let short = wire.slice(..wire.len() - 1);
        let e = decode_job(ct, short).unwrap_err();
        assert!(e.contains("9 bytes, its body_len says 10"), "{e}");
        let line = wire.slice(..wire.iter().position(|b| *b == b'\n').unwrap());
        let e = decode_job(ct, line.clone()).unwrap_err();
        assert!(e.contains("no line feed"), "{e}");
        let e = decode_job("application/json", line).unwrap_err();
        assert!(e.contains("is sent as"), "{e}");
        let e = decode_job("text/plain", wire).unwrap_err();
        assert!(e.contains("expected application/json"), "{e}");
    }
}
