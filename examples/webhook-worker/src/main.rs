//! `webhook-worker`: the ready-made worker of worker-registry's reference router. It speaks the
//! worker protocol (`/worker/v1`, designed in the router's `docs::worker_protocol`) and runs a
//! command once per event. The README has the flags, the environment and the exit statuses.
//!
//! * [`cli`]: the command line and environment;
//! * [`client`]: the protocol's calls and how each answer is read;
//! * [`state`]: what the threads share (the lease, the verdict, the stop, the command's exit);
//! * [`heartbeat`]: the heartbeat thread;
//! * [`run`]: the main loop (long poll, batches, drain, idle exit);
//! * [`event`]: one event's attempts and completion;
//! * [`command`]: the command's process group, environment and stdin;
//! * [`ending`]: how the worker ends, and its exit status.
//!
//! Threads, not an async runtime: three long-lived ones (main, heartbeat, signals) and two per
//! command run (its stdin writer, its waiter), all blocking; the README argues the choice.

mod cli;
mod client;
mod command;
mod ending;
mod event;
mod heartbeat;
mod run;
mod state;

use crate::ending::{Ending, USAGE_STATUS};
use crate::state::Shared;

use std::sync::Arc;

use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM};

fn main() {
    let args = match cli::Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            std::process::exit(if usage { USAGE_STATUS } else { 0 });
        }
    };
    init_logs(args.log_json);
    let shared = Arc::new(Shared::default());
    if let Err(e) = signals(&shared) {
        finish(&Ending::Failed(format!("cannot receive signals: {e}")));
    }
    let client = client::Client::new(&args.router_url, &args.credential);
    tracing::info!(worker = args.worker_id, router = %args.router_url, "worker started");
    heartbeat::spawn(client.clone(), Arc::clone(&shared));
    let ending = run::run(&args, &shared, &client);
    // The heartbeat thread stops at its next wake-up; the process does not wait for it.
    shared.update(|s| s.stop = true);
    finish(&ending);
}

fn finish(ending: &Ending) -> ! {
    let status = ending.status();
    if status == 0 {
        tracing::info!(status, "worker exits: {ending}");
    } else {
        tracing::error!(status, "worker exits: {ending}");
    }
    std::process::exit(status);
}

/// `SIGTERM`/`SIGINT` on a thread of their own: record the stop (the main thread stops its
/// command at the grace and exits), or end at once if the main thread is in a long poll.
fn signals(shared: &Arc<Shared>) -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                tracing::info!(signal, "stop signal");
                shared.update(|s| {
                    s.stop = true;
                    if s.polling {
                        // Nothing runs, the state lock is held: the main thread cannot start
                        // a command now. An event in the poll's answer stays the router's.
                        finish(&Ending::Stopped);
                    }
                });
            }
        })?;
    Ok(())
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::filter::LevelFilter::INFO;
    let b = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(filter)
        .with_ansi(false);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}
