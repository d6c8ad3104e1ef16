//! Real workers through the real router: the `webhook-worker` binary, and the Python worker of
//! the design page ("A worker in another language", extracted between its markers), each started
//! by the `process` launcher for a delivery posted to `/webhook`, speaking `/worker/v1` to the
//! router's protocol server over an in-memory registry on the real clock. Checked: the event's
//! body reaches the command byte for byte, its environment names the event and holds no
//! credential, the completion is recorded, and a drain while the command runs lets it finish,
//! then the worker is dead (`exited`) and its process gone. A command that keeps failing is
//! retried `--max-attempts` times, then reported (the counter, `GET /deliveries/failed` behind the
//! admin token) and completed: a redelivery is a duplicate.
//!
//! Without the `webhook-worker` binary (`cargo build -p webhook-worker`) or `python3` the test
//! says so in one line and passes; under `CI` it fails instead. No sleeps for timing: each wait
//! polls an observable condition, capped only by a hang.

mod common;

use common::{eventually, worker_binary};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use tokio::net::TcpListener;
use webhook_router::app::{self, App, Platform};
use webhook_router::launcher::process::ProcessLauncher;
use webhook_router::launcher::{BoxFuture, Launch, LaunchError, Launched, Launcher, Leftover};
use webhook_router::protocol::ProtocolSettings;
use webhook_router::{body, github, policy, server};
use worker_registry::WorkerRegistryExt;
use worker_registry::{
    DeadReason, DynRegistry, InMemoryRegistry, RegistryConfig, Status, WorkerId, WorkerRegistry,
};

/// Margins for a test machine: a lease of about 4.8 s, heartbeats every 1.2 s.
const HEARTBEAT: Duration = Duration::from_secs(1);
const MISSED: u32 = 5;
const MARGIN: Duration = Duration::from_millis(100);

/// The process launcher, as a launcher whose workers speak the protocol.
struct Spoken(ProcessLauncher);

impl Launcher for Spoken {
    fn kind(&self) -> &'static str {
        "process"
    }
    fn speaks_protocol(&self) -> bool {
        true
    }
    fn launch(&self, spec: Launch) -> BoxFuture<'_, Result<Launched, LaunchError>> {
        self.0.launch(spec)
    }
    fn leftovers(&self) -> BoxFuture<'_, Result<Vec<Leftover>, LaunchError>> {
        self.0.leftovers()
    }
    fn remove(&self, l: Leftover) -> BoxFuture<'_, Result<(), LaunchError>> {
        self.0.remove(l)
    }
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("protocol-workers-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A missing tool: one line and `None`, or a failure under `CI`.
fn missing(what: &str, how: &str) -> Option<()> {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} is missing (CI): {how}"
    );
    eprintln!("skipped: {what} is missing ({how} to run this test)");
    None
}

fn python() -> Option<()> {
    let ok = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(());
    }
    missing("python3", "apt-get install python3")
}

/// The Python worker of the design page, between its markers, without its code fence.
fn python_listing() -> String {
    let page = include_str!("../src/docs/worker_protocol.md");
    let (_, rest) = page.split_once("<!-- python-worker:begin -->").unwrap();
    let (block, _) = rest.split_once("<!-- python-worker:end -->").unwrap();
    let code = block.trim().strip_prefix("```python").unwrap();
    code.strip_suffix("```").unwrap().trim_start().to_owned()
}

struct Router {
    server: server::Server,
    memory: InMemoryRegistry,
    base: String,
}

