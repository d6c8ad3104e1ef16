//! Replicas as real processes (the `webhook-router` binary, three of them on one registry), one
//! killed with SIGKILL while its containers work: the events it held are re-dispatched by the
//! others, every accepted delivery is completed, and no worker id ever had two containers (counted
//! from every process's log). On PostgreSQL the victim is killed in the middle of a transaction:
//! its admission waits for a row lock the test holds when the kill lands.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use webhook_router::backend::RegistryChoice;

use crate::harness::*;

/// Work per event in the survivors.
const WORK: Duration = Duration::from_millis(600);
/// Work per event in the victim: its containers are still busy when it is killed, however long the
/// way to the kill took on a busy machine (with the survivors' 600 ms, a run at load 21 found the
/// victim's work all done before the kill, and nothing to re-dispatch).
const VICTIM_WORK: Duration = Duration::from_secs(3600);

/// One router process; killed (SIGKILL) when dropped.
pub(crate) struct Replica {
    child: Child,
    pub(crate) base: String,
    log: Arc<Mutex<Vec<String>>>,
}

/// A log line without its colours.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Replica {
    fn spawn(url: &str, name: &str, work: Duration) -> Self {
        Self::spawn_with(url, name, work, &[])
    }

    /// Like [`spawn`](Self::spawn), with `extra` flags after the others.
    pub(crate) fn spawn_with(url: &str, name: &str, work: Duration, extra: &[String]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_webhook-router"))
            .args(["--registry", url, "--registry-name", name])
            .args([
                "--bind",
                "127.0.0.1:0",
                "--webhook-secret",
                SECRET,
                "--admin-token",
                TOKEN,
            ])
            .args(["--capacity", "12", "--mailbox", "16"])
            .args(["--heartbeat-ms", &HEARTBEAT.as_millis().to_string()])
            .args(["--missed-heartbeats", &PATIENT_MISSED.to_string()])
            .args([
                "--work-ms",
                &work.as_millis().to_string(),
                "--idle-ms",
                "60000",
            ])
            .args(["--release-ack-ms", &(HEARTBEAT * 5).as_millis().to_string()])
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the webhook-router binary");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let line = plain(&line);
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest.split(": ").next().unwrap_or("").to_owned();
                    let _ = tx.send(addr);
                }
                lines.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the router did not start: {:?}", log.lock().unwrap()));
        Self {
            child,
            base: format!("http://{addr}"),
            log,
        }
    }

    fn lines(&self, containing: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(containing))
            .cloned()
            .collect()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The worker ids in `container started worker=N` lines.
