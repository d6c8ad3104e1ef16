//! The heartbeat thread: heartbeats on a connection of its own, concurrently with the long poll
//! and the command, and applies each answer to the shared lease.
//!
//! The interval is a quarter of the last lease granted (so three heartbeats can fail before it
//! runs out), at least [`MIN_INTERVAL`]; after a failure (`503`, no answer) the next try comes
//! within [`RETRY_INTERVAL`]. A heartbeat's answer counts from the instant it was sent, and a
//! heartbeat not answered within the interval is abandoned (its answer would come too late to
//! be worth the lease it grants).

use crate::client::{Client, Refusal};
use crate::state::{Shared, Verdict};

use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shortest interval between two heartbeats, whatever the lease.
pub const MIN_INTERVAL: Duration = Duration::from_millis(50);

/// The longest wait before a failed heartbeat is tried again.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// The interval before the first answer: try at once, then every [`RETRY_INTERVAL`].
const FIRST_INTERVAL: Duration = RETRY_INTERVAL;

/// Starts the heartbeat thread; it ends once a verdict or a stop is recorded.
pub fn spawn(client: Client, shared: Arc<Shared>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || run(&client, &shared))
        .expect("a thread can be spawned")
}

fn run(client: &Client, shared: &Shared) {
    let mut interval = FIRST_INTERVAL;
    loop {
        {
            let s = shared.lock();
            if s.verdict.is_some() || s.stop {
                return;
            }
        }
        let sent = Instant::now();
        let next = match client.heartbeat(interval.max(RETRY_INTERVAL)) {
            Ok(beat) => {
                shared.update(|s| s.renew(sent, beat.lease, beat.draining));
                interval = (beat.lease / 4).max(MIN_INTERVAL);
                tracing::debug!(
                    lease_ms = beat.lease.as_millis() as u64,
                    draining = beat.draining,
                    "heartbeat"
                );
                sent + interval
            }
            Err(Refusal::Fenced { reason }) => {
                return shared.update(|s| s.verdict = Some(Verdict::Fenced(reason)));
            }
            Err(Refusal::Unauthorized) => {
                return shared.update(|s| s.verdict = Some(Verdict::Unauthorized));
            }
            Err(e) => {
                let left = shared.lock().remaining(Instant::now());
                tracing::warn!(
                    lease_left_ms = left.as_millis() as u64,
                    "heartbeat not answered, trying again: {e}"
                );
                sent + interval.min(RETRY_INTERVAL)
            }
        };
        sleep_until(shared, next);
    }
}

/// Sleeps until `until`, or until a verdict or a stop is recorded.
fn sleep_until(shared: &Shared, until: Instant) {
    let mut s = shared.lock();
    while Instant::now() < until && s.verdict.is_none() && !s.stop {
        s = shared.wait(s, Some(until));
    }
}
