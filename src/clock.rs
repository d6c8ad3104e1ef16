//! Time sources: a monotonic [`Clock`] trait, the [`SystemClock`] default, and a [`ManualClock`]
//! that tests advance by hand.
//!
//! Liveness is decided on monotonic time only. The wall clock is read for display (`started_at`,
//! `last_heartbeat` in a snapshot), so a wall-clock jump (NTP step, manual change, leap smear) never
//! declares a worker dead nor keeps a dead one alive.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
#[cfg(not(target_os = "linux"))]
use std::time::Instant;
use std::time::{Duration, SystemTime};

/// A monotonic time source, as governor's `Clock`: the registry asks it for "now" and nothing else.
///
/// `now()` is the time elapsed since an arbitrary origin fixed when the clock was made; it never goes
/// backwards. `wall()` is used only to label snapshots for humans.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use worker_registry::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let t0 = clock.now();
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(clock.now() - t0, Duration::from_secs(30));
/// ```
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time since this clock's origin.
    fn now(&self) -> Duration;

    /// Wall-clock time now (display only, never used for liveness).
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }

    /// The smallest step by which [`now`](Self::now) advances: a heartbeat timeout must be well
    /// above it, or healthy workers look silent between two ticks. The default,
    /// [`DEFAULT_CLOCK_RESOLUTION`] (1 ms, the unit the in-memory registry stores times in), suits
    /// a clock that reads a fine-grained counter; a coarser clock must say so.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::clock::DEFAULT_CLOCK_RESOLUTION;
    /// use worker_registry::{Clock, SystemClock};
    ///
    /// struct Ticks;
    /// impl Clock for Ticks {
    ///     fn now(&self) -> Duration { Duration::ZERO }
    /// }
    /// assert_eq!(Ticks.resolution(), DEFAULT_CLOCK_RESOLUTION);
    /// assert!(SystemClock::new().resolution() > Duration::ZERO);
    /// ```
    fn resolution(&self) -> Duration {
        DEFAULT_CLOCK_RESOLUTION
    }

    /// [`now`](Self::now) in whole milliseconds (rounded down, saturating): the unit the
    /// in-memory registry stores times in, read on every heartbeat, admit and completion. A clock
    /// may compute it more cheaply than through a `Duration` (the system clock does), but it must
    /// always equal `now().as_millis()`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use worker_registry::{Clock, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// clock.advance(Duration::from_micros(2_999));
    /// assert_eq!(clock.now_millis(), 2);
    /// ```
    #[inline]
    fn now_millis(&self) -> u64 {
        millis(self.now())
    }
}

/// What [`Clock::resolution`] reports unless a clock says otherwise: 1 ms.
pub const DEFAULT_CLOCK_RESOLUTION: Duration = Duration::from_millis(1);

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Duration {
        (**self).now()
    }
    fn wall(&self) -> SystemTime {
        (**self).wall()
    }
    fn resolution(&self) -> Duration {
        (**self).resolution()
    }
    #[inline]
    fn now_millis(&self) -> u64 {
        (**self).now_millis()
    }
}

/// The real clock: a coarse monotonic clock for liveness, `SystemTime` for display.
///
/// On Linux, `now()` reads `CLOCK_MONOTONIC_COARSE`: the timestamp of the kernel's last timer tick,
/// read from the vDSO data page without reading the TSC. It costs a few nanoseconds where
/// `Instant::now()` costs tens (40-90 ns on the virtual machines this crate was measured on), and
/// every heartbeat, admit and completion reads the clock once. Its resolution is one kernel tick
/// (1-4 ms, as [`resolution`](Clock::resolution) reports from `clock_getres`), three orders of
/// magnitude below the heartbeat intervals liveness is decided on, and like `Instant` it never
/// goes backwards and ignores wall-clock steps. Elsewhere it is `std::time::Instant`.
///
/// # Examples
///
/// ```
/// use worker_registry::{Clock, SystemClock};
///
/// let clock = SystemClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    #[cfg(target_os = "linux")]
    origin: Duration,
    /// `origin` in nanoseconds (for `now_millis`, which stays in `u64` arithmetic).
    #[cfg(target_os = "linux")]
    origin_ns: u64,
    #[cfg(not(target_os = "linux"))]
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        #[cfg(target_os = "linux")]
        let origin = monotonic_coarse();
        Self {
            #[cfg(target_os = "linux")]
            origin,
            #[cfg(target_os = "linux")]
            origin_ns: u64::try_from(origin.as_nanos()).unwrap_or(u64::MAX),
            #[cfg(not(target_os = "linux"))]
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Duration {
        #[cfg(target_os = "linux")]
        {
            monotonic_coarse().saturating_sub(self.origin)
        }
        #[cfg(not(target_os = "linux"))]
        {
            self.origin.elapsed()
        }
    }

    /// On Linux, the coarse clock's `timespec` turned into milliseconds in `u64` arithmetic (a
    /// multiply-add and a division by a constant), skipping the `Duration` normalisation and
    /// `u128` conversion of `millis(now())`; the result is the same.
    #[inline]
    fn now_millis(&self) -> u64 {
        #[cfg(target_os = "linux")]
        {
            coarse_nanos().saturating_sub(self.origin_ns) / 1_000_000
        }
        #[cfg(not(target_os = "linux"))]
        {
            millis(self.now())
        }
    }

    /// On Linux, `clock_getres(CLOCK_MONOTONIC_COARSE)` (one kernel tick, 4 ms at `HZ=250`), never
    /// below [`DEFAULT_CLOCK_RESOLUTION`]; elsewhere [`DEFAULT_CLOCK_RESOLUTION`].
    fn resolution(&self) -> Duration {
        #[cfg(target_os = "linux")]
        {
            coarse_resolution().max(DEFAULT_CLOCK_RESOLUTION)
        }
        #[cfg(not(target_os = "linux"))]
        {
            DEFAULT_CLOCK_RESOLUTION
        }
    }
}

