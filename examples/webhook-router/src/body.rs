//! Reading a delivery's body under three limits, with its HMAC computed as it arrives:
//!
//! * a size cap (GitHub's 25 MiB): a `Content-Length` above it is refused before anything is read,
//!   a body that grows past it as soon as it does;
//! * a time limit for the whole body (a client trickling bytes holds nothing for long);
//! * a memory budget shared by every body being read ([`BodyBudget`]): buffer space is reserved
//!   as it is allocated, and a delivery that would exceed the budget is refused (503) at once
//!   instead of waiting. So the memory held by bodies in flight never exceeds the budget, however
//!   many connections announce large ones, and an attacker holds budget only for bytes actually
//!   sent, for at most the time limit.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::github::{SignatureError, Verifier};

/// Has the allocator give large buffers back to the operating system when they are freed.
///
/// glibc's malloc raises its mmap threshold each time a large mmapped block is freed, so after a
/// burst of large bodies later ones come from the heap, whose freed memory the process keeps:
/// measured, 40 hostile 25 MiB uploads in a row left the router at 94 MiB resident where it had
/// started at 13 MiB. A fixed threshold (which also disables that adjustment) keeps every body
/// buffer above it in its own mapping, unmapped when the delivery is done. A no-op elsewhere
/// than glibc. Call it once, first thing in `main`.
pub fn return_large_buffers_to_the_os() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters, and takes the allocator's own locks.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

/// The default memory budget for bodies being read at once: 64 MiB (two deliveries at GitHub's
/// cap, or hundreds of ordinary ones).
pub const DEFAULT_BODY_BUDGET: usize = 64 * 1024 * 1024;
/// The default time a client has to send a whole body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Budget units are KiB, so that the semaphore's permit count stays small.
const UNIT: usize = 1024;

/// The memory budget shared by all bodies being read (cheap to clone).
#[derive(Debug, Clone)]
pub struct BodyBudget {
    permits: Arc<Semaphore>,
    total: usize,
}

impl BodyBudget {
    /// A budget of `bytes` (at least one maximal delivery should fit for it to be useful).
    pub fn new(bytes: usize) -> Self {
        let units = bytes.div_ceil(UNIT).clamp(1, Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(units)),
            total: units * UNIT,
        }
    }

    /// Bytes reserved by bodies being read now.
    pub fn in_use(&self) -> usize {
        (self.total / UNIT - self.permits.available_permits()) * UNIT
    }

    /// The whole budget in bytes.
    pub fn total(&self) -> usize {
        self.total
    }
}

/// How a body is read.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    /// The largest body accepted.
    pub max: usize,
    /// The time a client has to send it all.
    pub timeout: Duration,
    /// The memory budget.
    pub budget: BodyBudget,
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Larger than the cap (413).
    TooLarge {
        /// The cap.
        max: usize,
    },
    /// Not all sent within the time limit (408).
    Timeout(Duration),
    /// The memory budget for bodies being read is used up (503, retry).
    Overloaded,
    /// The connection failed mid-body (400).
    Broken(String),
    /// The HMAC does not match (401).
    Signature(SignatureError),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLarge { max } => write!(
                f,
                "the payload is larger than {max} bytes, GitHub's limit for a webhook delivery"
            ),
            Self::Timeout(d) => write!(f, "the body was not received within {d:?}"),
            Self::Overloaded => write!(
                f,
                "too many deliveries are being received at once; send this one again shortly"
            ),
            Self::Broken(e) => write!(f, "the body could not be read: {e}"),
            Self::Signature(e) => e.fmt(f),
        }
    }
}

/// A body read into memory, holding its share of the budget until dropped.
pub struct ReadBody {
    /// The bytes.
    pub bytes: Vec<u8>,
    _reserved: Option<OwnedSemaphorePermit>,
}

impl ReadBody {
    /// The bytes as a shared buffer (what a [`Payload`](worker_registry::Payload) holds), their
    /// share of the read budget given back: from here on the registry's payload budget bounds
    /// them. The buffer is first shrunk to the body's length (it grew by doubling; glibc shrinks
    /// in place), so that what the budget counts is what is held.
    pub fn into_bytes(self) -> Bytes {
        let mut bytes = self.bytes;
        bytes.shrink_to_fit();
        Bytes::from(bytes)
    }
}

