//! The worker protocol's router side: what the `/worker/v1/...` endpoints ([`crate::http::worker`])
//! need to answer a worker that runs outside this process (a `process` or `docker` worker). The
//! design (endpoints, the credential, the lease and why it fences in time) is in
//! [`crate::docs::worker_protocol`].
//!
//! * [`Protocol`]: the router key that mints and verifies credentials, the lease rules from the
//!   registry's timings and the margins ([`ProtocolSettings`]), the URL workers are handed, and
//!   the [`hub::Hub`] of the workers this router serves;
//! * [`hub`]: each served worker's mailbox, the events it was handed and has not completed, and
//!   when the registry last showed it active (what a `draining` lease is counted from).

pub mod hub;

use crate::credential::{Credential, WorkerKey};
use crate::lease::{LeaseError, LeaseRules, DEFAULT_KILL_MARGIN, DEFAULT_TIMER_SLACK};

use std::sync::OnceLock;
use std::time::Duration;

use worker_registry::{FencingToken, RegistryConfig, WorkerId};

/// The environment variable holding a worker's credential.
pub const ENV_CREDENTIAL: &str = "WORKER_CREDENTIAL";
/// The environment variable holding the fencing token of the assignment that created the worker.
pub const ENV_TOKEN: &str = "WORKER_TOKEN";
/// The environment variable holding the URL of the router's worker protocol.
pub const ENV_ROUTER_URL: &str = "WORKER_ROUTER_URL";

/// The longest a `GET /worker/v1/next` waits for an event (a worker asks again after a `204`).
pub const DEFAULT_LONG_POLL: Duration = Duration::from_secs(20);

/// How the protocol is configured (`--worker-key-file`, `--kill-margin`, `--timer-slack`).
#[derive(Clone)]
pub struct ProtocolSettings {
    /// The router key every replica shares; `None`: drawn at random at start (one replica only).
    pub key: Option<WorkerKey>,
    /// `K`: how long a worker may take to kill its command and see it gone.
    pub kill_margin: Duration,
    /// `S`: how late a loaded worker's timer may fire.
    pub timer_slack: Duration,
}

impl Default for ProtocolSettings {
    fn default() -> Self {
        Self {
            key: None,
            kill_margin: DEFAULT_KILL_MARGIN,
            timer_slack: DEFAULT_TIMER_SLACK,
        }
    }
}

impl std::fmt::Debug for ProtocolSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtocolSettings")
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("kill_margin", &self.kill_margin)
            .field("timer_slack", &self.timer_slack)
            .finish()
    }
}

/// The protocol's state (see the [module documentation](self)).
pub struct Protocol {
    key: WorkerKey,
    rules: LeaseRules,
    heartbeat_interval: Duration,
    hub: hub::Hub,
    url: OnceLock<String>,
}

impl Protocol {
    /// The protocol of a router over a registry configured as `config`, with `settings`. The
    /// lease's drain bound `D_min` is the registry's `drain_deadline` (the router's own drains at
    /// shutdown are kept from binding, see the design page).
    pub fn new(config: &RegistryConfig, settings: ProtocolSettings) -> Self {
        let rules = LeaseRules::with_margins(
            config.heartbeat_timeout(),
            config.drain_deadline(),
            settings.kill_margin,
            settings.timer_slack,
        );
        Self {
            key: settings.key.unwrap_or_else(WorkerKey::random),
            rules,
            heartbeat_interval: config.heartbeat_interval(),
            hub: hub::Hub::default(),
            url: OnceLock::new(),
        }
    }

    /// Refused when an active worker's lease would not last two heartbeat intervals: checked
    /// before a launcher whose workers speak the protocol is used.
    pub fn check(&self) -> Result<(), LeaseError> {
        self.rules.check(self.heartbeat_interval)
    }

    /// The key.
    pub fn key(&self) -> &WorkerKey {
        &self.key
    }

    /// The lease rules.
    pub fn rules(&self) -> &LeaseRules {
        &self.rules
    }

    /// The workers this router serves.
    pub fn hub(&self) -> &hub::Hub {
        &self.hub
    }

    /// Records where the protocol is served (`http://<address>`), once; later calls are ignored.
    pub fn set_url(&self, url: String) {
        let _ = self.url.set(url);
    }

    /// Where the protocol is served, once a listener is bound.
    pub fn url(&self) -> Option<&str> {
        self.url.get().map(String::as_str)
    }

    /// The environment a protocol worker is started with: its id, the fencing token of the
    /// assignment that created it, its credential and the router's URL (nothing else: never the
    /// admin token or the webhook secret).
    pub fn env(&self, id: WorkerId, token: FencingToken) -> Vec<(String, String)> {
        let credential: Credential = self.key.mint(id, token);
        vec![
            (crate::launcher::ENV_WORKER_ID.to_owned(), id.to_string()),
            (ENV_TOKEN.to_owned(), token.to_string()),
            (ENV_CREDENTIAL.to_owned(), credential.as_str().to_owned()),
            (
                ENV_ROUTER_URL.to_owned(),
                self.url().unwrap_or_default().to_owned(),
            ),
        ]
    }
}
