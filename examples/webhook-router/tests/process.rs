//! Issue 37: the built `webhook-router` binary as a real process, stopped the way orchestrators
//! stop it (SIGTERM), probed (`/healthz`, `/readyz`), its log read as JSON lines. No sleep stands
//! for a duration: every wait is on a condition (a log line, a probe's answer, the exit), with a
//! generous bound that only turns a hang into a failure.

mod common;

use common::worker_binary;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

/// How long a wait may last before the test fails as hung (never reached when things work).
const HUNG: Duration = Duration::from_secs(120);

/// The log lines so far (each parsed as JSON), and the lines that were not JSON.
#[derive(Default)]
struct Log {
    lines: Vec<Value>,
    not_json: Vec<String>,
    closed: bool,
}

/// One router process, logging JSON lines; killed when dropped.
struct Router {
    child: Child,
    log: Arc<(Mutex<Log>, Condvar)>,
    /// `http://ADDR` of the webhook address.
    base: String,
    /// `http://ADDR` of the admin address, if it has one.
    admin: Option<String>,
    http: reqwest::Client,
}

impl Router {
    /// Starts the binary on a free loopback port with `args`.
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_webhook-router"))
            .args(["--bind", "127.0.0.1:0", "--log-format", "json"])
            .args(args)
            .env("RUST_LOG", "info,webhook_router=debug")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the webhook-router binary");
        let stderr = child.stderr.take().expect("piped stderr");
        let log: Arc<(Mutex<Log>, Condvar)> = Arc::default();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut log = sink.0.lock().unwrap();
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) if v.is_object() => log.lines.push(v),
                    _ => log.not_json.push(line),
                }
                sink.1.notify_all();
            }
            sink.0.lock().unwrap().closed = true;
            sink.1.notify_all();
        });
        let mut r = Self {
            child,
            log,
            base: String::new(),
            admin: None,
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
        };
        let addr = |prefix: &str, line: &Value| {
            let rest = line["message"].as_str()?.strip_prefix(prefix)?;
            Some(format!("http://{}", rest.split(": ").next()?))
        };
        let listening = r.wait_line(|l| addr("listening on http://", l).is_some());
        r.base = addr("listening on http://", &listening).unwrap();
        if args.contains(&"--admin-bind") {
            let line = r.wait_line(|l| addr("admin API on http://", l).is_some());
            r.admin = addr("admin API on http://", &line);
        }
        r
    }

    /// Waits for a log line `pred` accepts (one already written included), and returns it.
    fn wait_line(&self, pred: impl Fn(&Value) -> bool) -> Value {
        let (lock, cond) = &*self.log;
        let log = lock.lock().unwrap();
        let (log, timeout) = cond
            .wait_timeout_while(log, HUNG, |log| !log.closed && !log.lines.iter().any(&pred))
            .unwrap();
        match log.lines.iter().find(|l| pred(l)) {
            Some(line) => line.clone(),
            None => panic!(
                "no such log line (timed out: {}, process gone: {}): {:#?}\nnot JSON: {:#?}",
                timeout.timed_out(),
                log.closed,
                log.lines,
                log.not_json
            ),
        }
    }

    /// The log lines whose message is `message`.
    fn lines(&self, message: &str) -> Vec<Value> {
        let log = self.log.0.lock().unwrap();
        log.lines
            .iter()
            .filter(|l| l["message"] == message)
            .cloned()
            .collect()
    }

    fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// Waits for the process to exit (and its log to end); every line it wrote was JSON.
    fn exit(&mut self) -> ExitStatus {
        let (lock, cond) = &*self.log;
        let log = lock.lock().unwrap();
        let (log, _) = cond.wait_timeout_while(log, HUNG, |l| !l.closed).unwrap();
        assert!(log.closed, "the process did not exit");
        assert!(
            log.not_json.is_empty(),
            "lines not JSON: {:#?}",
            log.not_json
        );
        drop(log);
        self.child.wait().unwrap()
    }

    async fn deliver(&self, id: &str, payload: &Value) -> (StatusCode, Value) {
        self.deliver_signed(id, payload, None).await
    }

    /// A delivery signed with `secret` (unsigned without).
    async fn deliver_signed(
        &self,
        id: &str,
        payload: &Value,
        secret: Option<&str>,
    ) -> (StatusCode, Value) {
        let body = payload.to_string();
        let mut req = self
            .http
            .post(format!("{}/webhook", self.base))
            .header("content-type", "application/json")
            .header("x-github-event", "pull_request")
            .header("x-github-delivery", id);
        if let Some(secret) = secret {
            req = req.header(
                "x-hub-signature-256",
                webhook_router::github::sign(secret.as_bytes(), body.as_bytes()),
            );
        }
        let res = req.body(body).send().await.unwrap();
        let status = res.status();
        (status, res.json().await.unwrap())
    }

    /// `GET /workers` with `token`.
    async fn workers_with(&self, token: &str) -> StatusCode {
        let res = self
            .http
            .get(format!("{}/workers", self.base))
            .bearer_auth(token);
        res.send().await.unwrap().status()
    }

    async fn get(&self, base: &str, path: &str) -> (StatusCode, String) {
        let res = self.http.get(format!("{base}{path}")).send().await.unwrap();
        (res.status(), res.text().await.unwrap())
    }

    /// Polls `/readyz` until it answers `want` (the flip follows the signal's log line closely).
    async fn until_ready_is(&self, want: StatusCode) -> Value {
        for _ in 0..10_000 {
            let (status, body) = self.get(&self.base, "/readyz").await;
            if status == want {
                return serde_json::from_str(&body).unwrap();
            }
            tokio::task::yield_now().await;
        }
        panic!("/readyz never answered {want}");
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn event(number: u64, action: &str) -> Value {
    json!({
        "action": action,
        "number": number,
        "pull_request": { "number": number },
        "repository": { "full_name": "octo-org/api" }
    })
}

/// A worker's `loop finished` line for `delivery`: its outcome (`completed` when recorded).
fn finished(r: &Router, delivery: &str) -> Option<String> {
    r.lines("loop finished")
        .into_iter()
        .find(|l| l["event"] == delivery)
        .map(|l| l["outcome"].as_str().unwrap_or_default().to_owned())
}

/// Three deliveries answered 202 whose work is running, then SIGTERM: readiness turns 503 and a
/// new delivery is refused, the three are completed, the shutdown reports nothing unfinished and
/// the process exits 0. Every line of its log is JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_running_work_and_exits_0() {
    let mut r = Router::spawn(&["--work-ms", "1500", "--shutdown-ms", "60000"]);
    assert_eq!(r.until_ready_is(StatusCode::OK).await["status"], "ready");
    let (status, health) = r.get(&r.base, "/healthz").await;
    assert_eq!(
        (status, health.as_str()),
        (StatusCode::OK, r#"{"status":"ok"}"#)
    );
    for n in 1..=3 {
        let (status, body) = r.deliver(&format!("run-{n}"), &event(n, "opened")).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    for n in 1..=3 {
        let id = format!("run-{n}");
        r.wait_line(|l| l["message"] == "loop started" && l["event"] == id.as_str());
    }
    r.signal(libc::SIGTERM);
    let not_ready = r.until_ready_is(StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(not_ready["status"], "shutting_down", "{not_ready}");
    let (status, body) = r.deliver("late", &event(9, "opened")).await;
    assert_eq!(
        (status, &body["outcome"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("closing"))
    );
    let exit = r.exit();
    assert_eq!(exit.code(), Some(0), "{exit:?}");
    for n in 1..=3 {
        assert_eq!(
            finished(&r, &format!("run-{n}")).as_deref(),
            Some("completed"),
            "run-{n}"
        );
    }
    let report = r.wait_line(|l| l["message"] == "shut down");
    assert_eq!(
        (report["completed"].as_u64(), report["unfinished"].as_u64()),
        (Some(3), Some(0))
    );
    assert_eq!(r.lines("shutting down: not ready, refusing new deliveries, finishing the accepted ones (a second SIGTERM or SIGINT exits at once)")[0]["signal"], "SIGTERM");
}

/// A second SIGTERM during the shutdown exits at once, with 143 (128 + SIGTERM), leaving the
/// ten-minute work it waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_exits_at_once() {
    let mut r = Router::spawn(&["--work-ms", "600000", "--shutdown-ms", "600000"]);
    let (status, body) = r.deliver("long", &event(1, "opened")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    r.wait_line(|l| l["message"] == "loop started");
    r.signal(libc::SIGTERM);
    r.wait_line(|l| l["signal"] == "SIGTERM");
    r.signal(libc::SIGTERM);
    let exit = r.exit();
    assert_eq!(exit.code(), Some(143), "{exit:?}");
    assert!(
        r.lines("shut down").is_empty(),
        "it did not wait for the shutdown"
    );
    assert!(finished(&r, "long").is_none());
}

/// A pull request closed while its worker works: the events that follow park behind the draining
/// worker (`202 waiting`), then SIGTERM. Every one is completed before the exit, by the
/// successor the stop starts for them, and the exit status is 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_parked_behind_a_draining_worker_are_completed_before_the_exit() {
    let mut r = Router::spawn(&["--work-ms", "400", "--shutdown-ms", "60000"]);
    let mut ids = Vec::new();
    for (id, action, outcome) in [
        ("open", "opened", "assigned"),
        ("close", "closed", "drained"),
    ] {
        let (status, body) = r.deliver(id, &event(7, action)).await;
        assert_eq!(
            (status, &body["outcome"]),
            (StatusCode::ACCEPTED, &json!(outcome)),
            "{body}"
        );
        ids.push(id.to_owned());
    }
    for i in 0..5 {
        let id = format!("after-{i}");
        let (status, body) = r.deliver(&id, &event(7, "synchronize")).await;
        assert_eq!(
            (status, &body["outcome"]),
            (StatusCode::ACCEPTED, &json!("waiting")),
            "{body}"
        );
        ids.push(id);
    }
    r.signal(libc::SIGTERM);
    let exit = r.exit();
    assert_eq!(exit.code(), Some(0), "{exit:?}");
    for id in &ids {
        assert_eq!(finished(&r, id).as_deref(), Some("completed"), "{id}");
    }
    let report = r.wait_line(|l| l["message"] == "shut down");
    assert_eq!(report["unfinished"].as_u64(), Some(0), "{report}");
}

/// `--admin-bind`: the webhook address serves `POST /webhook` and the probes only; the admin API,
/// metrics and the OpenAPI document are on the admin address, which serves the probes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_bind_separates_the_admin_api_from_the_webhook() {
    let mut r = Router::spawn(&["--admin-bind", "127.0.0.1:0"]);
    let admin = r.admin.clone().expect("an admin address");
    assert_ne!(admin, r.base);
    for path in ["/workers", "/metrics", "/openapi.json"] {
        assert_eq!(
            r.get(&r.base, path).await.0,
            StatusCode::NOT_FOUND,
            "{path} on the webhook's"
        );
        assert_eq!(
            r.get(&admin, path).await.0,
            StatusCode::OK,
            "{path} on the admin's"
        );
    }
    for base in [&r.base, &admin] {
        assert_eq!(r.get(base, "/healthz").await.0, StatusCode::OK, "{base}");
        assert_eq!(r.get(base, "/readyz").await.0, StatusCode::OK, "{base}");
    }
    let on_admin = r
        .http
        .post(format!("{admin}/webhook"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(on_admin, StatusCode::NOT_FOUND);
    let (status, body) = r.deliver("d", &event(1, "opened")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    r.signal(libc::SIGINT);
    assert_eq!(r.exit().code(), Some(0));
}

/// A temporary directory, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("{name}-{}-{}", std::process::id(), rand_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// Writes `file` (as an editor would: a new file renamed over the old one).
    fn write(&self, file: &str, contents: &str) -> String {
        let path = self.0.join(file);
        let tmp = self.0.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, contents).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Secrets from files: the webhook secret and the admin token rotated by rewriting their files
/// and sending SIGHUP. Within the rotation window the old and the new are both accepted; once the
/// window is over (its log line), only the new. A file changed without SIGHUP is picked up by
/// the poll. A file left empty is refused and the secret kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_files_rotate_on_sighup_with_a_window_and_on_change() {
    let dir = TempDir::new("webhook-router-secrets");
    let secret_file = dir.write("webhook-secret", "old-secret\n");
    let token_file = dir.write("admin-token", "old-token\n");
    let mut r = Router::spawn(&[
        "--webhook-secret-file",
        &secret_file,
        "--admin-token-file",
        &token_file,
        "--secret-rotation-window",
        "4s",
        "--secret-poll-interval",
        "0s",
    ]);
    let pr = |n| event(n, "opened");
    assert_eq!(
        r.deliver_signed("a", &pr(1), Some("old-secret")).await.0,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        r.deliver_signed("b", &pr(2), Some("new-secret")).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(r.workers_with("old-token").await, StatusCode::OK);
    assert_eq!(r.workers_with("new-token").await, StatusCode::UNAUTHORIZED);

    dir.write("webhook-secret", "new-secret\n");
    dir.write("admin-token", "new-token");
    r.signal(libc::SIGHUP);
    let changed = |flag: &'static str| {
        move |l: &Value| {
            l["flag"] == flag
                && l["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("secret file changed"))
        }
    };
    r.wait_line(changed("--webhook-secret-file"));
    r.wait_line(changed("--admin-token-file"));
    // Within the window: both.
    assert_eq!(
        r.deliver_signed("c", &pr(3), Some("new-secret")).await.0,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        r.deliver_signed("d", &pr(4), Some("old-secret")).await.0,
        StatusCode::ACCEPTED
    );
    assert_eq!(r.workers_with("new-token").await, StatusCode::OK);
    assert_eq!(r.workers_with("old-token").await, StatusCode::OK);
    // After it: only the new.
    let over = |flag: &'static str| {
        move |l: &Value| {
            l["flag"] == flag
                && l["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("rotation window over"))
        }
    };
    r.wait_line(over("--webhook-secret-file"));
    r.wait_line(over("--admin-token-file"));
    assert_eq!(
        r.deliver_signed("e", &pr(5), Some("old-secret")).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        r.deliver_signed("f", &pr(6), Some("new-secret")).await.0,
        StatusCode::ACCEPTED
    );
    assert_eq!(r.workers_with("old-token").await, StatusCode::UNAUTHORIZED);
    assert_eq!(r.workers_with("new-token").await, StatusCode::OK);
    // An empty file is refused: the secret stays.
    dir.write("webhook-secret", "");
    r.signal(libc::SIGHUP);
    r.wait_line(|l| l["level"] == "ERROR" && l["flag"] == "--webhook-secret-file");
    assert_eq!(
        r.deliver_signed("g", &pr(7), Some("new-secret")).await.0,
        StatusCode::ACCEPTED
    );
    r.signal(libc::SIGTERM);
    assert_eq!(r.exit().code(), Some(0));
}

/// A changed file is read without SIGHUP, at the next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_secret_file_is_picked_up_by_the_poll() {
    let dir = TempDir::new("webhook-router-poll");
    let secret_file = dir.write("webhook-secret", "first");
    let mut r = Router::spawn(&[
        "--webhook-secret-file",
        &secret_file,
        "--secret-rotation-window",
        "0s",
        "--secret-poll-interval",
        "100ms",
    ]);
    assert_eq!(
        r.deliver_signed("a", &event(1, "opened"), Some("first"))
            .await
            .0,
        StatusCode::ACCEPTED
    );
    dir.write("webhook-secret", "second\r\n");
    r.wait_line(|l| l["message"] == "secret file changed: the new value is in use");
    assert_eq!(
        r.deliver_signed("b", &event(2, "opened"), Some("second"))
            .await
            .0,
        StatusCode::ACCEPTED
    );
    // No window: the first is refused at once.
    assert_eq!(
        r.deliver_signed("c", &event(3, "opened"), Some("first"))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    r.signal(libc::SIGTERM);
    assert_eq!(r.exit().code(), Some(0));
}

/// The `WORKER_CREDENTIAL` in the environment of the worker whose command wrote its parent's pid
/// into `file` (waited for).
async fn credential_of_worker_in(file: &std::path::Path) -> String {
    let pid = tokio::time::timeout(HUNG, async {
        loop {
            if let Some(pid) = std::fs::read_to_string(file)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                break pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the worker's command started");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    environ
        .split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(b"WORKER_CREDENTIAL="))
        .map(|v| String::from_utf8(v.to_vec()).unwrap())
        .expect("the worker has a credential")
}

/// `--worker-key-file` changed and SIGHUP: the next worker's credential is minted under the new
/// key, and the running worker, whose credential was minted under the old one, goes on and
/// completes its event (its calls still verify).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_key_file_rotates_on_sighup_and_running_workers_keep_theirs() {
    use webhook_router::credential::WorkerKey;
    let Some(bin) = worker_binary() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("wr-key-rotation-{}", rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("worker.key");
    let (old, new) = ([b'a'; 32], [b'b'; 32]);
    std::fs::write(&key, old).unwrap();
    let d = dir.display();
    let command = format!(
        "echo $PPID > {d}/pid-$WEBHOOK_DELIVERY.tmp; mv {d}/pid-$WEBHOOK_DELIVERY.tmp {d}/pid-$WEBHOOK_DELIVERY; \
         cat > /dev/null; while [ ! -e {d}/go ]; do sleep 0.01; done"
    );
    let (key_arg, bin_arg) = (key.display().to_string(), bin.display().to_string());
    let r = Router::spawn(&[
        "--launcher",
        "process",
        "--event-command",
        &command,
        "--worker-command",
        &bin_arg,
        "--worker-key-file",
        &key_arg,
        "--secret-poll-interval",
        "0s",
    ]);
    let (status, body) = r.deliver("r-1", &event(1, "opened")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let first = credential_of_worker_in(&dir.join("pid-r-1")).await;
    let under = |k: &[u8; 32], c: &str| WorkerKey::from_bytes(k).unwrap().verify(c).is_ok();
    assert!(under(&old, &first));

    std::fs::write(&key, new).unwrap();
    r.signal(libc::SIGHUP);
    r.wait_line(|l| {
        l["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("secret file changed"))
            && l["flag"] == "--worker-key-file"
    });
    let (status, body) = r.deliver("r-2", &event(2, "opened")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let second = credential_of_worker_in(&dir.join("pid-r-2")).await;
    assert!(
        under(&new, &second) && !under(&old, &second),
        "minted under the new key"
    );

    std::fs::write(dir.join("go"), b"").unwrap();
    for (id, number) in [("r-1", 1), ("r-2", 2)] {
        tokio::time::timeout(HUNG, async {
            loop {
                let (status, body) = r.deliver(id, &event(number, "opened")).await;
                if status == StatusCode::OK && body["state"] == "completed" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{id} completed"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
