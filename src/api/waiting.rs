//! What becomes of a parked delivery (see [`Waiting`](crate::Waiting)) that is never promoted:
//! [`ExpiredWaiting`], with its [`ExpireReason`]. Promoted
//! deliveries are handed over as [`ReleasedEvent`](crate::ReleasedEvent)s with
//! [`ReleaseReason::Promoted`](crate::ReleaseReason::Promoted); the semantics are on
//! [`WorkerRegistry::admit_with`](crate::WorkerRegistry::admit_with).

use std::fmt;
use std::time::Duration;

use super::ids::{DeliveryId, Target};

/// Why a parked delivery was dropped without being promoted.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use worker_registry::ExpireReason;
///
/// let r = ExpireReason::WaitedTooLong { limit: Duration::from_secs(60) };
/// assert_eq!(r.as_str(), "waited_too_long");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExpireReason {
    /// It waited longer than [`max_wait`](crate::RegistryConfig::max_wait).
    WaitedTooLong {
        /// The configured limit.
        limit: Duration,
    },
}

impl ExpireReason {
    /// `"waited_too_long"` (a metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WaitedTooLong { .. } => "waited_too_long",
        }
    }
}

impl fmt::Display for ExpireReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WaitedTooLong { limit } => write!(f, "waited longer than {limit:?}"),
        }
    }
}

/// A parked delivery dropped by a sweep (listed in
/// [`SweepReport::expired_waiting`](crate::SweepReport::expired_waiting), counted in
/// [`Stats::waiting_expired`](crate::Stats::waiting_expired) and published as
/// [`Event::WaitingExpired`](crate::Event::WaitingExpired)): its claim is gone, so a redelivery is
/// admitted as new.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use worker_registry::{DeliveryId, ExpireReason, ExpiredWaiting, Target};
///
/// let e = ExpiredWaiting::new(
///     Target::new("o/r", 1).unwrap(),
///     DeliveryId::new("d").unwrap(),
///     Duration::from_secs(61),
///     ExpireReason::WaitedTooLong { limit: Duration::from_secs(60) },
/// );
/// assert_eq!(e.to_string(), "d on o/r#1 dropped after 61s: waited longer than 60s");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExpiredWaiting {
    /// The delivery's target.
    pub target: Target,
    /// The delivery.
    pub delivery: DeliveryId,
    /// How long it waited (registry time).
    pub waited: Duration,
    /// Why it was dropped.
    pub reason: ExpireReason,
}

impl ExpiredWaiting {
    /// A dropped parked delivery.
    pub fn new(
        target: Target,
        delivery: DeliveryId,
        waited: Duration,
        reason: ExpireReason,
    ) -> Self {
        Self {
            target,
            delivery,
            waited,
            reason,
        }
    }
}

impl fmt::Display for ExpiredWaiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {} dropped after {:?}: {}",
            self.delivery, self.target, self.waited, self.reason
        )
    }
}
