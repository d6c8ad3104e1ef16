//! The key layout of one registry: every key starts with `{<name>}:`, so that all of them share
//! one hash tag (one Cluster slot) and a script may touch any of them.
//!
//! The scripts build most keys themselves from the prefix (see `scripts/lib_base.lua`, which lists
//! them all); this module holds the name's validation and the few keys the Rust side names.

use std::fmt;

/// The longest registry name accepted.
pub const MAX_REGISTRY_NAME_LEN: usize = 64;

/// A registry name refused by [`RedisRegistryBuilder::name`](super::RedisRegistryBuilder::name).
///
/// # Examples
///
/// ```
/// use worker_registry::redis::RegistryNameError;
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

/// Checks a registry name.
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

/// The keys of one registry that the Rust side names.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `{name}:`, the prefix of every key (ARGV[1] of every script).
    pub(crate) prefix: String,
    /// The test time offset (KEYS[1] of every script: every script reads it).
    pub(crate) offset: String,
    /// The pub/sub channel of lifecycle events.
    pub(crate) events: String,
    /// The counter replica ids come from.
    pub(crate) next_replica_id: String,
    /// The maintenance lease.
    pub(crate) lease: String,
}

impl Keys {
    /// The keys of registry `name` (already validated).
    pub(crate) fn new(name: &str) -> Self {
        let prefix = format!("{{{name}}}:");
        let key = |suffix: &str| format!("{prefix}{suffix}");
        Self {
            offset: key("test_offset_ms"),
            events: key("events"),
            next_replica_id: key("next_replica_id"),
            lease: key("sweep_lease"),
            prefix,
        }
    }

    /// The key of a claim on `member` (`<target>:<delivery>`).
    pub(crate) fn claim(&self, member: &str) -> String {
        format!("{}c:{member}", self.prefix)
    }

    /// Every key of the registry matches this pattern (for `SCAN` in tests and tools).
    pub(crate) fn pattern(&self) -> String {
        // `{` and `}` are not glob metacharacters; names contain none of `*?[]\`.
        format!("{}*", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_keys_share_one_hash_tag() {
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
        let k = Keys::new("pool-a");
        assert_eq!(k.prefix, "{pool-a}:");
        assert_eq!(k.offset, "{pool-a}:test_offset_ms");
        assert_eq!(k.claim("o/r#1:d"), "{pool-a}:c:o/r#1:d");
        for key in [&k.offset, &k.events, &k.next_replica_id, &k.lease] {
            assert!(key.starts_with("{pool-a}:"), "{key}");
        }
    }
}
