//! The router over a launcher of the test's own ([`Platform::launcher`](webhook_router::app::Platform)):
//! a start the launcher refuses loses nothing. The worker, never started, never heartbeats; the
//! sweep declares it dead after its start-up grace and releases its event, which the router
//! admits again onto a new worker, launched this time, which completes it.
//!
//! Time: tokio's paused clock, as in `router.rs`; waits poll observable state.

mod common;

use common::*;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use reqwest::StatusCode;
use serde_json::Value;
use webhook_router::launcher::task::TaskLauncher;
use webhook_router::launcher::{
    BoxFuture, Launch, LaunchError, Launched, Launcher, Leftover, ENV_WORKER_ID,
};
use webhook_router::worker::Timings;

/// Refuses the first `refuse` starts, then starts simulated workers; counts the starts asked for.
struct Flaky {
    tasks: TaskLauncher,
    refuse: u32,
    asked: AtomicU32,
}

impl Launcher for Flaky {
    fn kind(&self) -> &'static str {
        "flaky"
    }

    fn launch(&self, spec: Launch) -> BoxFuture<'_, Result<Launched, LaunchError>> {
        assert_eq!(
            spec.env,
            vec![(ENV_WORKER_ID.to_owned(), spec.id.to_string())],
            "a worker's environment names it, and holds nothing else"
        );
        // Relaxed: a counter read after the run.
        if self.asked.fetch_add(1, Ordering::Relaxed) < self.refuse {
            let worker = spec.id;
            return Box::pin(async move {
                Err(LaunchError::Refused {
                    worker,
                    reason: "refused by the test".to_owned(),
                })
            });
        }
        self.tasks.launch(spec)
    }

    fn leftovers(&self) -> BoxFuture<'_, Result<Vec<Leftover>, LaunchError>> {
        self.tasks.leftovers()
    }

    fn remove(&self, leftover: Leftover) -> BoxFuture<'_, Result<(), LaunchError>> {
        self.tasks.remove(leftover)
    }
}

#[tokio::test(start_paused = true)]
async fn a_refused_start_loses_nothing() {
    let made: Arc<OnceLock<Arc<Flaky>>> = Arc::default();
    let keep = made.clone();
    let setup = Setup::default();
    let (work, idle) = (setup.work, setup.idle);
    let make: MakeLauncher = Arc::new(move |registry| {
        let flaky = keep
            .get_or_init(|| {
                Arc::new(Flaky {
                    tasks: TaskLauncher::new(
                        registry,
                        Timings {
                            heartbeat: HEARTBEAT,
                            work,
                            idle,
                        },
                        Arc::default(),
                        Arc::default(),
                    ),
                    refuse: 1,
                    asked: AtomicU32::new(0),
                })
            })
            .clone();
        flaky as Arc<dyn Launcher>
    });
    let h = start(Setup {
        launcher: Some(make),
        ..setup
    })
    .await;
    let payload = pr("o/r", 1);
    let a = h.deliver("pull_request", "d-1", &payload).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    let first = worker_of(&a);
    // The refused worker dies unstarted; the event is admitted again onto a new worker, which is
    // launched and completes it.
    eventually(|| async {
        let again = h.deliver("pull_request", "d-1", &payload).await;
        (again.body["outcome"] == "duplicate" && again.body["state"] == "completed").then_some(())
    })
    .await;
    let flaky = made.get().unwrap();
    // Relaxed: read after the run.
    assert_eq!(
        flaky.asked.load(Ordering::Relaxed),
        2,
        "one refused start, one more"
    );
    let dead: Value = h.get(&format!("/workers/{first}")).await.body;
    assert_eq!(
        (&dead["status"], &dead["reason"], &dead["has_heartbeated"]),
        (&"dead".into(), &"missed_heartbeats".into(), &false.into()),
        "the refused worker died unstarted: {dead}"
    );
}
