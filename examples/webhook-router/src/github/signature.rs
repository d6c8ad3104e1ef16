//! The `X-Hub-Signature-256` HMAC of a delivery's body.

use std::fmt;

use axum::http::HeaderMap;
use hmac::{KeyInit, Mac};

use super::headers::*;
use crate::secrets::HmacSha256;

/// The `X-Hub-Signature-256` value GitHub would send for `body` under `secret`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Why a delivery's signature was refused (all answered with 401).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignatureError {
    /// A secret is configured but the delivery carries no `X-Hub-Signature-256`.
    Missing,
    /// The header is not `sha256=` followed by 64 hex digits, or appears twice.
    Malformed,
    /// The HMAC does not match the body.
    Mismatch,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => write!(f, "missing X-Hub-Signature-256 header"),
            Self::Malformed => write!(
                f,
                "X-Hub-Signature-256 is not one `sha256=` followed by 64 hex digits"
            ),
            Self::Mismatch => write!(f, "X-Hub-Signature-256 does not match the payload"),
        }
    }
}

/// The digest an `X-Hub-Signature-256` header announces, checked for form only (the body is not
/// needed for that, so a malformed header is refused before the body is read).
pub fn signature(headers: &HeaderMap) -> Result<[u8; 32], SignatureError> {
    let mut values = headers.get_all(SIGNATURE_HEADER).iter();
    let value = values.next().ok_or(SignatureError::Missing)?;
    if values.next().is_some() {
        return Err(SignatureError::Malformed);
    }
    let hex_digest = value
        .as_bytes()
        .strip_prefix(b"sha256=")
        .ok_or(SignatureError::Malformed)?;
    let mut expected = [0u8; 32];
    hex::decode_to_slice(hex_digest, &mut expected).map_err(|_| SignatureError::Malformed)?;
    Ok(expected)
}

/// An HMAC-SHA256 computed over a body as it arrives, chunk by chunk: under the secret, and
/// during a rotation window under the previous one too.
pub struct Verifier {
    current: HmacSha256,
    previous: Option<HmacSha256>,
}

fn hmac(secret: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length")
}

impl Verifier {
    /// Starts the HMAC under `secret`.
    pub fn new(secret: &[u8]) -> Self {
        Self::rotating(secret, None)
    }

    /// Starts the HMAC under `secret`, and under `previous` if given (a body signed with either
    /// verifies).
    pub fn rotating(secret: &[u8], previous: Option<&[u8]>) -> Self {
        Self {
            current: hmac(secret),
            previous: previous.map(hmac),
        }
    }

    /// Starts from HMAC states keyed already (a [`Keys`](crate::secrets::Keys)' own).
    pub fn keyed(current: &HmacSha256, previous: Option<&HmacSha256>) -> Self {
        Self {
            current: current.clone(),
            previous: previous.cloned(),
        }
    }

    /// Feeds the next chunk of the body.
    pub fn update(&mut self, chunk: &[u8]) {
        self.current.update(chunk);
        if let Some(p) = &mut self.previous {
            p.update(chunk);
        }
    }

    /// Compares with the announced digest, in constant time (`Mac::verify_slice`), under both
    /// secrets when there are two (both compared, whichever matches).
    pub fn verify(self, expected: &[u8; 32]) -> Result<(), SignatureError> {
        let current = self.current.verify_slice(expected).is_ok();
        let previous = self
            .previous
            .is_some_and(|p| p.verify_slice(expected).is_ok());
        if current | previous {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

/// Checks a delivery's HMAC-SHA256 against `secret` (header and whole body at once).
pub fn verify(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), SignatureError> {
    let expected = signature(headers)?;
    let mut v = Verifier::new(secret);
    v.update(body);
    v.verify(&expected)
}