fn starts(replica: &Replica) -> Vec<u64> {
    replica
        .lines("container started")
        .iter()
        .filter_map(|l| {
            l.split("worker=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Everything but the kill: three processes, traffic across them (each delivery to one replica,
/// its redelivery to the next), the kill of replica 0 (by `kill`, which may first make it busy in
/// a transaction), then the audit through the survivors.
async fn sigkill(choice: RegistryChoice, victim_url: String, kill: impl AsyncKill) {
    let url = choice_url(&choice);
    let name = unique("sigkill");
    let mut replicas = vec![
        Replica::spawn(&victim_url, &name, VICTIM_WORK),
        Replica::spawn(&url, &name, WORK),
        Replica::spawn(&url, &name, WORK),
    ];
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let http = client();

    // 18 deliveries on 6 pull requests; each redelivered at once to the next replica, which must
    // answer duplicate (the registry is shared).
    let mut accepted: Vec<(String, Value)> = Vec::new();
    let mut on_victim = 0;
    for i in 0..18usize {
        let (id, payload) = (format!("k-{i}"), pr("o/r", 1 + (i % 6) as u64));
        let a = deliver(&http, &bases[i % 3], &id, &payload).await;
        match a.status {
            StatusCode::ACCEPTED => {
                let again = deliver(&http, &bases[(i + 1) % 3], &id, &payload).await;
                assert_eq!(
                    again.status,
                    StatusCode::OK,
                    "a duplicate on another replica: {}",
                    again.body
                );
                if i % 3 == 0 {
                    on_victim += 1;
                }
                accepted.push((id, payload));
            }
            // A full queue: not accepted, nothing left behind.
            StatusCode::SERVICE_UNAVAILABLE => {}
            other => panic!("{id}: {other} {}", a.body),
        }
    }
    assert!(on_victim > 0);
    let victim_containers = starts(&replicas[0]);
    assert!(!victim_containers.is_empty(), "the victim runs containers");

    if let Some(extra) = kill.kill(&mut replicas[0], &bases[1], &name).await {
        accepted.push(extra);
    }
    assert!(
        try_deliver(&http, &bases[0], "k-probe", &pr("o/r", 1))
            .await
            .is_none(),
        "the victim is gone"
    );

    // The survivors re-dispatch the events the victim's containers held, by themselves (before
    // any redelivery below could be admitted in their place).
    let redispatched = || {
        replicas[1..]
            .iter()
            .map(|r| r.lines("released event re-dispatched").len())
            .sum::<usize>()
    };
    eventually("the survivors re-dispatched the victim's events", || {
        let n = redispatched();
        async move { (n > 0).then_some(()) }
    })
    .await;

    // Every accepted delivery is completed, through the survivors, the victim's included.
    for (n, (id, payload)) in accepted.iter().enumerate() {
        eventually(&format!("{id} completed"), || async {
            let again = deliver(&http, &bases[1 + n % 2], id, payload).await;
            again.completed().then_some(())
        })
        .await;
    }
    let redispatched = redispatched();
    let mut per_worker: HashMap<u64, usize> = HashMap::new();
    for r in &replicas {
        for w in starts(r) {
            *per_worker.entry(w).or_default() += 1;
        }
    }
    let twice: Vec<_> = per_worker.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "worker ids with two containers: {twice:?}"
    );
    eprintln!(
        "sigkill: {} accepted deliveries completed, {} containers over 3 processes ({} on the victim), {redispatched} events re-dispatched by the survivors",
        accepted.len(),
        per_worker.len(),
        victim_containers.len()
    );
}

pub(crate) fn choice_url(choice: &RegistryChoice) -> String {
    match choice {
        RegistryChoice::Redis(u) | RegistryChoice::Postgres(u) => u.clone(),
        other => panic!("not a shared backend: {other}"),
    }
}

/// How the victim is killed; may return one more accepted delivery to audit.
trait AsyncKill {
    async fn kill(
        self,
        victim: &mut Replica,
        survivor: &str,
        name: &str,
    ) -> Option<(String, Value)>;
}

/// Straight SIGKILL.
struct Plain;

impl AsyncKill for Plain {
    async fn kill(self, victim: &mut Replica, _: &str, _: &str) -> Option<(String, Value)> {
        victim.kill();
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_with_sigkill_on_redis() {
    let Some(choice) = shared(Kind::Redis) else {
        return;
    };
    let url = choice_url(&choice);
    sigkill(choice, url, Plain).await;
}

/// On PostgreSQL: the test locks the registry's capacity row, sends the victim a delivery for a
/// new pull request (its admission must create a worker, so it waits for that row inside its
/// transaction), waits until the server shows the victim's backend waiting for the lock, and
/// kills the victim then. The transaction commits or rolls back when the lock is released (the
/// client is gone either way); the delivery, sent again to a survivor as GitHub would, is
/// completed whichever it was.
struct MidTransaction {
    url: String,
}

impl AsyncKill for MidTransaction {
    async fn kill(
        self,
        victim: &mut Replica,
        survivor: &str,
        name: &str,
    ) -> Option<(String, Value)> {
        let (locker, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        locker.batch_execute("BEGIN").await.unwrap();
        // The registry's capacity row (the library's documented schema): a new worker needs it.
        locker
            .query(
                "SELECT c.live FROM wr_capacity c JOIN wr_registries r ON r.id = c.registry \
                 WHERE r.name = $1 FOR UPDATE OF c",
                &[&name],
            )
            .await
            .unwrap();
        let (id, payload) = ("k-mid".to_owned(), pr("o/mid", 1));
        let base = victim.base.clone();
        let (pid, p) = (id.clone(), payload.clone());
        let pending = tokio::spawn(async move { try_deliver(&client(), &base, &pid, &p).await });
        let waiting = eventually("the victim waits for the lock", || async {
            let rows = locker
                .query(
                    "SELECT query FROM pg_stat_activity WHERE application_name = 'victim' AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap();
            rows.first().map(|r| r.get::<_, String>(0))
        })
        .await;
        assert!(
            waiting.contains("wr_"),
            "blocked in a registry function: {waiting}"
        );
        victim.kill();
        assert!(
            pending.await.unwrap().is_none(),
            "the victim never answered"
        );
        locker.batch_execute("ROLLBACK").await.unwrap();
        // GitHub got no answer: the delivery is sent again, to a survivor.
        let http = client();
        let again = eventually("k-mid accepted by a survivor", || async {
            let a = deliver(&http, survivor, &id, &payload).await;
            matches!(a.status, StatusCode::ACCEPTED | StatusCode::OK).then_some(a)
        })
        .await;
        eprintln!(
            "sigkill mid-transaction in {waiting:?}: the victim's admission {} (the resend was answered {})",
            if again.status == StatusCode::OK { "had committed" } else { "was rolled back" },
            again.body["outcome"]
        );
        Some((id, payload))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_with_sigkill_mid_transaction_on_postgres() {
    let Some(choice) = shared(Kind::Postgres) else {
        return;
    };
    let url = choice_url(&choice);
    let sep = if url.contains('?') { '&' } else { '?' };
    let victim = format!("{url}{sep}application_name=victim");
    sigkill(choice, victim, MidTransaction { url }).await;
}
