//! The `webhook-worker` binary, a real process, against a small router that follows the design
//! page (`support`): the event's body and environment, retries, drain, the lease, the verdicts,
//! signals, and the command's fate when the worker dies. No sleeps for timing: each test waits
//! on a recorded call, a file or an exit, capped only by a hang.

mod support;

use support::{
    alive, assert_stopped_in_time, cut_heartbeats, exit_of, ticking, wait_file, worker, Beat,
    FakeRouter, Scratch, CREDENTIAL,
};

use std::os::unix::process::ExitStatusExt;

fn active(lease_ms: u64) -> Beat {
    Beat::Answer {
        draining: false,
        lease_ms,
    }
}

fn draining(lease_ms: u64) -> Beat {
    Beat::Answer {
        draining: true,
        lease_ms,
    }
}

fn pid_in(path: &std::path::Path) -> i32 {
    wait_file(path);
    let start = std::time::Instant::now();
    loop {
        if let Ok(p) = std::fs::read_to_string(path).unwrap().trim().parse() {
            return p;
        }
        assert!(
            start.elapsed() < support::HANG,
            "no pid in {}",
            path.display()
        );
        std::thread::yield_now();
    }
}

fn wait_dead(pid: i32) {
    let start = std::time::Instant::now();
    while alive(pid) {
        assert!(start.elapsed() < support::HANG, "process {pid} still runs");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Every byte value, and more than a pipe holds, so that stdin is written while the command
/// reads.
fn binary_body() -> Vec<u8> {
    (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect()
}

#[test]
fn an_event_runs_with_its_body_on_stdin_and_without_the_credential() {
    let dir = Scratch::new("happy");
    let router = FakeRouter::start(active(2_000));
    let body = binary_body();
    router.push("d-1", &body);
    let cmd = format!("cat > {0}/body; env > {0}/env", dir.0.display());
    let mut w = worker(&router.url, &cmd, &[]);
    router.wait_for("the completion", |f| {
        f.calls.iter().any(|c| c.path == "complete")
    });
    assert_eq!(
        std::fs::read(dir.path("body")).unwrap(),
        body,
        "the body, byte for byte"
    );
    let env = std::fs::read_to_string(dir.path("env")).unwrap();
    for line in [
        "WEBHOOK_EVENT=pull_request",
        "WEBHOOK_DELIVERY=d-1",
        "WEBHOOK_ACTION=opened",
        "WEBHOOK_CONTENT_TYPE=application/json",
        "WEBHOOK_TARGET=octo/repo#12",
        "WORKER_ID=7",
        "WORKER_TOKEN=7340033",
        "TRACEPARENT=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} missing from\n{env}");
    }
    assert!(
        !env.contains("WORKER_CREDENTIAL") && !env.contains(CREDENTIAL),
        "{env}"
    );
    assert!(!env.contains("WORKER_ROUTER_URL"), "{env}");
    let c = &router.calls("complete")[0].body;
    assert_eq!(c["delivery"], "d-1");
    assert_eq!(c["outcome"], "succeeded");
    assert_eq!(c["attempts"], 1);
    // loop/started came first, and no event was asked for before a heartbeat was answered.
    let f = router.lock();
    let first = |p: &str| f.calls.iter().position(|c| c.path == p).unwrap();
    assert!(first("heartbeat") < first("next"));
    assert!(first("next") < first("loop/started"));
    assert!(first("loop/started") < first("complete"));
    drop(f);
    // Drained while idle: the next poll is empty, loop/finished says dead, exit 0.
    router.lock().beat = draining(2_000);
    assert_eq!(exit_of(&mut w).code(), Some(0));
    assert!(!router.calls("loop/finished").is_empty());
}

#[test]
fn a_failing_command_is_retried_then_completed_failed() {
    let dir = Scratch::new("retry");
    let router = FakeRouter::start(active(60_000));
    router.push("d-2", b"{}");
    let cmd = format!("echo run >> {}/runs; exit 7", dir.0.display());
    let mut w = worker(
        &router.url,
        &cmd,
        &["--max-attempts", "3", "--retry-backoff", "10ms"],
    );
    router.wait_for("the completion", |f| {
        f.calls.iter().any(|c| c.path == "complete")
    });
    let runs = std::fs::read_to_string(dir.path("runs")).unwrap();
    assert_eq!(runs.lines().count(), 3, "three attempts");
    let c = &router.calls("complete")[0].body;
    assert_eq!(c["outcome"], "failed");
    assert_eq!(c["attempts"], 3);
    assert_eq!(c["reason"], "exit status 7");
    assert_eq!(router.calls("complete").len(), 1);
    w.kill().unwrap();
    w.wait().unwrap();
}

#[test]
fn drain_finishes_the_current_event_then_exits_0() {
    let dir = Scratch::new("drain");
    let router = FakeRouter::start(active(2_000));
    router.push("d-3", b"{}");
    let d = dir.0.display();
    let cmd = format!(
        "touch {d}/started; while [ ! -e {d}/go ]; do sleep 0.01; done; echo ok > {d}/finished"
    );
    let mut w = worker(&router.url, &cmd, &[]);
    wait_file(&dir.path("started"));
    router.lock().beat = draining(2_000);
    let beats = router.calls("heartbeat").len();
    // The worker has heard of the drain once a heartbeat after the change was answered.
    router.wait_for("a heartbeat answered draining", |f| {
        f.calls.iter().filter(|c| c.path == "heartbeat").count() > beats + 1
    });
    std::fs::write(dir.path("go"), "").unwrap();
    assert_eq!(exit_of(&mut w).code(), Some(0), "drained: exit 0");
    assert!(
        dir.path("finished").exists(),
        "the current event ran to its end"
    );
    let c = router.calls("complete");
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].body["outcome"], "succeeded");
    let f = router.lock();
    let last = |p: &str| f.calls.iter().rposition(|c| c.path == p).unwrap();
    assert!(
        last("complete") < last("loop/finished"),
        "loop/finished after the completion"
    );
}

