//! What the launchers' tests share: the router's log captured (every event, with its fields), a
//! wait for a line of it, a wait for a process's death on a pidfd, and the hang bound.

#![allow(dead_code)] // each test binary uses its part

use std::collections::BTreeMap;
use std::fmt;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// How long a wait may last before the test fails as hung (never reached when things work).
pub const HUNG: Duration = Duration::from_secs(120);

/// One event of the router's log: its target and fields (`message` included), as strings.
#[derive(Debug, Clone)]
pub struct Event {
    pub target: String,
    pub fields: BTreeMap<String, String>,
}

impl Event {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

struct Capture(watch::Sender<Vec<Event>>);

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let target = event.metadata().target().to_owned();
        self.0.send_modify(|log| log.push(Event { target, fields }));
    }
}

/// The log of every test of this binary (installed as the global subscriber on first use).
pub fn log() -> &'static watch::Sender<Vec<Event>> {
    static LOG: OnceLock<watch::Sender<Vec<Event>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let (tx, _) = watch::channel(Vec::new());
        let subscriber = tracing_subscriber::registry().with(Capture(tx.clone()));
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        tx
    })
}

/// Waits for the first event of worker `worker` that `pred` accepts, and returns it.
pub async fn wait_event(worker: u64, pred: impl Fn(&Event) -> bool) -> Event {
    let worker = worker.to_string();
    let mut rx = log().subscribe();
    let found = |log: &Vec<Event>| {
        log.iter()
            .find(|e| e.field("worker") == Some(&worker) && pred(e))
            .cloned()
    };
    let wait = rx.wait_for(|log| found(log).is_some());
    let Ok(log) = tokio::time::timeout(HUNG, wait).await else {
        let seen: Vec<Event> = log()
            .borrow()
            .iter()
            .filter(|e| e.field("worker") == Some(&worker))
            .cloned()
            .collect();
        panic!("hung waiting for a log event of worker {worker}; its events: {seen:#?}");
    };
    let log = log.expect("the log is never closed");
    found(&log).expect("just seen")
}

/// Waits for worker `worker`'s output line on `stream` starting with `prefix`; returns the rest.
pub async fn wait_line(worker: u64, stream: &str, prefix: &str) -> String {
    let e = wait_event(worker, |e| {
        e.target == "webhook_router::worker_output"
            && e.field("stream") == Some(stream)
            && e.field("message").is_some_and(|m| m.starts_with(prefix))
    })
    .await;
    e.field("message").unwrap()[prefix.len()..]
        .trim()
        .to_owned()
}

/// Whether process `pid` is alive (a zombie counts as dead).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 1..]
                .split_whitespace()
                .next();
            !matches!(state, Some("Z" | "X"))
        }
    }
}

/// Waits until process `pid` (any process, not only a child) has exited, on a pidfd.
pub async fn wait_gone(pid: i32) {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return; // already gone
    }
    // SAFETY: a descriptor just returned by the kernel, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: the OwnedFd stays open, and the same, while the AsyncFd owns it.
    let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.unwrap();
    tokio::time::timeout(HUNG, fd.readable())
        .await
        .expect("hung waiting for a process to exit")
        .unwrap()
        .retain_ready();
}
