//! What the end-to-end tests with real workers share (`real_workers.rs`: processes;
//! `docker_workers.rs`: containers): a router over an in-memory registry on a `ManualClock` with a
//! launcher of the test's, an event command that records what it saw into a directory of the
//! test's, and waits on those records capped by a hang bound.
#![allow(dead_code)] // each test binary uses its part

use crate::common;

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
use webhook_router::launcher::Launcher;
use webhook_router::protocol::ProtocolSettings;
use webhook_router::{github, server};
use worker_registry::{
    DeadReason, DynRegistry, InMemoryRegistry, ManualClock, RegistryConfig, Status, WorkerId,
    WorkerRegistry, WorkerRegistryExt,
};

pub const HEARTBEAT: Duration = Duration::from_millis(200);
pub const SWEEP: Duration = Duration::from_millis(20);
pub const MISSED: u32 = 3;
/// K and S: the lease is 600 ms · 0.998 − 101 ms = 497 ms.
pub const MARGIN: Duration = Duration::from_millis(50);
/// Only a hang reaches it.
pub const HANG: Duration = Duration::from_secs(120);

pub use crate::common::worker_binary;

/// A fresh directory for one test's records, writable by anyone (a container's user is
/// `nobody`).
pub fn scratch() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static N: AtomicU32 = AtomicU32::new(0);
    // Relaxed: a counter for distinct names.
    let n = N.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("wr-real-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

/// The event command, its records in `d` (as the command sees it): records `start <delivery>
/// <run> <ns>`, the body's digest and both environments, then waits for `go-<delivery>`
/// (ticking its own clock into `tick-<run>` all the while), and records `end <delivery> <run>
/// <ns>`. `run` is the shell expression naming one run: `$$` for processes of one host; for
/// containers, whose pids repeat, `$WORKER_ID` (a new container is a new worker).
pub fn event_command(d: &Path, run: &str) -> String {
    let d = d.display();
    format!(
        "echo \"start $WEBHOOK_DELIVERY {run} $(date +%s%N)\" >> {d}/log; \
         sha256sum | cut -d' ' -f1 > {d}/digest-$WEBHOOK_DELIVERY-{run}; \
         tr '\\0' '\\n' < /proc/$PPID/environ > {d}/env-worker-{run}; \
         tr '\\0' '\\n' < /proc/$$/environ > {d}/env-cmd-{run}; \
         while [ ! -e {d}/go-$WEBHOOK_DELIVERY ]; do date +%s%N >> {d}/tick-{run}; sleep 0.01; done; \
         echo \"end $WEBHOOK_DELIVERY {run} $(date +%s%N)\" >> {d}/log"
    )
}

/// One line of the command's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub what: String,
    pub delivery: String,
    /// The run: the command's pid, or its worker's id (see [`event_command`]).
    pub run: u64,
    pub ns: u128,
}

pub struct Real {
    pub server: server::Server,
    pub clock: ManualClock,
    pub registry: InMemoryRegistry<ManualClock>,
    pub dir: Records,
    pub base: String,
    pub http: reqwest::Client,
    pub secret: Option<&'static str>,
    /// How many workers a previous incarnation left running that this router settled at start.
    pub settled: usize,
}

/// How a test's router is made: the launcher of its workers, built on the records' directory.
pub struct Start<'a> {
    pub dir: PathBuf,
    pub launcher: Arc<dyn Launcher>,
    pub secret: Option<&'static str>,
    pub token: Option<&'static str>,
    /// A proxy the workers reach the router through, cut while its flag is set.
    pub proxy: Option<(TcpListener, watch::Receiver<bool>)>,
    /// The registry the router runs on (default: a new one), for a router "restarted" on the
    /// registry of a previous one.
    pub registry: Option<(&'a InMemoryRegistry<ManualClock>, &'a ManualClock)>,
}

impl<'a> Start<'a> {
    pub fn new(dir: PathBuf, launcher: Arc<dyn Launcher>) -> Self {
        Start {
            dir,
            launcher,
            secret: None,
            token: None,
            proxy: None,
            registry: None,
        }
    }
}

pub fn config() -> RegistryConfig {
    RegistryConfig::builder()
        .max_workers(4)
        .heartbeat_interval(HEARTBEAT)
        .missed_heartbeats(MISSED)
        .sweep_interval(SWEEP)
        .startup_grace(HEARTBEAT)
        .build()
        .unwrap()
}

