//! The protocol's client: one call per endpoint of `/worker/v1`, each answer mapped to what the
//! worker does next ([`Refusal`] for the answers that are not the call's success). The endpoints,
//! their answers and the meaning of each status are in the router's design page
//! (`worker_protocol.md`).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use ureq::http::{HeaderMap, Response};
use ureq::Agent;

/// The largest event body accepted: GitHub's cap of 25 MiB, with room for nothing else.
pub const MAX_BODY_BYTES: u64 = 25 * 1024 * 1024;

/// The largest JSON answer read (a heartbeat, a fenced answer).
const MAX_JSON_BYTES: u64 = 64 * 1024;

/// What a heartbeat answer said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// `draining`: finish what is held, take nothing new.
    pub draining: bool,
    /// How long the worker may act without another successful heartbeat, counted from the send.
    pub lease: Duration,
}

/// One event, as `GET /next` hands it.
#[derive(Debug, Clone)]
pub struct Event {
    /// The body, byte for byte as GitHub sent it.
    pub body: Vec<u8>,
    /// `X-GitHub-Event`.
    pub event: String,
    /// `X-GitHub-Delivery`.
    pub delivery: String,
    /// `X-GitHub-Action`, when there is one.
    pub action: Option<String>,
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// `X-Worker-Target`: `owner/repo#number`.
    pub target: String,
    /// `X-Worker-Fencing-Token`: the fencing token of this event's claim.
    pub token: String,
    /// `traceparent`, when the router sends one.
    pub traceparent: Option<String>,
}

/// How a delivery ended, for `complete`.
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    /// The delivery (`X-GitHub-Delivery`).
    pub delivery: String,
    /// `succeeded` or `failed`.
    pub outcome: &'static str,
    /// How many times the command ran.
    pub attempts: u32,
    /// Why it failed (empty on success).
    pub reason: String,
}

/// An answer that is not the call's success.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// `410`: the registry declared the worker dead; stop at once, without another call.
    Fenced {
        /// The answer's `reason`.
        reason: String,
    },
    /// `401`: the credential does not verify; the worker was launched wrong.
    Unauthorized,
    /// `503`, or the router could not be reached: not a verdict, try again.
    Unavailable {
        /// What was observed.
        why: String,
    },
    /// Any other answer: a router speaking another protocol.
    Unexpected {
        /// The status.
        status: u16,
        /// The call.
        call: &'static str,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fenced { reason } => write!(f, "fenced by the router ({reason})"),
            Self::Unauthorized => f.write_str("the router refused the worker's credential (401)"),
            Self::Unavailable { why } => write!(f, "the router is unavailable: {why}"),
            Self::Unexpected { status, call } => {
                write!(f, "the router answered {status} to {call}")
            }
        }
    }
}

/// The client of one worker (cheap to clone; each clone used from one thread keeps its own
/// connection).
#[derive(Clone)]
pub struct Client {
    agent: Agent,
    base: String,
    authorization: String,
}

#[derive(Deserialize)]
struct BeatBody {
    status: String,
    lease_ms: u64,
}

#[derive(Deserialize)]
struct StatusBody {
    status: String,
}

#[derive(Deserialize)]
struct FencedBody {
    #[serde(default)]
    reason: String,
}

impl Client {
    /// A client of the router at `base` (`http://host:port`), presenting `credential`.
    pub fn new(base: &str, credential: &str) -> Self {
        let agent = Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections_per_host(2)
            .build()
            .into();
        Self {
            agent,
            base: format!("{}/worker/v1", base.trim_end_matches('/')),
            authorization: format!("Bearer {credential}"),
        }
    }

    /// `POST /heartbeat`, answered within `timeout` or counted unavailable.
    pub fn heartbeat(&self, timeout: Duration) -> Result<Beat, Refusal> {
        let call = "heartbeat";
        let mut r = self.post(call, None, timeout)?;
        let b: BeatBody = json(&mut r, call)?;
        Ok(Beat {
            draining: b.status == "draining",
            lease: Duration::from_millis(b.lease_ms),
        })
    }

