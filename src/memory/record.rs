//! A worker's record: what the in-memory registry keeps per worker, and its display copy.

use std::time::{Duration, SystemTime};

use super::cell::StateCell;
use crate::api::error::RegistryError;
use crate::api::ids::{FencingToken, Target, WorkerId};
use crate::api::snapshot::WorkerInfo;
use crate::api::status::{Status, WorkerKind};
use crate::state::Word;
use crate::sync::{AtomicU64, Ordering};

/// What the registry keeps per worker. Shared as an `Arc` between the worker map, the target map,
/// the claims it holds and any [`WorkerHandle`](crate::WorkerHandle); immutable but for its atomics.
pub(crate) struct WorkerRecord {
    pub(crate) id: WorkerId,
    pub(crate) target: Option<Target>,
    pub(crate) started_wall: SystemTime,
    pub(crate) started_ms: u64,
    pub(crate) state: StateCell,
    /// Assignments received (the low bits of the [`FencingToken`]).
    assignments: AtomicU64,
    /// 1 + the time of death in ms, or 0 while alive or before the killer recorded it.
    died_at: AtomicU64,
    /// 1 + when the brake last marked it suspect, in ms.
    suspect_since: AtomicU64,
    /// 1 + when its drain deadline passes, in ms; 0 if it was never drained.
    drain_deadline: AtomicU64,
    /// In-flight claims it holds (stuck ones included), so that its death tells the sweep whether
    /// there is anything to release.
    claims: AtomicU64,
}

impl WorkerRecord {
    pub(crate) fn new(
        id: WorkerId,
        target: Option<Target>,
        now_ms: u64,
        wall: SystemTime,
        assigned: bool,
        holds_claim: bool,
    ) -> Self {
        Self {
            id,
            target,
            started_wall: wall,
            started_ms: now_ms,
            state: StateCell::new(Word::new(now_ms, assigned)),
            assignments: AtomicU64::new(u64::from(assigned)),
            died_at: AtomicU64::new(0),
            suspect_since: AtomicU64::new(0),
            drain_deadline: AtomicU64::new(0),
            claims: AtomicU64::new(u64::from(holds_claim)),
        }
    }

    /// One more in-flight claim held. Relaxed: it is sequenced before the assignment CAS that
    /// places the claim, and a death's CAS acquires that, so the death's `holds_claims` sees it.
    #[inline]
    pub(crate) fn hold(&self) {
        self.claims.fetch_add(1, Ordering::Relaxed);
    }