/// A router with `start`'s launcher, its webhook and worker listeners on loopback.
pub async fn real(start: Start<'_>) -> Real {
    if std::env::var_os("REAL_WORKERS_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter("info").try_init();
    }
    let (registry, clock) = match start.registry {
        Some((r, c)) => (r.clone(), c.clone()),
        None => {
            let clock = ManualClock::new();
            (InMemoryRegistry::with_clock(config(), clock.clone()), clock)
        }
    };
    let options = common::protocol_options(start.secret, start.token);
    let mut platform = Platform::local(options.mailbox, options.overflow);
    platform.launcher = Some(start.launcher);
    platform.protocol = ProtocolSettings {
        key: None,
        kill_margin: MARGIN,
        timer_slack: MARGIN,
    };
    let app = App::with_platform(DynRegistry::new(registry.clone()), options, platform);
    app.protocol().check().unwrap();
    // As the router's main does: what a previous incarnation left is settled before serving.
    let settled = app.lifecycle().settle_leftovers().await.unwrap();
    let webhook = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = worker.local_addr().unwrap();
    if let Some((listener, cut)) = start.proxy {
        app.protocol()
            .set_url(format!("http://{}", listener.local_addr().unwrap()));
        tokio::spawn(forward(listener, upstream, cut));
    }
    let server = server::serve_all(app, webhook, None, Some(worker), Default::default())
        .await
        .unwrap();
    Real {
        base: format!("http://{}", server.addr()),
        server,
        clock,
        registry,
        dir: Records(start.dir),
        http: reqwest::Client::builder().no_proxy().build().unwrap(),
        secret: start.secret,
        settled,
    }
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

/// The records' directory, deleted with it.
pub struct Records(PathBuf);

impl std::ops::Deref for Records {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for Records {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Real {
    pub async fn deliver(&self, id: &str, body: &[u8]) -> u64 {
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

    pub fn lines(&self) -> Vec<Line> {
        let text = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        text.lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                Line {
                    what: f[0].to_owned(),
                    delivery: f[1].to_owned(),
                    run: f[2].parse().unwrap(),
                    ns: f[3].parse().unwrap(),
                }
            })
            .collect()
    }

    /// Waits until the log has `n` lines `what`, and returns them.
    pub async fn until(&self, what: &str, n: usize) -> Vec<Line> {
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

    pub fn go(&self, delivery: &str) {
        std::fs::write(self.dir.join(format!("go-{delivery}")), b"").unwrap();
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap()
    }

    /// Moves the registry's clock past the heartbeat timeout in steps of half a sweep interval,
    /// a sweep after each (a longer gap between two sweeps is a stall of the registry's own,
    /// which it does not count against its workers); the sweeper's callback does the rest.
    pub async fn pass_the_timeout(&self) {
        for _ in 0..(MISSED + 1) * 20 {
            self.clock.advance(SWEEP / 2);
            let swept = self.registry.stats().sweeps;
            until("a sweep", || {
                (self.registry.stats().sweeps > swept).then_some(())
            })
            .await;
        }
    }

    /// Delivers one event, drains its worker mid-event, lets the command finish, and checks
    /// that the worker exited cleanly (status 0: `exited`) and completed the event once; returns
    /// the worker.
    pub async fn drain_mid_event(&self) -> WorkerId {
        let id = WorkerId::new(self.deliver("d-1", &body()).await);
        self.until("start", 1).await;
        assert_eq!(self.registry.drain(id).await, Ok(Status::Draining));
        self.go("d-1");
        self.until("end", 1).await;
        let metrics = self.server.app().metrics();
        until("a clean exit", || {
            (metrics.exits("exited") == 1).then_some(())
        })
        .await;
        assert_eq!(self.registry.stats().claims_completed, 1);
        assert_eq!(
            self.registry.worker(id).await.unwrap().unwrap().status,
            Status::Dead(DeadReason::Exited)
        );
        assert_eq!((metrics.exits("crashed"), metrics.exits("fenced")), (0, 0));
        id
    }

    /// Asserts that delivery `delivery` (`body`) ran exactly twice, completed by the second run,
    /// each run on a byte-equal body, and that it was completed once.
    pub async fn assert_ran_twice_completed_once(&self, delivery: &str, body: &[u8]) {
        until("the completion", || {
            (self.registry.stats().claims_completed == 1).then_some(())
        })
        .await;
        let lines = self.lines();
        let starts: Vec<&Line> = lines.iter().filter(|l| l.what == "start").collect();
        let ends: Vec<&Line> = lines.iter().filter(|l| l.what == "end").collect();
        assert_eq!(
            (starts.len(), ends.len()),
            (2, 1),
            "run twice, completed once: {lines:?}"
        );
        assert_ne!(starts[1].run, starts[0].run, "a new run");
        assert_eq!(ends[0].run, starts[1].run, "the second run completed");
        for s in &starts {
            assert_eq!(
                self.read(&format!("digest-{delivery}-{}", s.run)).trim(),
                digest(body),
                "run {} read the body as posted",
                s.run
            );
        }
    }
}

/// Polls `probe` every 10 ms until it yields; fails after [`HANG`].
pub async fn until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let started = std::time::Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(started.elapsed() < HANG, "hung waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn digest(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

/// A pull request's event, pretty-printed with trailing newlines (a body no re-encoding keeps).
pub fn body() -> Vec<u8> {
    let mut b = serde_json::to_vec_pretty(&common::pr("o/r", 1)).unwrap();
    b.extend_from_slice(b"\n\n");
    b
}
