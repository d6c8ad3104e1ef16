//! Identities: [`WorkerId`], [`Target`] (repository + PR/issue number), [`DeliveryId`] (GitHub's
//! `X-GitHub-Delivery`) and the [`FencingToken`]. Everything that comes from the network is validated here, once,
//! with a typed error that says what was seen.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

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
    ///
    /// # Examples
    ///
    /// See [`FencingToken`].
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
    ///
    /// # Examples
    ///
    /// See [`from_raw`](Self::from_raw).
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The worker this token was issued to.
    ///
    /// # Examples
    ///
    /// See [`FencingToken`].
    pub const fn worker(self) -> WorkerId {
        WorkerId(self.0 >> Self::SEQ_BITS)
    }

    /// Which assignment of that worker it was (1 for the first).
    ///
    /// # Examples
    ///
    /// See [`FencingToken`].
    pub const fn seq(self) -> u64 {
        self.0 & Self::MAX_SEQ
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The longest GitHub owner (user or organisation) name.
pub const MAX_OWNER_LEN: usize = 39;
/// The longest GitHub repository name.
pub const MAX_REPO_NAME_LEN: usize = 100;
/// The longest delivery id accepted.
pub const MAX_DELIVERY_ID_LEN: usize = 255;

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

/// A webhook delivery id (GitHub's `X-GitHub-Delivery`): non-empty, at most 255 bytes of visible ASCII.
///
/// A redelivery carries the same id, which is what makes deduplication possible. Cloning is cheap.
/// Its hash is computed once, here, keyed with the process's random seed; a canonical UUID (the
/// shape of GitHub's ids) is also kept as its 16 bytes, which is all the registry stores of it.
///
/// # Examples
///
/// ```
/// use worker_registry::DeliveryId;
///
/// let e = DeliveryId::new("72d3162e-cc78-11e3-81ab-4c9367dc0958").unwrap();
/// assert_eq!(e.as_str().len(), 36);
/// assert!(DeliveryId::new("").is_err());
/// assert!(DeliveryId::new("has space").is_err());
/// ```
#[derive(Clone)]
pub struct DeliveryId {
    text: Arc<str>,
    /// Keyed with the process's random seed; see [`Target`]'s.
    hash: u64,
    /// The 16 bytes of a canonical (lower-case, hyphenated) UUID, the shape of GitHub's ids.
    uuid: Option<[u8; 16]>,
}

impl DeliveryId {
    /// Validates and wraps a delivery id.
    pub fn new(id: &str) -> Result<Self, DeliveryIdError> {
        if id.is_empty() {
            return Err(DeliveryIdError::Empty);
        }
        if id.len() > MAX_DELIVERY_ID_LEN {
            return Err(DeliveryIdError::TooLong {
                len: id.len(),
                max: MAX_DELIVERY_ID_LEN,
            });
        }
        if let Some(b) = id.bytes().find(|b| !b.is_ascii_graphic()) {
            return Err(DeliveryIdError::BadByte { found: b });
        }
        let uuid = parse_uuid(id);
        Ok(Self {
            hash: delivery_hash(uuid.as_ref(), id),
            text: Arc::from(id),
            uuid,
        })
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The id's keyed hash, computed once at validation.
    #[inline]
    pub(crate) fn key_hash(&self) -> u64 {
        self.hash
    }

    /// The id's 16 bytes, if it is a canonical UUID (then it is exactly its rendering).
    #[inline]
    pub(crate) fn uuid(&self) -> Option<&[u8; 16]> {
        self.uuid.as_ref()
    }

    /// The id whose canonical rendering is this UUID.
    pub(crate) fn from_uuid(bytes: [u8; 16]) -> Self {
        let text = render_uuid(&bytes);
        Self {
            hash: delivery_hash(Some(&bytes), &text),
            text: Arc::from(text.as_str()),
            uuid: Some(bytes),
        }
    }

    /// The id's text, shared.
    pub(crate) fn shared_text(&self) -> &Arc<str> {
        &self.text
    }

    /// An id from text that was validated before (the registry's own copy of one).
    pub(crate) fn from_validated(text: Arc<str>) -> Self {
        Self {
            hash: delivery_hash(None, &text),
            uuid: None,
            text,
        }
    }
}

/// A delivery id's keyed hash: of its 16 bytes if it is a canonical UUID, else of its text (the
/// two are told apart, and a UUID always takes the first form, so equal ids hash equally).
#[inline]
pub(crate) fn delivery_hash(uuid: Option<&[u8; 16]>, text: &str) -> u64 {
    match uuid {
        Some(bytes) => crate::sync::key_hash(&(0u8, bytes)),
        None => crate::sync::key_hash(&(1u8, text)),
    }
}

/// The 16 bytes of `s` if it is a canonical UUID: 36 characters, lower-case hex digits, hyphens
/// after the 8th, 12th, 16th and 20th digit. Anything else (upper case included) is not, so that
/// the bytes render back to exactly `s`.
fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 || b[8] != b'-' || b[13] != b'-' || b[18] != b'-' || b[23] != b'-' {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 16];
    let mut digits = b.iter().copied().filter(|c| *c != b'-');
    for byte in &mut out {
        let hi = nibble(digits.next()?)?;
        let lo = nibble(digits.next()?)?;
        *byte = (hi << 4) | lo;
    }
    Some(out)
}

fn render_uuid(bytes: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(36);
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(HEX[usize::from(byte >> 4)] as char);
        s.push(HEX[usize::from(byte & 15)] as char);
    }
    s
}

