//! [`RegistryError`]: what a registry call refused, with what it observed, and [`BackendSource`],
//! the cause a backend that could not answer carries.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use super::ids::{DeliveryId, Target, WorkerId};
use super::outcome::Rejection;
use super::report::ReleaseReason;
use super::status::{DeadReason, Status};

/// Why a registry call was refused. Every variant carries what the registry observed, so a caller
/// can log or map it (the HTTP API maps `UnknownWorker` to 404, `WorkerDead` to 409 and a
/// retryable `Backend` error to 503).
///
/// # Examples
///
/// ```
/// use worker_registry::{memory::Direct, RegistryError, WorkerId};
///
/// let registry = Direct::default();
/// let err = registry.heartbeat(WorkerId::new(99)).unwrap_err();
/// assert_eq!(err, RegistryError::UnknownWorker { id: WorkerId::new(99) });
/// assert!(!err.is_retryable());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegistryError {
    /// No worker with this id (never existed, or dead and purged after the retention window).
    UnknownWorker {
        /// The id asked for.
        id: WorkerId,
    },
    /// The worker is dead: it is fenced and must stop.
    WorkerDead {
        /// The worker.
        id: WorkerId,
        /// How it died.
        reason: DeadReason,
    },
    /// No claim for this (target, delivery) pair, or it was forgotten.
    UnknownClaim {
        /// The target.
        target: Target,
        /// The delivery.
        delivery: DeliveryId,
    },
    /// The claim was released (its worker died, or it was stuck in flight); its completion is
    /// refused: the delivery will be, or was, dispatched again.
    ClaimReleased {
        /// The target.
        target: Target,
        /// The delivery.
        delivery: DeliveryId,
        /// The worker that held it.
        holder: Option<WorkerId>,
        /// Why it was released.
        reason: ReleaseReason,
    },
    /// A worker tried to complete a claim it does not hold (it was declared dead and the delivery
    /// was re-admitted onto another worker, or it never held it).
    NotHolder {
        /// The target.
        target: Target,
        /// The delivery.
        delivery: DeliveryId,
        /// The claim's actual holder (none for a bare claim).
        holder: Option<WorkerId>,
        /// The worker that tried.
        worker: WorkerId,
    },
    /// The claim is completed; it cannot be released.
    ClaimCompleted {
        /// The target.
        target: Target,
        /// The delivery.
        delivery: DeliveryId,
    },
    /// The request was refused for the same reason an assignment would be (a registration when
    /// `max_workers` are alive).
    Rejected(Rejection),
    /// This registry has handed out every worker id it can ([`WorkerId::MAX`]).
    IdsExhausted,
    /// The payload an admission carried is larger than
    /// [`max_payload_bytes`](crate::RegistryConfig::max_payload_bytes): bad input, refused before
    /// anything was claimed or placed.
    PayloadTooLarge {
        /// Its [`size`](crate::Payload::size).
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// This backend does not offer what the call asked for: nothing was done. No backend of this
    /// crate answers it; it is for a backend of your own that cannot yet do all the contract
    /// asks.
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// What it does not offer (`"payloads"`).
        feature: &'static str,
    },
    /// A shared backend's registry was opened with another configuration than the one stored
    /// with it (by the first handle that opened it): the handle is refused, since replicas that
    /// decide with different limits disagree on capacity and on who is dead.
    ConfigDisagrees {
        /// The first setting that differs (`max_workers`, `heartbeat_timeout_ms`, ...).
        setting: &'static str,
        /// Its value as stored with the registry.
        stored: String,
        /// Its value in this handle's configuration.
        configured: String,
    },
    /// The backend could not answer: the connection is down, a call timed out, the server
    /// answered something unexpected. Whether the call took effect is unknown; see the
    /// [module documentation](crate::WorkerRegistry) on retries.
    Backend {
        /// Which backend (`"redis"`, `"postgres"`, ...).
        backend: &'static str,
        /// Whether retrying the same call later can succeed (a lost connection: yes; a script the
        /// server rejects: no).
        retryable: bool,
        /// The underlying error.
        source: BackendSource,
    },
}

