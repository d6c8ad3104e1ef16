//! What the registry's decisions return: [`Admission`], [`AssignOutcome`], [`ClaimOutcome`],
//! [`HeartbeatAck`], [`DrainAll`], and the parts they are made of (a parked admission's
//! [`Waiting`] among them).

use std::fmt;
use std::time::{Duration, SystemTime};

use super::ids::{FencingToken, WorkerId};

/// A target placed on a worker.
///
/// # Examples
///
/// ```
/// use worker_registry::{Assignment, FencingToken, WorkerId};
///
/// let w = WorkerId::new(7);
/// let a = Assignment::new(w, FencingToken::new(w, 1).unwrap(), true);
/// assert!(a.new);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Assignment {
    /// The worker that owns the target.
    pub worker: WorkerId,
    /// The fencing token of this assignment.
    pub token: FencingToken,
    /// True if the worker was created by this assignment (the router must start it).
    pub new: bool,
}

impl Assignment {
    /// An assignment of `worker` with `token`; `new` if the assignment created the worker.
    pub fn new(worker: WorkerId, token: FencingToken, new: bool) -> Self {
        Self { worker, token, new }
    }
}

/// Why a target could not be placed (and a worker could not be registered).
///
/// # Examples
///
/// ```
/// use worker_registry::{Rejection, WorkerId};
///
/// assert_eq!(Rejection::CapacityFull { limit: 4 }.as_str(), "capacity");
/// assert_eq!(Rejection::TargetDraining { worker: WorkerId::new(1) }.as_str(), "draining");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// `max_workers` live workers exist already.
    CapacityFull {
        /// The configured limit.
        limit: usize,
    },
    /// The target's worker is draining; the target gets no second worker until that one is dead.
    TargetDraining {
        /// The draining worker.
        worker: WorkerId,
    },
    /// The delivery's payload would take the bytes of payloads the registry holds past
    /// [`payload_budget`](crate::RegistryConfig::payload_budget). Never parked (a parked delivery
    /// holds its payload too); admitted again once completions have freed room.
    PayloadBudget {
        /// Bytes of payloads held when it was refused (as that decision read them).
        held: u64,
        /// The payload's [`size`](crate::Payload::size).
        needed: u64,
        /// The budget.
        limit: u64,
    },
}

impl Rejection {
    /// `"capacity"`, `"draining"` or `"payload_budget"` (a metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CapacityFull { .. } => "capacity",
            Self::TargetDraining { .. } => "draining",
            Self::PayloadBudget { .. } => "payload_budget",
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::CapacityFull { limit } => {
                write!(f, "capacity full: {limit} live workers is the limit")
            }
            Self::TargetDraining { worker } => {
                write!(f, "the target's worker {worker} is draining")
            }
            Self::PayloadBudget {
                held,
                needed,
                limit,
            } => write!(
                f,
                "payload budget full: {held} of {limit} bytes held, {needed} more needed"
            ),
        }
    }
}

/// The answer of [`assign`](crate::WorkerRegistry::assign).
///
/// # Examples
///
/// ```
/// use worker_registry::{AssignOutcome, Rejection};
///
/// let o = AssignOutcome::Rejected(Rejection::CapacityFull { limit: 1 });
/// assert!(matches!(o, AssignOutcome::Rejected(_)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignOutcome {
    /// Placed (on the target's existing worker, or a new one).
    Assigned(Assignment),
    /// Not placed.
    Rejected(Rejection),
}

/// Whether a claim that blocked a delivery is still running or already done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClaimState {
    /// Being handled by a live worker.
    InFlight,
    /// Completed; remembered so redeliveries are recognised.
    Completed,
    /// Parked in the waiting room, not yet promoted (see
    /// [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with)).
    Waiting,
}

impl ClaimState {
    /// `"in_flight"` or `"completed"`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(worker_registry::ClaimState::InFlight.as_str(), "in_flight");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Completed => "completed",
            Self::Waiting => "waiting",
        }
    }
}

/// The answer to a delivery that is already being handled, or was handled recently.
///
/// # A lost reply
///
/// An `admit` that created a worker may commit while its reply never reaches the router (a
/// timeout, a dropped connection): the router's retry then gets this duplicate, naming the new
/// worker, and nobody has started its container. [`unstarted`](Self::unstarted) tells that case
/// apart: the claim is in flight on a live worker that has never heartbeated. A router that gets
/// it starts the holder unless it already runs that worker id (a start is keyed by worker id, so
/// starting a worker that another path is already starting is a no-op for the launcher); see
/// [`needs_start`](Self::needs_start). A worker within its start-up grace looks the same, so a
/// launcher that can start one id twice must refuse the second start itself (the reference
/// router keys containers by worker id).
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use worker_registry::{AlreadyClaimed, ClaimState, WorkerId};
///
/// let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
/// let dup = AlreadyClaimed::new(Some(WorkerId::new(3)), at, ClaimState::InFlight);
/// assert_eq!(dup.holder, Some(WorkerId::new(3)));
/// assert_eq!(dup.since(), at);
/// assert_eq!(dup.since_unix_ms(), 1_700_000_000_123);
/// assert_eq!(dup.needs_start(), None);
/// assert_eq!(dup.with_unstarted(true).needs_start(), Some(WorkerId::new(3)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AlreadyClaimed {
    /// The worker handling it (none for a bare claim not yet bound to a worker).
    pub holder: Option<WorkerId>,
    /// When the first delivery was claimed, in milliseconds since the Unix epoch (wall clock,
    /// display only; read it with [`since`](Self::since)). Kept as a count, not a
    /// `SystemTime`, so a duplicate's answer costs an addition, not a conversion.
    since_ms: u64,
    /// In flight or completed.
    pub state: ClaimState,
    /// The claim is in flight on a live worker that has never heartbeated: the reply that told
    /// a router to start it may have been lost (see [A lost reply](Self#a-lost-reply)). Always
    /// false for a completed claim and a bare one.
    pub unstarted: bool,
}