impl PartialEq for DeliveryId {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.text == other.text
    }
}

impl Eq for DeliveryId {}

impl std::hash::Hash for DeliveryId {
    /// Feeds the precomputed keyed hash (equal ids have equal hashes).
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialOrd for DeliveryId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DeliveryId {
    /// By text.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.text.cmp(&other.text)
    }
}

impl fmt::Display for DeliveryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for DeliveryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeliveryId({})", &self.text)
    }
}

impl FromStr for DeliveryId {
    type Err = DeliveryIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeliveryId::new(s)
    }
}

/// Why an [`DeliveryId`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliveryIdError {
    /// The id was empty.
    Empty,
    /// The id was longer than the limit.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A byte that is not visible ASCII (space, control, non-ASCII).
    BadByte {
        /// The first offending byte.
        found: u8,
    },
}

impl fmt::Display for DeliveryIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "delivery id is empty"),
            Self::TooLong { len, max } => {
                write!(f, "delivery id is {len} bytes long; the limit is {max}")
            }
            Self::BadByte { found } => {
                write!(
                    f,
                    "delivery id contains byte 0x{found:02x}; only visible ASCII is allowed"
                )
            }
        }
    }
}

impl std::error::Error for DeliveryIdError {}

/// At most `max` bytes of `s`, cut on a character boundary (for error messages).
fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Owners GitHub produces, from each kind of account, are accepted.
    #[test]
    fn every_kind_of_github_owner_is_accepted() {
        for owner in [
            "octocat",
            "Octo-Org",
            "a",
            "0",
            "github-actions",
            "mona_octocorp",      // Enterprise Managed User: login + '_' + short code
            "mona-lisa_octocorp", // normalised EMU login with a hyphen
            "ab12_ACME1",
            "legacy-",      // older accounts may end with a hyphen ...
            "legacy--name", // ... or have two in a row
            "abcdefghijklmnopqrstuvwxyz0123456789abc", // 39 characters
        ] {
            let t = Target::new(&format!("{owner}/repo"), 1);
            assert!(t.is_ok(), "{owner}: {t:?}");
        }
        for name in [
            "repo", "my.repo", "my_repo", "-repo", ".github", "a..b", "UPPER",
        ] {
            assert!(Target::new(&format!("o/{name}"), 1).is_ok(), "{name}");
        }
    }

    /// Owners GitHub cannot produce are refused, each with its reason.
    #[test]
    fn owners_github_cannot_produce_are_refused() {
        for (owner, says) in [
            ("-mona", "starts with '-'"),
            ("_octocorp", "starts with '_'"),
            ("mona_", "ends with '_'"),
            ("mona_octo_corp", "more than one '_'"),
            ("mona_octo-corp", "short code"),
            ("-_x", "starts with '-'"),
        ] {
            let e = Target::new(&format!("{owner}/repo"), 1).unwrap_err();
            assert!(
                matches!(&e, TargetError::BadOwner { owner: o, .. } if o == owner),
                "{owner}: {e:?}"
            );
            assert!(e.to_string().contains(says), "{owner}: {e}");
        }
        for (owner, found) in [("mona.lisa", '.'), ("mona lisa", ' '), ("mönä", 'ö')] {
            assert_eq!(
                Target::new(&format!("{owner}/repo"), 1),
                Err(TargetError::BadCharacter {
                    part: "owner",
                    found
                })
            );
        }
        assert!(matches!(
            Target::new(&format!("{}_x/repo", "a".repeat(38)), 1),
            Err(TargetError::TooLong {
                part: "owner",
                len: 40,
                max: 39
            })
        ));
    }
}
