//! How Redis failures become registry errors: a lost connection, a timeout or a server that is
//! loading, failing over or busy is `RegistryError::Backend { retryable: true }`; a script the
//! server rejects, or a reply that does not decode, is `retryable: false` (a bug, or a foreign
//! writer). Nothing here panics. [`RedisConnectError`] is what connecting can fail with.

use std::fmt;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::keys::RegistryNameError;
use crate::api::error::RegistryError;

/// The backend's name in [`RegistryError::Backend`].
pub(crate) const BACKEND: &str = "redis";

/// Whether retrying later can help.
pub(crate) fn is_retryable(e: &RedisError) -> bool {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => true,
        // BUSY: another script runs too long; OOM: the server is full (expiry may free it).
        _ => matches!(e.code(), Some("BUSY" | "OOM")),
    }
}

/// The registry error for a Redis failure.
pub(crate) fn backend(e: RedisError) -> RegistryError {
    RegistryError::backend(BACKEND, is_retryable(&e), e)
}

/// Why [`RedisRegistryBuilder::connect`](super::RedisRegistryBuilder::connect) failed.
///
/// # Examples
///
/// ```
/// use worker_registry::redis::{RedisConnectError, RegistryNameError};
///
/// let e = RedisConnectError::InvalidName(RegistryNameError::Empty);
/// assert!(!e.is_retryable());
/// assert_eq!(e.to_string(), "invalid registry name: registry name is empty");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisConnectError {
    /// The registry name cannot be used in keys.
    InvalidName(RegistryNameError),
    /// The URL does not parse (the message says why; a password in it is not repeated).
    InvalidUrl {
        /// What redis-rs said about it.
        reason: String,
    },
    /// The server is older than the backend needs (Redis 7.0: script effects replication,
    /// `ZADD LT`).
    ServerTooOld {
        /// The version the server reported.
        version: String,
        /// The oldest version supported.
        required: &'static str,
    },
    /// The server could not be reached or answered with an error.
    Unavailable(RegistryError),
    /// The registry's stored configuration differs from this handle's
    /// ([`RegistryError::ConfigDisagrees`], which names the setting and both values).
    ConfigDisagrees(RegistryError),
}

impl RedisConnectError {
    /// Whether connecting again later can succeed (the server was unreachable).
    ///
    /// # Examples
    ///
    /// See [`RedisConnectError`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(e) if e.is_retryable())
    }
}

impl fmt::Display for RedisConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName(e) => write!(f, "invalid registry name: {e}"),
            Self::InvalidUrl { reason } => write!(f, "invalid Redis URL: {reason}"),
            Self::ServerTooOld { version, required } => write!(
                f,
                "Redis server {version} is too old: the registry needs {required} or later"
            ),
            Self::Unavailable(e) => write!(f, "cannot connect to Redis: {e}"),
            Self::ConfigDisagrees(e) => write!(f, "refused: {e}"),
        }
    }
}

impl std::error::Error for RedisConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::InvalidName(e) => Some(e),
            Self::Unavailable(e) | Self::ConfigDisagrees(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RedisConnectError> for RegistryError {
    /// A connect error as a registry error (for code that only handles the latter).
    fn from(e: RedisConnectError) -> Self {
        match e {
            RedisConnectError::Unavailable(e) => e,
            other => RegistryError::backend(BACKEND, false, other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_failures_are_retryable_and_script_errors_are_not() {
        let io = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert!(backend(io).is_retryable());
        let script = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "ERR user_script:1: WRONGTYPE",
        ));
        let e = backend(script);
        assert!(!e.is_retryable());
        assert!(matches!(
            e,
            RegistryError::Backend {
                backend: "redis",
                ..
            }
        ));
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert!(backend(loading).is_retryable());
    }
}
