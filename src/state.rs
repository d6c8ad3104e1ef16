//! A worker's liveness state in one 64-bit word, and the transitions on it as pure functions.
//!
//! This is shared by every backend that keeps a worker's state in one word (the in-memory
//! backend's CAS cell, a networked backend that decodes a stored word); nothing here touches
//! memory shared between threads.
//!
//! Status, activity, the suspect flag, the death reason and the last-heartbeat time live in the same
//! `AtomicU64`, so every decision that depends on "is it alive and when did it last beat" is one
//! compare-and-swap on one word (the governor style). A heartbeat racing the sweeper therefore either
//! lands (the sweeper's CAS fails, it re-reads a fresh timestamp and spares the worker) or is refused
//! because the sweeper's CAS to `Dead` won: never both.
//!
//! ```text
//!  63                                   8 7      5   4      3       2     1 0
//! +--------------------------------------+--------+------+-------+------+-----+
//! | last heartbeat, ms since clock origin| reason |beaten|suspect| busy |stat |
//! +--------------------------------------+--------+------+-------+------+-----+
//! ```

use std::fmt;

use crate::api::status::{Activity, DeadReason, Status};

const STATUS_MASK: u64 = 0b11;
const ACTIVE: u64 = 0;
const DRAINING: u64 = 1;
const DEAD: u64 = 2;
const BUSY: u64 = 1 << 2;
const SUSPECT: u64 = 1 << 3;
const BEATEN: u64 = 1 << 4;
const REASON_SHIFT: u32 = 5;
const REASON_MASK: u64 = 0b111 << REASON_SHIFT;
const TS_SHIFT: u32 = 8;
/// The largest storable timestamp (56 bits of milliseconds, about 2.28 million years).
const TS_MAX: u64 = u64::MAX >> TS_SHIFT;

fn reason_bits(reason: DeadReason) -> u64 {
    (match reason {
        DeadReason::MissedHeartbeats => 1,
        DeadReason::Exited => 2,
        DeadReason::Deregistered => 3,
        DeadReason::DrainTimedOut => 4,
    }) << REASON_SHIFT
}

/// A decoded state word.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(u64);

impl Word {
    /// A new worker: active, last "heartbeat" = creation time, not yet beaten.
    #[inline]
    pub(crate) fn new(now_ms: u64, busy: bool) -> Self {
        Self(ACTIVE | if busy { BUSY } else { 0 }).with_ts(now_ms)
    }

    #[inline]
    pub(crate) fn status(self) -> Status {
        match self.0 & STATUS_MASK {
            ACTIVE => Status::Active,
            DRAINING => Status::Draining,
            _ => Status::Dead(match (self.0 & REASON_MASK) >> REASON_SHIFT {
                1 => DeadReason::MissedHeartbeats,
                2 => DeadReason::Exited,
                4 => DeadReason::DrainTimedOut,
                _ => DeadReason::Deregistered,
            }),
        }
    }

    #[inline]
    pub(crate) fn is_dead(self) -> bool {
        self.0 & STATUS_MASK == DEAD
    }

    #[inline]
    pub(crate) fn is_active(self) -> bool {
        self.0 & STATUS_MASK == ACTIVE
    }

    #[inline]
    pub(crate) fn activity(self) -> Activity {
        if self.0 & BUSY != 0 {
            Activity::Busy
        } else {
            Activity::Idle
        }
    }

    #[inline]
    pub(crate) fn is_suspect(self) -> bool {
        self.0 & SUSPECT != 0
    }

    /// Whether the worker has heartbeated at least once (else it is still in its start-up grace).
    #[inline]
    pub(crate) fn has_beaten(self) -> bool {
        self.0 & BEATEN != 0
    }

    /// Last heartbeat (or creation) time, ms since the clock's origin.
    #[inline]
    pub(crate) fn ts(self) -> u64 {
        self.0 >> TS_SHIFT
    }

    #[inline]
    fn with_ts(self, ms: u64) -> Self {
        Self((self.0 & ((1 << TS_SHIFT) - 1)) | (ms.min(TS_MAX) << TS_SHIFT))
    }

