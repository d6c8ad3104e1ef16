//! A worker's credential: minted by the router that launches the worker, verified by any replica
//! without a lookup. The design (why an HMAC, what it binds, where the key comes from, what never
//! reaches a worker) is in [`crate::docs::worker_protocol`].
//!
//! [`WorkerKey`] is the router key every replica shares (`--worker-key-file`, or drawn at random
//! for a single replica); [`WorkerKey::mint`] makes a [`Credential`] for a worker id and the
//! fencing token of the assignment that created the worker; [`WorkerKey::verify`] checks one
//! presented as `Authorization: Bearer ...` and says whose it is ([`Verified`]), or why not
//! ([`CredentialError`]).
//!
//! The format, `v1.<worker id>.<token>.<64 lowercase hex digits>`, where the digits are
//! `HMAC-SHA256(key, "worker-registry worker v1" NUL id NUL token)`, ids and tokens in decimal, is
//! pinned by a known-answer test computed with Python's `hmac` module.

use crate::secrets::{HmacSha256, Secret};

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use hmac::Mac;
use rand::RngCore;
use worker_registry::{FencingToken, WorkerId};

/// The credential format's version prefix.
pub const VERSION: &str = "v1";

/// What the MAC covers before the id and the token: the format and its use, so that a MAC made
/// under the same key for anything else never passes for a credential.
const DOMAIN: &[u8] = b"worker-registry worker v1\0";

/// The shortest key accepted from a file: 32 bytes (the HMAC-SHA256 key size that gives its full
/// strength).
pub const MIN_KEY_BYTES: usize = 32;

/// The length of a random key ([`WorkerKey::random`]).
pub const RANDOM_KEY_BYTES: usize = 32;

/// The longest credential looked at: `v1`, the largest id (14 digits) and token (20 digits), 64
/// hex digits and three dots come to 103 characters; anything longer is refused unparsed.
pub const MAX_CREDENTIAL_LEN: usize = 128;

/// The router key that mints and verifies worker credentials (see the [module documentation](self)).
///
/// Cloning shares it: a key read from `--worker-key-file` is replaced in place when the file
/// changes ([`secret`](Self::secret), watched by [`crate::reload`] with
/// [`Rotation::UntilNextChange`](crate::reload::Rotation::UntilNextChange)). New credentials are
/// minted under the new key; one minted under the key it replaced keeps verifying until the
/// next change (a worker keeps its credential for life). Changing the file twice retires the
/// first key: the way to shut out a leaked one, at the cost of its workers (answered `401`, they
/// exit and their work is re-dispatched).
#[derive(Clone)]
pub struct WorkerKey {
    /// The current key and the one it replaced, each with its HMAC key schedule computed once;
    /// each mint or verification starts from a copy.
    secret: Secret,
    /// Whether it was drawn at random by this process (fit only for a single replica).
    random: bool,
}

impl WorkerKey {
    /// A key drawn from the operating system's random source: right for a single replica only,
    /// since no other process can verify what it mints (see [`is_random`](Self::is_random)).
    pub fn random() -> Self {
        let mut key = [0u8; RANDOM_KEY_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut key);
        let mut k = Self::new(&key);
        k.random = true;
        k
    }

    /// The key in `bytes`, refused if shorter than [`MIN_KEY_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        if bytes.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort {
                len: bytes.len(),
                min: MIN_KEY_BYTES,
            });
        }
        Ok(Self::new(bytes))
    }

    /// The key in the file at `path` (`--worker-key-file`): its bytes, less one trailing newline
    /// (`\n` or `\r\n`, as an editor or `echo` leaves), at least [`MIN_KEY_BYTES`] of them.
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        let bytes = std::fs::read(path).map_err(|e| KeyError::Unreadable {
            path: path.display().to_string(),
            error: e.to_string(),
        })?;
        let key = bytes
            .strip_suffix(b"\r\n")
            .or_else(|| bytes.strip_suffix(b"\n"))
            .unwrap_or(&bytes);
        Self::from_bytes(key).map_err(|e| match e {
            KeyError::TooShort { len, min } => KeyError::TooShortFile {
                path: path.display().to_string(),
                len,
                min,
            },
            other => other,
        })
    }

    fn new(key: &[u8]) -> Self {
        Self {
            secret: Secret::new(Some(Arc::from(key))),
            random: false,
        }
    }

    /// The key as a swappable secret, for [`crate::reload`] to replace when its file changes
    /// (values it loads pass [`check_key`] first).
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    /// Whether this process drew the key at random ([`random`](Self::random)): another replica
    /// cannot verify its credentials, so with a shared backend the router warns.
    pub fn is_random(&self) -> bool {
        self.random
    }

    /// The credential of `worker`, created by the assignment whose fencing token is `token`.
    pub fn mint(&self, worker: WorkerId, token: FencingToken) -> Credential {
        let keys = self.secret.keys();
        let current = keys
            .macs()
            .0
            .expect("a worker key always has a current value");
        let tag = tag(current, worker, token).finalize().into_bytes();
        Credential(format!("{VERSION}.{worker}.{token}.{}", hex::encode(tag)))
    }

    /// Checks a credential as presented (the `Authorization: Bearer` value): its format, and its
    /// MAC under the current key or the one it replaced, each compared in constant time. On
    /// success, whose it is.
    pub fn verify(&self, presented: &str) -> Result<Verified, CredentialError> {
        let (worker, token, mac) = parse(presented)?;
        let keys = self.secret.keys();
        let (current, previous) = keys.macs();
        let under = |key: Option<&HmacSha256>| {
            key.is_some_and(|k| tag(k, worker, token).verify_slice(&mac).is_ok())
        };
        if under(current) || under(previous) {
            Ok(Verified { worker, token })
        } else {
            Err(CredentialError::Mismatch { worker })
        }
    }
}

