//! How Redis failures become registry errors: a lost connection, a timeout or a server that is
//! loading, failing over or busy is `RegistryError::Backend { retryable: true }`; a script the
//! server rejects, or a reply that does not decode, is `retryable: false` (a bug, or a foreign
//! writer). Nothing here panics.

use redis::{ErrorKind, RedisError, ServerErrorKind};

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
        // BUSY: another script runs too long; OOM: the server is full (expiry may free it);
        // READONLY inside a script's error: the server was demoted (see `link.rs`).
        _ => matches!(e.code(), Some("BUSY" | "OOM")) || super::link::demoted(e),
    }
}

/// The registry error for a Redis failure.
pub(crate) fn backend(e: RedisError) -> RegistryError {
    RegistryError::backend(BACKEND, is_retryable(&e), e)
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
