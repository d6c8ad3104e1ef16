//! The Python worker of the design page ("A worker in another language"), extracted from the
//! page between its markers and run as a real process against the small router of `support`:
//! the body on stdin, the environment without the credential, drain, the lease. Skipped with one
//! line without `python3`; under `CI` that fails instead.

mod support;

use support::{
    assert_stopped_in_time, cut_heartbeats, exit_of, launched, ticking, wait_file, Beat,
    FakeRouter, Scratch, CREDENTIAL,
};

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const PAGE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../webhook-router/src/docs/worker_protocol.md"
);

/// The listing between `<!-- python-worker:begin -->` and `<!-- python-worker:end -->`, without
/// its code fence.
pub fn listing() -> String {
    let page = std::fs::read_to_string(PAGE).unwrap();
    let (_, rest) = page
        .split_once("<!-- python-worker:begin -->")
        .expect("the begin marker");
    let (block, _) = rest
        .split_once("<!-- python-worker:end -->")
        .expect("the end marker");
    let block = block.trim();
    let code = block
        .strip_prefix("```python")
        .and_then(|b| b.strip_suffix("```"))
        .expect("a ```python fence between the markers");
    code.trim_start_matches('\n').to_owned()
}

fn python() -> Option<()> {
    let found = Command::new("python3")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(());
    }
    assert!(std::env::var_os("CI").is_none(), "python3 is missing (CI)");
    eprintln!("skipped: python3 not found (install python3 to run the docs' Python worker)");
    None
}

fn start(dir: &Scratch, url: &str, cmd: &str) -> Child {
    let script: PathBuf = dir.path("worker.py");
    std::fs::write(&script, listing()).unwrap();
    launched(Command::new("python3").arg(&script), url, cmd)
}

#[test]
fn the_python_worker_runs_an_event_and_drains() {
    let Some(()) = python() else { return };
    let dir = Scratch::new("py-happy");
    let router = FakeRouter::start(Beat::Answer {
        draining: false,
        lease_ms: 2_000,
    });
    let body: Vec<u8> = (0..200_000u32).map(|i| (i * 13 % 256) as u8).collect();
    router.push("p-1", &body);
    let cmd = format!("cat > {0}/body; env > {0}/env", dir.0.display());
    let mut w = start(&dir, &router.url, &cmd);
    router.wait_for("the completion", |f| {
        f.calls.iter().any(|c| c.path == "complete")
    });
    assert_eq!(std::fs::read(dir.path("body")).unwrap(), body);
    let env = std::fs::read_to_string(dir.path("env")).unwrap();
    for line in [
        "WEBHOOK_EVENT=pull_request",
        "WEBHOOK_DELIVERY=p-1",
        "WEBHOOK_TARGET=octo/repo#12",
        "WORKER_TOKEN=7340033",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} missing from\n{env}");
    }
    assert!(!env.contains(CREDENTIAL), "{env}");
    let c = &router.calls("complete")[0].body;
    assert_eq!(
        (c["outcome"].as_str(), c["attempts"].as_u64()),
        (Some("succeeded"), Some(1))
    );
    router.lock().beat = Beat::Answer {
        draining: true,
        lease_ms: 2_000,
    };
    assert_eq!(exit_of(&mut w).code(), Some(0), "drained");
}

#[test]
fn the_python_worker_kills_its_command_when_the_lease_runs_out() {
    let Some(()) = python() else { return };
    let dir = Scratch::new("py-lease");
    let lease_ms = 1_500;
    let router = FakeRouter::start(Beat::Answer {
        draining: false,
        lease_ms,
    });
    router.push("p-2", b"{}");
    let ticks = dir.path("ticks");
    let mut w = start(&dir, &router.url, &ticking(&ticks));
    wait_file(&ticks);
    let last_answered = cut_heartbeats(&router);
    assert_eq!(exit_of(&mut w).code(), Some(4));
    assert_stopped_in_time(&ticks, last_answered, lease_ms);
}
