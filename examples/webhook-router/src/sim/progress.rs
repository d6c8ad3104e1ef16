//! The progress phase: one line on stderr (rewritten in place on a terminal, else one a
//! second) with what was sent and how it was answered.

use std::io::{IsTerminal, Write as _};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::sleep;
use worker_registry::WorkerRegistry;

use super::client::Outcome;
use super::Sim;

/// Starts the progress line; it stops once the run is `done`.
pub(super) fn spawn(sim: &Arc<Sim>) -> JoinHandle<()> {
    let sim = sim.clone();
    tokio::spawn(async move {
        let tty = std::io::stderr().is_terminal();
        // Relaxed: a stop flag.
        while !sim.done.load(Ordering::Relaxed) {
            sleep(Duration::from_millis(if tty { 250 } else { 1000 })).await;
            let line = line(&sim);
            let mut err = std::io::stderr().lock();
            let _ = if tty {
                write!(err, "\r{line}\x1b[K")
            } else {
                writeln!(err, "{line}")
            };
            let _ = err.flush();
        }
    })
}

fn line(sim: &Sim) -> String {
    let (tally, app) = (&sim.tally, sim.app());
    let secs = sim.started.elapsed().as_secs_f64();
    // Relaxed: statistics.
    let sent = tally.sent.load(Ordering::Relaxed);
    format!(
        "[{secs:5.1}s] {sent}/{} sent, {:.0} req/s | workers {}/{} live | assigned {} duplicate {} ignored {} 503 {} | crashed {} drained {}",
        sim.deliveries.len(),
        sent as f64 / secs.max(1e-3),
        app.registry().stats().live_workers,
        app.registry().config().max_workers(),
        tally.get(Outcome::AssignedNew) + tally.get(Outcome::AssignedExisting),
        tally.get(Outcome::Duplicate),
        tally.get(Outcome::Ignored),
        tally.get(Outcome::Capacity)
            + tally.get(Outcome::Draining)
            + tally.get(Outcome::RoomFull)
            + tally.get(Outcome::OverflowFull)
            + tally.get(Outcome::Unavailable),
        tally.crashes.load(Ordering::Relaxed),
        tally.drains.load(Ordering::Relaxed),
    )
}

/// Waits for the last progress line and ends it.
pub(super) async fn finish(progress: JoinHandle<()>) {
    let _ = progress.await;
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
}
