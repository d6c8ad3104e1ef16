//! How driver and pool errors become [`RegistryError::Backend`], which of them a retry can
//! resolve, and the bounded retry of transactions that lost a race (serialization failures and
//! deadlocks).

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::api::error::RegistryError;

/// The backend's name in [`RegistryError::Backend`].
pub(crate) const BACKEND: &str = "postgres";

/// How many times one call runs its transaction before a lost race is reported as a (retryable)
/// backend error.
pub(crate) const MAX_ATTEMPTS: u32 = 12;

/// A failure inside one attempt of a call.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The driver or the server refused.
    Pg(tokio_postgres::Error),
    /// No connection could be had.
    Pool(PoolError),
    /// The server answered something this version of the crate cannot read (a bug, or a schema
    /// from another version).
    Decode(String),
    /// The database was migrated by the old history and stopped before its last version.
    Schema(SchemaTooOld),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Pg(e)
    }
}

impl From<PoolError> for Failure {
    fn from(e: PoolError) -> Self {
        Self::Pool(e)
    }
}

impl Failure {
    /// Whether this attempt lost a race that another attempt can win: a serialization failure
    /// (raised by the functions themselves when a concurrent transaction committed first), a
    /// deadlock the server broke, or a lock wait past `lock_timeout`.
    fn is_conflict(&self) -> bool {
        match self {
            Self::Pg(e) => matches!(
                e.code(),
                Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::T_R_DEADLOCK_DETECTED
                    || *c == SqlState::LOCK_NOT_AVAILABLE
            ),
            _ => false,
        }
    }

    /// The contract's error for this failure.
    pub(crate) fn into_registry(self) -> RegistryError {
        match self {
            Self::Pg(e) if e.code() == Some(&SqlState::INVALID_SQL_STATEMENT_NAME) => {
                RegistryError::backend(BACKEND, false, PoolerMismatch(e))
            }
            Self::Pg(e) => {
                let retryable = pg_retryable(&e);
                RegistryError::backend(BACKEND, retryable, e)
            }
            Self::Pool(e) => {
                let retryable = match &e {
                    PoolError::Backend(pg) => pg_retryable(pg),
                    PoolError::Timeout(_) => true,
                    _ => false,
                };
                RegistryError::backend(BACKEND, retryable, e)
            }
            Self::Decode(what) => RegistryError::backend(BACKEND, false, DecodeError(what)),
            Self::Schema(e) => RegistryError::backend(BACKEND, false, e),
        }
    }
}

/// Whether a driver error is transient: the connection failed or went away (no SQLSTATE), the
/// server is shutting down, starting up or out of resources, or a lock or statement timed out.
/// Anything else (a constraint, a syntax error, a missing function) is a bug or a schema from
/// another version, and retrying will not help.
fn pg_retryable(e: &tokio_postgres::Error) -> bool {
    let Some(code) = e.code() else {
        return true;
    };
    let code = code.code();
    code.starts_with("08") // connection exception
        || code.starts_with("40") // transaction rollback: serialization, deadlock
        || code.starts_with("53") // insufficient resources (too many connections, ...)
        || code.starts_with("57P") // admin shutdown, crash shutdown, cannot connect now
        || code == "57014" // query canceled (statement_timeout)
        || code == "55P03" // lock not available (lock_timeout)
        || code == "25006" // read-only transaction: the server was demoted, a primary is elsewhere
}

/// Whether an attempt that failed with `e` may be retried at once on another connection (the
/// server turned read-only, as a demoted primary does: another connection finds the new one).
pub(crate) fn demoted(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION)
}

/// The server answered something this crate cannot read.
#[derive(Debug)]
pub(crate) struct DecodeError(pub(crate) String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unexpected answer from the database: {}", self.0)
    }
}

impl Error for DecodeError {}

/// The old history's last version (migrations 0001-0009 before the baseline): a database at it
/// holds exactly the baseline's schema (`migrate.rs`).
pub(crate) const OLD_HISTORY_LAST: i32 = 9;

