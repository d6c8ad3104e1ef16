//! [`StateCell`]: the atomic cell around a worker's state word; every change is one CAS loop over
//! the pure transitions of `crate::state`.

use crate::state::Word;
use crate::sync::{AtomicU64, Ordering};

/// The atomic cell holding a [`Word`].
pub(crate) struct StateCell {
    word: AtomicU64,
}

impl StateCell {
    pub(crate) fn new(w: Word) -> Self {
        Self {
            word: AtomicU64::new(w.bits()),
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
