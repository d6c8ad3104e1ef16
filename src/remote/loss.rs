//! Data-loss detection for the networked backends: what a handle remembers of the server's
//! registry (its incarnation, a value set once when the registry's data is created, and the
//! highest worker id handed out), and the verdict when the server's answer no longer fits.
//!
//! A server that lost the registry's data (a restart without persistence, `FLUSHALL`, a database
//! recreated) has no incarnation, or a new one; a server whose data went back in time (a failover
//! to a replica or standby that lagged, a restore of an older copy) has the same incarnation but
//! a worker-id counter below one the handle saw. Either way the workers created in what was lost
//! no longer exist: the handle reports them (those its last snapshot listed alive that the server
//! no longer knows) so that their owners stop them. Ids never repeat across either (see the
//! backends' id rule), so a container of a lost worker is refused everywhere as unknown.

use std::fmt;

use crate::api::contract::WorkerRegistry;
use crate::api::error::RegistryError;
use crate::api::ids::WorkerId;
use crate::api::snapshot::StatusSnapshot;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// What a handle found, comparing the server's registry with what it saw before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Loss {
    /// The registry's incarnation changed: its data is gone, and was created again.
    Gone {
        /// The incarnation the handle knew.
        was: String,
        /// The server's now.
        now: String,
    },
    /// The worker-id counter is below an id the handle saw: the data went back in time.
    Rewound {
        /// The highest id the handle saw.
        seen: u64,
        /// The server's counter now.
        now: u64,
    },
    /// The published snapshot version is below the one the handle holds: the data went back in
    /// time.
    VersionRewound {
        /// The version the handle holds.
        seen: u64,
        /// The server's now.
        now: u64,
    },
}

impl Loss {
    /// The data went back in time (the incarnation is unchanged): the handle that finds it
    /// moves the incarnation on, so that every other handle finds it too.
    pub(crate) fn is_rewind(&self) -> bool {
        !matches!(self, Self::Gone { .. })
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gone { was, now } => write!(
                f,
                "the registry's data is gone (incarnation {was:?} is now {now:?})"
            ),
            Self::Rewound { seen, now } => write!(
                f,
                "the registry's data went back in time (worker id {seen} was handed out, the \
                 counter stands at {now})"
            ),
            Self::VersionRewound { seen, now } => write!(
                f,
                "the registry's data went back in time (snapshot version {seen} was published, \
                 the server is at {now})"
            ),
        }
    }
}

/// What a handle saw of the server's registry, and how many losses it found.
pub(crate) struct LossWatch {
    incarnation: Mutex<String>,
    last_id: AtomicU64,
    losses: AtomicU64,
}

impl LossWatch {
    /// A watch that starts from the server's `incarnation` and id counter as read at connect.
    pub(crate) fn new(incarnation: String, last_id: u64) -> Self {
        Self {
            incarnation: Mutex::new(incarnation),
            last_id: AtomicU64::new(last_id),
            losses: AtomicU64::new(0),
        }
    }

    /// Starts over from the server's `incarnation` and id counter, judging nothing (a handle
    /// that read them only after it was built).
    pub(crate) fn begin(&self, incarnation: &str, last_id: u64) {
        let mut known = self.incarnation.lock().unwrap_or_else(|p| p.into_inner());
        incarnation.clone_into(&mut known);
        // Relaxed: see `saw`.
        self.last_id.store(last_id, Ordering::Relaxed);
    }

    /// Notes an id the handle was handed (an answer of this handle's own call).
    pub(crate) fn saw(&self, id: WorkerId) {
        // Relaxed: a maximum; compared only against the server's counter read later by the same
        // handle, which is ordered by the round trip in between.
        self.last_id.fetch_max(id.get(), Ordering::Relaxed);
    }

    /// Compares the server's `incarnation`, id counter and published snapshot `version` now
    /// with what was seen before (`cached`: the version of the handle's snapshot), and remembers
    /// them; the loss found, if any (counted).
    pub(crate) fn observe(
        &self,
        incarnation: &str,
        last_id: u64,
        cached: u64,
        version: u64,
    ) -> Option<Loss> {
        let mut known = self.incarnation.lock().unwrap_or_else(|p| p.into_inner());
        // Relaxed: see `saw`; the lock orders concurrent observations.
        let seen = self.last_id.load(Ordering::Relaxed);
        let loss = if *known != incarnation {
            Some(Loss::Gone {
                was: known.clone(),
                now: incarnation.to_owned(),
            })
        } else if last_id < seen {
            Some(Loss::Rewound { seen, now: last_id })
        } else if version < cached {
            Some(Loss::VersionRewound {
                seen: cached,
                now: version,
            })
        } else {
            None
        };
        incarnation.clone_into(&mut known);
        if loss.is_some() {
            // After a loss the server's counter is the reference again.
            self.last_id.store(last_id, Ordering::Relaxed);
            // Relaxed: a statistic.
            self.losses.fetch_add(1, Ordering::Relaxed);
        } else {
            self.last_id.fetch_max(last_id, Ordering::Relaxed);
        }
        loss
    }

    /// Losses found so far (`Stats::data_losses`).
    pub(crate) fn losses(&self) -> u64 {
        // Relaxed: a statistic.
        self.losses.load(Ordering::Relaxed)
    }
}

/// The workers `before` (a handle's snapshot from before the loss) lists alive that `registry`
/// no longer knows: what the loss lost. One read per worker listed alive (at most
/// `max_workers`), once per loss.
pub(crate) async fn lost_workers<R: WorkerRegistry>(
    registry: &R,
    before: &StatusSnapshot,
) -> Result<Vec<WorkerId>, RegistryError> {
    let mut lost = Vec::new();
    for w in before.workers.iter().filter(|w| w.status.is_alive()) {
        if registry.worker(w.id).await?.is_none() {
            lost.push(w.id);
        }
    }
    Ok(lost)
}

/// Logs a loss a handle found (an error: the operator's data is gone).
pub(crate) fn log(backend: &str, registry: &str, replica: &str, loss: &Loss, lost: &[WorkerId]) {
    tracing::error!(
        backend,
        registry,
        replica,
        lost = lost.len(),
        "{loss}: the workers created in what was lost no longer exist (their ids are never handed \
         out again); stop their containers"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_incarnation_or_a_counter_below_what_was_seen_is_a_loss() {
        let w = LossWatch::new("a".into(), 10);
        assert_eq!(w.observe("a", 10, 0, 0), None);
        w.saw(WorkerId::new(12));
        assert_eq!(w.observe("a", 12, 3, 3), None);
        assert_eq!(
            w.observe("a", 11, 3, 3),
            Some(Loss::Rewound { seen: 12, now: 11 })
        );
        assert_eq!(w.observe("a", 11, 3, 3), None, "reported once");
        assert_eq!(
            w.observe("a", 11, 3, 2),
            Some(Loss::VersionRewound { seen: 3, now: 2 })
        );
        assert_eq!(
            w.observe("b", 20, 0, 0),
            Some(Loss::Gone {
                was: "a".into(),
                now: "b".into()
            })
        );
        assert_eq!(w.observe("b", 21, 0, 0), None);
        assert_eq!(w.losses(), 3);
    }
}