#[test]
fn the_lease_running_out_kills_the_command_before_its_deadline() {
    let dir = Scratch::new("lease");
    let lease_ms = 1_500;
    let router = FakeRouter::start(active(lease_ms));
    router.push("d-4", b"{}");
    let d = dir.0.display();
    let ticks = dir.path("ticks");
    // The command's own clock (a tick every 10 ms while it lives); a grandchild in its group.
    let cmd = format!("sleep 1000 & echo $! > {d}/grandchild; {}", ticking(&ticks));
    let mut w = worker(&router.url, &cmd, &[]);
    let grandchild = pid_in(&dir.path("grandchild"));
    wait_file(&ticks);
    // The router stops answering heartbeats: the last answered one bounds the lease.
    let last_answered = cut_heartbeats(&router);
    let status = exit_of(&mut w);
    assert_eq!(status.code(), Some(4), "lease expired: exit 4");
    assert_stopped_in_time(&ticks, last_answered, lease_ms);
    wait_dead(grandchild);
    assert!(router.calls("complete").is_empty(), "nothing completed");
}

#[test]
fn fenced_kills_the_command_and_exits_3() {
    let dir = Scratch::new("fenced");
    let router = FakeRouter::start(active(2_000));
    router.push("d-5", b"{}");
    let cmd = format!(
        "echo $$ > {}/pid; while :; do sleep 0.01; done",
        dir.0.display()
    );
    let mut w = worker(&router.url, &cmd, &[]);
    let pid = pid_in(&dir.path("pid"));
    router.lock().beat = Beat::Fenced("missed_heartbeats");
    assert_eq!(exit_of(&mut w).code(), Some(3));
    wait_dead(pid);
    assert!(
        router.calls("complete").is_empty(),
        "a fenced worker calls nothing more"
    );
}