impl AlreadyClaimed {
    /// A duplicate held by `holder` since `since`, in `state` (not [`unstarted`](Self::unstarted)).
    /// `since` is kept to the millisecond (rounded down; a time before the Unix epoch is kept as
    /// the epoch).
    pub fn new(holder: Option<WorkerId>, since: SystemTime, state: ClaimState) -> Self {
        let since_ms = since
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self::at_unix_ms(holder, since_ms, state)
    }

    /// As [`new`](Self::new), with `since` in milliseconds since the Unix epoch.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use worker_registry::{AlreadyClaimed, ClaimState};
    ///
    /// let dup = AlreadyClaimed::at_unix_ms(None, 1_500, ClaimState::Completed);
    /// assert_eq!(dup.since(), SystemTime::UNIX_EPOCH + Duration::from_millis(1_500));
    /// ```
    #[inline]
    pub fn at_unix_ms(holder: Option<WorkerId>, since_ms: u64, state: ClaimState) -> Self {
        Self {
            holder,
            since_ms,
            state,
            unstarted: false,
        }
    }

    /// When the first delivery was claimed (wall clock, to the millisecond, display only; a
    /// time the platform's `SystemTime` cannot hold reads as the epoch).
    pub fn since(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_millis(self.since_ms))
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// [`since`](Self::since) in milliseconds since the Unix epoch.
    pub fn since_unix_ms(&self) -> u64 {
        self.since_ms
    }

    /// The same duplicate with [`unstarted`](Self::unstarted) set to `unstarted`.
    #[must_use]
    pub fn with_unstarted(mut self, unstarted: bool) -> Self {
        self.unstarted = unstarted;
        self
    }

    /// The worker a router should start because of this duplicate: the holder of an
    /// [`unstarted`](Self::unstarted) claim, if the router does not run it already.
    pub fn needs_start(&self) -> Option<WorkerId> {
        self.holder.filter(|_| self.unstarted)
    }
}

/// The answer of [`claim`](crate::WorkerRegistry::claim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This delivery is new: the caller owns it.
    Claimed,
    /// The same (target, delivery) is in flight or was completed recently: skip it.
    AlreadyClaimed(AlreadyClaimed),
}

/// A delivery parked in the waiting room: claimed (a redelivery is a duplicate in
/// [`ClaimState::Waiting`](crate::ClaimState::Waiting)), queued, and handed to a sweep's caller
/// when room appears.
///
/// # Examples
///
/// ```
/// use worker_registry::{Rejection, Waiting};
///
/// let w = Waiting::new(3, Rejection::CapacityFull { limit: 2 });
/// assert_eq!(w.position, 3);
/// assert_eq!(w.to_string(), "waiting at position 3 (capacity)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiting {
    /// How many deliveries wait, this one included, when it was parked (1: it is the only one).
    /// An indication for the answer to the sender, not a promise: promotion is fair across
    /// owners, so a delivery of a quiet owner may overtake a busy owner's older ones.
    pub position: usize,
    /// Why it could not be placed now: no capacity (or its owner's cap), or its target's worker
    /// draining.
    pub reason: Rejection,
}

impl Waiting {
    /// A delivery parked at `position` because of `reason`.
    pub fn new(position: usize, reason: Rejection) -> Self {
        Self { position, reason }
    }
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "waiting at position {} ({})",
            self.position,
            self.reason.as_str()
        )
    }
}

/// The answer of [`admit_with`](crate::WorkerRegistry::admit_with): what a router does with one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// New delivery, placed on a worker; the claim is held by that worker.
    Assigned(Assignment),
    /// A redelivery of something in flight or recently completed: skip it.
    Duplicate(AlreadyClaimed),
    /// Not placed, and parked: the delivery waits for room and is handed to a sweep's caller
    /// when it is promoted (see [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with)).
    Waiting(Waiting),
    /// Not placed; no claim was left behind, so a later redelivery can be admitted.
    Rejected(Rejection),
}

/// What a live worker learns from its heartbeat (as Faktory's `BEAT` reply tells a worker to
/// quiet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeartbeatAck {
    /// Carry on.
    Active,
    /// Finish the current loop, take nothing new, then exit.
    Draining,
}

/// What [`drain_all_within`](crate::WorkerRegistry::drain_all_within) did.
///
/// # Examples
///
/// ```
/// let mut d = worker_registry::DrainAll::default();
/// d.draining = 2;
/// assert_eq!(d.exited, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainAll {
    /// Busy workers now draining (they exit when their loop finishes, or die at the deadline).
    pub draining: usize,
    /// Idle workers that exited at once.
    pub exited: usize,
}