    /// `GET /next?wait_ms=`: the next event, or `None` when none came within `wait`.
    pub fn next(&self, wait: Duration) -> Result<Option<Event>, Refusal> {
        let call = "next";
        let url = format!("{}/next?wait_ms={}", self.base, wait.as_millis());
        // The router answers within `wait`; the margin covers a slow answer, not a lost one.
        let timeout = wait + Duration::from_secs(10);
        let r = self
            .agent
            .get(&url)
            .header("Authorization", &self.authorization)
            .config()
            .timeout_global(Some(timeout))
            .build()
            .call();
        let mut r = answer(r, call, &[200, 204])?;
        if r.status().as_u16() == 204 {
            return Ok(None);
        }
        let body = r
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_vec()
            .map_err(|e| unavailable(call, e))?;
        event(r.headers(), body).map(Some)
    }

    /// `POST /loop/started`.
    pub fn loop_started(&self, delivery: &str) -> Result<(), Refusal> {
        let body = serde_json::json!({ "delivery": delivery }).to_string();
        self.post("loop/started", Some(body), short()).map(drop)
    }

    /// `POST /complete`.
    pub fn complete(&self, c: &Completion) -> Result<(), Refusal> {
        let body = serde_json::to_string(c).expect("a completion serializes");
        self.post("complete", Some(body), short()).map(drop)
    }

    /// `POST /loop/finished`: whether the worker is now dead (a draining worker's last loop).
    pub fn loop_finished(&self) -> Result<bool, Refusal> {
        let call = "loop/finished";
        let mut r = self.post(call, None, short())?;
        let b: StatusBody = json(&mut r, call)?;
        Ok(b.status != "active" && b.status != "draining")
    }

    /// `POST /exit`: the worker's last call.
    pub fn exit(&self) -> Result<(), Refusal> {
        self.post("exit", None, short()).map(drop)
    }

    fn post(
        &self,
        call: &'static str,
        body: Option<String>,
        timeout: Duration,
    ) -> Result<Response<ureq::Body>, Refusal> {
        let req = self
            .agent
            .post(format!("{}/{call}", self.base))
            .header("Authorization", &self.authorization)
            .config()
            .timeout_global(Some(timeout))
            .build();
        let r = match body {
            Some(b) => req.content_type("application/json").send(b),
            None => req.send_empty(),
        };
        answer(r, call, &[200, 204])
    }
}

/// The timeout of a call the router answers at once.
fn short() -> Duration {
    Duration::from_secs(10)
}

fn answer(
    r: Result<Response<ureq::Body>, ureq::Error>,
    call: &'static str,
    ok: &[u16],
) -> Result<Response<ureq::Body>, Refusal> {
    let mut r = r.map_err(|e| unavailable(call, e))?;
    let status = r.status().as_u16();
    match status {
        s if ok.contains(&s) => Ok(r),
        410 => {
            let reason =
                json::<FencedBody>(&mut r, call).map_or_else(|_| String::new(), |b| b.reason);
            Err(Refusal::Fenced { reason })
        }
        401 => Err(Refusal::Unauthorized),
        // A 5xx is the router's trouble, not a verdict on the worker: the lease keeps running.
        500..=599 => Err(Refusal::Unavailable {
            why: format!("{call} answered {status}"),
        }),
        _ => Err(Refusal::Unexpected { status, call }),
    }
}

fn unavailable(call: &str, e: ureq::Error) -> Refusal {
    Refusal::Unavailable {
        why: format!("{call}: {e}"),
    }
}

fn json<T: for<'de> Deserialize<'de>>(
    r: &mut Response<ureq::Body>,
    call: &'static str,
) -> Result<T, Refusal> {
    let status = r.status().as_u16();
    let bytes = r
        .body_mut()
        .with_config()
        .limit(MAX_JSON_BYTES)
        .read_to_vec()
        .map_err(|e| unavailable(call, e))?;
    serde_json::from_slice(&bytes).map_err(|_| Refusal::Unexpected { status, call })
}

fn event(h: &HeaderMap, body: Vec<u8>) -> Result<Event, Refusal> {
    let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let need = |name: &str| {
        get(name).ok_or(Refusal::Unexpected {
            status: 200,
            call: "next (a header is missing)",
        })
    };
    Ok(Event {
        event: need("x-github-event")?,
        delivery: need("x-github-delivery")?,
        target: need("x-worker-target")?,
        token: need("x-worker-fencing-token")?,
        action: get("x-github-action"),
        content_type: get("content-type"),
        traceparent: get("traceparent"),
        body,
    })
}