#[test]
fn drained_while_idle_exits_0() {
    // A drain of an idle worker ends it at once in the registry (dead, `exited`): the next
    // call is answered 410 with that reason, which is the drain reaching it, not a fencing.
    let router = FakeRouter::start(active(2_000));
    let mut w = worker(&router.url, "true", &[]);
    router.wait_for("a long poll", |f| f.calls.iter().any(|c| c.path == "next"));
    router.lock().beat = Beat::Fenced("exited");
    let status = exit_of(&mut w);
    assert_eq!(
        status.code(),
        Some(0),
        "drained while idle: exit 0, {status:?}"
    );
}

#[test]
fn a_refused_credential_exits_2_and_fetches_nothing() {
    let router = FakeRouter::start(Beat::Unauthorized);
    let mut w = worker(&router.url, "true", &[]);
    assert_eq!(exit_of(&mut w).code(), Some(2));
    assert!(router.calls("next").is_empty());
}

#[test]
fn no_event_before_the_first_lease_and_503_is_waited_out() {
    let dir = Scratch::new("first");
    let router = FakeRouter::start(Beat::Unavailable);
    router.push("d-6", b"{}");
    router.lock().next_unavailable = 2;
    let mut w = worker(&router.url, &format!("touch {}/ran", dir.0.display()), &[]);
    router.wait_for("three unanswered heartbeats", |f| {
        f.calls.iter().filter(|c| c.path == "heartbeat").count() >= 3
    });
    assert!(router.calls("next").is_empty(), "no lease, no event");
    router.lock().beat = active(2_000);
    router.wait_for("the completion", |f| {
        f.calls.iter().any(|c| c.path == "complete")
    });
    assert!(dir.path("ran").exists());
    assert!(
        router.calls("next").len() >= 3,
        "two 503 answers, then the event"
    );
    w.kill().unwrap();
    w.wait().unwrap();
}

#[test]
fn sigterm_stops_a_command_that_ignores_it_at_the_grace() {
    let dir = Scratch::new("term");
    let router = FakeRouter::start(active(60_000));
    router.push("d-7", b"{}");
    let cmd = format!(
        "trap '' TERM; echo $$ > {}/pid; while :; do sleep 0.01; done",
        dir.0.display()
    );
    let mut w = worker(&router.url, &cmd, &["--stop-grace", "100ms"]);
    let pid = pid_in(&dir.path("pid"));
    // SAFETY: a signal to the worker process this test started.
    unsafe { libc::kill(w.id() as i32, libc::SIGTERM) };
    let status = exit_of(&mut w);
    assert_eq!(status.code(), Some(5), "{status:?}");
    wait_dead(pid);
    assert!(router.calls("complete").is_empty());
}

#[test]
fn sigterm_while_idle_exits_0() {
    let router = FakeRouter::start(active(60_000));
    let mut w = worker(&router.url, "true", &[]);
    router.wait_for("a long poll", |f| f.calls.iter().any(|c| c.path == "next"));
    // SAFETY: a signal to the worker process this test started.
    unsafe { libc::kill(w.id() as i32, libc::SIGTERM) };
    let status = exit_of(&mut w);
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(status.signal().is_none());
}

#[test]
fn a_killed_worker_takes_its_command_and_the_commands_children_with_it() {
    let dir = Scratch::new("orphan");
    let router = FakeRouter::start(active(60_000));
    router.push("d-8", b"{}");
    let d = dir.0.display();
    let cmd = format!("sleep 1000 & echo $! > {d}/grandchild; echo $$ > {d}/pid; wait");
    let mut w = worker(&router.url, &cmd, &[]);
    let (pid, grandchild) = (pid_in(&dir.path("pid")), pid_in(&dir.path("grandchild")));
    w.kill().unwrap();
    w.wait().unwrap();
    wait_dead(pid);
    wait_dead(grandchild);
}
