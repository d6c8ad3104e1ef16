//! Worker ids and fencing tokens.

use std::fmt;
use std::str::FromStr;

use super::truncate;

/// A worker's identity, assigned by the registry and never reused.
///
/// # Examples
///
/// ```
/// use worker_registry::WorkerId;
///
/// let id: WorkerId = "42".parse().unwrap();
/// assert_eq!(id.get(), 42);
/// assert!("x".parse::<WorkerId>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(u64);

impl WorkerId {
    /// The largest id a registry hands out (ids fill the high 44 bits of a [`FencingToken`]).
    pub const MAX: u64 = (1 << 44) - 1;

    /// Wraps a raw id (for looking up a worker by an id received over the network).
    pub const fn new(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw id.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for WorkerId {
    type Err = WorkerIdError;
    /// Parses a decimal id: digits only, no sign, no leading zero, at most [`WorkerId::MAX`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let canonical = !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        let bad = || WorkerIdError::NotANumber {
            input: truncate(s, 64),
        };
        let raw = if canonical {
            s.parse::<u64>().map_err(|_| bad())?
        } else {
            return Err(bad());
        };
        if raw > WorkerId::MAX {
            return Err(WorkerIdError::OutOfRange { id: raw });
        }
        Ok(WorkerId(raw))
    }
}

/// A worker id that was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerIdError {
    /// Not a decimal number without sign or leading zeros.
    NotANumber {
        /// What was received (at most 64 bytes of it).
        input: String,
    },
    /// Larger than [`WorkerId::MAX`].
    OutOfRange {
        /// The id.
        id: u64,
    },
}

impl fmt::Display for WorkerIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotANumber { input } => write!(
                f,
                "worker id {input:?} is not a non-negative decimal integer"
            ),
            Self::OutOfRange { id } => {
                write!(f, "worker id {id} is larger than {}", WorkerId::MAX)
            }
        }
    }
}

impl std::error::Error for WorkerIdError {}

/// A fencing token: increases with every assignment of a target, across its successive workers.
///
/// The high 44 bits are the worker id (ids increase and are never reused, so a target's next
/// worker always has larger tokens than its previous one); the low 20 bits count the assignments
/// that worker has received (saturating at [`MAX_SEQ`](Self::MAX_SEQ)). A lease manager or the
/// worker itself can reject work carrying a token lower than the highest it has seen.
///
/// # Examples
///
/// ```
/// use worker_registry::{FencingToken, WorkerId};
///
/// let t = FencingToken::new(WorkerId::new(3), 7).unwrap();
/// assert_eq!((t.worker(), t.seq()), (WorkerId::new(3), 7));
/// assert!(FencingToken::new(WorkerId::new(4), 1).unwrap() > t);
/// assert!(FencingToken::new(WorkerId::new(WorkerId::MAX + 1), 1).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Bits of the assignment counter.
    pub const SEQ_BITS: u32 = 20;
    /// The largest assignment counter (later assignments of the same worker repeat it).
    pub const MAX_SEQ: u64 = (1 << Self::SEQ_BITS) - 1;

    /// The token for the `seq`-th assignment of `worker` (`seq` saturates at
    /// [`MAX_SEQ`](Self::MAX_SEQ)); refused for an id above [`WorkerId::MAX`].
    pub const fn new(worker: WorkerId, seq: u64) -> Result<Self, WorkerIdError> {
        if worker.0 > WorkerId::MAX {
            return Err(WorkerIdError::OutOfRange { id: worker.0 });
        }
        let seq = if seq > Self::MAX_SEQ {
            Self::MAX_SEQ
        } else {
            seq
        };
        Ok(Self((worker.0 << Self::SEQ_BITS) | seq))
    }

    /// A token from its integer form ([`get`](Self::get)).
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{FencingToken, WorkerId};
    ///
    /// let t = FencingToken::new(WorkerId::new(3), 7).unwrap();
    /// assert_eq!(FencingToken::from_raw(t.get()), t);
    /// ```
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The token as one integer (what the HTTP API shows).
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The worker this token was issued to.
    pub const fn worker(self) -> WorkerId {
        WorkerId(self.0 >> Self::SEQ_BITS)
    }

    /// Which assignment of that worker it was (1 for the first).
    pub const fn seq(self) -> u64 {
        self.0 & Self::MAX_SEQ
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
