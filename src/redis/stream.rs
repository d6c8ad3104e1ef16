//! The released-event stream: how a dead worker's unfinished deliveries reach exactly one replica
//! and are not lost if that replica dies before acting on them.
//!
//! The sweep script `XADD`s each released delivery to `{name}:released` (consumer group
//! `dispatch`); every replica's sweep then takes its share in the same script: entries handed out
//! longer than `release_ack_timeout` ago (registry time, tracked in `{name}:deliveries`) and not
//! acknowledged are claimed again (`XCLAIM`), then new ones are read (`XREADGROUP`, consumer = the
//! replica id). Each entry comes back in a [`SweepReport`](crate::SweepReport) as a
//! [`ReleasedEvent`](crate::ReleasedEvent) whose [`Receipt`](crate::Receipt) is the entry id;
//! `acknowledge` `XACK`s and `XDEL`s it.

/// The most released entries one sweep hands out; the rest follow in the next sweeps.
pub const HANDOUT_BATCH: usize = 1_000;

/// The most expired completed claims one sweep deletes (a sweep after a long pause deletes the
/// rest in the sweeps that follow; expired claims count as absent meanwhile).
pub const EXPIRY_BATCH: usize = 10_000;
