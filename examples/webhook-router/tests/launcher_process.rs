//! The `process` launcher with real processes (`sh -c` commands as the worker). No sleep stands
//! for a duration: every wait is on a log line (the worker's output, through the launcher), a
//! process's exit (a pidfd) or the worker's [`Exit`], with a generous bound that only turns a hang
//! into a failure; the stop grace is measured on tokio's paused clock.
#![cfg(target_os = "linux")]

mod launcher_common;

use launcher_common::*;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use webhook_router::launcher::process::{ProcessLauncher, ProcessLauncherBuilder};
use webhook_router::launcher::{Exit, Launch, LaunchError, Launched, Launcher};
use webhook_router::mailbox::{self, OverflowMetrics};
use worker_registry::WorkerId;

fn sh(script: &str) -> ProcessLauncherBuilder {
    log(); // the capture is installed before any worker logs
    ProcessLauncher::builder(vec!["sh".into(), "-c".into(), script.into()])
}

fn launch_spec(id: u64, env: &[(&str, &str)]) -> Launch {
    let (_tx, jobs) = mailbox::channel(4, 4, OverflowMetrics::default());
    let mut spec = Launch::new(WorkerId::new(id), jobs);
    spec.env
        .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    spec
}

async fn launch(launcher: &ProcessLauncher, id: u64, env: &[(&str, &str)]) -> Launched {
    launcher.launch(launch_spec(id, env)).await.unwrap()
}

async fn exit_of(launched: Launched) -> Exit {
    tokio::time::timeout(HUNG, launched.exit)
        .await
        .expect("hung waiting for the worker's exit")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wr-launcher-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test]
async fn the_environment_is_exactly_the_one_given_plus_path() {
    let launcher = sh("echo pid $$; tail -f /dev/null")
        .path("/usr/bin:/bin")
        .build()
        .unwrap();
    // The test's own environment (HOME, CARGO_*, ...) must not leak: the set is compared whole.
    assert!(std::env::vars_os().count() > 0);
    let launched = launch(&launcher, 101, &[("WORKER_CREDENTIAL", "v1.101.x.y")]).await;
    let pid: i32 = wait_line(101, "stdout", "pid ").await.parse().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let env: BTreeSet<&[u8]> = environ
        .split(|&b| b == 0)
        .filter(|v| !v.is_empty())
        .collect();
    let expected: BTreeSet<&[u8]> = [
        &b"PATH=/usr/bin:/bin"[..],
        b"WORKER_ID=101",
        b"WORKER_CREDENTIAL=v1.101.x.y",
    ]
    .into();
    assert_eq!(env, expected);
    launched.control.kill();
    assert_eq!(exit_of(launched).await, Exit::Crashed);
}

/// The worker's children: one in its process group, one in a group of its own (as the
/// `webhook-worker` starts its command); both must die with it.
const FAMILY: &str = "tail -f /dev/null & echo child $!; \
    python3 -c 'import os, signal; os.setpgid(0, 0); print(\"grandchild\", os.getpid(), flush=True); signal.pause()' & \
    wait";

async fn family(id: u64) -> [i32; 2] {
    let child = wait_line(id, "stdout", "child ").await.parse().unwrap();
    let grandchild = wait_line(id, "stdout", "grandchild ")
        .await
        .parse()
        .unwrap();
    assert!(alive(child) && alive(grandchild));
    [child, grandchild]
}

#[tokio::test]
async fn kill_ends_the_whole_session_children_in_other_groups_too() {
    let launcher = sh(FAMILY).build().unwrap();
    let launched = launch(&launcher, 102, &[]).await;
    let pids = family(102).await;
    launched.control.kill();
    assert_eq!(exit_of(launched).await, Exit::Crashed);
    for pid in pids {
        assert!(!alive(pid), "process {pid} outlived its killed worker");
    }
    // Calls after the end do nothing (and signal no one).
    let again = launch(&launcher, 103, &[("X", "1")]).await;
    again.control.kill();
    again.control.stop();
    assert!(matches!(
        exit_of(again).await,
        Exit::Crashed | Exit::Stopped(_)
    ));
}

