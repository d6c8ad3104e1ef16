//! Real workers on a shared backend:
//!
//! * a router process running `webhook-worker` processes (`--event-command`,
//!   `--launcher-state-dir`) is killed with SIGKILL mid-event. Nothing it started is left running
//!   (the worker's parent-death signal, its command's guard), and a router restarted on the same
//!   registry and state directory settles the leftovers and has the event run again, in a new
//!   process, to completion;
//! * two live replicas with one `--worker-key-file`, each running its own workers: a pull
//!   request's event sent to the replica that did not launch its worker reaches that worker; when
//!   the launching replica is killed, the survivor runs the events its worker held in a new
//!   process, and only after the old command's last sign of life (the commands' own clock ticks):
//!   never two commands at once for one pull request.

use std::time::Duration;

use reqwest::StatusCode;
use webhook_router::backend::RegistryChoice;

use crate::common::worker_binary;
use crate::harness::*;
use crate::processes::{choice_url, Replica};

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

/// One line of the two-replica test's command log: `start|end <delivery> <pid> <ns>`.
struct Run {
    what: String,
    delivery: String,
    pid: u32,
    ns: u128,
}

fn runs(dir: &std::path::Path) -> Vec<Run> {
    std::fs::read_to_string(dir.join("log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Run {
                what: f.first()?.to_string(),
                delivery: f.get(1)?.to_string(),
                pid: f.get(2)?.parse().ok()?,
                ns: f.get(3)?.parse().ok()?,
            })
        })
        .collect()
}

fn starts_of<'a>(runs: &'a [Run], delivery: &str) -> Vec<&'a Run> {
    runs.iter()
        .filter(|r| r.what == "start" && r.delivery == delivery)
        .collect()
}

/// The last tick (ns) of the command with `pid`.
fn last_tick(dir: &std::path::Path, pid: u32) -> u128 {
    std::fs::read_to_string(dir.join(format!("tick-{pid}")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap_or(0)
}

async fn two_live_replicas(choice: RegistryChoice) {
    let Some(bin) = worker_binary() else {
        return;
    };
    let dir = std::env::temp_dir().join(unique("wr-two-live"));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("worker.key");
    std::fs::write(&key, "k".repeat(48)).unwrap();
    let d = dir.display();
    let command = format!(
        "echo \"start $WEBHOOK_DELIVERY $$ $(date +%s%N)\" >> {d}/log; cat > /dev/null; \
         while [ ! -e {d}/go-$WEBHOOK_DELIVERY ]; do date +%s%N >> {d}/tick-$$; sleep 0.01; done; \
         echo \"end $WEBHOOK_DELIVERY $$ $(date +%s%N)\" >> {d}/log"
    );
    let extra = vec![
        "--event-command".to_owned(),
        command,
        "--worker-command".to_owned(),
        bin.display().to_string(),
        "--worker-key-file".to_owned(),
        key.display().to_string(),
    ];
    let url = choice_url(&choice);
    let name = unique("two-live");
    let work = Duration::from_millis(10);
    let mut launcher = Replica::spawn_with(&url, &name, work, &extra);
    let survivor = Replica::spawn_with(&url, &name, work, &extra);
    let http = client();
    let (pr1, pr2) = (pr("o/r", 1), pr("o/r", 2));

    let first = deliver(&http, &launcher.base, "t-1", &pr1).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    until("t-1's command", || {
        !starts_of(&runs(&dir), "t-1").is_empty()
    })
    .await;
    // Sent to the other replica: it reaches the same worker, a process of the first replica's.
    let second = deliver(&http, &survivor.base, "t-2", &pr1).await;
    assert_eq!(second.status, StatusCode::ACCEPTED, "{}", second.body);
    assert_eq!(second.worker(), first.worker(), "sticky across replicas");
    let other = deliver(&http, &survivor.base, "t-3", &pr2).await;
    assert_eq!(other.status, StatusCode::ACCEPTED, "{}", other.body);
    assert_ne!(other.worker(), first.worker());
    until("t-3's command", || {
        !starts_of(&runs(&dir), "t-3").is_empty()
    })
    .await;
    let old = starts_of(&runs(&dir), "t-1")[0].pid;

    launcher.kill();
    until("the killed replica's command to be gone", || !alive(old)).await;
    until("t-1 to run again on the survivor", || {
        starts_of(&runs(&dir), "t-1").len() >= 2
    })
    .await;
    for delivery in ["t-1", "t-2", "t-3"] {
        std::fs::write(dir.join(format!("go-{delivery}")), b"").unwrap();
    }
    for (id, payload) in [("t-1", &pr1), ("t-2", &pr1), ("t-3", &pr2)] {
        eventually(&format!("{id} completed"), || async {
            deliver(&http, &survivor.base, id, payload)
                .await
                .completed()
                .then_some(())
        })
        .await;
    }

    let all = runs(&dir);
    let again = starts_of(&all, "t-1");
    assert_eq!(again.len(), 2, "t-1 ran twice: once per worker");
    assert_ne!(again[1].pid, old, "in a new process");
    assert!(
        again[1].ns > last_tick(&dir, old),
        "the successor's command started after the old one's last tick"
    );
    // t-2 waited behind t-1 in the killed worker's queue: released with it, and run once.
    assert_eq!(starts_of(&all, "t-2").len(), 1, "t-2 ran once");
    // Never two commands at once for pull request 1: each run (from its start to its end, or to
    // its last tick if it was killed) ends before the next one starts.
    let mut spans: Vec<(u128, u128, u32)> = all
        .iter()
        .filter(|r| r.what == "start" && r.delivery != "t-3")
        .map(|r| {
            let end = all
                .iter()
                .find(|e| e.what == "end" && e.pid == r.pid)
                .map_or_else(|| last_tick(&dir, r.pid), |e| e.ns);
            (r.ns, end, r.pid)
        })
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(
            pair[0].1 < pair[1].0,
            "two commands of one pull request overlapped: {pair:?}"
        );
    }
    // The other pull request's worker lives on the survivor: untouched by the kill.
    assert_eq!(starts_of(&all, "t-3").len(), 1, "t-3 ran once");
    let ended = all.iter().filter(|r| r.what == "end").count();
    assert_eq!(ended, 3, "every delivery completed once");
    drop(survivor);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_live_replicas_with_process_workers_on_redis() {
    let Some(choice) = shared(Kind::Redis) else {
        return;
    };
    two_live_replicas(choice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_live_replicas_with_process_workers_on_postgres() {
    let Some(choice) = shared(Kind::Postgres) else {
        return;
    };
    two_live_replicas(choice).await;
}