    /// One in-flight claim fewer. Relaxed: a stale read only makes a sweep look at the claims once
    /// more than it needs to.
    #[inline]
    pub(crate) fn unhold(&self) {
        let _ = self
            .claims
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Whether it holds in-flight claims. Relaxed: see `hold`.
    pub(crate) fn holds_claims(&self) -> bool {
        self.claims.load(Ordering::Relaxed) > 0
    }

    /// Records one more assignment and returns its token. Relaxed: a counter whose uniqueness comes
    /// from the read-modify-write itself; it publishes nothing.
    pub(crate) fn next_token(&self) -> FencingToken {
        let seq = self.assignments.fetch_add(1, Ordering::Relaxed) + 1;
        token(self.id, seq)
    }

    /// The latest token handed out (seq 0 if none yet). Relaxed: display only.
    pub(crate) fn token(&self) -> FencingToken {
        token(self.id, self.assignments.load(Ordering::Relaxed))
    }

    /// Called once, by the thread whose CAS made the worker dead. Release: pairs with the Acquire in
    /// `died_at`, so a sweeper that sees the time also sees the death (it reads the word after).
    pub(crate) fn record_death(&self, now_ms: u64) {
        self.died_at
            .store(now_ms.saturating_add(1), Ordering::Release);
    }

    /// When it died, if the killer has recorded it yet. Acquire: see `record_death`.
    pub(crate) fn died_at(&self) -> Option<u64> {
        match self.died_at.load(Ordering::Acquire) {
            0 => None,
            t => Some(t - 1),
        }
    }

    /// Called by the (serialised) sweeper after its CAS set the suspect flag. Relaxed: only the
    /// sweeper reads or writes it, and sweeps are serialised by the sweep mutex.
    pub(crate) fn mark_suspect_since(&self, now_ms: u64) {
        self.suspect_since
            .store(now_ms.saturating_add(1), Ordering::Relaxed);
    }

    /// When the brake marked it suspect. Relaxed: see `mark_suspect_since`.
    pub(crate) fn suspect_since(&self) -> Option<u64> {
        match self.suspect_since.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t - 1),
        }
    }

    /// Records a drain deadline, keeping the earlier one if it was drained before. Relaxed: the
    /// sweep that acts on it re-checks the state word by CAS; a sweep that misses a deadline
    /// stored a moment ago acts on it at the next sweep.
    pub(crate) fn set_drain_deadline(&self, at_ms: u64) {
        let at = at_ms.saturating_add(1);
        let _ = self
            .drain_deadline
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                (cur == 0 || at < cur).then_some(at)
            });
    }

    /// Moves a drain deadline that had not passed when `stall` began out by the stall's length:
    /// the worker keeps the drain time it had left (it could not report its loop's end while the
    /// registry did not run). Relaxed: as `set_drain_deadline`; both are read-modify-writes, so
    /// neither is lost.
    pub(crate) fn extend_drain_deadline(&self, stall: super::stall::Span) {
        let _ = self
            .drain_deadline
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                let at = cur.checked_sub(1)?;
                (at > stall.start).then(|| at.saturating_add(stall.len()).saturating_add(1))
            });
    }

    /// When its drain deadline passes, if it was drained. Relaxed: see `set_drain_deadline`.
    pub(crate) fn drain_deadline(&self) -> Option<u64> {
        match self.drain_deadline.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t - 1),
        }
    }

    pub(crate) fn kind(&self) -> WorkerKind {
        if self.target.is_some() {
            WorkerKind::Spawned
        } else {
            WorkerKind::Registered
        }
    }

    /// A display copy of this record as of `w` (a word read once by the caller).
    pub(crate) fn info(&self, w: Word, now_ms: u64, wall_origin: SystemTime) -> WorkerInfo {
        let mut info =
            WorkerInfo::new(self.id, self.target.clone(), self.kind(), self.started_wall);
        self.write_info(&mut info, w, now_ms, wall_origin);
        info
    }

    /// Brings `info`, a display copy of this record, up to date as of `w`: only the fields that
    /// change (no allocation, no reference count touched).
    #[inline]
    pub(crate) fn write_info(
        &self,
        info: &mut WorkerInfo,
        w: Word,
        now_ms: u64,
        wall_origin: SystemTime,
    ) {
        let at = |ms: u64| wall_origin + Duration::from_millis(ms);
        info.status = w.status();
        info.activity = w.activity();
        info.suspect = w.is_suspect();
        info.last_heartbeat = at(w.ts());
        info.heartbeat_age = Duration::from_millis(now_ms.saturating_sub(w.ts()));
        info.has_heartbeated = w.has_beaten();
        info.died_at = if w.is_dead() {
            self.died_at().map(at)
        } else {
            None
        };
        info.token = self.token();
        info.drain_deadline = if w.status() == Status::Draining {
            self.drain_deadline().map(at)
        } else {
            None
        };
        info.uptime = Duration::from_millis(now_ms.saturating_sub(self.started_ms));
    }
}

/// The token for the `seq`-th assignment of `id`. Ids this registry hands out never exceed
/// [`WorkerId::MAX`] (creation refuses to go past it), so the layout cannot be violated.
fn token(id: WorkerId, seq: u64) -> FencingToken {
    let seq = seq.min(FencingToken::MAX_SEQ);
    FencingToken::from_raw((id.get() << FencingToken::SEQ_BITS) | seq)
}

/// The error for a call refused on a worker whose state word is `w`: dead (with its reason), or
/// unknown if the word is not a dead one. Shared by the registry's calls and the worker's handle.
pub(crate) fn dead_error(id: WorkerId, w: Word) -> RegistryError {
    match w.status() {
        Status::Dead(reason) => RegistryError::WorkerDead { id, reason },
        _ => RegistryError::UnknownWorker { id },
    }
}
