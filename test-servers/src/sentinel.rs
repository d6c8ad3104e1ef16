//! A throwaway `redis-sentinel` monitoring one primary, stopped when dropped (and when the test
//! process exits: it runs under the same small shell as the servers in [`crate::redis`]).

use std::io::Write as _;
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-sentinel` this process started.
pub struct Sentinel {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<(Child, ChildStdin)>,
}

impl Sentinel {
    /// Starts a Sentinel (quorum 1) that monitors the primary on `primary_port` as `service`;
    /// `None` without the binary (after the skip line, or a failure under `CI`).
    pub fn start(primary_port: u16, service: &str, what: &str) -> Option<Self> {
        let have = Command::new("redis-sentinel")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !have {
            assert!(
                std::env::var_os("CI").is_none(),
                "{what}: redis-sentinel is not installed and CI is set"
            );
            let _ = writeln!(
                std::io::stderr().lock(),
                "skipped: {what} (install redis-sentinel)"
            );
            return None;
        }
        let dir = tempfile::tempdir().expect("a directory for the sentinel");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a loopback port")
            .port();
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
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"redis-sentinel "$1" & pid=$!; read _ignored; kill $pid; wait $pid"#)
            .arg("sh")
            .arg(&conf)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-sentinel");
        let stdin = child.stdin.take().expect("stdin");
        let s = Self {
            port,
            dir,
            child: Some((child, stdin)),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-sentinel did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
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

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.child.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}
