//! The maintenance lease: one replica sweeps at a time.
//!
//! `{name}:sweep_lease` holds `<replica id>\t<expiry, registry ms>` and is set with `PX` = the
//! lease's TTL, 3 x `sweep_interval` (at least 1 s). The sweep script takes the lease if it is
//! free, its own, or lapsed, and renews it at the end of each maintenance step, in the same atomic
//! step, so two replicas never sweep at once (a holder whose lease lapsed between two steps
//! stops at the step that finds it taken). The lease lapses by the key's own expiry
//! (real time) or when the registry's time (the server clock plus the test offset) passes the
//! stored expiry, so a test that advances time sees a silent replica's lease lapse without
//! sleeping. Replica ids come from `INCR {name}:next_replica_id`: unique, never reused.

use std::time::Duration;

use crate::config::RegistryConfig;

/// The shortest lease.
pub(crate) const MIN_LEASE_TTL: Duration = Duration::from_secs(1);

/// The lease's time to live for `config`: 3 x `sweep_interval`, at least [`MIN_LEASE_TTL`].
pub(crate) fn ttl(config: &RegistryConfig) -> Duration {
    config.sweep_interval().saturating_mul(3).max(MIN_LEASE_TTL)
}

/// The owner recorded in a lease value.
pub(crate) fn owner(value: &str) -> &str {
    value.split('\t').next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_lives_three_sweep_intervals_and_at_least_a_second() {
        let c = |ms| {
            RegistryConfig::builder()
                .sweep_interval(Duration::from_millis(ms))
                .build()
                .unwrap()
        };
        assert_eq!(ttl(&c(100)), Duration::from_secs(1));
        assert_eq!(ttl(&c(5_000)), Duration::from_secs(15));
        assert_eq!(owner("r7\t12345"), "r7");
    }
}
