//! Delivery ids: GitHub's `X-GitHub-Delivery`, kept as 16 bytes when it is a canonical UUID.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The longest delivery id accepted.
pub const MAX_DELIVERY_ID_LEN: usize = 255;

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
fn delivery_hash(uuid: Option<&[u8; 16]>, text: &str) -> u64 {
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
