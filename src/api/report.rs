//! What a sweep returns: [`SweepReport`], and the [`ReleasedEvent`]s in it that a router must
//! re-dispatch.

use std::fmt;
use std::time::Duration;

use super::ids::{DeliveryId, Target, WorkerId};
use super::status::DeadReason;

/// Why a delivery's claim was released for re-dispatch.
///
/// # Examples
///
/// ```
/// use worker_registry::{DeadReason, ReleaseReason};
///
/// assert_eq!(ReleaseReason::WorkerDied(DeadReason::MissedHeartbeats).as_str(), "worker_died");
/// assert_eq!(ReleaseReason::Stuck.to_string(), "stuck");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReleaseReason {
    /// The worker holding it died (for this reason) before completing it.
    WorkerDied(DeadReason),
    /// It stayed in flight longer than `max_in_flight`; its (live) worker was drained.
    Stuck,
    /// A bare claim (bound to no worker) was neither completed nor released within the heartbeat
    /// timeout.
    Unbound,
    /// Not a release: a parked delivery was promoted out of the waiting room and placed on a
    /// worker (its [`ReleasedEvent::assignment`]). The caller delivers it to that worker (and
    /// starts the worker if the assignment is `new`) instead of admitting it again.
    Promoted,
}

impl ReleaseReason {
    /// `"worker_died"`, `"stuck"`, `"unbound"` or `"promoted"` (a metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WorkerDied(_) => "worker_died",
            Self::Stuck => "stuck",
            Self::Unbound => "unbound",
            Self::Promoted => "promoted",
        }
    }
}

impl fmt::Display for ReleaseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WorkerDied(r) => write!(f, "worker died ({r})"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// A backend's handle on one handed-over released event, echoed back by
/// [`Maintenance::acknowledge`](crate::Maintenance::acknowledge) (a stream entry id, an outbox row
/// id). Opaque to callers; the in-memory backend uses none.
///
/// # Examples
///
/// ```
/// use worker_registry::Receipt;
///
/// let r = Receipt::new("1700000000000-0");
/// assert_eq!(r.as_str(), "1700000000000-0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Receipt(String);

impl Receipt {
    /// Wraps a backend's identifier.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The identifier.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A delivery that was in flight and must be dispatched again: its claim was released (see
/// [`Maintenance`](crate::Maintenance)).
///
/// # Examples
///
/// ```
/// use worker_registry::{DeadReason, DeliveryId, ReleaseReason, ReleasedEvent, Target, WorkerId};
///
/// let e = ReleasedEvent::new(
///     Target::new("o/r", 1).unwrap(),
///     DeliveryId::new("d-1").unwrap(),
///     Some(WorkerId::new(7)),
///     ReleaseReason::WorkerDied(DeadReason::MissedHeartbeats),
/// );
/// assert_eq!(e.to_string(), "d-1 on o/r#1 (worker 7: worker died (missed_heartbeats))");
/// assert!(e.receipt().is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReleasedEvent {
    /// The delivery's target.
    pub target: Target,
    /// The delivery.
    pub delivery: DeliveryId,
    /// The worker that held it (none for a bare claim).
    pub holder: Option<WorkerId>,
    /// Why it was released.
    pub reason: ReleaseReason,
    /// For a promoted delivery ([`ReleaseReason::Promoted`]), the assignment the promotion made:
    /// its claim is in flight on that worker already, so admitting it again would be a
    /// duplicate. `None` for every other reason.
    pub assignment: Option<crate::Assignment>,
    /// The payload the delivery was admitted with, byte for byte (`None` if it carried none):
    /// re-dispatch it with the delivery, `admit_with(&e.target, &e.delivery, e.payload.as_ref())`
    /// (see [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with)); a promoted one
    /// goes to its assignment's worker.
    pub payload: Option<crate::Payload>,
    receipt: Option<Receipt>,
}

impl ReleasedEvent {
    /// A released event with no receipt.
    pub fn new(
        target: Target,
        delivery: DeliveryId,
        holder: Option<WorkerId>,
        reason: ReleaseReason,
    ) -> Self {
        Self {
            target,
            delivery,
            holder,
            reason,
            assignment: None,
            payload: None,
            receipt: None,
        }
    }

    /// A promoted delivery, placed by the promotion on `assignment`'s worker.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{Assignment, DeliveryId, FencingToken, ReleaseReason, ReleasedEvent, Target, WorkerId};
    ///
    /// let w = WorkerId::new(7);
    /// let a = Assignment::new(w, FencingToken::new(w, 1).unwrap(), true);
    /// let e = ReleasedEvent::promoted(Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap(), a);
    /// assert_eq!((e.reason, e.holder, e.assignment), (ReleaseReason::Promoted, Some(w), Some(a)));
    /// ```
    pub fn promoted(target: Target, delivery: DeliveryId, assignment: crate::Assignment) -> Self {
        Self {
            target,
            delivery,
            holder: Some(assignment.worker),
            reason: ReleaseReason::Promoted,
            assignment: Some(assignment),
            payload: None,
            receipt: None,
        }
    }

    /// The same event carrying `payload` (what its delivery was admitted with).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeliveryId, Payload, ReleaseReason, ReleasedEvent, Target};
    ///
    /// let p = Payload::builder("ping", &b"{}"[..]).build().unwrap();
    /// let e = ReleasedEvent::new(Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap(), None,
    ///     ReleaseReason::Unbound).with_payload(Some(p.clone()));
    /// assert_eq!(e.payload, Some(p));
    /// ```
    pub fn with_payload(mut self, payload: Option<crate::Payload>) -> Self {
        self.payload = payload;
        self
    }

    /// The same event carrying the backend's receipt for it.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeliveryId, Receipt, ReleaseReason, ReleasedEvent, Target};
    ///
    /// let e = ReleasedEvent::new(Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap(), None,
    ///     ReleaseReason::Unbound).with_receipt(Receipt::new("42"));
    /// assert_eq!(e.receipt().map(Receipt::as_str), Some("42"));
    /// ```
    pub fn with_receipt(mut self, receipt: Receipt) -> Self {
        self.receipt = Some(receipt);
        self
    }

    /// The backend's receipt, if it uses them.
    pub fn receipt(&self) -> Option<&Receipt> {
        self.receipt.as_ref()
    }
}

impl fmt::Display for ReleasedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.holder {
            Some(h) => write!(
                f,
                "{} on {} (worker {h}: {})",
                self.delivery, self.target, self.reason
            ),
            None => write!(f, "{} on {} ({})", self.delivery, self.target, self.reason),
        }
    }
}