#[tokio::test]
async fn a_worker_that_ends_by_itself_leaves_nothing_running() {
    // The worker exits 0 while its children run (once the test writes to its FIFO): the
    // launcher kills them.
    let dir = temp_dir("fifo");
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("go");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    let script = FAMILY.replace("wait", &format!("read line < {}; exit 0", fifo.display()));
    let launcher = sh(&script).build().unwrap();
    let launched = launch(&launcher, 104, &[]).await;
    let pids = family(104).await;
    tokio::task::spawn_blocking(move || std::fs::write(fifo, "go\n"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(exit_of(launched).await, Exit::Exited);
    for pid in pids {
        assert!(!alive(pid), "process {pid} outlived its worker");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn dropping_the_exit_kills_the_session() {
    let launcher = sh(FAMILY).build().unwrap();
    let launched = launch(&launcher, 105, &[]).await;
    let pids = family(105).await;
    drop(launched);
    for pid in pids {
        wait_gone(pid).await;
    }
}

#[tokio::test(start_paused = true)]
async fn stop_sends_sigterm_then_sigkill_after_the_grace() {
    // Ignores SIGTERM (the trap is inherited by tail), so only the escalation ends it. The grace
    // is an hour of tokio's paused clock, advanced when the test has nothing else to do.
    let launcher = sh("trap '' TERM; echo ready; tail -f /dev/null")
        .stop_grace(Duration::from_secs(3600))
        .build()
        .unwrap();
    let launched = launch(&launcher, 106, &[]).await;
    // No timer may run while the worker starts (the paused clock would jump to it).
    let mut log = log().subscribe();
    log.wait_for(|l| {
        l.iter()
            .any(|e| e.field("worker") == Some("106") && e.field("message") == Some("ready"))
    })
    .await
    .unwrap();
    let started = tokio::time::Instant::now();
    launched.control.stop();
    assert_eq!(launched.exit.await, Exit::Stopped(Vec::new()));
    assert!(started.elapsed() >= Duration::from_secs(3600));
    let ended = wait_event(106, |e| e.field("message") == Some("worker process ended")).await;
    assert_eq!(ended.field("status"), Some("signal: 9 (SIGKILL)"));
}

#[tokio::test]
async fn stop_of_a_worker_that_honours_sigterm_is_stopped() {
    let launcher =
        sh("trap 'echo term; exit 0' TERM; echo ready; while :; do read x < /dev/null; done")
            .build()
            .unwrap();
    let launched = launch(&launcher, 107, &[]).await;
    wait_line(107, "stdout", "ready").await;
    launched.control.stop();
    assert_eq!(exit_of(launched).await, Exit::Stopped(Vec::new()));
    wait_line(107, "stdout", "term").await;
}

#[tokio::test]
async fn exit_statuses_map() {
    let launcher = sh("case $HOW in signal) kill -9 $$ ;; *) exit $HOW ;; esac")
        .build()
        .unwrap();
    for (id, how, exit) in [
        (110, "0", Exit::Exited),
        (111, "3", Exit::Fenced),
        (112, "4", Exit::Crashed),
        (113, "1", Exit::Crashed),
        (114, "signal", Exit::Crashed),
    ] {
        let launched = launch(&launcher, id, &[("HOW", how)]).await;
        assert_eq!(exit_of(launched).await, exit, "exit {how}");
    }
}

#[tokio::test]
async fn output_lines_arrive_tagged_with_the_worker() {
    let launcher = sh("echo out-line; echo err-line >&2; printf 'no newline'")
        .build()
        .unwrap();
    let launched = launch(&launcher, 120, &[]).await;
    assert_eq!(exit_of(launched).await, Exit::Exited);
    // Read before the exit was reported: no wait needed, but wait_line also checks the tags.
    assert_eq!(wait_line(120, "stdout", "out-line").await, "");
    assert_eq!(wait_line(120, "stderr", "err-line").await, "");
    assert_eq!(wait_line(120, "stdout", "no newline").await, "");
}

#[tokio::test]
async fn a_command_that_does_not_exist_is_refused_and_leaves_no_record() {
    let dir = temp_dir("missing");
    let launcher = ProcessLauncher::builder(vec!["/nonexistent/webhook-worker".into()])
        .state_dir(&dir)
        .build()
        .unwrap();
    let err = launcher
        .launch(launch_spec(130, &[]))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&err, LaunchError::Refused { worker, reason } if worker.get() == 130 && reason.contains("/nonexistent/webhook-worker")),
        "{err}"
    );
    assert!(launcher.leftovers().await.unwrap().is_empty());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    assert!(ProcessLauncher::builder(Vec::new()).build().is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_previous_incarnations_leftover_is_found_and_removed() {
    let dir = temp_dir("leftover");
    let before = sh(FAMILY).state_dir(&dir).build().unwrap();
    let launched = launch(&before, 140, &[]).await;
    let [child, grandchild] = family(140).await;
    let worker_pid: i32 = wait_event(140, |e| {
        e.field("message") == Some("worker process started")
    })
    .await
    .field("pid")
    .unwrap()
    .parse()
    .unwrap();
    // The incarnation vanishes without a word (its exit never awaited nor dropped), and its
    // worker dies as PR_SET_PDEATHSIG would kill it: what is left is its command, an orphan.
    std::mem::forget(launched);
    // SAFETY: kill(2) of our own (unreaped) child.
    assert_eq!(unsafe { libc::kill(worker_pid, libc::SIGKILL) }, 0);

    let after = sh("true").state_dir(&dir).build().unwrap();
    let found = after.leftovers().await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].worker, WorkerId::new(140));
    assert_eq!(found[0].handle, format!("session {worker_pid}"));
    after.remove(found[0].clone()).await.unwrap();
    assert!(!alive(child) && !alive(grandchild));
    assert!(after.leftovers().await.unwrap().is_empty());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    // Removing it again is not an error.
    after.remove(found[0].clone()).await.unwrap();
    // SAFETY: reaping our own child, killed above.
    unsafe { libc::waitpid(worker_pid, std::ptr::null_mut(), 0) };
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_record_whose_session_is_gone_is_not_a_leftover() {
    let dir = temp_dir("stale");
    let launcher = sh("exit 0").state_dir(&dir).build().unwrap();
    // A record from another boot: its session id means nothing now.
    std::fs::write(dir.join("worker-150"), "v1 1 1 another-boot\n").unwrap();
    assert!(launcher.leftovers().await.unwrap().is_empty());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    // A worker that ended normally leaves no record.
    let launched = launch(&launcher, 151, &[]).await;
    assert_eq!(exit_of(launched).await, Exit::Exited);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