/// The MAC of a credential for `worker` and `token` under `key`, not finalized.
fn tag(key: &HmacSha256, worker: WorkerId, token: FencingToken) -> HmacSha256 {
    let mut mac = key.clone();
    mac.update(DOMAIN);
    mac.update(worker.to_string().as_bytes());
    mac.update(b"\0");
    mac.update(token.to_string().as_bytes());
    mac
}

/// Whether `value` can be a worker key (at least [`MIN_KEY_BYTES`]): the check a reloaded
/// `--worker-key-file` passes before it replaces the key.
pub fn check_key(value: &[u8]) -> Result<(), String> {
    WorkerKey::from_bytes(value)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

impl fmt::Debug for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerKey")
            .field("random", &self.random)
            .finish_non_exhaustive()
    }
}

/// The parts of a well-formed credential: the id, the token, the MAC's 32 bytes.
fn parse(presented: &str) -> Result<(WorkerId, FencingToken, Vec<u8>), CredentialError> {
    let malformed = |why| Err(CredentialError::Malformed { why });
    if presented.len() > MAX_CREDENTIAL_LEN {
        return malformed("longer than any credential");
    }
    let mut parts = presented.split('.');
    let (Some(version), Some(id), Some(token), Some(tag), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return malformed("not four parts separated by dots");
    };
    if version != VERSION {
        return Err(CredentialError::Version {
            found: version.to_owned(),
        });
    }
    let Ok(worker) = id.parse::<WorkerId>() else {
        return malformed("the worker id is not a decimal id");
    };
    let Some(token) = canonical_u64(token).map(FencingToken::from_raw) else {
        return malformed("the token is not a decimal number");
    };
    if token.worker() != worker {
        return malformed("the token was not issued to that worker");
    }
    let lower_hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    if tag.len() != 64 || !tag.bytes().all(lower_hex) {
        return malformed("the MAC is not 64 lowercase hex digits");
    }
    let Ok(tag) = hex::decode(tag) else {
        return malformed("the MAC is not 64 lowercase hex digits");
    };
    Ok((worker, token, tag))
}

/// `s` as a `u64` if it is written the one way [`FencingToken`]'s `Display` writes it: digits
/// only, no sign, no leading zero.
fn canonical_u64(s: &str) -> Option<u64> {
    let digits = !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    let leading_zero = s.len() > 1 && s.starts_with('0');
    if !digits || leading_zero {
        return None;
    }
    s.parse().ok()
}

/// A worker's credential (handed to it in `WORKER_CREDENTIAL`). Its `Debug` shows no MAC.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(String);

impl Credential {
    /// The credential as the worker presents it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.0.rsplit_once('.').map_or("", |(head, _)| head);
        write!(f, "Credential({shown}.<redacted>)")
    }
}

/// Whose a verified credential is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// The worker.
    pub worker: WorkerId,
    /// The fencing token of the assignment that created it.
    pub token: FencingToken,
}

/// Why a credential was refused (answered 401, and the worker ends: it was launched wrong).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CredentialError {
    /// Not of the credential's form.
    Malformed {
        /// What is wrong with it.
        why: &'static str,
    },
    /// Of another version of the format than [`VERSION`].
    Version {
        /// The version it names.
        found: String,
    },
    /// Well-formed, but not minted under this key for that worker and token.
    Mismatch {
        /// The worker it names.
        worker: WorkerId,
    },
}

