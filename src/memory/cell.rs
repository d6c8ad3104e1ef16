//! [`StateCell`]: the atomic cell around a worker's state word; every change is one CAS loop over
//! the pure transitions of `crate::state`.

use crate::state::Word;
use crate::sync::{AtomicU64, Ordering};

/// The atomic cell holding a [`Word`].
pub(crate) struct StateCell {
    word: AtomicU64,
    /// LOOM TWIN ONLY (`Fault::TransitionLoadStore`): `transition` degrades to load-then-store.
    #[cfg(worker_registry_loom)]
    racy: std::sync::atomic::AtomicBool,
}

impl StateCell {
    pub(crate) fn new(w: Word) -> Self {
        Self {
            word: AtomicU64::new(w.bits()),
            #[cfg(worker_registry_loom)]
            racy: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Reads the word. Acquire: pairs with the AcqRel of `transition`, so whoever sees a status
    /// also sees everything its writer did before the transition (e.g. a record's `died_at` is
    /// written after and has its own ordering; nothing else rides on it).
    #[inline]
    pub(crate) fn load(&self) -> Word {
        Word::from_bits(self.word.load(Ordering::Acquire))
    }

    /// The one way the word changes: a CAS loop that applies `f` to the current word until the swap
    /// succeeds or `f` refuses. Returns the (old, new) pair on success, or `f`'s refusal.
    ///
    /// AcqRel on success: a transition is a publication point (see `load`); Acquire on failure:
    /// the retry decides on the freshly observed word.
    #[inline]
    pub(crate) fn transition<E>(
        &self,
        mut f: impl FnMut(Word) -> Result<Word, E>,
    ) -> Result<(Word, Word), E> {
        #[cfg(worker_registry_loom)]
        if self.racy.load(std::sync::atomic::Ordering::Relaxed) {
            return self.transition_load_store(f);
        }
        let mut cur = self.load();
        loop {
            let next = f(cur)?;
            if next == cur {
                return Ok((cur, next));
            }
            match self.word.compare_exchange_weak(
                cur.bits(),
                next.bits(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok((cur, next)),
                Err(actual) => cur = Word::from_bits(actual),
            }
        }
    }
}

/// LOOM TWIN ONLY: the broken transition the loom models must catch (`Fault::TransitionLoadStore`).
#[cfg(worker_registry_loom)]
impl StateCell {
    /// Makes every later `transition` on this cell load-then-store.
    pub(crate) fn make_racy(&self) {
        // Relaxed: a std flag set before the model's threads start; loom's spawn orders it.
        self.racy.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// BROKEN ON PURPOSE: decides on a load, then stores, so a concurrent transition in between is
    /// overwritten (a lost update) instead of making this one retry.
    fn transition_load_store<E>(
        &self,
        mut f: impl FnMut(Word) -> Result<Word, E>,
    ) -> Result<(Word, Word), E> {
        let cur = self.load();
        let next = f(cur)?;
        // Release: as strong as the real transition's publication; only atomicity is removed.
        self.word.store(next.bits(), Ordering::Release);
        Ok((cur, next))
    }
}
