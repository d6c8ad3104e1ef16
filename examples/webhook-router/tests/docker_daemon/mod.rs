//! A Docker daemon for the tests that need one (`launcher_docker.rs`, `docker_workers.rs`): the
//! one `DOCKER_HOST` names (`.ci/run` starts one and exports it), or else a dockerd of the test
//! binary's own, started as root; and the worker image built by the project's script. Without a
//! daemon the tests say so in one line and pass; under `CI` they fail.
#![allow(dead_code)] // each test binary uses its part

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bollard::{Docker, API_DEFAULT_VERSION};

/// The daemon's `DOCKER_HOST`, once `image` (given it) has built this binary's image; after a
/// one-line skip naming `tests` (or a panic under `CI`) when there is no daemon. `hung` bounds
/// a dockerd's start.
pub fn daemon(
    tests: &str,
    hung: Duration,
    image: impl FnOnce(&str) -> Result<(), String>,
) -> Option<&'static str> {
    static HOST: OnceLock<Result<String, String>> = OnceLock::new();
    let host = HOST.get_or_init(|| {
        let host = match std::env::var("DOCKER_HOST") {
            Ok(host) => host,
            Err(_) => start_dockerd(hung)?,
        };
        image(&host)?;
        Ok(host)
    });
    match host {
        Ok(host) => Some(host),
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("CI is set, and the Docker tests cannot run: {why}")
        }
        Err(why) => {
            eprintln!(
                "skipped: {tests} ({why}; install docker.io and run as root, or set DOCKER_HOST)"
            );
            None
        }
    }
}

/// Starts a dockerd of this process's own, stopped and deleted by a watchdog when it exits.
pub fn start_dockerd(hung: Duration) -> Result<String, String> {
    let dockerd = ["/usr/sbin/dockerd", "/usr/bin/dockerd"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or("no dockerd")?;
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("dockerd needs root".into());
    }
    let dir = PathBuf::from(format!("/tmp/wr-dockerd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let d = dir.display();
    let sock = format!("{d}/docker.sock");
    let log = std::fs::File::create(dir.join("log")).map_err(|e| e.to_string())?;
    let daemon = Command::new(dockerd)
        .args(["--bridge=none", "--iptables=false", "--ip6tables=false"])
        .args([
            "--data-root",
            &format!("{d}/data"),
            "--exec-root",
            &format!("{d}/exec"),
        ])
        .args([
            "--pidfile",
            &format!("{d}/pid"),
            "-H",
            &format!("unix://{sock}"),
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("{dockerd}: {e}"))?;
    let watchdog = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 0.5; done; \
         DOCKER_HOST=unix://{sock} docker ps -aq | xargs -r env DOCKER_HOST=unix://{sock} docker rm -f >/dev/null 2>&1; \
         kill {daemon}; while kill -0 {daemon} 2>/dev/null; do sleep 0.2; done; \
         findmnt -rn -o TARGET | grep '^{d}/' | sort -r | xargs -r umount 2>/dev/null; rm -rf {d}",
        me = std::process::id(),
        daemon = daemon.id(),
    );
    Command::new("sh")
        .args(["-c", &watchdog])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    // The socket appears once the daemon has completed its initialization.
    let started = Instant::now();
    while !Path::new(&sock).exists() {
        if started.elapsed() > hung {
            return Err(format!("dockerd did not listen (its log: {d}/log)"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(format!("unix://{sock}"))
}

/// A client of the daemon at `host`, at the API version agreed with it.
pub async fn client(host: &str) -> Docker {
    Docker::connect_with_unix(host, 120, API_DEFAULT_VERSION)
        .unwrap()
        .negotiate_version()
        .await
        .unwrap()
}

/// Builds image `tag` on the daemon at `host` by `deploy/worker-image/build`, from `binary`,
/// with the programs `add` (found on this machine's `PATH`).
pub fn build_image(host: &str, binary: &Path, tag: &str, add: &[&str]) -> Result<(), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut build = Command::new(root.join("deploy/worker-image/build"));
    build.arg("--binary").arg(binary).args(["--tag", tag]);
    for program in add {
        build.args(["--add", program]);
    }
    let out = build
        .env("DOCKER_HOST", host)
        .output()
        .map_err(|e| format!("deploy/worker-image/build: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "deploy/worker-image/build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}