async fn router(argv: Vec<String>, admin_token: Option<&str>) -> Router {
    let config = RegistryConfig::builder()
        .max_workers(4)
        .heartbeat_interval(HEARTBEAT)
        .missed_heartbeats(MISSED)
        .sweep_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let memory = InMemoryRegistry::new(config);
    let options = app::Options {
        webhook_secret: None::<&str>.into(),
        admin_token: admin_token.into(),
        work: Duration::ZERO,
        idle: Duration::from_secs(3600),
        mailbox: 8,
        overflow: 0,
        policy: Arc::new(policy::Policy::default()),
        body: body::BodyLimits {
            max: github::MAX_PAYLOAD_BYTES,
            timeout: body::DEFAULT_BODY_TIMEOUT,
            budget: body::BodyBudget::new(body::DEFAULT_BODY_BUDGET),
        },
    };
    let launcher = ProcessLauncher::builder(argv)
        .stop_grace(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut platform = Platform::local(options.mailbox, options.overflow);
    platform.launcher = Some(Arc::new(Spoken(launcher)));
    platform.protocol = ProtocolSettings {
        key: None,
        kill_margin: MARGIN,
        timer_slack: MARGIN,
    };
    let app = App::with_platform(DynRegistry::new(memory.clone()), options, platform);
    app.protocol().check().expect("a usable lease");
    let webhook = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = server::serve_all(app, webhook, None, Some(worker), Default::default())
        .await
        .unwrap();
    Router {
        base: format!("http://{}", server.addr()),
        server,
        memory,
    }
}

/// Every byte value, odd JSON spacing: what a JSON round trip or a text decoder would change.
fn raw_body() -> Vec<u8> {
    let mut b = serde_json::to_vec_pretty(&common::pr("o/r", 1)).unwrap();
    b.extend_from_slice(b"  \n");
    b
}

/// The command: the body and environment into files, then waits for `go` (a drain meanwhile),
/// and records its worker's pid (its parent's).
fn command(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "cat > {d}/body.tmp && mv {d}/body.tmp {d}/body; env > {d}/env; echo $PPID > {d}/worker; \
         while [ ! -e {d}/go ]; do sleep 0.01; done"
    )
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// Posts one delivery, checks what the command received, drains the worker while the command
/// runs, and checks that it finished, completed and left.
async fn one_delivery_then_drain(r: &Router, dir: &Scratch) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let res = http
        .post(format!("{}/webhook", r.base))
        .header("content-type", "application/json")
        .header(github::EVENT_HEADER, "pull_request")
        .header(github::DELIVERY_HEADER, "d-1")
        .body(raw_body())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let answer: serde_json::Value = res.json().await.unwrap();
    let id = WorkerId::new(answer["targets"][0]["worker"].as_u64().unwrap());
    let worker_pid = eventually(|| async {
        std::fs::read_to_string(dir.path("worker"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
    })
    .await;
    assert_eq!(
        std::fs::read(dir.path("body")).unwrap(),
        raw_body(),
        "byte for byte"
    );
    let env = std::fs::read_to_string(dir.path("env")).unwrap();
    for line in [
        "WEBHOOK_EVENT=pull_request",
        "WEBHOOK_DELIVERY=d-1",
        "WEBHOOK_TARGET=o/r#1",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} missing from\n{env}");
    }
    assert!(!env.contains("WORKER_CREDENTIAL"), "{env}");
    // Drained while its command runs: it finishes, completes, and its loop ends the worker.
    assert_eq!(r.memory.drain(id).await.unwrap(), Status::Draining);
    std::fs::write(dir.path("go"), "").unwrap();
    eventually(|| async { (r.memory.stats().claims_completed == 1).then_some(()) }).await;
    eventually(|| async {
        let info = r.memory.worker(id).await.unwrap()?;
        (info.status == Status::Dead(DeadReason::Exited)).then_some(())
    })
    .await;
    eventually(|| async { (!alive(worker_pid)).then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_worker_runs_a_real_delivery_and_drains() {
    let Some(bin) = worker_binary() else { return };
    let dir = Scratch::new("binary");
    let argv = vec![
        bin.display().to_string(),
        "--event-command".to_owned(),
        command(&dir.0),
    ];
    let r = router(argv, None).await;
    one_delivery_then_drain(&r, &dir).await;
    drop(r.server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_worker_from_the_docs() {
    let Some(()) = python() else { return };
    let dir = Scratch::new("python");
    let script = dir.path("worker.py");
    std::fs::write(&script, python_listing()).unwrap();
    // The process launcher gives exactly the router's environment: the command comes with env.
    let argv = vec![
        "env".to_owned(),
        format!("WEBHOOK_EVENT_COMMAND={}", command(&dir.0)),
        "python3".to_owned(),
        script.display().to_string(),
    ];
    let r = router(argv, None).await;
    one_delivery_then_drain(&r, &dir).await;
    drop(r.server);
}

const ADMIN: &str = "admin-token";

/// `GET {path}` on the admin API with the admin token: the status and the body.
async fn admin_get(r: &Router, path: &str) -> (StatusCode, String) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let res = http
        .get(format!("{}{path}", r.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    (res.status(), res.text().await.unwrap())
}

async fn post_delivery(r: &Router, delivery: &str) -> reqwest::Response {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    http.post(format!("{}/webhook", r.base))
        .header("content-type", "application/json")
        .header(github::EVENT_HEADER, "pull_request")
        .header(github::DELIVERY_HEADER, delivery)
        .body(raw_body())
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_keeps_failing_is_reported_and_completed() {
    let Some(bin) = worker_binary() else { return };
    let argv = [
        &bin.display().to_string(),
        "--event-command",
        "echo failing >&2; exit 7",
        "--max-attempts",
        "2",
        "--retry-backoff",
        "10ms",
    ];
    let r = router(argv.map(str::to_owned).to_vec(), Some(ADMIN)).await;
    let res = post_delivery(&r, "d-fails").await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let answer: serde_json::Value = res.json().await.unwrap();
    let (worker, token) = (
        &answer["targets"][0]["worker"],
        &answer["targets"][0]["token"],
    );

    let failed: serde_json::Value = eventually(|| async {
        let (status, body) = admin_get(&r, "/deliveries/failed").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        (v["total"] == 1).then_some(v)
    })
    .await;
    let entries = failed["failed"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{failed}");
    let f = &entries[0];
    assert_eq!(f["delivery"], "d-fails");
    assert_eq!(f["target"], "o/r#1");
    assert_eq!((&f["worker"], &f["token"]), (worker, token));
    assert_eq!(f["attempts"], 2);
    assert_eq!(f["reason"], "exit status 7");
    assert_eq!(f["reason_truncated"], false);
    assert!(
        f["at"]
            .as_str()
            .unwrap()
            .parse::<humantime::Timestamp>()
            .is_ok(),
        "RFC 3339: {f}"
    );
    assert_eq!(failed["kept"], 1000);

    // Completed, as failed: the claim is done and the counter says so.
    assert_eq!(r.memory.stats().claims_completed, 1);
    let (_, metrics) = admin_get(&r, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "webhook_router_worker_failed_total 1"),
        "{metrics}"
    );
    let res = post_delivery(&r, "d-fails").await;
    assert_eq!(res.status(), StatusCode::OK);
    let again: serde_json::Value = res.json().await.unwrap();
    assert_eq!(again["outcome"], "duplicate", "{again}");

    // Behind the admin token; `limit` is read, and refused with a JSON error when malformed.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let res = http
        .get(format!("{}/deliveries/failed", r.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let (status, body) = admin_get(&r, "/deliveries/failed?limit=0").await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["failed"].as_array().unwrap().len(), &v["total"]),
        (0, &1.into())
    );
    let (status, body) = admin_get(&r, "/deliveries/failed?limit=many").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["error"].is_string());
    drop(r.server);
}