impl RegistryError {
    /// A [`Backend`](Self::Backend) error from `backend`, caused by `source`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::error::Error as _;
    /// use worker_registry::RegistryError;
    ///
    /// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    /// let e = RegistryError::backend("redis", true, io);
    /// assert!(e.is_retryable());
    /// assert_eq!(e.to_string(), "redis backend unavailable: connection refused");
    /// assert_eq!(e.source().unwrap().to_string(), "connection refused");
    /// ```
    pub fn backend(
        backend: &'static str,
        retryable: bool,
        source: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> Self {
        Self::Backend {
            backend,
            retryable,
            source: BackendSource(Arc::from(source.into())),
        }
    }

    /// [`UnknownClaim`](Self::UnknownClaim) for the pair (what every backend answers for a claim
    /// it does not hold).
    pub(crate) fn unknown_claim(target: &Target, delivery: &DeliveryId) -> Self {
        Self::UnknownClaim {
            target: target.clone(),
            delivery: delivery.clone(),
        }
    }

    /// [`ClaimCompleted`](Self::ClaimCompleted) for the pair.
    pub(crate) fn claim_completed(target: &Target, delivery: &DeliveryId) -> Self {
        Self::ClaimCompleted {
            target: target.clone(),
            delivery: delivery.clone(),
        }
    }

    /// Whether retrying the same call later can succeed: only for a retryable backend error.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Backend {
                retryable: true,
                ..
            }
        )
    }

    /// The status the worker was seen in, for errors about a worker.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::{DeadReason, RegistryError, Status, WorkerId};
    ///
    /// let e = RegistryError::WorkerDead { id: WorkerId::new(1), reason: DeadReason::Exited };
    /// assert_eq!(e.observed_status(), Some(Status::Dead(DeadReason::Exited)));
    /// ```
    pub fn observed_status(&self) -> Option<Status> {
        match self {
            Self::WorkerDead { reason, .. } => Some(Status::Dead(*reason)),
            _ => None,
        }
    }
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownWorker { id } => write!(f, "unknown worker {id}"),
            Self::WorkerDead { id, reason } => write!(f, "worker {id} is dead ({reason})"),
            Self::UnknownClaim { target, delivery } => {
                write!(f, "no claim for delivery {delivery} on {target}")
            }
            Self::ClaimReleased {
                target,
                delivery,
                reason,
                ..
            } => write!(
                f,
                "claim for delivery {delivery} on {target} was released: {reason}"
            ),
            Self::NotHolder {
                target,
                delivery,
                holder,
                worker,
            } => match holder {
                Some(h) => write!(
                    f,
                    "worker {worker} does not hold delivery {delivery} on {target}: worker {h} does"
                ),
                None => write!(
                    f,
                    "worker {worker} does not hold delivery {delivery} on {target}: no worker does"
                ),
            },
            Self::ClaimCompleted { target, delivery } => write!(
                f,
                "claim for delivery {delivery} on {target} is already completed"
            ),
            Self::Rejected(r) => r.fmt(f),
            Self::IdsExhausted => write!(f, "worker ids exhausted"),
            Self::PayloadTooLarge { size, limit } => write!(
                f,
                "the payload is {size} bytes; max_payload_bytes is {limit}"
            ),
            Self::Unsupported { backend, feature } => {
                write!(f, "the {backend} backend does not support {feature}")
            }
            Self::ConfigDisagrees {
                setting,
                stored,
                configured,
            } => write!(
                f,
                "the registry's stored configuration has {setting} = {stored}, this handle's \
                 {configured}: every replica must use the same one"
            ),
            Self::Backend {
                backend, source, ..
            } => write!(f, "{backend} backend unavailable: {source}"),
        }
    }
}

impl Error for RegistryError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Backend { source, .. } => Some(&*source.0),
            _ => None,
        }
    }
}

/// The cause of a [`RegistryError::Backend`]: the backend's own error, shared so that the error
/// stays cheap to clone. Two are equal when they read the same (for assertions in tests).
///
/// # Examples
///
/// ```
/// use worker_registry::RegistryError;
///
/// let RegistryError::Backend { source, .. } = RegistryError::backend("redis", true, "timed out")
/// else { unreachable!() };
/// assert_eq!(source.to_string(), "timed out");
/// ```
#[derive(Clone)]
pub struct BackendSource(Arc<dyn Error + Send + Sync>);

impl BackendSource {
    /// The underlying error.
    ///
    /// # Examples
    ///
    /// ```
    /// use worker_registry::RegistryError;
    ///
    /// let RegistryError::Backend { source, .. } = RegistryError::backend("pg", false, "bad sql")
    /// else { unreachable!() };
    /// assert_eq!(source.get().to_string(), "bad sql");
    /// ```
    pub fn get(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Debug for BackendSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for BackendSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl PartialEq for BackendSource {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for BackendSource {}