/// What one [`sweep`](crate::Maintenance::sweep) did, and the released events handed to its
/// caller.
///
/// Build one with `SweepReport::default()` and set its fields (a backend outside this crate does).
///
/// # Examples
///
/// ```
/// use worker_registry::SweepReport;
///
/// let mut report = SweepReport::default();
/// report.swept = true;
/// report.version = 3;
/// assert!(report.released.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SweepReport {
    /// Whether this call did the maintenance work (always, in memory; in a shared backend, when
    /// this replica held the maintenance lease).
    pub swept: bool,
    /// The version of the snapshot published (or, if not `swept`, the latest one fetched).
    pub version: u64,
    /// The registry's time when the sweep ran (its clock, or the server's), since its origin.
    pub at: Duration,
    /// How long the sweep took (real time, as this caller measured it).
    pub took: Duration,
    /// How much registry stall this sweep detected and credited to the workers (see the stall
    /// rule on [`sweep`](crate::Maintenance::sweep)); zero normally.
    pub stall_credited: Duration,
    /// Workers this sweep declared dead, with the reason.
    pub died: Vec<(WorkerId, DeadReason)>,
    /// Workers this sweep marked suspect instead of dead, because the brake engaged.
    pub suspected: Vec<WorkerId>,
    /// Whether the mass-staleness brake held back deaths in this sweep (it engaged now, or workers
    /// it suspected earlier are still silent but within `suspect_grace`).
    pub brake_engaged: bool,
    /// Workers this sweep drained because one of their claims was stuck in flight.
    pub drained_stuck: Vec<WorkerId>,
    /// Targets unassigned because their worker died in this sweep.
    pub released_targets: Vec<Target>,
    /// Released deliveries handed to this caller: re-dispatch them, then
    /// [`acknowledge`](crate::Maintenance::acknowledge) them. Promoted deliveries come here too
    /// ([`ReleaseReason::Promoted`], already placed: deliver them to their assignment).
    pub released: Vec<ReleasedEvent>,
    /// Parked deliveries this sweep dropped (see
    /// [`max_wait`](crate::RegistryConfig::max_wait)).
    pub expired_waiting: Vec<crate::ExpiredWaiting>,
    /// Deliveries still waiting after this sweep.
    pub waiting: usize,
    /// Completed claims forgotten after `claim_retention`.
    pub expired_claims: usize,
    /// Completed claims evicted (oldest first) to stay within `max_retained_claims`.
    pub evicted_claims: usize,
    /// Dead worker records purged after `dead_retention`.
    pub purged_workers: usize,
}

impl SweepReport {
    /// The released deliveries as (target, delivery) pairs, in report order.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeliveryId, ReleaseReason, ReleasedEvent, SweepReport, Target};
    ///
    /// let mut r = SweepReport::default();
    /// let (t, d) = (Target::new("o/r", 1).unwrap(), DeliveryId::new("d").unwrap());
    /// r.released.push(ReleasedEvent::new(t.clone(), d.clone(), None, ReleaseReason::Unbound));
    /// assert_eq!(r.released_pairs(), vec![(t, d)]);
    /// ```
    pub fn released_pairs(&self) -> Vec<(Target, DeliveryId)> {
        self.released
            .iter()
            .map(|e| (e.target.clone(), e.delivery.clone()))
            .collect()
    }
}
