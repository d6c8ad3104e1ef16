//! [`ConnectError`]: what opening a shared backend (`redis::RedisRegistryBuilder::connect`,
//! `postgres::PostgresRegistryBuilder::connect`) can fail with, the same type for every backend;
//! and [`RegistryNameError`], a registry name that cannot be used.

use std::fmt;

use super::error::RegistryError;

/// The longest registry name the Redis backend accepts (its keys carry the name as a hash tag).
pub const MAX_REGISTRY_NAME_LEN: usize = 64;

/// Why connecting to a shared backend failed. Every backend's builder returns it, so a router
/// handles one type whichever backend it opens; `backend` names which one refused.
///
/// # Examples
///
/// ```
/// use worker_registry::{ConnectError, RegistryError, RegistryNameError};
///
/// let e = ConnectError::InvalidName { backend: "redis", error: RegistryNameError::Empty };
/// assert!(!e.is_retryable());
/// assert_eq!(e.backend(), "redis");
/// assert_eq!(e.to_string(), "redis: invalid registry name: registry name is empty");
/// let as_call_error: RegistryError = e.into();
/// assert!(!as_call_error.is_retryable());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectError {
    /// The registry name cannot be used.
    InvalidName {
        /// The backend that refused it.
        backend: &'static str,
        /// Why.
        error: RegistryNameError,
    },
    /// The URL (or the connection settings) do not parse; a password in it is not repeated.
    InvalidUrl {
        /// The backend.
        backend: &'static str,
        /// What the client library said about it.
        reason: String,
    },
    /// The server is older than the backend needs.
    ServerTooOld {
        /// The backend.
        backend: &'static str,
        /// The version the server reported.
        version: String,
        /// The oldest version supported.
        required: &'static str,
    },
    /// The settings cannot work together (for example TLS asked for in a build without the TLS
    /// feature, or a setting a connection pooler in front of the server does not carry).
    Unsupported {
        /// The backend.
        backend: &'static str,
        /// What cannot work, and what to change.
        reason: String,
    },
    /// The server could not be reached, or it answered with an error (see the inner error's
    /// [`is_retryable`](RegistryError::is_retryable)).
    Backend(RegistryError),
}

impl ConnectError {
    /// Whether connecting again later can succeed (the server was unreachable or busy).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Backend(e) if e.is_retryable())
    }

    /// The backend that refused (`"redis"`, `"postgres"`).
    pub fn backend(&self) -> &'static str {
        match self {
            Self::InvalidName { backend, .. }
            | Self::InvalidUrl { backend, .. }
            | Self::ServerTooOld { backend, .. }
            | Self::Unsupported { backend, .. } => backend,
            Self::Backend(RegistryError::Backend { backend, .. }) => backend,
            Self::Backend(_) => "registry",
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName { backend, error } => {
                write!(f, "{backend}: invalid registry name: {error}")
            }
            Self::InvalidUrl { backend, reason } => write!(f, "{backend}: invalid URL: {reason}"),
            Self::ServerTooOld {
                backend,
                version,
                required,
            } => write!(
                f,
                "{backend}: server {version} is too old: the registry needs {required} or later"
            ),
            Self::Unsupported { backend, reason } => write!(f, "{backend}: {reason}"),
            Self::Backend(e) => write!(f, "cannot connect: {e}"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::InvalidName { error, .. } => Some(error),
            Self::Backend(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConnectError> for RegistryError {
    /// A connect error as a registry error (for code that only handles the latter): the inner
    /// error of `Backend`, any other as a backend error that is not retryable.
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::Backend(e) => e,
            other => RegistryError::backend(other.backend(), false, other),
        }
    }
}

/// A registry name the Redis backend refuses (see
/// [`ConnectError::InvalidName`]).
///
/// # Examples
///
/// ```
/// use worker_registry::RegistryNameError;
///
/// let err = RegistryNameError::BadCharacter { name: "a{b}".into(), found: '{' };
/// assert!(err.to_string().contains("'{'"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegistryNameError {
    /// The name is empty.
    Empty,
    /// The name is longer than [`MAX_REGISTRY_NAME_LEN`].
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A character outside `A-Z a-z 0-9 - _ . :` (braces would break the hash tag).
    BadCharacter {
        /// The name (at most [`MAX_REGISTRY_NAME_LEN`] bytes of it).
        name: String,
        /// The first offending character.
        found: char,
    },
}

impl fmt::Display for RegistryNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("registry name is empty"),
            Self::TooLong { len, max } => {
                write!(f, "registry name is {len} bytes long; the limit is {max}")
            }
            Self::BadCharacter { name, found } => write!(
                f,
                "registry name {name:?} contains {found:?}; allowed are letters, digits and - _ . :"
            ),
        }
    }
}

impl std::error::Error for RegistryNameError {}

/// Checks a registry name against the Redis backend's rule.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn validate_name(name: &str) -> Result<(), RegistryNameError> {
    if name.is_empty() {
        return Err(RegistryNameError::Empty);
    }
    if name.len() > MAX_REGISTRY_NAME_LEN {
        return Err(RegistryNameError::TooLong {
            len: name.len(),
            max: MAX_REGISTRY_NAME_LEN,
        });
    }
    if let Some(found) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(RegistryNameError::BadCharacter {
            name: name.chars().take(MAX_REGISTRY_NAME_LEN).collect(),
            found,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(validate_name(""), Err(RegistryNameError::Empty));
        assert!(matches!(
            validate_name(&"x".repeat(65)),
            Err(RegistryNameError::TooLong { len: 65, .. })
        ));
        assert!(matches!(
            validate_name("pool}a"),
            Err(RegistryNameError::BadCharacter { found: '}', .. })
        ));
        assert!(validate_name("pool-a:eu.1_x").is_ok());
    }

    #[test]
    fn a_connect_error_says_which_backend_and_whether_to_retry() {
        let down = ConnectError::Backend(RegistryError::backend("postgres", true, "refused"));
        assert!(down.is_retryable());
        assert_eq!(down.backend(), "postgres");
        let old = ConnectError::ServerTooOld {
            backend: "redis",
            version: "6.2.1".into(),
            required: "7.0",
        };
        assert!(!old.is_retryable());
        let e: RegistryError = old.into();
        assert!(matches!(
            e,
            RegistryError::Backend {
                backend: "redis",
                retryable: false,
                ..
            }
        ));
    }
}