/// `clock_getres(CLOCK_MONOTONIC_COARSE)`; 10 ms (a slow kernel tick) if the call fails.
#[cfg(target_os = "linux")]
fn coarse_resolution() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed `timespec` for the call to write into, and
    // `CLOCK_MONOTONIC_COARSE` is a clock id every Linux since 2.6.32 supports.
    let rc = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        return Duration::from_millis(10);
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// `CLOCK_MONOTONIC_COARSE` as a `Duration` since boot.
#[cfg(target_os = "linux")]
#[inline]
fn monotonic_coarse() -> Duration {
    let ts = coarse_timespec();
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds since boot (saturating; `u64` nanoseconds last 584
/// years of uptime).
#[cfg(target_os = "linux")]
#[inline]
fn coarse_nanos() -> u64 {
    let ts = coarse_timespec();
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// `clock_gettime(CLOCK_MONOTONIC_COARSE)`.
#[cfg(target_os = "linux")]
#[inline]
fn coarse_timespec() -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed `timespec` for the call to write into, and
    // `CLOCK_MONOTONIC_COARSE` is a clock id every Linux since 2.6.32 supports. Were the call ever
    // to fail, `ts` stays zero and `now()` saturates to the origin: nothing looks stale.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC_COARSE) failed");
    ts
}

/// A clock that only moves when told to: the fake clock for tests (like governor's `FakeRelativeClock`).
///
/// Cloning shares the same time, so a test keeps one clone and hands another to the registry.
/// Its wall clock is a fixed instant plus the elapsed manual time, so snapshots are reproducible.
///
/// It uses `std` atomics even under loom: time is an input the models set, not a subject of them.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use worker_registry::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(shared.now(), Duration::from_millis(1500));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

/// The wall-clock time a [`ManualClock`] reports at its origin: 2026-01-01T00:00:00Z.
pub const MANUAL_CLOCK_WALL_ORIGIN_SECS: u64 = 1_767_225_600;

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `by` (saturating at about 584 years).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // SeqCst: tests advance time from one thread and expect every other thread's next read to
        // see it; this is test infrastructure, so the strongest ordering costs nothing that matters.
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Sets the time to `to` if that is later than now (time never goes backwards).
    pub fn set(&self, to: Duration) {
        let to = u64::try_from(to.as_nanos()).unwrap_or(u64::MAX);
        // SeqCst: as in `advance`.
        self.nanos.fetch_max(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Duration {
        // SeqCst: pairs with `advance`; see there.
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    fn wall(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(MANUAL_CLOCK_WALL_ORIGIN_SECS) + self.now()
    }

    /// 1 ns: it represents any step it is given exactly.
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
}

/// A clock driven by tokio's time, so `tokio::time::pause()` and `advance()` move it: the clock to use
/// when testing the [`Sweeper`](crate::Sweeper) with paused time.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use worker_registry::{Clock, TokioClock};
///
/// let clock = TokioClock::new();
/// tokio::time::advance(Duration::from_secs(5)).await;
/// assert!(clock.now() >= Duration::from_secs(5));
/// # }
/// ```
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

#[cfg(feature = "tokio")]
impl TokioClock {
    /// A clock whose origin is tokio's now (call from inside a runtime when time is paused).
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

#[cfg(feature = "tokio")]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tokio")]
impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// 1 ms: tokio's timers (which drive the sleeps and intervals of whoever heartbeats on this
    /// time) fire at millisecond granularity.
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
}

/// Milliseconds since the clock's origin, the unit stored in a worker's state word.
#[inline]
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolutions_are_reported() {
        let system = SystemClock::new().resolution();
        assert!(system >= DEFAULT_CLOCK_RESOLUTION, "{system:?}");
        // A kernel tick is at most 10 ms on any configuration Linux ships (HZ >= 100).
        assert!(system <= Duration::from_millis(10), "{system:?}");
        assert_eq!(ManualClock::new().resolution(), Duration::from_nanos(1));
        assert_eq!(
            Arc::new(ManualClock::new()).resolution(),
            Duration::from_nanos(1)
        );
    }

    /// `now_millis` is `now()` in whole milliseconds, read in either order around it.
    #[test]
    fn now_millis_agrees_with_now() {
        let clock = SystemClock::new();
        for _ in 0..1_000 {
            let before = millis(clock.now());
            let ms = clock.now_millis();
            let after = millis(clock.now());
            assert!(before <= ms && ms <= after, "{before} <= {ms} <= {after}");
        }
        let manual = ManualClock::new();
        manual.advance(Duration::from_nanos(7_999_999));
        assert_eq!(manual.now_millis(), 7);
    }

    /// The reported resolution is what the clock does: two reads a tick apart differ, and no step
    /// is smaller than a tick (sampled over a few ticks, with no wall-clock threshold).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_coarse_clock_moves_in_steps_of_its_resolution() {
        let res = coarse_resolution();
        let clock = SystemClock::new();
        let mut last = clock.now();
        let mut steps = 0;
        while steps < 3 {
            let now = clock.now();
            if now != last {
                assert!(
                    now - last >= res / 2,
                    "step {:?} below resolution {res:?}",
                    now - last
                );
                last = now;
                steps += 1;
            }
            std::hint::spin_loop();
        }
    }
}
