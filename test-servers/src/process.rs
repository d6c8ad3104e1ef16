//! What the throwaway servers that run as one foreground process share (`pgbouncer`,
//! `redis-sentinel`): the binary check with its skip line, a free loopback port, and a child that
//! runs under a small shell which stops it when the pipe from this process closes (on drop, and
//! when the test process exits however it exits).

use std::io::Write as _;
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `binary --version` runs. Without it: the one skip line naming `install`, or, with `CI`
/// set, a failure (`.ci/run` installs every server the tests need).
pub(crate) fn have_or_skip(binary: &str, install: &str, what: &str) -> bool {
    let have = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        assert!(
            std::env::var_os("CI").is_none(),
            "{what}: {binary} is not installed and CI is set (.ci/run installs it)"
        );
        let _ = writeln!(
            std::io::stderr().lock(),
            "skipped: {what} (install {install})"
        );
    }
    have
}

/// A loopback port nothing listens on now.
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a loopback port")
        .port()
}

/// A server process tied to this one: it is stopped when this is dropped.
pub(crate) struct Tethered {
    child: Option<(Child, ChildStdin)>,
}

impl Tethered {
    /// Runs `command "$1"` (a shell word list, e.g. `runuser -u u -- pgbouncer`) with `arg` as
    /// `$1`, under a shell that kills it once its stdin closes.
    pub(crate) fn spawn(command: &str, arg: &std::path::Path) -> Self {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                r#"{command} "$1" & pid=$!; read _ignored; kill $pid; wait $pid"#
            ))
            .arg("sh")
            .arg(arg)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command}: {e}"));
        let stdin = child.stdin.take().expect("the child's stdin");
        Self {
            child: Some((child, stdin)),
        }
    }

    /// Waits until something accepts connections on `port` (a condition, polled; the cap only
    /// bounds a start that failed), or fails naming `what` with `log()`.
    pub(crate) fn wait_listening(&self, port: u16, what: &str, log: impl Fn() -> String) {
        let cap = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < cap, "{what} did not start: {}", log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Tethered {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.child.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}
