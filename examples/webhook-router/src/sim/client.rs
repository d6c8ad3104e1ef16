//! The simulated GitHub and operator: the HTTP client that sends deliveries to the replicas (a
//! delivery's sends go round the live ones) and calls the admin API, and the tally of answers.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::Value;

use super::traffic::Delivery;
use crate::github;

/// How one request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Outcome {
    AssignedNew,
    AssignedExisting,
    Duplicate,
    Ignored,
    /// Parked in the registry's waiting room (202): processed when room appears.
    Waiting,
    Capacity,
    Draining,
    /// 503: no room, and the registry's waiting room full.
    RoomFull,
    /// 503: the worker's mailbox and overflow full.
    OverflowFull,
    Unavailable,
    Refused,
    Failed,
}

pub(super) const OUTCOMES: [Outcome; 12] = [
    Outcome::AssignedNew,
    Outcome::AssignedExisting,
    Outcome::Duplicate,
    Outcome::Ignored,
    Outcome::Waiting,
    Outcome::Capacity,
    Outcome::Draining,
    Outcome::RoomFull,
    Outcome::OverflowFull,
    Outcome::Unavailable,
    Outcome::Refused,
    Outcome::Failed,
];

/// Shared counters of the run.
#[derive(Default)]
pub(super) struct Tally {
    by_outcome: [AtomicU64; OUTCOMES.len()],
    /// The next delivery to send (the clients take them in order).
    pub(super) next: AtomicUsize,
    /// Deliveries sent by the clients (resends excluded).
    pub(super) sent: AtomicUsize,
    /// Containers crashed by the chaos.
    pub(super) crashes: AtomicU64,
    /// Workers drained by the chaos.
    pub(super) drains: AtomicU64,
}

impl Tally {
    pub(super) fn add(&self, o: Outcome) {
        let i = OUTCOMES.iter().position(|x| *x == o).unwrap_or(0);
        // Relaxed: statistics, read after the tasks are joined (or approximately for progress).
        self.by_outcome[i].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn get(&self, o: Outcome) -> u64 {
        let i = OUTCOMES.iter().position(|x| *x == o).unwrap_or(0);
        // Relaxed: see `add`.
        self.by_outcome[i].load(Ordering::Relaxed)
    }
}

/// The replicas under test, as the simulated clients see them.
pub(super) struct Client {
    http: reqwest::Client,
    /// `http://addr` of each replica.
    pub(super) bases: Vec<String>,
    /// Which replicas still answer (a killed one is skipped).
    pub(super) alive: Vec<AtomicBool>,
    /// Sends of each delivery so far, by the index of its first attempt: the next one goes to the
    /// next replica.
    sends: Vec<AtomicUsize>,
    admin_token: Option<String>,
}

impl Client {
    /// A client of the replicas at `bases` for `deliveries` deliveries, with `clients` concurrent
    /// senders.
    pub(super) fn new(
        bases: Vec<String>,
        deliveries: usize,
        clients: usize,
        admin_token: Option<String>,
    ) -> Self {
        let http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(clients.max(1) + 2)
            .build()
            .expect("a plain HTTP client builds");
        Self {
            http,
            alive: bases.iter().map(|_| AtomicBool::new(true)).collect(),
            bases,
            sends: (0..deliveries).map(|_| AtomicUsize::new(0)).collect(),
            admin_token,
        }
    }

    pub(super) fn is_alive(&self, replica: usize) -> bool {
        // Acquire: pairs with the Release in `kill`; a client that sees a replica dead stops using it.
        self.alive[replica].load(Ordering::Acquire)
    }

    /// The replica for the next send of delivery `original`: the one after the replica its previous
    /// send went to, skipping dead ones.
    fn replica_for(&self, original: usize) -> usize {
        let n = self.bases.len();
        // Relaxed: only the count matters.
        let k = self.sends[original].fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|j| (original + k + j) % n)
            .find(|&r| self.is_alive(r))
            .unwrap_or(0)
    }