/// Reads `body` under `limits`, feeding `verify` (the HMAC and the digest the header announced)
/// as it goes and checking it at the end.
pub async fn read(
    body: Body,
    limits: &BodyLimits,
    verify: Option<(Verifier, [u8; 32])>,
) -> Result<ReadBody, BodyError> {
    match tokio::time::timeout(limits.timeout, read_all(body, limits, verify)).await {
        Ok(r) => r,
        Err(_) => Err(BodyError::Timeout(limits.timeout)),
    }
}

async fn read_all(
    mut body: Body,
    limits: &BodyLimits,
    mut verify: Option<(Verifier, [u8; 32])>,
) -> Result<ReadBody, BodyError> {
    let mut bytes: Vec<u8> = Vec::new();
    let mut reserved: Option<OwnedSemaphorePermit> = None;
    let mut reserved_units = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Broken(e.to_string()))?;
        let Ok(chunk) = frame.into_data() else {
            continue; // trailers
        };
        if bytes.len() + chunk.len() > limits.max {
            return Err(BodyError::TooLarge { max: limits.max });
        }
        if let Some((v, _)) = verify.as_mut() {
            v.update(&chunk);
        }
        // Grow by doubling, but never past the cap, and reserve what the buffer will hold before
        // allocating it.
        let need = bytes.len() + chunk.len();
        if need > bytes.capacity() {
            let cap = need.max(bytes.capacity() * 2).clamp(8 * UNIT, limits.max);
            let units = cap.div_ceil(UNIT);
            if units > reserved_units {
                let more =
                    u32::try_from(units - reserved_units).map_err(|_| BodyError::Overloaded)?;
                let permit = limits
                    .budget
                    .permits
                    .clone()
                    .try_acquire_many_owned(more)
                    .map_err(|_| BodyError::Overloaded)?;
                match reserved.as_mut() {
                    Some(r) => r.merge(permit),
                    None => reserved = Some(permit),
                }
                reserved_units = units;
            }
            bytes.reserve_exact(cap - bytes.len());
        }
        bytes.extend_from_slice(&chunk);
    }
    if let Some((v, expected)) = verify {
        v.verify(&expected).map_err(BodyError::Signature)?;
    }
    Ok(ReadBody {
        bytes,
        _reserved: reserved,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, budget: usize) -> BodyLimits {
        BodyLimits {
            max,
            timeout: Duration::from_secs(1),
            budget: BodyBudget::new(budget),
        }
    }

    #[tokio::test]
    async fn reads_within_the_cap_and_refuses_beyond_it() {
        let l = limits(100_000, 1 << 20);
        let ok = read(Body::from(vec![b'x'; 100_000]), &l, None)
            .await
            .unwrap();
        assert_eq!(ok.bytes.len(), 100_000);
        assert!(l.budget.in_use() >= 100_000);
        drop(ok);
        assert_eq!(l.budget.in_use(), 0, "the budget is given back");
        let big = read(Body::from(vec![b'x'; 100_001]), &l, None).await;
        assert_eq!(big.err(), Some(BodyError::TooLarge { max: 100_000 }));
    }

    #[tokio::test]
    async fn the_budget_is_shared_and_refuses_instead_of_waiting() {
        let l = limits(1 << 20, 1 << 20);
        let first = read(Body::from(vec![b'x'; 600_000]), &l, None)
            .await
            .unwrap();
        let second = read(Body::from(vec![b'x'; 600_000]), &l, None).await;
        assert_eq!(second.err(), Some(BodyError::Overloaded));
        drop(first);
        assert!(read(Body::from(vec![b'x'; 600_000]), &l, None)
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn the_hmac_is_checked_on_the_streamed_body() {
        let l = limits(1 << 20, 1 << 20);
        let body = b"{\"zen\":\"Design for failure.\"}".to_vec();
        let sig = crate::github::sign(b"k", &body);
        let mut expected = [0u8; 32];
        hex::decode_to_slice(&sig["sha256=".len()..], &mut expected).unwrap();
        let ok = read(
            Body::from(body.clone()),
            &l,
            Some((Verifier::new(b"k"), expected)),
        )
        .await;
        assert!(ok.is_ok());
        let bad = read(
            Body::from(body),
            &l,
            Some((Verifier::new(b"other"), expected)),
        )
        .await;
        assert_eq!(
            bad.err(),
            Some(BodyError::Signature(SignatureError::Mismatch))
        );
    }
}
