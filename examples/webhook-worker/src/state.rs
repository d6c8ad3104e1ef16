//! What the worker's threads share: the lease (rules 1 and 2 of the design page), the last
//! status the router gave, a verdict that ends the worker, the stop signal, and the running
//! command's exit. One mutex and one condition variable: every change wakes the main thread,
//! which alone decides what the worker does.

use std::process::ExitStatus;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why the worker must end now, whatever it is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `410` on some call.
    Fenced(String),
    /// `401` on some call.
    Unauthorized,
}

/// The shared state (see the [module documentation](self)).
#[derive(Debug, Default)]
pub struct State {
    /// When the lease runs out; `None` before the first successful heartbeat.
    pub lease_until: Option<Instant>,
    /// The send instant of the newest heartbeat whose answer was applied.
    newest_sent: Option<Instant>,
    /// The last heartbeat said `draining`.
    pub draining: bool,
    /// Set once; the main thread ends the worker.
    pub verdict: Option<Verdict>,
    /// `SIGTERM` or `SIGINT` arrived.
    pub stop: bool,
    /// The main thread is in a long poll, running nothing: a stop may end the process at once.
    pub polling: bool,
    /// The running command has ended (set by its waiter thread, taken by the main thread).
    pub command_exit: Option<std::io::Result<ExitStatus>>,
}

impl State {
    /// Rule 2: a heartbeat sent at `sent` and answered extends the lease to `sent + lease`,
    /// unless a newer heartbeat's answer was already applied.
    pub fn renew(&mut self, sent: Instant, lease: Duration, draining: bool) {
        if self.newest_sent.is_some_and(|n| n >= sent) {
            return;
        }
        self.newest_sent = Some(sent);
        self.lease_until = Some(sent + lease);
        self.draining = draining;
    }

    /// Whether the worker holds an unexpired lease at `now` (rule 1).
    pub fn holds_lease(&self, now: Instant) -> bool {
        self.lease_until.is_some_and(|u| now < u)
    }

    /// What is left of the lease at `now` (zero without one).
    pub fn remaining(&self, now: Instant) -> Duration {
        self.lease_until
            .map_or(Duration::ZERO, |u| u.saturating_duration_since(now))
    }
}

/// [`State`] behind its mutex, with the condition variable every change notifies.
#[derive(Debug, Default)]
pub struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    /// Locks the state. **Locking behaviour:** the one mutex; held only for field updates.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A thread that panicked holding the lock left plain data behind: keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the state and wakes every waiter. **Locking behaviour:** the one mutex.
    pub fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }

    /// Waits for a change, at most until `until` (forever with `None`). **Locking behaviour:**
    /// releases the mutex while waiting.
    pub fn wait<'a>(
        &self,
        guard: MutexGuard<'a, State>,
        until: Option<Instant>,
    ) -> MutexGuard<'a, State> {
        match until {
            None => self.changed.wait(guard).unwrap_or_else(|p| p.into_inner()),
            Some(u) => {
                let d = u.saturating_duration_since(Instant::now());
                self.changed
                    .wait_timeout(guard, d)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_answer_never_moves_the_lease() {
        let mut s = State::default();
        let t0 = Instant::now();
        assert!(!s.holds_lease(t0), "no lease before the first heartbeat");
        let t1 = t0 + Duration::from_secs(1);
        s.renew(t1, Duration::from_secs(10), false);
        assert_eq!(s.lease_until, Some(t1 + Duration::from_secs(10)));
        // An answer to the earlier heartbeat, arriving late, with a longer lease: ignored.
        s.renew(t0, Duration::from_secs(60), true);
        assert_eq!(s.lease_until, Some(t1 + Duration::from_secs(10)));
        assert!(!s.draining);
        // A newer one with a shorter lease shortens it (a draining answer).
        let t2 = t1 + Duration::from_secs(1);
        s.renew(t2, Duration::from_secs(2), true);
        assert_eq!(s.lease_until, Some(t2 + Duration::from_secs(2)));
        assert!(s.draining && s.holds_lease(t2) && !s.holds_lease(t2 + Duration::from_secs(2)));
    }
}
