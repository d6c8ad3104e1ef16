//! The settle phase: the sweeps re-dispatch what crashed workers held and the workers finish
//! everything. On a shared backend it waits until the server holds nothing unfinished (the
//! library's audit, [`Audit::unfinished`](worker_registry::Audit::unfinished)) and no router
//! keeps a released event to re-dispatch; in memory, until the registry is quiet (nothing in flight, nobody busy, nothing
//! waiting to be re-dispatched). Either way at most [`SETTLE_CAP`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, Instant};
use worker_registry::{StatusSnapshot, WorkerRegistry};

use super::sampler::Probe;
use super::Sim;

/// How long the settle phase after the traffic waits at most for every accepted delivery to be
/// completed (it normally takes a second or two; a loaded machine takes longer, never this long
/// unless something is stuck).
///
/// # Examples
///
/// ```
/// use webhook_router::sim::SETTLE_CAP;
///
/// assert!(SETTLE_CAP.as_secs() >= 10);
/// ```
pub const SETTLE_CAP: Duration = Duration::from_secs(60);

/// How the router settled.
pub(super) struct Settled {
    /// How long it took.
    pub(super) took: Duration,
    /// The registry's snapshot then.
    pub(super) status: Arc<StatusSnapshot>,
    /// `Some` if the phase ended at [`SETTLE_CAP`] rather than settled: what the server still
    /// held unfinished then (0 in memory), or why it could not be read.
    pub(super) cut: Option<Result<u64, String>>,
    /// Released events the live routers kept to re-dispatch when the phase ended.
    pub(super) pending: usize,
}

/// Waits for the router to settle.
pub(super) async fn run(sim: &Sim, probe: &Probe) -> Settled {
    let sweep = sim.app().registry().config().sweep_interval();
    let started = Instant::now();
    // A shared backend: settled when its server holds no unfinished claim and no released delivery
    // not yet re-dispatched, and no router keeps one to place later. That is "every accepted
    // delivery completed", read where it is decided, so no wall-clock stretch of quiet snapshots
    // stands in for it (a loaded machine re-dispatches late, not never; a released delivery not
    // yet re-dispatched is invisible in the snapshot).
    // In memory (one replica), the snapshot is the registry's own state: quiet once a snapshot
    // published after the previous poll shows nothing in flight or busy and nothing was
    // re-dispatched since (a sweep publishes before its callback re-dispatches).
    let mut previous: Option<(u64, u64)> = None;
    let mut cut = None;
    let mut pending;
    loop {
        let live = sim.live_apps();
        pending = live
            .iter()
            .map(|a| a.outstanding().pending())
            .sum::<usize>();
        let settled = match probe.unfinished().await {
            Some(read) => {
                let left = read.map_err(|e| e.to_string());
                let done = left == Ok(0) && pending == 0;
                cut = Some(left);
                done
            }
            None => {
                let s = live[0].registry().status();
                let redispatched: u64 = live.iter().map(|a| a.redispatcher().redispatched()).sum();
                let quiet = s.claims.in_flight == 0 && s.counts.busy == 0 && pending == 0;
                let settled = quiet
                    && previous.is_some_and(|(generation, before)| {
                        s.version > generation && redispatched == before
                    });
                previous = Some((s.version, redispatched));
                settled
            }
        };
        if settled {
            cut = None;
            break;
        }
        if started.elapsed() > SETTLE_CAP {
            cut.get_or_insert(Ok(0));
            break;
        }
        sleep(sweep).await;
    }
    let took = started.elapsed();
    let status = sim.live_apps()[0].registry().status();
    Settled {
        took,
        status,
        cut,
        pending,
    }
}
