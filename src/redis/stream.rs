//! The released-event stream: how a dead worker's unfinished deliveries reach exactly one replica
//! and are not lost if that replica dies before acting on them.
//!
//! The sweep script `XADD`s each released delivery to `{name}:released` (consumer group
//! `dispatch`); every replica's sweep takes its share in each of its steps (at most 128 a step,
//! [`HANDOUT_BATCH`] a sweep): entries handed out
//! longer than `release_ack_timeout` ago (registry time, tracked in `{name}:deliveries`) and not
//! acknowledged are claimed again (`XCLAIM`), then new ones are read (`XREADGROUP`, consumer = the
//! replica id). Each entry comes back in a [`SweepReport`](crate::SweepReport) as a
//! [`ReleasedEvent`](crate::ReleasedEvent) whose [`Receipt`](crate::Receipt) is the entry id;
//! `acknowledge` `XACK`s and `XDEL`s it.

/// The most released entries one sweep hands out; the rest follow in the next sweeps.
pub(crate) const HANDOUT_BATCH: usize = 1_000;