/// The database's schema was migrated by the migrations of worker-registry before 0.2.0 (the
/// old history, 0001-0009, replaced by one baseline) and stopped before 0009: this version
/// cannot bring it up to date. The source of the [`RegistryError::Backend`] (not retryable)
/// that [`PostgresRegistry::migrate`](super::PostgresRegistry::migrate) and `connect` return;
/// the upgrade path is in [`docs::postgres`](crate::docs::postgres), "Migrations".
///
/// # Examples
///
/// ```
/// use worker_registry::postgres::SchemaTooOld;
/// use worker_registry::RegistryError;
///
/// fn found(e: &RegistryError) -> Option<i32> {
///     let mut cause = std::error::Error::source(e);
///     while let Some(c) = cause {
///         if let Some(old) = c.downcast_ref::<SchemaTooOld>() {
///             return Some(old.found);
///         }
///         cause = c.source();
///     }
///     None
/// }
/// # assert_eq!(found(&RegistryError::backend("postgres", false, "down")), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchemaTooOld {
    /// The last version of the old history the database records.
    pub found: i32,
}

impl fmt::Display for SchemaTooOld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the database's schema is at migration {:04} of the old history (0001-{:04}), which \
             this version cannot upgrade: migrate it to {:04} first with worker-registry at git \
             revision 5f5eb62 (the last with the old history; PostgresRegistry::migrate), then \
             connect with this version; or, if its registries hold nothing to keep, drop its \
             wr_* tables and functions and connect again",
            self.found, OLD_HISTORY_LAST, OLD_HISTORY_LAST,
        )
    }
}

impl Error for SchemaTooOld {}

/// A prepared statement vanished between two round trips of one call: the connection goes through
/// a pooler in transaction mode, which lends a server connection per transaction.
#[derive(Debug)]
pub(crate) struct PoolerMismatch(pub(crate) tokio_postgres::Error);

impl fmt::Display for PoolerMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: the URL seems to go through a connection pooler in transaction mode (PgBouncer \
             pool_mode = transaction), where prepared statements do not survive; build the \
             handle with transaction_pooler(true)",
            self.0
        )
    }
}

impl Error for PoolerMismatch {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.0)
    }
}

/// A call did not finish within the handle's call timeout.
#[derive(Debug)]
pub(crate) struct TimedOut(pub(crate) Duration);

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no answer from the database within {:?}", self.0)
    }
}

impl Error for TimedOut {}

/// Runs `attempt` until it succeeds, fails for a reason other than a lost race, or has lost
/// [`MAX_ATTEMPTS`] races; all of it within `timeout`.
pub(crate) async fn retrying<T, F, Fut>(
    timeout: Duration,
    mut attempt: F,
) -> Result<T, RegistryError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let run = async {
        let mut tries = 0u32;
        loop {
            tries += 1;
            match attempt().await {
                Ok(v) => return Ok(v),
                // The server turned read-only (a demoted primary): that connection was dropped,
                // and the next one goes where `target_session_attrs` finds a primary.
                Err(Failure::Pg(e)) if demoted(&e) && tries < MAX_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(10 * u64::from(tries))).await;
                }
                Err(f) if f.is_conflict() && tries < MAX_ATTEMPTS => {
                    // The race is usually already decided (the winner committed); a short,
                    // growing pause spreads out the rare longer pile-ups.
                    tokio::time::sleep(Duration::from_micros(50 * u64::from(tries * tries))).await;
                }
                Err(f) => return Err(f.into_registry()),
            }
        }
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(r) => r,
        Err(_) => Err(RegistryError::backend(BACKEND, true, TimedOut(timeout))),
    }
}

/// A decode failure for `what`.
pub(crate) fn decode(what: impl Into<String>) -> Failure {
    Failure::Decode(what.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_errors_are_not_retryable_and_say_what_was_seen() {
        let e = decode("outcome \"maybe\"").into_registry();
        assert!(!e.is_retryable());
        assert_eq!(
            e.to_string(),
            "postgres backend unavailable: unexpected answer from the database: outcome \"maybe\""
        );
    }

    #[test]
    fn pool_timeouts_are_retryable() {
        let e = Failure::Pool(PoolError::Timeout(deadpool_postgres::TimeoutType::Wait));
        assert!(e.into_registry().is_retryable());
    }
}
