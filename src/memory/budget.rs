//! The payload budget: the bytes of payloads the registry holds, reserved as capacity is (one
//! compare-and-swap on one counter when a payload is stored, given back when it leaves), against
//! `payload_budget`. No lock: the counter sits on a cache line of its own, since every admission
//! that carries a payload and every completion of one writes it.

use crate::api::outcome::Rejection;
use crate::sync::{AtomicU64, CachePadded, Gauge, Ordering};

/// Bytes and count of the payloads held, and the limit.
pub(crate) struct Budget {
    /// Bytes held ([`Payload::size`](crate::Payload::size) summed), decided by CAS.
    bytes: CachePadded<AtomicU64>,
    /// Payloads held (statistics: nothing decides on it).
    count: Gauge,
    limit: u64,
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            bytes: CachePadded::new(AtomicU64::new(0)),
            count: Gauge::new(),
            limit,
        }
    }

    /// Reserves `size` bytes for one payload about to be stored, counting `credit` bytes as
    /// available: a payload the same step replaces (and then [`release`](Self::release)s), so
    /// that taking a pair's place never needs more than it frees. Refused, with the bytes seen
    /// held, if those plus `size` less `credit` would pass the limit; nothing is reserved then.
    /// (Between this and the release of the credit both payloads are counted, as both exist.)
    #[inline]
    pub(crate) fn reserve(&self, size: u64, credit: u64) -> Result<(), Rejection> {
        let limit = self.limit;
        // AcqRel: the bound needs only that every reservation and release is one read-modify-write
        // in this counter's single modification order (which any RMW gives); Acquire/Release also
        // orders a payload's release before the reservation that reuses its bytes, as capacity's.
        let reserved = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                let after = held.checked_add(size)?;
                (after.saturating_sub(credit) <= limit).then_some(after)
            });
        match reserved {
            Ok(_) => {
                self.count.inc();
                Ok(())
            }
            Err(held) => Err(Rejection::PayloadBudget {
                held,
                needed: size,
                limit,
            }),
        }
    }

    /// Gives back the `size` bytes of one payload the registry no longer holds.
    #[inline]
    pub(crate) fn release(&self, size: u64) {
        // AcqRel: see `reserve`.
        self.bytes.fetch_sub(size, Ordering::AcqRel);
        self.count.dec();
    }

    /// Bytes held now.
    pub(crate) fn bytes(&self) -> u64 {
        // Acquire: pairs with the AcqRel updates; a gauge no older than the last change seen.
        self.bytes.load(Ordering::Acquire)
    }

    /// Payloads held now.
    pub(crate) fn count(&self) -> usize {
        self.count.get()
    }

    /// The limit.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }
}
