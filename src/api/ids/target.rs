//! Targets: a repository and a pull request (or issue) number, validated as GitHub names them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::truncate;

/// The longest GitHub owner (user or organisation) name.
pub const MAX_OWNER_LEN: usize = 39;
/// The longest GitHub repository name.
pub const MAX_REPO_NAME_LEN: usize = 100;

/// What a worker works on: one pull request (or issue) of one repository.
///
/// Validated on construction: `owner/name` as GitHub produces them, and a number of at least 1.
/// The owner is a user or organisation login (ASCII letters, digits and hyphens, not starting with
/// a hyphen, at most 39 characters), or an Enterprise Managed User's login (`mona_octocorp`: such a
/// name, an underscore and the enterprise's short code of letters and digits); the repository
/// name is ASCII letters, digits, `-`, `_` and `.`, at most 100 characters, neither `.` nor `..`. GitHub treats names case-insensitively, so the name is stored lower-cased
/// and `Octo/Repo#1` and `octo/repo#1` are the same target. Cloning is cheap (one pointer is
/// shared), and its hash is computed once, here, keyed with the process's random seed.
///
/// # Examples
///
/// ```
/// use worker_registry::Target;
///
/// let t = Target::new("Octo-Org/my.repo", 17).unwrap();
/// assert_eq!(t.to_string(), "octo-org/my.repo#17");
/// assert_eq!(t, "octo-org/my.repo#17".parse().unwrap());
/// assert!(Target::new("no-slash", 1).is_err());
/// assert!(Target::new("a/b", 0).is_err());
/// // An Enterprise Managed User's repository; an owner GitHub cannot produce.
/// assert!(Target::new("mona_octocorp/app", 1).is_ok());
/// assert!(Target::new("-mona/app", 1).is_err());
/// ```
#[derive(Clone)]
pub struct Target(Arc<TargetInner>);

/// A target's parts and its hash, computed once when it is validated.
struct TargetInner {
    /// Keyed with the process's random seed (see `crate::sync::key_hash`), so maps can use it
    /// directly without an attacker being able to choose colliding targets.
    hash: u64,
    number: u64,
    repo: Box<str>,
}

impl Target {
    /// Validates and builds a target from a repository full name and a PR/issue number.
    pub fn new(repo_full_name: &str, number: u64) -> Result<Self, TargetError> {
        validate_repo(repo_full_name)?;
        if number == 0 {
            return Err(TargetError::ZeroNumber);
        }
        let repo: Box<str> = repo_full_name.to_ascii_lowercase().into_boxed_str();
        let hash = crate::sync::key_hash(&(repo.as_ref(), number));
        Ok(Self(Arc::new(TargetInner { hash, number, repo })))
    }

    /// The repository full name, `owner/name`, lower-cased.
    pub fn repo(&self) -> &str {
        &self.0.repo
    }

    /// The pull request or issue number.
    pub fn number(&self) -> u64 {
        self.0.number
    }

    /// The target's keyed hash, computed once at validation.
    #[inline]
    pub(crate) fn key_hash(&self) -> u64 {
        self.0.hash
    }
}

impl PartialEq for Target {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || (self.0.hash == other.0.hash
                && self.0.number == other.0.number
                && self.0.repo == other.0.repo)
    }
}

impl Eq for Target {}

impl std::hash::Hash for Target {
    /// Feeds the precomputed keyed hash (equal targets have equal hashes).
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash);
    }
}

impl PartialOrd for Target {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Target {
    /// By repository, then number.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.repo(), self.number()).cmp(&(other.repo(), other.number()))
    }
}

