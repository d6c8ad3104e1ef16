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

use common::pr;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use webhook_router::app::{App, Platform};
use webhook_router::launcher::process::ProcessLauncher;
use webhook_router::protocol::ProtocolSettings;
use webhook_router::{github, server};
use worker_registry::WorkerRegistryExt;
use worker_registry::{
    DynRegistry, InMemoryRegistry, ManualClock, RegistryConfig, Status, WorkerId, WorkerRegistry,
};

const HEARTBEAT: Duration = Duration::from_millis(200);
const SWEEP: Duration = Duration::from_millis(20);
const MISSED: u32 = 3;
/// K and S: the lease is 600 ms · 0.998 − 101 ms = 497 ms.
const MARGIN: Duration = Duration::from_millis(50);
/// Only a hang reaches it.
const HANG: Duration = Duration::from_secs(120);

/// The `webhook-worker` binary next to this test's (target/<profile>), or why the test skips.
fn worker_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent()?.parent()?.join("webhook-worker");
    if bin.is_file() {
        return Some(bin);
    }
    let why = format!(
        "{} not built: run `cargo build -p webhook-worker` first",
        bin.display()
    );
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("skipped: {why}");
    None
}

/// A fresh directory for one test's records.
fn scratch() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    // Relaxed: a counter for distinct names.
    let n = N.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("wr-real-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The event command: records `start <delivery> <pid> <ns>`, the body's digest and both
/// environments, then waits for `go-<delivery>` (ticking its own clock into `tick-<pid>` all
/// the while), and records `end <delivery> <pid> <ns>`.
fn event_command(d: &Path) -> String {
    let d = d.display();
    format!(
        "echo \"start $WEBHOOK_DELIVERY $$ $(date +%s%N)\" >> {d}/log; \
         sha256sum | cut -d' ' -f1 > {d}/digest-$WEBHOOK_DELIVERY-$$; \
         tr '\\0' '\\n' < /proc/$PPID/environ > {d}/env-worker-$$; \
         tr '\\0' '\\n' < /proc/$$/environ > {d}/env-cmd-$$; \
         while [ ! -e {d}/go-$WEBHOOK_DELIVERY ]; do date +%s%N >> {d}/tick-$$; sleep 0.01; done; \
         echo \"end $WEBHOOK_DELIVERY $$ $(date +%s%N)\" >> {d}/log"
    )
}

/// One line of the command's log.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    what: String,
    delivery: String,
    pid: u32,
    ns: u128,
}

struct Real {
    server: server::Server,
    clock: ManualClock,
    registry: InMemoryRegistry<ManualClock>,
    dir: PathBuf,
    base: String,
    http: reqwest::Client,
    secret: Option<&'static str>,
}

async fn real(secret: Option<&'static str>, token: Option<&'static str>) -> Option<Real> {
    real_via(secret, token, None).await
}

/// A router whose workers reach it at `url` (a proxy's) when given.
async fn real_via(
    secret: Option<&'static str>,
    token: Option<&'static str>,
    proxy: Option<(TcpListener, watch::Receiver<bool>)>,
) -> Option<Real> {
    let bin = worker_binary()?;
    if std::env::var_os("REAL_WORKERS_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter("info").try_init();
    }
    let dir = scratch();
    let config = RegistryConfig::builder()
        .max_workers(4)
        .heartbeat_interval(HEARTBEAT)
        .missed_heartbeats(MISSED)
        .sweep_interval(SWEEP)
        .startup_grace(HEARTBEAT)
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let registry = InMemoryRegistry::with_clock(config, clock.clone());
    let options = common::protocol_options(secret, token);
    let argv = vec![
        bin.display().to_string(),
        "--event-command".to_owned(),
        event_command(&dir),
        "--idle-exit".to_owned(),
        "0s".to_owned(),
    ];
    let launcher = ProcessLauncher::builder(argv)
        .stop_grace(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut platform = Platform::local(options.mailbox, options.overflow);
    platform.launcher = Some(Arc::new(launcher));
    platform.protocol = ProtocolSettings {
        key: None,
        kill_margin: MARGIN,
        timer_slack: MARGIN,
    };
    let app = App::with_platform(DynRegistry::new(registry.clone()), options, platform);
    app.protocol().check().unwrap();
    let webhook = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = worker.local_addr().unwrap();
    if let Some((listener, cut)) = proxy {
        app.protocol()
            .set_url(format!("http://{}", listener.local_addr().unwrap()));
        tokio::spawn(forward(listener, upstream, cut));
    }
    let server = server::serve_all(app, webhook, None, Some(worker), Default::default())
        .await
        .unwrap();
    Some(Real {
        base: format!("http://{}", server.addr()),
        server,
        clock,
        registry,
        dir,
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
        secret,
    })
}

/// A TCP proxy to `upstream` that, while `cut` is set, forwards nothing: open connections are
/// dropped and new ones are held open unanswered.
async fn forward(listener: TcpListener, upstream: SocketAddr, cut: watch::Receiver<bool>) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            return;
        };
        let mut cut = cut.clone();
        tokio::spawn(async move {
            if *cut.borrow_and_update() {
                // Held, unanswered, until the proxy heals; then dropped.
                let _ = cut.wait_for(|c| !*c).await;
                return;
            }
            let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                _ = cut.wait_for(|c| *c) => {}
            }
        });
    }
}