    #[inline]
    fn set(self, bit: u64, on: bool) -> Self {
        Self(if on { self.0 | bit } else { self.0 & !bit })
    }

    #[inline]
    fn with_status(self, status: u64) -> Self {
        Self((self.0 & !STATUS_MASK) | status)
    }

    #[inline]
    fn dead(self, reason: DeadReason) -> Self {
        Self(((self.0 & !STATUS_MASK & !REASON_MASK & !SUSPECT) | DEAD) | reason_bits(reason))
    }

    /// The raw word (for a cell that stores it).
    #[inline]
    pub(crate) fn bits(self) -> u64 {
        self.0
    }

    /// A word from its raw bits.
    #[inline]
    pub(crate) fn from_bits(bits: u64) -> Self {
        Self(bits)
    }
}

impl fmt::Debug for Word {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Word")
            .field("status", &self.status())
            .field("activity", &self.activity())
            .field("suspect", &self.is_suspect())
            .field("beaten", &self.has_beaten())
            .field("ts", &self.ts())
            .finish()
    }
}

/// Why a transition was refused: the worker was already dead (with this word).
#[derive(Debug, Clone, Copy)]
pub(crate) struct IsDead(pub(crate) Word);

// ---- the transitions, as pure functions of the current word -------------------------------------

/// A heartbeat at `now_ms`: refused if dead; otherwise records the time (never moving it backwards),
/// marks the worker as having beaten, and clears suspicion.
#[inline]
pub(crate) fn beat(w: Word, now_ms: u64) -> Result<Word, IsDead> {
    if w.is_dead() {
        return Err(IsDead(w));
    }
    Ok(w.with_ts(now_ms.max(w.ts()))
        .set(BEATEN, true)
        .set(SUSPECT, false))
}

/// An assignment: only an active worker takes one; it becomes busy.
#[inline]
pub(crate) fn assign(w: Word) -> Result<Word, Word> {
    if !w.is_active() {
        return Err(w);
    }
    Ok(w.set(BUSY, true))
}

/// The worker reports that a loop started.
#[inline]
pub(crate) fn loop_started(w: Word) -> Result<Word, IsDead> {
    if w.is_dead() {
        return Err(IsDead(w));
    }
    Ok(w.set(BUSY, true))
}

/// The worker reports that its loop finished: idle if active, dead (exited) if draining.
#[inline]
pub(crate) fn loop_finished(w: Word) -> Result<Word, IsDead> {
    match w.status() {
        Status::Dead(_) => Err(IsDead(w)),
        Status::Draining => Ok(w.set(BUSY, false).dead(DeadReason::Exited)),
        Status::Active => Ok(w.set(BUSY, false)),
    }
}

/// Drain: a busy active worker becomes draining (its loop may finish); an idle one has no loop to
/// finish and exits at once; draining again changes nothing.
#[inline]
pub(crate) fn drain(w: Word) -> Result<Word, IsDead> {
    match w.status() {
        Status::Dead(_) => Err(IsDead(w)),
        Status::Draining => Ok(w),
        Status::Active if w.activity() == Activity::Busy => Ok(w.with_status(DRAINING)),
        Status::Active => Ok(w.dead(DeadReason::Exited)),
    }
}

/// A clean exit: `Exited` if it was draining, `Deregistered` if it was active.
#[inline]
pub(crate) fn deregister(w: Word) -> Result<Word, IsDead> {
    match w.status() {
        Status::Dead(_) => Err(IsDead(w)),
        Status::Draining => Ok(w.set(BUSY, false).dead(DeadReason::Exited)),
        Status::Active => Ok(w.set(BUSY, false).dead(DeadReason::Deregistered)),
    }
}