/// Why an owner made of allowed characters (ASCII letters, digits, `-`, `_`) is still not one
/// GitHub can produce, if it is not.
///
/// A user or organisation login is letters, digits and hyphens, and never starts with a hyphen
/// (new logins also cannot end with one or contain two in a row, but older accounts that do still
/// exist, so those are accepted). An Enterprise Managed User's login is such a name, an underscore
/// and the enterprise's short code, letters and digits (`mona_octocorp`). The whole login is at
/// most 39 characters, checked before this.
fn owner_shape_error(owner: &str) -> Option<&'static str> {
    let (base, shortcode) = match owner.split_once('_') {
        Some((base, code)) => (base, Some(code)),
        None => (owner, None),
    };
    if base.is_empty() {
        return Some("starts with '_' (an enterprise short code follows a user name)");
    }
    if base.starts_with('-') {
        return Some("starts with '-'");
    }
    match shortcode {
        Some("") => Some("ends with '_' (an enterprise short code must follow it)"),
        Some(code) if code.contains('_') => Some("has more than one '_'"),
        Some(code) if code.contains('-') => {
            Some("has '-' in its enterprise short code (letters and digits only)")
        }
        _ => None,
    }
}

fn validate_repo(full: &str) -> Result<(), TargetError> {
    let Some((owner, name)) = full.split_once('/') else {
        return Err(TargetError::NotOwnerSlashName {
            input: truncate(full, 160),
        });
    };
    if owner.is_empty() || name.is_empty() || name.contains('/') {
        return Err(TargetError::NotOwnerSlashName {
            input: truncate(full, 160),
        });
    }
    if owner.len() > MAX_OWNER_LEN {
        return Err(TargetError::TooLong {
            part: "owner",
            len: owner.len(),
            max: MAX_OWNER_LEN,
        });
    }
    if name.len() > MAX_REPO_NAME_LEN {
        return Err(TargetError::TooLong {
            part: "repository name",
            len: name.len(),
            max: MAX_REPO_NAME_LEN,
        });
    }
    if let Some(c) = owner
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
    {
        return Err(TargetError::BadCharacter {
            part: "owner",
            found: c,
        });
    }
    if let Some(reason) = owner_shape_error(owner) {
        return Err(TargetError::BadOwner {
            owner: owner.to_owned(),
            reason,
        });
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(TargetError::BadCharacter {
            part: "repository name",
            found: c,
        });
    }
    if name == "." || name == ".." {
        return Err(TargetError::NotOwnerSlashName {
            input: full.to_owned(),
        });
    }
    Ok(())
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.repo(), self.number())
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Target({self})")
    }
}

impl FromStr for Target {
    type Err = TargetError;
    /// Parses `owner/name#number`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((repo, num)) = s.rsplit_once('#') else {
            return Err(TargetError::MissingNumber {
                input: truncate(s, 160),
            });
        };
        let number = num.parse::<u64>().map_err(|_| TargetError::MissingNumber {
            input: truncate(s, 160),
        })?;
        Target::new(repo, number)
    }
}

/// Why a [`Target`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetError {
    /// Not of the form `owner/name`.
    NotOwnerSlashName {
        /// What was received (at most 160 bytes of it).
        input: String,
    },
    /// A part is longer than GitHub allows.
    TooLong {
        /// Which part: "owner" or "repository name".
        part: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A character GitHub does not allow in that part.
    BadCharacter {
        /// Which part.
        part: &'static str,
        /// The first offending character.
        found: char,
    },
    /// An owner of allowed characters arranged as GitHub never does (a leading hyphen, an
    /// underscore that is not followed by an enterprise short code, ...).
    BadOwner {
        /// The owner (at most 39 bytes: longer ones are refused as too long first).
        owner: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// PR/issue numbers start at 1.
    ZeroNumber,
    /// `owner/name#number` without a valid `#number`.
    MissingNumber {
        /// What was received (at most 160 bytes of it).
        input: String,
    },
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotOwnerSlashName { input } => {
                write!(
                    f,
                    "target repository {input:?} is not of the form owner/name"
                )
            }
            Self::TooLong { part, len, max } => {
                write!(f, "target {part} is {len} bytes long; the limit is {max}")
            }
            Self::BadCharacter { part, found } => {
                write!(
                    f,
                    "target {part} contains {found:?}, which GitHub does not allow"
                )
            }
            Self::BadOwner { owner, reason } => {
                write!(
                    f,
                    "target owner {owner:?} {reason}, which GitHub does not allow"
                )
            }
            Self::ZeroNumber => write!(f, "target number must be at least 1"),
            Self::MissingNumber { input } => {
                write!(f, "target {input:?} is not of the form owner/name#number")
            }
        }
    }
}

impl std::error::Error for TargetError {}