impl fmt::Display for CredentialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed { why } => write!(f, "malformed worker credential: {why}"),
            Self::Version { found } => write!(
                f,
                "worker credential of version {found:?}, this router speaks {VERSION:?}"
            ),
            Self::Mismatch { worker } => write!(
                f,
                "the credential of worker {worker} was not minted under this router's worker key \
                 (replicas must share --worker-key-file)"
            ),
        }
    }
}

impl std::error::Error for CredentialError {}

/// Why a worker key could not be had.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The key file could not be read.
    Unreadable {
        /// The file.
        path: String,
        /// What reading it said.
        error: String,
    },
    /// The key is shorter than [`MIN_KEY_BYTES`].
    TooShort {
        /// Its length in bytes.
        len: usize,
        /// The shortest accepted.
        min: usize,
    },
    /// The key file holds fewer than [`MIN_KEY_BYTES`] (a trailing newline not counted).
    TooShortFile {
        /// The file.
        path: String,
        /// Its key's length in bytes.
        len: usize,
        /// The shortest accepted.
        min: usize,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable { path, error } => {
                write!(f, "cannot read the worker key file {path}: {error}")
            }
            Self::TooShort { len, min } => {
                write!(f, "a worker key of {len} bytes; at least {min} are needed")
            }
            Self::TooShortFile { path, len, min } => write!(
                f,
                "the worker key file {path} holds {len} bytes; at least {min} are needed \
                 (e.g. `head -c 32 /dev/urandom > {path}`)"
            ),
        }
    }
}

