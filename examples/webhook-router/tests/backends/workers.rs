//! Real workers on a shared backend: a router process running `webhook-worker` processes
//! (`--event-command`, `--launcher-state-dir`) is killed with SIGKILL mid-event. Nothing it
//! started is left running (the worker's parent-death signal, its command's guard), and a router
//! restarted on the same registry and state directory settles the leftovers and has the event
//! run again, in a new process, to completion.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::StatusCode;
use webhook_router::backend::RegistryChoice;

use crate::harness::*;
use crate::processes::{choice_url, Replica};

/// `webhook-worker` next to this test binary's directory, or `None` after the skip line (a
/// failure under `CI`).
fn worker_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent()?.parent()?.join("webhook-worker");
    if bin.is_file() {
        return Some(bin);
    }
    let why = format!("{} not built: cargo build -p webhook-worker", bin.display());
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("skipped: {why}");
    None
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
    })
}

/// `(command pid, worker pid)` of every command started so far.
fn started(dir: &std::path::Path) -> Vec<(u32, u32)> {
    std::fs::read_to_string(dir.join("log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect()
}

async fn until(what: &str, mut probe: impl FnMut() -> bool) {
    let began = std::time::Instant::now();
    while !probe() {
        assert!(began.elapsed() < HANG, "hung waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn restart_leaves_no_orphan(choice: RegistryChoice) {
    let Some(bin) = worker_binary() else {
        return;
    };
    let dir = std::env::temp_dir().join(unique("wr-orphans"));
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let d = dir.display();
    let command = format!(
        "echo \"$$ $PPID\" >> {d}/log; cat > /dev/null; \
         while [ ! -e {d}/go ]; do sleep 0.01; done"
    );
    let extra = vec![
        "--event-command".to_owned(),
        command,
        "--worker-command".to_owned(),
        bin.display().to_string(),
        "--launcher-state-dir".to_owned(),
        state.display().to_string(),
    ];
    let url = choice_url(&choice);
    let name = unique("orphans");
    let work = Duration::from_millis(10);
    let mut first = Replica::spawn_with(&url, &name, work, &extra);
    let http = client();
    let payload = pr("o/r", 1);
    let a = deliver(&http, &first.base, "d-orphan", &payload).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    until("the first command", || !started(&dir).is_empty()).await;
    let (command, worker) = started(&dir)[0];
    assert!(alive(command) && alive(worker));
    first.kill();
    // SIGKILL of the router: its worker and the worker's command go with it.
    until("the first incarnation's processes to be gone", || {
        !alive(command) && !alive(worker)
    })
    .await;
    // The next start settles the records, and the event runs again once the registry has
    // declared the silent worker dead.
    let second = Replica::spawn_with(&url, &name, work, &extra);
    until("the event to run again", || started(&dir).len() >= 2).await;
    let (again, again_worker) = started(&dir)[1];
    assert_ne!(again, command, "a new process");
    std::fs::write(dir.join("go"), b"").unwrap();
    eventually("the delivery completed", || async {
        let a = deliver(&http, &second.base, "d-orphan", &payload).await;
        (a.body["state"] == "completed").then_some(())
    })
    .await;
    assert_eq!(started(&dir).len(), 2, "run twice, no more");
    drop(second);
    until("the second incarnation's processes to be gone", || {
        !alive(again) && !alive(again_worker)
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_killed_and_restarted_on_redis_leaves_no_orphan() {
    let Some(choice) = shared(Kind::Redis) else {
        return;
    };
    restart_leaves_no_orphan(choice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_killed_and_restarted_on_postgres_leaves_no_orphan() {
    let Some(choice) = shared(Kind::Postgres) else {
        return;
    };
    restart_leaves_no_orphan(choice).await;
}
