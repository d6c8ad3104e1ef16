//! The self-fencing lease a heartbeat answer grants: how long a worker may keep acting without
//! another successful heartbeat, counted by the worker from the instant it sent the heartbeat.
//! Pure arithmetic on durations (no clock is read here); the derivation, the clock assumptions
//! and every path it guards are in [`crate::docs::worker_protocol`].
//!
//! [`LeaseRules::active`] is the lease of a worker answered `active`:
//! `min(T, D_min)·(1 − 2ρ) − K − S − 1 ms`; [`LeaseRules::draining`] that of a worker answered
//! `draining`, `since` after the start of the last registry call that showed it active:
//! `D_min·(1 − 2ρ) − since − K − S − 1 ms`, never more than the first. (`since` needs no rate
//! term of its own: it and the lease are both counted on clocks at most ρ slow, so the worker's
//! stop comes at most `(since + lease)·(1 + ρ) + K + S` after the call that showed it active,
//! and `since + lease` is what the formula bounds.) Integer nanoseconds
//! throughout, rounded towards the shorter lease.

use std::fmt;
use std::time::Duration;

/// The clock-rate error assumed of every monotonic clock involved, in parts per million (`ρ`):
/// ten times a crystal's worst drift, twice the fastest slew NTP applies.
pub const RATE_ERROR_PPM: u64 = 1_000;

/// `K`: the time a worker takes to kill its command's process group and see it gone.
pub const DEFAULT_KILL_MARGIN: Duration = Duration::from_secs(1);

/// `S`: how late a running worker's timer may fire on a loaded machine.
pub const DEFAULT_TIMER_SLACK: Duration = Duration::from_secs(1);

/// The strictness term: the lease ends at least this long before the bound.
const STRICT: Duration = Duration::from_millis(1);

const MILLION: u128 = 1_000_000;

/// What a lease is derived from (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRules {
    heartbeat_timeout: Duration,
    drain_min: Duration,
    kill: Duration,
    slack: Duration,
}

impl LeaseRules {
    /// The rules for a registry whose heartbeat timeout is `heartbeat_timeout`
    /// (`RegistryConfig::heartbeat_timeout`) and whose workers can be given drain deadlines no
    /// shorter than `drain_min`, with [`DEFAULT_KILL_MARGIN`] and [`DEFAULT_TIMER_SLACK`].
    /// Refused if a worker answered `active` would not hold its lease for `heartbeat_interval`
    /// twice over (it would fence itself after one late heartbeat).
    pub fn new(
        heartbeat_timeout: Duration,
        drain_min: Duration,
        heartbeat_interval: Duration,
    ) -> Result<Self, LeaseError> {
        let rules = Self::with_margins(
            heartbeat_timeout,
            drain_min,
            DEFAULT_KILL_MARGIN,
            DEFAULT_TIMER_SLACK,
        );
        rules.check(heartbeat_interval)?;
        Ok(rules)
    }

    /// The rules with a kill margin `kill` (`K`, `--kill-margin`) and a timer slack `slack` (`S`,
    /// `--timer-slack`) of the operator's choosing, unchecked: see [`check`](Self::check). The
    /// margins are the worker's to keep: a worker that cannot kill its command within `kill`,
    /// or whose timers fire later than `slack`, is not covered by the lease.
    pub fn with_margins(
        heartbeat_timeout: Duration,
        drain_min: Duration,
        kill: Duration,
        slack: Duration,
    ) -> Self {
        Self {
            heartbeat_timeout,
            drain_min,
            kill,
            slack,
        }
    }

    /// Refused if a worker answered `active` would not hold its lease for `heartbeat_interval`
    /// twice over (it would fence itself after one late heartbeat).
    pub fn check(&self, heartbeat_interval: Duration) -> Result<(), LeaseError> {
        let lease = self.active();
        if lease < heartbeat_interval.saturating_mul(2) {
            return Err(LeaseError::TooShort {
                lease,
                heartbeat_interval,
            });
        }
        Ok(())
    }

    /// The lease of a worker whose heartbeat was answered `active`.
    pub fn active(&self) -> Duration {
        let bound = self.heartbeat_timeout.min(self.drain_min);
        shrink(bound)
            .saturating_sub(self.kill)
            .saturating_sub(self.slack)
            .saturating_sub(STRICT)
    }

    /// The lease of a worker whose heartbeat was answered `draining`, `since` after this router
    /// started the last registry call that showed the worker active (zero: stop now).
    pub fn draining(&self, since: Duration) -> Duration {
        shrink(self.drain_min)
            .saturating_sub(since)
            .saturating_sub(self.kill)
            .saturating_sub(self.slack)
            .saturating_sub(STRICT)
            .min(self.active())
    }
}

/// `d·(1 − 2ρ)`, rounded down.
fn shrink(d: Duration) -> Duration {
    let ns = d.as_nanos() * (MILLION - 2 * u128::from(RATE_ERROR_PPM)) / MILLION;
    nanos(ns)
}

fn nanos(ns: u128) -> Duration {
    let secs = u64::try_from(ns / 1_000_000_000).unwrap_or(u64::MAX);
    // The remainder is below 10^9, which fits in a u32.
    let sub = u32::try_from(ns % 1_000_000_000).unwrap_or(0);
    Duration::new(secs, sub)
}

