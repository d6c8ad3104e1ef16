//! Where the in-memory registry emits lifecycle events.
//!
//! A worker's `WorkerCreated` is published just before the worker becomes visible in the maps, so
//! it always precedes the worker's other events; on the assignment path that happens under the
//! target's shard lock. Without the `tokio` feature the hub is empty and every emission point an
//! empty inline function.

use super::record::WorkerRecord;
use crate::api::report::SweepReport;
use crate::api::status::DeadReason;
use crate::state::Word;

#[cfg(feature = "tokio")]
pub(crate) use with_tokio::EventHub;
#[cfg(not(feature = "tokio"))]
pub(crate) use without_tokio::EventHub;

#[cfg(feature = "tokio")]
mod with_tokio {
    use std::collections::BTreeMap;

    use super::{DeadReason, SweepReport, Word, WorkerRecord};
    use crate::api::events::{Event, EventSender};
    use crate::api::ids::{DeliveryId, Target};
    use crate::api::report::ReleaseReason;
    use crate::api::status::Status;

    /// The registry's event sender and its emission points.
    pub(crate) struct EventHub {
        pub(crate) sender: EventSender,
    }

    impl EventHub {
        pub(crate) fn new() -> Self {
            Self {
                sender: EventSender::new(),
            }
        }

        #[inline]
        pub(crate) fn created(&self, rec: &WorkerRecord) {
            self.sender.send(|| Event::WorkerCreated {
                worker: rec.id,
                target: rec.target.clone(),
            });
        }

        /// Publishes `WorkerDraining` if this transition is the one that set `rec` draining.
        #[inline]
        pub(crate) fn transition(&self, rec: &WorkerRecord, old: Word, new: Word) {
            if new.status() == Status::Draining && old.status() != Status::Draining {
                self.sender.send(|| Event::WorkerDraining {
                    worker: rec.id,
                    target: rec.target.clone(),
                });
            }
        }

        #[inline]
        pub(crate) fn suspect(&self, rec: &WorkerRecord) {
            self.sender.send(|| Event::WorkerSuspect {
                worker: rec.id,
                target: rec.target.clone(),
            });
        }

        /// Publishes `DeliveryStuck` for a delivery the sweep released as stuck on `rec`.
        pub(crate) fn stuck(&self, rec: &WorkerRecord, target: &Target, delivery: &DeliveryId) {
            self.sender.send(|| Event::DeliveryStuck {
                worker: rec.id,
                target: target.clone(),
                delivery: delivery.clone(),
            });
        }

        #[inline]
        pub(crate) fn died(&self, rec: &WorkerRecord, reason: DeadReason) {
            self.sender.send(|| Event::WorkerDied {
                worker: rec.id,
                target: rec.target.clone(),
                reason,
            });
        }

        /// One `TargetReleased` per target the sweep released work on, in target order.
        pub(crate) fn released(&self, report: &SweepReport) {
            if report.released_targets.is_empty() && report.released.is_empty() {
                return;
            }
            if !self.sender.has_subscribers() {
                return;
            }
            let mut by_target: BTreeMap<&Target, Vec<DeliveryId>> = BTreeMap::new();
            for t in &report.released_targets {
                by_target.entry(t).or_default();
            }
            for e in report
                .released
                .iter()
                .filter(|e| e.reason != ReleaseReason::Promoted)
            {
                by_target
                    .entry(&e.target)
                    .or_default()
                    .push(e.delivery.clone());
            }
            for (target, deliveries) in by_target {
                self.sender.send(|| Event::TargetReleased {
                    target: target.clone(),
                    deliveries,
                });
            }
        }

        /// One `DeliveryPromoted` per promoted delivery, then one `WaitingExpired` per dropped one,
        /// in report order.
        pub(crate) fn waiting(&self, report: &SweepReport) {
            if !self.sender.has_subscribers() {
                return;
            }
            for e in &report.released {
                if let (ReleaseReason::Promoted, Some(a)) = (e.reason, e.assignment) {
                    self.sender.send(|| Event::DeliveryPromoted {
                        worker: a.worker,
                        target: e.target.clone(),
                        delivery: e.delivery.clone(),
                    });
                }
            }
            for e in &report.expired_waiting {
                self.sender.send(|| Event::WaitingExpired {
                    target: e.target.clone(),
                    delivery: e.delivery.clone(),
                    reason: e.reason,
                });
            }
        }
    }
}

#[cfg(not(feature = "tokio"))]
mod without_tokio {
    use super::{DeadReason, SweepReport, Word, WorkerRecord};
    use crate::api::ids::{DeliveryId, Target};

    /// No subscribers can exist without tokio: every emission point is empty.
    pub(crate) struct EventHub;

    impl EventHub {
        pub(crate) fn new() -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn created(&self, _: &WorkerRecord) {}
        #[inline(always)]
        pub(crate) fn transition(&self, _: &WorkerRecord, _: Word, _: Word) {}
        #[inline(always)]
        pub(crate) fn suspect(&self, _: &WorkerRecord) {}
        #[inline(always)]
        pub(crate) fn stuck(&self, _: &WorkerRecord, _: &Target, _: &DeliveryId) {}
        #[inline(always)]
        pub(crate) fn died(&self, _: &WorkerRecord, _: DeadReason) {}
        #[inline(always)]
        pub(crate) fn released(&self, _: &SweepReport) {}
        #[inline(always)]
        pub(crate) fn waiting(&self, _: &SweepReport) {}
    }
}
