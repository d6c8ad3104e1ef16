//! The settle phase: the sweeps re-dispatch what crashed workers held and the workers finish
//! everything; it waits until the registry is quiet (nothing in flight, nobody busy, nothing
//! waiting to be re-dispatched), for long enough to trust it, or a time limit passes.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, Instant};
use worker_registry::{StatusSnapshot, WorkerRegistry};

use super::Sim;
use crate::app::App;

/// How the router settled.
pub(super) struct Settled {
    /// How long it took.
    pub(super) took: Duration,
    /// The registry's snapshot then.
    pub(super) status: Arc<StatusSnapshot>,
}

/// Waits for the router to settle.
pub(super) async fn run(sim: &Sim) -> Settled {
    let config = sim.app().registry().config().clone();
    let sweep = config.sweep_interval();
    // A shared backend offers a released event that a killed replica held again only after
    // `release_ack_timeout`: quiet must last that long (and a sweep) before it counts.
    let quiet_for = if sim.replicas() > 1 {
        config.release_ack_timeout() + sweep * 2
    } else {
        Duration::ZERO
    };
    let started = Instant::now();
    let limit = Duration::from_secs(10) + quiet_for * 2;
    // A sweep publishes its snapshot before its callback re-dispatches what it released, so a quiet
    // snapshot only counts if nothing was re-dispatched since before it was published: since the
    // previous poll, which saw an older snapshot.
    let mut previous: Option<(u64, u64)> = None;
    let mut quiet_since: Option<Instant> = None;
    loop {
        let live = sim.live_apps();
        let s = live[0].registry().status();
        let redispatched: u64 = live.iter().map(App::redispatched).sum();
        let pending: usize = live.iter().map(App::pending_redispatch).sum();
        let quiet = s.claims.in_flight == 0 && s.counts.busy == 0 && pending == 0;
        let settled = quiet
            && previous.is_some_and(|(generation, before)| {
                s.version > generation && redispatched == before
            });
        if settled {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= quiet_for {
                break;
            }
        } else {
            quiet_since = None;
        }
        if started.elapsed() > limit {
            break;
        }
        previous = Some((s.version, redispatched));
        sleep(sweep).await;
    }
    let took = started.elapsed();
    let status = sim.live_apps()[0].registry().status();
    Settled { took, status }
}