/// Why lease rules were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseError {
    /// The lease of an active worker would be shorter than two heartbeat intervals.
    TooShort {
        /// The lease the rules give.
        lease: Duration,
        /// The heartbeat interval.
        heartbeat_interval: Duration,
    },
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort {
                lease,
                heartbeat_interval,
            } => write!(
                f,
                "a worker's lease would be {lease:?}, less than two heartbeat intervals \
                 ({heartbeat_interval:?} each): raise missed_heartbeats or the drain deadline, or \
                 shorten the heartbeat interval"
            ),
        }
    }
}

impl std::error::Error for LeaseError {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RHO: u128 = RATE_ERROR_PPM as u128;

    /// The safety condition itself, in exact integer arithmetic (nanoseconds, scaled by 10^12):
    /// a worker whose lease, counted on a clock up to ρ slow, runs out `K + S` before it has
    /// stopped, has stopped strictly before `after_active + bound/(1+ρ)` true time, the earliest a
    /// registry clock up to ρ fast can declare it dead; `after_active` is how long after the
    /// last call that showed it active (or after its heartbeat was recorded) the lease was
    /// counted from, measured on a clock up to ρ slow.
    fn stops_in_time(lease: Duration, after_active: Duration, bound: Duration) -> bool {
        let (l, a, b) = (lease.as_nanos(), after_active.as_nanos(), bound.as_nanos());
        let ks = (DEFAULT_KILL_MARGIN + DEFAULT_TIMER_SLACK).as_nanos();
        // (a(1+ρ) + l(1+ρ) + K + S)(1+ρ) < b, all times 10^12.
        let stopped = ((a + l) * (MILLION + RHO) + ks * MILLION) * (MILLION + RHO);
        stopped < b * MILLION * MILLION
    }

    #[test]
    fn the_default_lease() {
        let rules = LeaseRules::new(
            Duration::from_secs(120),
            Duration::from_secs(30 * 60),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(rules.active(), Duration::from_millis(117_759));
        assert!(stops_in_time(
            rules.active(),
            Duration::ZERO,
            Duration::from_secs(120)
        ));
        // Drained a minute after the last active answer: the drain's half hour is the bound.
        let left = rules.draining(Duration::from_secs(60));
        assert_eq!(left, rules.active(), "capped by the heartbeat timeout");
    }

    /// The margin is not padding: a lease without `K + S` would not stop in time, with the same
    /// arithmetic the property below checks.
    #[test]
    fn the_margin_is_needed() {
        let t = Duration::from_secs(120);
        let rules = LeaseRules::new(t, Duration::from_secs(1800), Duration::from_secs(30)).unwrap();
        let without_margin = rules.active() + DEFAULT_KILL_MARGIN + DEFAULT_TIMER_SLACK;
        assert!(!stops_in_time(without_margin, Duration::ZERO, t));
        // And the rate term: T minus K + S only, with no allowance for ρ.
        let without_rates = t - DEFAULT_KILL_MARGIN - DEFAULT_TIMER_SLACK - STRICT;
        assert!(!stops_in_time(without_rates, Duration::ZERO, t));
    }

    /// A drain deadline shorter than the heartbeat timeout bounds every lease, an active one too
    /// (a drain can begin right after an `active` answer).
    #[test]
    fn a_short_drain_deadline_caps_active_leases() {
        let rules = LeaseRules::new(
            Duration::from_secs(120),
            Duration::from_secs(20),
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(rules.active() < Duration::from_secs(18));
        assert!(stops_in_time(
            rules.active(),
            Duration::ZERO,
            Duration::from_secs(20)
        ));
    }

    #[test]
    fn a_drain_that_has_run_out_grants_nothing() {
        let rules = LeaseRules::new(
            Duration::from_secs(120),
            Duration::from_secs(60),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(rules.draining(Duration::from_secs(60)), Duration::ZERO);
        assert_eq!(rules.draining(Duration::from_secs(3600)), Duration::ZERO);
        assert_eq!(rules.draining(Duration::MAX), Duration::ZERO);
    }

    #[test]
    fn rules_that_would_fence_after_one_late_heartbeat_are_refused() {
        // The test registries' timings: 3 missed heartbeats of 200 ms.
        let err = LeaseRules::new(
            Duration::from_millis(600),
            Duration::from_secs(60),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(matches!(err, LeaseError::TooShort { lease, .. } if lease == Duration::ZERO));
        assert!(err.to_string().contains("two heartbeat intervals"));
    }

    proptest! {
        /// Whatever the timeout, the drain deadline and the time since the worker was last seen
        /// active, the lease granted stops the worker before the registry's earliest verdict.
        #[test]
        fn every_lease_stops_in_time(
            timeout_ms in 0u64..10_000_000,
            drain_ms in 0u64..10_000_000,
            since_ms in 0u64..20_000_000,
        ) {
            let rules = LeaseRules {
                heartbeat_timeout: Duration::from_millis(timeout_ms),
                drain_min: Duration::from_millis(drain_ms),
                kill: DEFAULT_KILL_MARGIN,
                slack: DEFAULT_TIMER_SLACK,
            };
            let (t, d, since) = (
                Duration::from_millis(timeout_ms),
                Duration::from_millis(drain_ms),
                Duration::from_millis(since_ms),
            );
            let active = rules.active();
            let draining = rules.draining(since);
            if !active.is_zero() {
                prop_assert!(stops_in_time(active, Duration::ZERO, t));
                prop_assert!(stops_in_time(active, Duration::ZERO, d));
            }
            if !draining.is_zero() {
                prop_assert!(stops_in_time(draining, since, d));
                prop_assert!(stops_in_time(draining, Duration::ZERO, t));
            }
        }
    }
}
