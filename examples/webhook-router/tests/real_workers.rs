//! End to end with real processes: the router's `process` launcher starts real `webhook-worker`
//! processes (built by `cargo build -p webhook-worker`), whose event command records its own start
//! and end times, its pid and the digest of the body it read, into files of a directory of the
//! test's. The registry is in memory on a `ManualClock`: a worker dies only when the test moves
//! that clock, so no test bets on timing; waits are for conditions, capped by a hang bound.
//!
//! * a worker `SIGKILL`ed mid-event: its delivery runs again in a new process on a byte-equal
//!   body, exactly once more;
//! * a worker cut off from the router by a TCP proxy that stops forwarding kills its command on
//!   its own lease, while the registry still counts it alive; its successor's command starts
//!   after the last sign of life of the first (their own timestamps);
//! * drain: the current event completes and the worker process exits 0;
//! * neither the admin token nor the webhook secret is in `/proc/<pid>/environ` of a worker or
//!   of its command.
//!
//! Without the `webhook-worker` binary each test says so in one line and passes; under `CI` it
//! fails instead.
#![cfg(target_os = "linux")]

mod common;
mod real_common;

use real_common::{body, digest, event_command, real, scratch, until, worker_binary, Real, Start};

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use webhook_router::launcher::process::ProcessLauncher;
use worker_registry::{WorkerId, WorkerRegistry};

/// A router whose workers are `webhook-worker` processes, reaching it through `proxy` when
/// given; `None` when the binary is not built.
async fn processes(
    secret: Option<&'static str>,
    token: Option<&'static str>,
    proxy: Option<(TcpListener, watch::Receiver<bool>)>,
) -> Option<Real> {
    let bin = worker_binary()?;
    let dir = scratch();
    let argv = vec![
        bin.display().to_string(),
        "--event-command".to_owned(),
        event_command(&dir, "$$"),
        "--idle-exit".to_owned(),
        "0s".to_owned(),
    ];
    let launcher = ProcessLauncher::builder(argv)
        .stop_grace(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut start = Start::new(dir, Arc::new(launcher));
    (start.secret, start.token, start.proxy) = (secret, token, proxy);
    Some(real(start).await)
}

fn alive(pid: u64) -> bool {
    // A zombie has no /proc/<pid>/environ readable... but still a stat: check its state.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_event_runs_it_again_in_a_new_process_exactly_once_more() {
    let Some(r) = processes(None, None, None).await else {
        return;
    };
    let body = body();
    let first = r.deliver("d-1", &body).await;
    let started = r.until("start", 1).await;
    // Mid-event: the command has read its body and is waiting for go.
    let tick = r.dir.join(format!("tick-{}", started[0].run));
    until("the first run's first tick", || tick.exists().then_some(())).await;
    // SIGKILL of the worker's process group (Control::kill).
    r.server
        .app()
        .lifecycle()
        .crash(WorkerId::new(first))
        .await
        .unwrap();
    until("the killed worker's command to die", || {
        (!alive(started[0].run)).then_some(())
    })
    .await;
    r.pass_the_timeout().await;
    let again = r.until("start", 2).await;
    assert_ne!(again[1].run, again[0].run, "a new process");
    r.go("d-1");
    r.until("end", 1).await;
    r.assert_ran_twice_completed_once("d-1", &body).await;
    let dead = r
        .registry
        .worker(WorkerId::new(first))
        .await
        .unwrap()
        .unwrap();
    assert!(!dead.status.is_alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_the_router_kills_its_command_before_its_pr_moves_on() {
    let (cut_tx, cut) = watch::channel(false);
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let Some(r) = processes(None, None, Some((proxy, cut))).await else {
        return;
    };
    let body = body();
    let first = WorkerId::new(r.deliver("d-1", &body).await);
    let started = r.until("start", 1).await;
    let pid = started[0].run;
    // The proxy stops forwarding: the worker's heartbeats go unanswered.
    cut_tx.send_replace(true);
    // The worker's lease runs out and it kills its command: on its own, since the registry's
    // clock has not moved and the router still counts it alive.
    until("the cut-off command to die", || (!alive(pid)).then_some(())).await;
    let info = r.registry.worker(first).await.unwrap().unwrap();
    assert!(
        info.status.is_alive(),
        "the command died while the registry still counted its worker alive: {:?}",
        info.status
    );
    let ticks = r.read(&format!("tick-{pid}"));
    // The last whole line (a kill may cut the last write short).
    let last_tick: u128 = ticks
        .lines()
        .rev()
        .find_map(|l| l.trim().parse().ok())
        .unwrap();
    // Only now may the registry hand the pull request on.
    cut_tx.send_replace(false);
    r.pass_the_timeout().await;
    let again = r.until("start", 2).await;
    r.go("d-1");
    r.until("end", 1).await;
    assert!(
        again[1].ns > last_tick,
        "the successor's command started ({}) after the first one's last sign of life ({last_tick})",
        again[1].ns
    );
    assert_eq!(
        r.read(&format!("digest-d-1-{}", again[1].run)).trim(),
        digest(&body)
    );
    assert!(
        r.lines().iter().all(|l| l.what != "end" || l.run != pid),
        "the cut-off command never finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_completes_its_event_and_exits_0() {
    let Some(r) = processes(None, None, None).await else {
        return;
    };
    r.drain_mid_event().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_or_command_sees_the_admin_token_or_the_webhook_secret() {
    const SECRET: &str = "webhook-secret-5c1e";
    const TOKEN: &str = "admin-token-a7d3";
    let Some(r) = processes(Some(SECRET), Some(TOKEN), None).await else {
        return;
    };
    r.deliver("d-1", &body()).await;
    let started = r.until("start", 1).await;
    let pid = started[0].run;
    let worker_env = until("the worker's environ", || {
        std::fs::read_to_string(r.dir.join(format!("env-worker-{pid}")))
            .ok()
            .filter(|s| !s.is_empty())
    })
    .await;
    let command_env = until("the command's environ", || {
        std::fs::read_to_string(r.dir.join(format!("env-cmd-{pid}")))
            .ok()
            .filter(|s| !s.is_empty())
    })
    .await;
    assert!(
        worker_env.contains("WORKER_CREDENTIAL="),
        "the worker's own environ: {worker_env}"
    );
    assert!(!command_env.contains("WORKER_CREDENTIAL="));
    for env in [&worker_env, &command_env] {
        assert!(!env.contains(SECRET), "the webhook secret leaked: {env}");
        assert!(!env.contains(TOKEN), "the admin token leaked: {env}");
    }
    r.go("d-1");
    r.until("end", 1).await;
}
