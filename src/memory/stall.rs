//! The stall rule: time during which the registry itself was not running is never counted against
//! its workers.
//!
//! The registry cannot see a pause of its own process (a `SIGSTOP`, a paused VM, a starved
//! runtime) while it happens, but the next sweep can: sweeps run every `sweep_interval`, so a
//! sweep that comes more than two intervals after the previous one knows the registry stalled for
//! the excess. It records that span, and from then on every duration the sweep judges a worker by
//! (silence since its last heartbeat, time in flight of its claims, time since it was marked
//! suspect) leaves out the part that overlaps a recorded stall, and a drain deadline that had not
//! passed when the stall began moves out by the stall's length. A paused lease holder is given its
//! pause back in the same way.
//!
//! A worker that heartbeats after the stall is judged on that heartbeat alone: the stall lies
//! before it and no longer matters. The first sweep of a registry has no predecessor, so it
//! measures nothing.

/// The stall rule's memory between sweeps; kept under the sweep mutex (sweeps run one at a time).
pub(crate) struct StallWatch {
    /// When the previous sweep ran (ms), if one has.
    last_sweep_ms: Option<u64>,
    /// The stalls measured so far that can still matter.
    pub(crate) stalls: Stalls,
}

impl StallWatch {
    pub(crate) fn new() -> Self {
        Self {
            last_sweep_ms: None,
            stalls: Stalls::default(),
        }
    }

    /// A sweep starts at `now`: measures the stall since the previous sweep (`interval_ms` apart
    /// when the registry runs normally), records it, forgets stalls older than `horizon_ms` can
    /// reach, and returns the stall found, if any.
    pub(crate) fn begin(&mut self, now: u64, interval_ms: u64, horizon_ms: u64) -> Option<Span> {
        let prev = self
            .last_sweep_ms
            .replace(now.max(self.last_sweep_ms.unwrap_or(0)))?;
        let gap = now.saturating_sub(prev);
        let stall = (gap > interval_ms.saturating_mul(2)).then(|| Span {
            start: prev.saturating_add(interval_ms),
            end: now,
        });
        if let Some(span) = stall {
            self.stalls.record(span);
        }
        self.stalls.forget_older_than(now, horizon_ms);
        stall
    }
}

/// A span of registry time `[start, end]` (ms) during which the registry did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u64,
    pub(crate) end: u64,
}

impl Span {
    pub(crate) fn len(self) -> u64 {
        self.end - self.start
    }

    /// How much of this span lies after `from` (and before its end).
    pub(crate) fn after(self, from: u64) -> u64 {
        self.end.saturating_sub(from.max(self.start))
    }
}

/// The most stalls remembered; older ones are dropped first, which only ever gives less credit.
const MAX_STALLS: usize = 64;

/// The recorded stalls, oldest first, disjoint and increasing (each lies between two consecutive
/// sweeps), with their running total for `O(log n)` lookups.
#[derive(Default)]
pub(crate) struct Stalls {
    spans: Vec<Span>,
    /// `after[i]`: the total length of `spans[i..]`.
    suffix: Vec<u64>,
}

impl Stalls {
    fn record(&mut self, span: Span) {
        if self.spans.len() == MAX_STALLS {
            self.spans.remove(0);
        }
        self.spans.push(span);
        self.reindex();
    }

    /// Drops stalls that ended so long ago that nothing still judged can be based before them.
    /// Anything based before a stall that ended at `e` has run for at least `now - e` minus the
    /// stalls after it; once that exceeds `horizon_ms` (the longest any judgement waits), it has
    /// been judged already.
    fn forget_older_than(&mut self, now: u64, horizon_ms: u64) {
        let keep_from = (0..self.spans.len())
            .find(|&i| {
                let later = self.suffix.get(i + 1).copied().unwrap_or(0);
                now.saturating_sub(self.spans[i].end).saturating_sub(later) <= horizon_ms
            })
            .unwrap_or(self.spans.len());
        if keep_from > 0 {
            self.spans.drain(..keep_from);
            self.reindex();
        }
    }

    fn reindex(&mut self) {
        self.suffix.clear();
        let mut acc = 0u64;
        for s in self.spans.iter().rev() {
            acc = acc.saturating_add(s.len());
            self.suffix.push(acc);
        }
        self.suffix.reverse();
    }

    /// Stalled time after `from` (up to the latest sweep).
    pub(crate) fn since(&self, from: u64) -> u64 {
        // The first stall that ends after `from`; every later one lies wholly after it.
        let i = self.spans.partition_point(|s| s.end <= from);
        match self.spans.get(i) {
            None => 0,
            Some(first) => first.after(from) + self.suffix.get(i + 1).copied().unwrap_or(0),
        }
    }

    /// The time to judge something based at `from` by at `now`: `now` minus the stalled time in
    /// between, so `judge(from, now) - from` is how long the registry actually ran since `from`.
    #[inline]
    pub(crate) fn judge(&self, from: u64, now: u64) -> u64 {
        if self.spans.is_empty() {
            return now;
        }
        now.saturating_sub(self.since(from)).max(from.min(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_far_later_than_its_interval_measures_the_excess() {
        let mut s = StallWatch::new();
        assert_eq!(
            s.begin(1_000, 100, 10_000),
            None,
            "the first sweep measures nothing"
        );
        assert_eq!(s.begin(1_100, 100, 10_000), None);
        assert_eq!(
            s.begin(1_300, 100, 10_000),
            None,
            "two intervals is not a stall"
        );
        let stall = s.begin(5_300, 100, 10_000).unwrap();
        assert_eq!((stall.start, stall.end, stall.len()), (1_400, 5_300, 3_900));
        // Based before the stall: the whole stall is credited; during it: the rest of it; after
        // it: nothing.
        assert_eq!(s.stalls.since(1_000), 3_900);
        assert_eq!(s.stalls.since(5_000), 300);
        assert_eq!(s.stalls.since(5_300), 0);
        assert_eq!(s.stalls.judge(1_000, 5_400), 1_500);
        assert_eq!(s.stalls.judge(5_300, 5_400), 5_400);
    }

    #[test]
    fn stalls_add_up_and_old_ones_are_forgotten() {
        let mut s = StallWatch::new();
        s.begin(0, 10, 1_000);
        s.begin(100, 10, 1_000); // stall [10, 100]
        s.begin(110, 10, 1_000);
        s.begin(300, 10, 1_000); // stall [120, 300]
        assert_eq!(s.stalls.since(0), 90 + 180);
        assert_eq!(s.stalls.since(105), 180);
        assert_eq!(s.stalls.judge(0, 300), 30);
        s.begin(2_300, 10, 1_000); // stall [310, 2_300]
        assert_eq!(s.stalls.since(0), 90 + 180 + 1_990);
        assert_eq!(
            s.stalls.spans.len(),
            3,
            "something based at 0 has run only 40 ms"
        );
        // Regular sweeps for longer than the horizon: every stall ages out.
        for t in (2_310..=3_400).step_by(10) {
            s.begin(t, 10, 1_000);
        }
        assert!(s.stalls.spans.is_empty(), "{:?}", s.stalls.spans);
        assert_eq!(s.stalls.since(0), 0);
    }

    #[test]
    fn at_most_max_stalls_are_kept() {
        let mut s = StallWatch::new();
        let mut t = 0;
        for _ in 0..(MAX_STALLS + 10) {
            s.begin(t, 1, u64::MAX / 4);
            t += 10;
        }
        assert_eq!(s.stalls.spans.len(), MAX_STALLS);
    }
}
