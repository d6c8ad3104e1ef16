//! The router's secrets as handles that can be swapped while it runs ([`Secret`]): the webhook
//! secret, the admin token, the GitHub token and App key. Given inline (a flag) they never
//! change; given as files (`--*-file`, `--github-app-key`) they are re-read on SIGHUP and when the
//! file changes (see [`crate::reload`]), and during a rotation window the previous webhook secret
//! and admin token are accepted beside the new ones.
//!
//! Reading one is lock-free ([`arc_swap`]): the webhook path loads the current keys once per
//! delivery without a lock or a reference-count write.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};
use hmac::{Hmac, KeyInit};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// HMAC-SHA256, as GitHub signs deliveries.
pub type HmacSha256 = Hmac<Sha256>;

/// The keys a [`Secret`] holds now, each with its HMAC key schedule computed once (a webhook
/// secret signs every delivery; a delivery's HMAC starts from a copy of it).
#[derive(Default)]
pub struct Keys {
    current: Option<Arc<[u8]>>,
    previous: Option<Arc<[u8]>>,
    macs: (Option<HmacSha256>, Option<HmacSha256>),
}

fn mac(key: &Option<Arc<[u8]>>) -> Option<HmacSha256> {
    key.as_deref()
        .map(|k| HmacSha256::new_from_slice(k).expect("HMAC accepts keys of any length"))
}

impl Keys {
    fn new(current: Option<Arc<[u8]>>, previous: Option<Arc<[u8]>>) -> Self {
        Self {
            macs: (mac(&current), mac(&previous)),
            current,
            previous,
        }
    }

    /// The HMAC states keyed with the current value and the previous one.
    pub fn macs(&self) -> (Option<&HmacSha256>, Option<&HmacSha256>) {
        (self.macs.0.as_ref(), self.macs.1.as_ref())
    }

    /// The current value.
    pub fn current(&self) -> Option<&[u8]> {
        self.current.as_deref()
    }

    /// The value it replaced, while the rotation window lasts.
    pub fn previous(&self) -> Option<&[u8]> {
        self.previous.as_deref()
    }
}

/// A secret the router checks or sends, shared by everything that uses it (cheap to clone) and
/// swapped in place when its file changes. Unset (`None`) means "none configured".
///
/// # Examples
///
/// ```
/// use webhook_router::secrets::Secret;
///
/// let token = Secret::from(Some("old"));
/// assert!(token.accepts(b"old"));
/// token.replace(b"new".as_slice().into(), true);
/// assert!(token.accepts(b"new") && token.accepts(b"old"), "both during the window");
/// token.retire_previous();
/// assert!(token.accepts(b"new") && !token.accepts(b"old"));
/// assert!(!Secret::default().is_set());
/// ```
#[derive(Clone, Default)]
pub struct Secret(Arc<ArcSwap<Keys>>);

impl Secret {
    /// A secret with this value (or none).
    pub fn new(value: Option<Arc<[u8]>>) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(Keys::new(value, None))))
    }

    /// Whether one is configured.
    pub fn is_set(&self) -> bool {
        self.0.load().current.is_some()
    }

    /// The keys now, without a lock or a reference-count write (hold it briefly).
    pub fn keys(&self) -> Guard<Arc<Keys>> {
        self.0.load()
    }

    /// The current value, to send (a token) or to sign with.
    pub fn current(&self) -> Option<Arc<[u8]>> {
        self.0.load().current.clone()
    }

    /// The current value as text (a token read from a file is UTF-8 in practice; anything else
    /// is replaced, visibly).
    pub fn current_text(&self) -> Option<String> {
        self.current()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    /// Whether `presented` is the current value or, during a rotation window, the previous one.
    /// Constant-time in the values' contents (`subtle`); an empty value never matches.
    pub fn accepts(&self, presented: &[u8]) -> bool {
        if presented.is_empty() {
            return false;
        }
        let keys = self.keys();
        let matches = |v: Option<&[u8]>| v.is_some_and(|v| bool::from(v.ct_eq(presented)));
        // Both compared, so that the time does not say which one matched.
        matches(keys.current()) | matches(keys.previous())
    }

    /// A new value; with `keep_previous`, the one it replaces stays accepted until
    /// [`retire_previous`](Self::retire_previous). (One writer at a time: the reloader.)
    pub fn replace(&self, value: Arc<[u8]>, keep_previous: bool) {
        let old = self.0.load_full();
        let previous = if keep_previous {
            old.current.clone()
        } else {
            None
        };
        self.0.store(Arc::new(Keys::new(Some(value), previous)));
    }

    /// Ends the rotation window: only the current value is accepted.
    pub fn retire_previous(&self) {
        let current = self.0.load().current.clone();
        self.0.store(Arc::new(Keys::new(current, None)));
    }
}

impl From<Option<&str>> for Secret {
    fn from(value: Option<&str>) -> Self {
        Self::new(value.map(|v| Arc::from(v.as_bytes())))
    }
}

impl From<Option<String>> for Secret {
    fn from(value: Option<String>) -> Self {
        Self::new(value.map(|v| Arc::from(v.into_bytes())))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self.keys();
        f.debug_struct("Secret")
            .field("current", &keys.current.as_ref().map(|_| "<redacted>"))
            .field("previous", &keys.previous.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A secret file's value: its contents without one trailing line break (`\n` or `\r\n`, as
/// `echo` and editors leave), refused if empty. `flag` names it in the error.
///
/// # Examples
///
/// ```
/// let dir = std::env::temp_dir().join(format!("secret-doc-{}", std::process::id()));
/// std::fs::write(&dir, "s3cret\n").unwrap();
/// assert_eq!(webhook_router::secrets::read_file("--x-file", &dir).unwrap(), b"s3cret");
/// std::fs::write(&dir, "\n").unwrap();
/// assert!(webhook_router::secrets::read_file("--x-file", &dir).is_err());
/// std::fs::remove_file(&dir).unwrap();
/// ```
pub fn read_file(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    let mut bytes = std::fs::read(path)
        .map_err(|e| format!("{flag} {}: cannot read it: {e}", path.display()))?;
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    if bytes.is_empty() {
        return Err(format!("{flag} {}: the file is empty", path.display()));
    }
    Ok(bytes)
}