    /// Any live replica, for admin calls.
    pub(super) fn any(&self, rng: &mut StdRng) -> usize {
        let live: Vec<usize> = (0..self.bases.len())
            .filter(|&r| self.is_alive(r))
            .collect();
        live.get(rng.gen_range(0..live.len().max(1)))
            .copied()
            .unwrap_or(0)
    }

    pub(super) async fn send(&self, d: &Delivery, original: usize) -> (Outcome, Option<Value>) {
        let base = &self.bases[self.replica_for(original)];
        let res = self
            .http
            .post(format!("{base}/webhook"))
            .header("content-type", "application/json")
            .header("user-agent", "GitHub-Hookshot/sim")
            .header(github::EVENT_HEADER, d.event)
            .header(github::DELIVERY_HEADER, &d.id)
            .header(github::SIGNATURE_HEADER, &d.signature)
            .body(d.body.clone())
            .send()
            .await;
        let Ok(res) = res else {
            return (Outcome::Failed, None);
        };
        let status = res.status().as_u16();
        let body: Option<Value> = res.json().await.ok();
        let outcome = body
            .as_ref()
            .and_then(|b| b.get("outcome"))
            .and_then(Value::as_str);
        let o = match (status, outcome) {
            (202, Some("assigned")) => {
                let new = body.as_ref().and_then(|b| b["new"].as_bool());
                if new == Some(true) {
                    Outcome::AssignedNew
                } else {
                    Outcome::AssignedExisting
                }
            }
            (200, Some("duplicate")) => Outcome::Duplicate,
            // The PR's worker got a `closed` event as its last one.
            (202, Some("drained")) => Outcome::AssignedExisting,
            (202, Some("ignored")) => Outcome::Ignored,
            (202, Some("waiting")) => Outcome::Waiting,
            // The registry's payload budget is room too: counted with capacity.
            (503, Some("capacity" | "payload_budget")) => Outcome::Capacity,
            (503, Some("draining")) => Outcome::Draining,
            (503, Some("waiting_room_full")) => Outcome::RoomFull,
            (503, Some("overflow_full")) => Outcome::OverflowFull,
            // The router is shutting down, or its backend (or the worker's container) is away.
            (503, Some("closing" | "unavailable")) => Outcome::Unavailable,
            (400..=499, _) => Outcome::Refused,
            _ => Outcome::Failed,
        };
        (o, body)
    }

    fn admin(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.admin_token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Live worker ids, from the admin API of `replica` (the registry's, all replicas').
    pub(super) async fn live_workers(&self, replica: usize) -> Vec<u64> {
        let Ok(res) = self
            .admin(self.http.get(format!("{}/workers", self.bases[replica])))
            .send()
            .await
        else {
            return Vec::new();
        };
        let Ok(v) = res.json::<Value>().await else {
            return Vec::new();
        };
        v["workers"]
            .as_array()
            .map(|ws| {
                ws.iter()
                    .filter(|w| w["status"] == "active")
                    .filter_map(|w| w["id"].as_u64())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) async fn post_ok(&self, replica: usize, path: String) -> bool {
        self.admin(self.http.post(format!("{}{path}", self.bases[replica])))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }
}

/// Remembers that a delivery was placed (or needs a retry).
pub(super) fn record(
    o: Outcome,
    i: usize,
    accepted: &Mutex<HashSet<usize>>,
    retry: &Mutex<Vec<usize>>,
) {
    match o {
        Outcome::AssignedNew
        | Outcome::AssignedExisting
        | Outcome::Duplicate
        | Outcome::Waiting => {
            accepted.lock().expect("not poisoned").insert(i);
        }
        // Refused, or cut off (a killed replica): send it again.
        Outcome::Capacity
        | Outcome::Draining
        | Outcome::RoomFull
        | Outcome::OverflowFull
        | Outcome::Unavailable
        | Outcome::Failed => retry.lock().expect("not poisoned").push(i),
        _ => {}
    }
}
