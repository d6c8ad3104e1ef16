//! Real Redis servers for the tests: the one named by `WORKER_REGISTRY_REDIS_URL`, or a throwaway
//! `redis-server` on a free loopback port in a temporary directory, stopped when dropped (and when
//! the test process exits, however it exits: the server runs under a small shell that kills it
//! when the pipe from this process closes).
//!
//! Without `redis-server` (and without the variable) a test prints one line saying it skipped and
//! returns; with `CI` set it fails instead.

use std::io::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The variable naming an existing server.
pub const URL_VAR: &str = "WORKER_REGISTRY_REDIS_URL";
/// The variable naming the server binary the throwaway servers run (default `redis-server` on the
/// `PATH`): a Valkey `valkey-server`, say.
pub const SERVER_VAR: &str = "WORKER_REGISTRY_REDIS_SERVER";
/// The variable naming the command-line client that forms clusters (default `redis-cli`).
pub const CLI_VAR: &str = "WORKER_REGISTRY_REDIS_CLI";

/// The server binary: [`SERVER_VAR`]'s, or `redis-server`.
pub fn server_binary() -> String {
    std::env::var(SERVER_VAR).unwrap_or_else(|_| "redis-server".to_owned())
}

/// The client binary: [`CLI_VAR`]'s, or `redis-cli`.
pub fn cli_binary() -> String {
    std::env::var(CLI_VAR).unwrap_or_else(|_| "redis-cli".to_owned())
}

/// Whether the skip line was printed already (once per test binary).
static SKIP_PRINTED: AtomicBool = AtomicBool::new(false);

fn skip(what: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what}: redis-server is not installed and {URL_VAR} is not set, and CI is set: \
         the Redis tests must run in CI (.ci/run installs redis-server)"
    );
    if !SKIP_PRINTED.swap(true, Ordering::Relaxed) {
        // Straight to the file descriptor: the test harness captures `eprintln!`.
        let _ = writeln!(
            std::io::stderr().lock(),
            "skipped: Redis tests (install redis-server, or set {URL_VAR} or {SERVER_VAR})"
        );
    }
}

/// Whether a `redis-server` binary is on the PATH.
pub fn have_binary() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| {
        Command::new(server_binary())
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A `redis-server` this process started.
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    aof: bool,
    /// More `redis-server` arguments (`--replicaof`, TLS), kept for a restart.
    extra: Vec<String>,
    /// Whether the shell removes `dir` when the server exits (the shared server, which is never
    /// dropped: statics are not).
    remove_dir: bool,
    child: Option<(Child, ChildStdin)>,
}

static DIRS: AtomicU64 = AtomicU64::new(0);

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local address").port()
}

impl Server {
    /// Starts a server (with the append-only file on, fsync per write, if `aof`); `None` (after
    /// the skip line) without the binary.
    pub fn start(aof: bool, what: &str) -> Option<Self> {
        Self::start_with(aof, false, what)
    }

    /// Starts a server without AOF with more arguments (`--replicaof 127.0.0.1 <port>`, TLS
    /// settings: `$PORT` in one is the server's port, and with `--tls-port` it is only waited for
    /// to accept connections); `None` (after the skip line) without the binary.
    pub fn start_args(extra: &[String], what: &str) -> Option<Self> {
        Self::start_full(false, false, extra, what)
    }

    /// As [`start_args`](Self::start_args), its directory removed by the shell when the server
    /// exits (for servers held in statics, which are never dropped).
    pub(crate) fn start_args_removed(extra: &[String], what: &str) -> Option<Self> {
        Self::start_full(false, true, extra, what)
    }

    fn start_with(aof: bool, remove_dir: bool, what: &str) -> Option<Self> {
        Self::start_full(aof, remove_dir, &[], what)
    }

    fn start_full(aof: bool, remove_dir: bool, extra: &[String], what: &str) -> Option<Self> {
        if !have_binary() {
            skip(what);
            return None;
        }
        let dir = std::env::temp_dir().join(format!(
            "wr-redis-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let mut last_err = String::new();
        for _ in 0..5 {
            let mut s = Self {
                port: free_port(),
                dir: dir.clone(),
                aof,
                extra: extra.to_vec(),
                remove_dir,
                child: None,
            };
            match s.launch() {
                Ok(()) => return Some(s),
                Err(e) => last_err = e,
            }
        }
        panic!("could not start redis-server: {last_err}");
    }

    fn launch(&mut self) -> Result<(), String> {
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--logfile".into(),
            self.dir.join("redis.log").display().to_string(),
        ];
        if self.aof {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
        } else {
            args.extend(["--appendonly", "no"].map(String::from));
        }
        // `$PORT` in an extra argument is the server's port (`--port 0 --tls-port $PORT`).
        let port = self.port.to_string();
        args.extend(self.extra.iter().map(|a| a.replace("$PORT", &port)));
        let tls = self.extra.iter().any(|a| a == "--tls-port");
        // The shell kills the server when our end of its stdin closes (drop, or process exit).
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(
                r#""$WR_SERVER" "$@" & pid=$!; read _ignored; kill $pid; wait $pid
                   if [ -n "$WR_REMOVE_DIR" ]; then rm -rf "$WR_REMOVE_DIR"; fi"#,
            )
            .env("WR_SERVER", server_binary())
            .env(
                "WR_REMOVE_DIR",
                if self.remove_dir {
                    self.dir.as_os_str()
                } else {
                    "".as_ref()
                },
            )
            .arg("sh")
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        self.child = Some((child, stdin));
        // Wait (bounded) until it answers.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let up = if tls {
                std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            } else {
                ping(self.port)
            };
            if up {
                return Ok(());
            }
            if let Some((c, _)) = &mut self.child {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return Err(format!("redis-server exited: {status}"));
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop();
        Err("redis-server did not answer within 10 s".into())
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops the server (SIGTERM) and waits for it.
    pub fn stop(&mut self) {
        if let Some((mut child, stdin)) = self.child.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory (what it persisted comes back).
    pub fn restart(&mut self) {
        self.stop();
        self.launch().expect("restart redis-server");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether something on `port` answers PING.
fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// The server the ordinary tests share: the one named by the variable, or one this process
/// started (stopped when it exits). `None` after the skip line.
pub fn shared(what: &str) -> Option<String> {
    if let Ok(url) = std::env::var(URL_VAR) {
        return Some(url);
    }
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| Server::start_with(false, true, what))
        .as_ref()
        .map(Server::url)
}

static NAMES: AtomicU64 = AtomicU64::new(0);

/// A registry name no other test (in this process, or an earlier run on a shared server) uses.
pub fn unique_name(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "t-{test}-{}-{}-{}",
        std::process::id(),
        NAMES.fetch_add(1, Ordering::Relaxed),
        nanos % 1_000_000_007
    )
}