/// Whether `w` is past its deadline at `now_ms` (strictly older than the timeout; a worker that has
/// never beaten also gets the start-up grace).
#[inline]
pub(crate) fn is_stale(w: Word, now_ms: u64, timeout_ms: u64, startup_grace_ms: u64) -> bool {
    if w.is_dead() {
        return false;
    }
    let allowed = if w.has_beaten() {
        timeout_ms
    } else {
        timeout_ms.saturating_add(startup_grace_ms)
    };
    now_ms.saturating_sub(w.ts()) > allowed
}

/// The sweeper's kill: only if the worker is still stale on the word the CAS sees.
#[inline]
pub(crate) fn expire(
    w: Word,
    now_ms: u64,
    timeout_ms: u64,
    startup_grace_ms: u64,
) -> Result<Word, Word> {
    if !is_stale(w, now_ms, timeout_ms, startup_grace_ms) {
        return Err(w);
    }
    Ok(w.dead(DeadReason::MissedHeartbeats))
}

/// The sweeper's kill of a draining worker past its drain deadline: only if it is still draining.
#[inline]
pub(crate) fn drain_timed_out(w: Word) -> Result<Word, Word> {
    if w.status() != Status::Draining {
        return Err(w);
    }
    Ok(w.set(BUSY, false).dead(DeadReason::DrainTimedOut))
}

/// The brake's alternative to a kill: mark suspect, only if still stale.
#[inline]
pub(crate) fn suspect(
    w: Word,
    now_ms: u64,
    timeout_ms: u64,
    startup_grace_ms: u64,
) -> Result<Word, Word> {
    if !is_stale(w, now_ms, timeout_ms, startup_grace_ms) {
        return Err(w);
    }
    Ok(w.set(SUSPECT, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_round_trips_every_field() {
        let w = Word::new(123_456, true);
        assert_eq!(w.status(), Status::Active);
        assert_eq!(w.activity(), Activity::Busy);
        assert_eq!(w.ts(), 123_456);
        assert!(!w.has_beaten());
        let w = beat(w, 200_000).unwrap();
        assert!(w.has_beaten());
        assert_eq!(w.ts(), 200_000);
        let d = drain(w).unwrap();
        assert_eq!(d.status(), Status::Draining);
        assert_eq!(d.activity(), Activity::Busy);
        let x = loop_finished(d).unwrap();
        assert_eq!(x.status(), Status::Dead(DeadReason::Exited));
        assert_eq!(x.ts(), 200_000, "death keeps the last heartbeat time");
        assert!(beat(x, 300_000).is_err());
    }

    #[test]
    fn heartbeat_never_moves_time_backwards() {
        let w = beat(Word::new(0, false), 500).unwrap();
        assert_eq!(beat(w, 400).unwrap().ts(), 500);
    }

    #[test]
    fn timestamps_saturate_instead_of_corrupting_flags() {
        let w = Word::new(u64::MAX, true);
        assert_eq!(w.status(), Status::Active);
        assert_eq!(w.activity(), Activity::Busy);
        assert_eq!(w.ts(), TS_MAX);
    }

    #[test]
    fn staleness_is_strict_and_new_workers_get_the_startup_grace() {
        let fresh = Word::new(0, true);
        assert!(!is_stale(fresh, 150, 100, 50));
        assert!(is_stale(fresh, 151, 100, 50));
        let beaten = beat(fresh, 0).unwrap();
        assert!(!is_stale(beaten, 100, 100, 50));
        assert!(is_stale(beaten, 101, 100, 50));
    }

    #[test]
    fn every_dead_reason_decodes() {
        for r in DeadReason::ALL {
            assert_eq!(Word::new(7, false).dead(r).status(), Status::Dead(r));
        }
    }

    #[test]
    fn drain_of_idle_worker_exits_and_of_busy_one_drains() {
        let idle = Word::new(0, false);
        assert_eq!(
            drain(idle).unwrap().status(),
            Status::Dead(DeadReason::Exited)
        );
        let busy = Word::new(0, true);
        assert_eq!(drain(busy).unwrap().status(), Status::Draining);
        assert_eq!(
            deregister(busy).unwrap().status(),
            Status::Dead(DeadReason::Deregistered)
        );
    }
}