impl std::error::Error for KeyError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> WorkerKey {
        WorkerKey::from_bytes(&[byte; 32]).unwrap()
    }

    fn token(worker: u64, seq: u64) -> FencingToken {
        FencingToken::new(WorkerId::new(worker), seq).unwrap()
    }

    /// The format, pinned against an independent implementation: Python's
    /// `hmac.new(b"k" * 32, b"worker-registry worker v1\0" + b"7\0" + b"7340033", "sha256")`.
    #[test]
    fn known_answer() {
        let t = token(7, 1);
        assert_eq!(t.get(), 7_340_033);
        let c = key(b'k').mint(WorkerId::new(7), t);
        assert_eq!(
            c.as_str(),
            "v1.7.7340033.9de65b4a6d96a5bb42aa91ed844439cd82303aaf28b683ef9beb87a24f2145b3"
        );
        assert!(c.as_str().len() <= MAX_CREDENTIAL_LEN);
    }

    #[test]
    fn a_replaced_key_keeps_verifying_until_the_next_change() {
        let (w, t) = (WorkerId::new(42), token(42, 3));
        let k = key(1);
        let shared = k.clone();
        let old = k.mint(w, t);
        k.secret().replace(Arc::from([2u8; 32].as_slice()), true);
        let new = shared.mint(w, t);
        assert_ne!(
            old, new,
            "minted under the new key, seen through every clone"
        );
        assert_eq!(new, key(2).mint(w, t));
        assert!(
            shared.verify(old.as_str()).is_ok(),
            "the old key still verifies"
        );
        assert!(shared.verify(new.as_str()).is_ok());
        k.secret().replace(Arc::from([3u8; 32].as_slice()), true);
        assert_eq!(
            shared.verify(old.as_str()),
            Err(CredentialError::Mismatch { worker: w }),
            "a second change retires the first key"
        );
        assert!(shared.verify(new.as_str()).is_ok());
        assert!(check_key(&[0; 31]).is_err() && check_key(&[0; 32]).is_ok());
    }

    #[test]
    fn a_minted_credential_verifies_under_its_key_only() {
        let (w, t) = (WorkerId::new(42), token(42, 3));
        let c = key(1).mint(w, t);
        assert_eq!(
            key(1).verify(c.as_str()),
            Ok(Verified {
                worker: w,
                token: t
            })
        );
        assert_eq!(
            key(2).verify(c.as_str()),
            Err(CredentialError::Mismatch { worker: w })
        );
        let (a, b) = (WorkerKey::random(), WorkerKey::random());
        assert!(a.is_random() && !key(1).is_random());
        assert!(a.verify(a.mint(w, t).as_str()).is_ok());
        assert!(
            b.verify(a.mint(w, t).as_str()).is_err(),
            "two random keys differ"
        );
    }

    /// The largest id and token fit under the length cap.
    #[test]
    fn the_largest_credential_fits() {
        let w = WorkerId::new(WorkerId::MAX);
        let t = token(WorkerId::MAX, FencingToken::MAX_SEQ);
        let c = key(1).mint(w, t);
        assert!(c.as_str().len() <= MAX_CREDENTIAL_LEN, "{}", c.as_str());
        assert!(key(1).verify(c.as_str()).is_ok());
    }

    /// Changing any part of a credential makes it fail: the MAC binds the id and the token.
    #[test]
    fn every_part_is_bound() {
        let k = key(1);
        let (w, t) = (WorkerId::new(42), token(42, 3));
        let c = k.mint(w, t);
        let tag = c.as_str().rsplit_once('.').unwrap().1.to_owned();
        // Another assignment of the same worker, with this MAC.
        let other_token = format!("v1.42.{}.{tag}", token(42, 4));
        assert_eq!(
            k.verify(&other_token),
            Err(CredentialError::Mismatch { worker: w })
        );
        // Another worker (with its own token), with this MAC.
        let other_worker = format!("v1.43.{}.{tag}", token(43, 3));
        assert_eq!(
            k.verify(&other_worker),
            Err(CredentialError::Mismatch {
                worker: WorkerId::new(43)
            })
        );
        // One hex digit of the MAC changed.
        let mut flipped = c.as_str().to_owned();
        let last = flipped.pop().unwrap();
        flipped.push(if last == '0' { '1' } else { '0' });
        assert_eq!(
            k.verify(&flipped),
            Err(CredentialError::Mismatch { worker: w })
        );
    }

    #[test]
    fn malformed_credentials_are_refused_with_why() {
        let k = key(1);
        let c = k.mint(WorkerId::new(42), token(42, 3));
        let tag = c.as_str().rsplit_once('.').unwrap().1.to_owned();
        let t = token(42, 3);
        let malformed = [
            String::new(),
            "v1".to_owned(),
            format!("v1.42.{t}"),
            format!("v1.42.{t}.{tag}.x"),
            format!("v1.042.{t}.{tag}"),
            format!("v1.+42.{t}.{tag}"),
            format!("v1.42.0{t}.{tag}"),
            format!("v1.42.-{t}.{tag}"),
            format!("v1.42..{tag}"),
            // The token of another worker, under this worker's id.
            format!("v1.42.{}.{tag}", token(43, 3)),
            format!("v1.42.{t}.{}", tag.to_uppercase()),
            format!("v1.42.{t}.{}", &tag[..63]),
            format!("v1.42.{t}.{tag}0"),
            format!("v1.42.{t}.{}", "g".repeat(64)),
            format!("v1.42.{t}.{tag}{}", "0".repeat(MAX_CREDENTIAL_LEN)),
        ];
        for bad in &malformed {
            assert!(
                matches!(k.verify(bad), Err(CredentialError::Malformed { .. })),
                "{bad:?}: {:?}",
                k.verify(bad)
            );
        }
        assert_eq!(
            k.verify(&format!("v2.42.{t}.{tag}")),
            Err(CredentialError::Version {
                found: "v2".to_owned()
            })
        );
    }

    #[test]
    fn the_debug_forms_show_no_secret() {
        let k = key(1);
        let c = k.mint(WorkerId::new(42), token(42, 3));
        let tag = c.as_str().rsplit_once('.').unwrap().1.to_owned();
        assert!(!format!("{c:?}").contains(&tag));
        assert!(format!("{c:?}").contains("v1.42."));
        assert_eq!(format!("{k:?}"), "WorkerKey { random: false, .. }");
    }

    #[test]
    fn keys_from_files() {
        let dir = std::env::temp_dir().join(format!("worker-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (w, t) = (WorkerId::new(42), token(42, 3));
        // One trailing newline is not part of the key.
        for (name, contents) in [("lf", b"\n".as_slice()), ("crlf", b"\r\n"), ("none", b"")] {
            let path = dir.join(name);
            std::fs::write(&path, [[b'k'; 32].as_slice(), contents].concat()).unwrap();
            let from_file = WorkerKey::from_file(&path).unwrap();
            assert!(!from_file.is_random());
            assert!(
                key(b'k').verify(from_file.mint(w, t).as_str()).is_ok(),
                "{name}"
            );
        }
        let short = dir.join("short");
        std::fs::write(&short, [b'k'; 31]).unwrap();
        assert!(matches!(
            WorkerKey::from_file(&short),
            Err(KeyError::TooShortFile {
                len: 31,
                min: 32,
                ..
            })
        ));
        assert!(matches!(
            WorkerKey::from_file(&dir.join("absent")),
            Err(KeyError::Unreadable { .. })
        ));
        assert_eq!(
            WorkerKey::from_bytes(&[0; 16]).unwrap_err(),
            KeyError::TooShort { len: 16, min: 32 }
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
