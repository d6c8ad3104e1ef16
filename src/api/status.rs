//! A worker's status as every backend reports it: [`Status`], [`DeadReason`], [`Activity`],
//! [`WorkerKind`], and the worker-pool document's view of them, [`PoolStatus`].

use std::fmt;

/// Where a worker is in its life. Forward-only: `Active -> Draining -> Dead`, `Active -> Dead`.
///
/// The worker-pool document's statuses are a view of this: see [`PoolStatus`].
///
/// # Examples
///
/// ```
/// use worker_registry::{DeadReason, Status};
///
/// assert!(Status::Draining.is_alive());
/// assert_eq!(Status::Dead(DeadReason::Exited).to_string(), "dead (exited)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Alive and accepting assignments.
    Active,
    /// Alive, finishing its current loop, accepting nothing new.
    Draining,
    /// Gone for good; the reason says how.
    Dead(DeadReason),
}

impl Status {
    /// `"active"`, `"draining"` or `"dead"`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(worker_registry::Status::Active.as_str(), "active");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Draining => "draining",
            Self::Dead(_) => "dead",
        }
    }

    /// True unless dead.
    pub fn is_alive(self) -> bool {
        !matches!(self, Self::Dead(_))
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dead(r) => write!(f, "dead ({r})"),
            s => f.write_str(s.as_str()),
        }
    }
}

/// How a worker died.
///
/// # Examples
///
/// ```
/// use worker_registry::DeadReason;
///
/// assert_eq!(DeadReason::DrainTimedOut.as_str(), "drain_timed_out");
/// assert_eq!(DeadReason::ALL.len(), 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadReason {
    /// It missed the configured number of heartbeat intervals (declared by a sweep).
    MissedHeartbeats,
    /// It finished its loop after being drained, or exited while draining.
    Exited,
    /// It deregistered while active.
    Deregistered,
    /// It was still draining when its drain deadline passed (declared by a sweep).
    DrainTimedOut,
}

impl DeadReason {
    /// `"missed_heartbeats"`, `"exited"`, `"deregistered"` or `"drain_timed_out"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissedHeartbeats => "missed_heartbeats",
            Self::Exited => "exited",
            Self::Deregistered => "deregistered",
            Self::DrainTimedOut => "drain_timed_out",
        }
    }

    /// Every reason, for metrics label sets.
    pub const ALL: [DeadReason; 4] = [
        Self::MissedHeartbeats,
        Self::Exited,
        Self::Deregistered,
        Self::DrainTimedOut,
    ];

    /// Parses [`as_str`](Self::as_str)'s output (for backends that store the reason as text).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::DeadReason;
    ///
    /// assert_eq!(DeadReason::parse("exited"), Some(DeadReason::Exited));
    /// assert_eq!(DeadReason::parse("bored"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for DeadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a worker is running a loop (reported by the worker, and set by an assignment).
///
/// # Examples
///
/// ```
/// assert_eq!(worker_registry::Activity::Busy.as_str(), "busy");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activity {
    /// Waiting for work.
    Idle,
    /// Running a loop.
    Busy,
}

impl Activity {
    /// `"idle"` or `"busy"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Busy => "busy",
        }
    }
}

/// The worker-pool document's four statuses, as a view of [`Status`] and [`Activity`]:
/// `idle`/`busy` are an active worker's activity, `offline` is dead.
///
/// # Examples
///
/// ```
/// use worker_registry::{Activity, PoolStatus, Status};
///
/// assert_eq!(PoolStatus::of(Status::Active, Activity::Busy), PoolStatus::Busy);
/// assert_eq!(PoolStatus::of(Status::Draining, Activity::Idle).as_str(), "draining");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolStatus {
    /// Active and idle.
    Idle,
    /// Active and busy.
    Busy,
    /// Draining.
    Draining,
    /// Dead, for any reason.
    Offline,
}

impl PoolStatus {
    /// The pool view of a status and an activity.
    pub fn of(status: Status, activity: Activity) -> Self {
        match (status, activity) {
            (Status::Active, Activity::Idle) => Self::Idle,
            (Status::Active, Activity::Busy) => Self::Busy,
            (Status::Draining, _) => Self::Draining,
            (Status::Dead(_), _) => Self::Offline,
        }
    }

    /// `"idle"`, `"busy"`, `"draining"` or `"offline"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Busy => "busy",
            Self::Draining => "draining",
            Self::Offline => "offline",
        }
    }
}

/// How a worker came to be.
///
/// # Examples
///
/// ```
/// assert_eq!(worker_registry::WorkerKind::Registered.as_str(), "registered");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerKind {
    /// Created by an assignment for one target (a container the router spawns).
    Spawned,
    /// Registered by itself, with no target (a pool worker that pulls work elsewhere).
    Registered,
}

impl WorkerKind {
    /// `"spawned"` or `"registered"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Spawned => "spawned",
            Self::Registered => "registered",
        }
    }
}
