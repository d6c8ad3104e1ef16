//! A throwaway `redis-sentinel` monitoring one primary, stopped when dropped (and when the test
//! process exits: it runs under the same small shell as the servers in [`crate::redis`]).

use crate::process::{free_port, have_or_skip, Tethered};

/// A `redis-sentinel` this process started.
pub struct Sentinel {
    pub port: u16,
    /// Declared before `dir`: fields drop in order, and the process stops before its
    /// directory goes.
    child: Tethered,
    dir: tempfile::TempDir,
}

impl Sentinel {
    /// Starts a Sentinel (quorum 1) that monitors the primary on `primary_port` as `service`;
    /// `None` without the binary (after the skip line, or a failure under `CI`).
    pub fn start(primary_port: u16, service: &str, what: &str) -> Option<Self> {
        if !have_or_skip("redis-sentinel", "redis-sentinel", what) {
            return None;
        }
        let dir = tempfile::tempdir().expect("a directory for the sentinel");
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {service} 127.0.0.1 {primary_port} 1\n\
                 sentinel down-after-milliseconds {service} 1000\n\
                 sentinel failover-timeout {service} 10000\n",
                dir = dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let child = Tethered::spawn("redis-sentinel", &conf);
        let s = Self { port, dir, child };
        s.child.wait_listening(port, "redis-sentinel", || s.log());
        Some(s)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The Sentinel's log (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }
}