impl Drop for Real {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Real {
    async fn deliver(&self, id: &str, body: &[u8]) -> u64 {
        let mut req = self
            .http
            .post(format!("{}/webhook", self.base))
            .header("content-type", "application/json")
            .header(github::EVENT_HEADER, "pull_request")
            .header(github::DELIVERY_HEADER, id);
        if let Some(s) = self.secret {
            req = req.header(github::SIGNATURE_HEADER, github::sign(s.as_bytes(), body));
        }
        let res = req.body(body.to_vec()).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED);
        let v: Value = res.json().await.unwrap();
        v["targets"][0]["worker"].as_u64().unwrap()
    }

    fn lines(&self) -> Vec<Line> {
        let text = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        text.lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                Line {
                    what: f[0].to_owned(),
                    delivery: f[1].to_owned(),
                    pid: f[2].parse().unwrap(),
                    ns: f[3].parse().unwrap(),
                }
            })
            .collect()
    }

    /// Waits until the log has `n` lines `what`, and returns them.
    async fn until(&self, what: &str, n: usize) -> Vec<Line> {
        until(what, || {
            let found: Vec<Line> = self
                .lines()
                .into_iter()
                .filter(|l| l.what == what)
                .collect();
            (found.len() >= n).then_some(found)
        })
        .await
    }

    fn go(&self, delivery: &str) {
        std::fs::write(self.dir.join(format!("go-{delivery}")), b"").unwrap();
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap()
    }

    /// Moves the registry's clock past the heartbeat timeout in steps of half a sweep interval,
    /// a sweep after each (a longer gap between two sweeps is a stall of the registry's own,
    /// which it does not count against its workers); the sweeper's callback does the rest.
    async fn pass_the_timeout(&self) {
        for _ in 0..(MISSED + 1) * 20 {
            self.clock.advance(SWEEP / 2);
            let swept = self.registry.stats().sweeps;
            until("a sweep", || {
                (self.registry.stats().sweeps > swept).then_some(())
            })
            .await;
        }
    }
}

/// Polls `probe` every 10 ms until it yields; fails after [`HANG`].
async fn until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let started = std::time::Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(started.elapsed() < HANG, "hung waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn digest(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

fn alive(pid: u32) -> bool {
    // A zombie has no /proc/<pid>/environ readable... but still a stat: check its state.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn body() -> Vec<u8> {
    let mut b = serde_json::to_vec_pretty(&pr("o/r", 1)).unwrap();
    b.extend_from_slice(b"\n\n");
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_event_runs_it_again_in_a_new_process_exactly_once_more() {
    let Some(r) = real(None, None).await else {
        return;
    };
    let body = body();
    let first = r.deliver("d-1", &body).await;
    let started = r.until("start", 1).await;
    // Mid-event: the command has read its body and is waiting for go.
    let tick = r.dir.join(format!("tick-{}", started[0].pid));
    until("the first run's first tick", || tick.exists().then_some(())).await;
    // SIGKILL of the worker's process group (Control::kill).
    r.server.app().crash(WorkerId::new(first)).await.unwrap();
    until("the killed worker's command to die", || {
        (!alive(started[0].pid)).then_some(())
    })
    .await;
    r.pass_the_timeout().await;
    let again = r.until("start", 2).await;
    assert_ne!(again[1].pid, again[0].pid, "a new process");
    r.go("d-1");
    r.until("end", 1).await;
    until("the completion", || {
        (r.registry.stats().claims_completed == 1).then_some(())
    })
    .await;
    let lines = r.lines();
    let starts: Vec<&Line> = lines.iter().filter(|l| l.what == "start").collect();
    let ends: Vec<&Line> = lines.iter().filter(|l| l.what == "end").collect();
    assert_eq!(
        (starts.len(), ends.len()),
        (2, 1),
        "run twice, completed once: {lines:?}"
    );
    assert_eq!(ends[0].pid, starts[1].pid, "the second run completed");
    for s in &starts {
        assert_eq!(
            r.read(&format!("digest-d-1-{}", s.pid)).trim(),
            digest(&body),
            "run {} read the body as posted",
            s.pid
        );
    }
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
    let Some(r) = real_via(None, None, Some((proxy, cut))).await else {
        return;
    };
    let body = body();
    let first = WorkerId::new(r.deliver("d-1", &body).await);
    let started = r.until("start", 1).await;
    let pid = started[0].pid;
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
        r.read(&format!("digest-d-1-{}", again[1].pid)).trim(),
        digest(&body)
    );
    assert!(
        r.lines().iter().all(|l| l.what != "end" || l.pid != pid),
        "the cut-off command never finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_completes_its_event_and_exits_0() {
    let Some(r) = real(None, None).await else {
        return;
    };
    let id = WorkerId::new(r.deliver("d-1", &body()).await);
    r.until("start", 1).await;
    assert_eq!(r.registry.drain(id).await, Ok(Status::Draining));
    r.go("d-1");
    r.until("end", 1).await;
    let metrics = r.server.app().metrics();
    until("a clean exit", || {
        (metrics.exits("exited") == 1).then_some(())
    })
    .await;
    assert_eq!(r.registry.stats().claims_completed, 1);
    assert_eq!(
        r.registry.worker(id).await.unwrap().unwrap().status,
        Status::Dead(worker_registry::DeadReason::Exited)
    );
    assert_eq!((metrics.exits("crashed"), metrics.exits("fenced")), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_or_command_sees_the_admin_token_or_the_webhook_secret() {
    const SECRET: &str = "webhook-secret-5c1e";
    const TOKEN: &str = "admin-token-a7d3";
    let Some(r) = real(Some(SECRET), Some(TOKEN)).await else {
        return;
    };
    r.deliver("d-1", &body()).await;
    let started = r.until("start", 1).await;
    let pid = started[0].pid;
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
