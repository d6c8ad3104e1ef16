//! The sweep's own list of workers, in a stable order, and the buffer it builds each snapshot in.
//!
//! The sweep reads every worker once per pass, so it keeps them in a plain `Vec` (created workers
//! reach it through a channel, purged ones leave it) rather than walking the workers map. Because
//! the order is stable, a snapshot's entry `i` describes the same worker as the last snapshot's
//! entry `i` unless that worker left: the sweep recycles the oldest published snapshot's buffer
//! (once no reader holds it) and brings each entry up to date in place, without allocating and
//! without touching the target's reference count. Only new or moved entries are built afresh.

use super::record::WorkerRecord;
use crate::api::snapshot::{StatusSnapshot, WorkerInfo};
use crate::sync::{channel, Arc, Receiver, Sender};

/// Workers as the sweep sees them.
pub(crate) struct Roster {
    records: Vec<Arc<WorkerRecord>>,
    newborns: Receiver<Arc<WorkerRecord>>,
    /// The snapshot the last publication replaced: its buffer is reused when no one holds it.
    spare: Option<std::sync::Arc<StatusSnapshot>>,
}

impl Roster {
    /// An empty roster, and the sender that worker creation announces new workers on.
    pub(crate) fn new() -> (Self, Sender<Arc<WorkerRecord>>) {
        let (tx, rx) = channel();
        let roster = Self {
            records: Vec::new(),
            newborns: rx,
            spare: None,
        };
        (roster, tx)
    }

    /// Takes in the workers created since the last call.
    pub(crate) fn take_newborns(&mut self) {
        while let Ok(rec) = self.newborns.try_recv() {
            self.records.push(rec);
        }
    }

    pub(crate) fn records(&self) -> &[Arc<WorkerRecord>] {
        &self.records
    }

    /// A buffer for the next snapshot's entries: the spare snapshot's, if no reader still holds
    /// it, else a new one.
    pub(crate) fn buffer(&mut self) -> Vec<WorkerInfo> {
        if let Some(mut spare) = self.spare.take() {
            if let Some(s) = std::sync::Arc::get_mut(&mut spare) {
                return std::mem::take(&mut s.workers);
            }
        }
        Vec::with_capacity(self.records.len() + 16)
    }

    /// Keeps the snapshot a publication replaced, to reuse its buffer next time.
    pub(crate) fn keep_spare(&mut self, old: std::sync::Arc<StatusSnapshot>) {
        self.spare = Some(old);
    }

    /// Removes the workers at `idx` (ascending) from the roster and the matching entries from
    /// `infos`, keeping the two aligned.
    pub(crate) fn remove(&mut self, idx: &[usize], infos: &mut Vec<WorkerInfo>) {
        for &i in idx.iter().rev() {
            self.records.swap_remove(i);
            infos.swap_remove(i);
        }
    }
}
