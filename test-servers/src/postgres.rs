//! A PostgreSQL server for tests and benchmarks: the one named by `WORKER_REGISTRY_POSTGRES_URL`,
//! or a throwaway cluster (`initdb` + `pg_ctl` from the distribution's PostgreSQL) in a temporary
//! directory on a free loopback port, with durability off for speed, stopped when dropped. When
//! running as root, the cluster runs as an unprivileged user (`postgres`, else `nobody`), since
//! PostgreSQL refuses to run as root.
//!
//! Without the binaries (and without the variable) [`shared_url`] prints one line saying the
//! PostgreSQL tests were skipped and how to enable them, and returns `None`; when `CI` is set it
//! panics instead, so CI cannot pass by skipping. With the binaries present, a cluster that fails
//! to start (initdb failing, no user to run it as, `runuser` missing) is a failure, `CI` or not:
//! only a machine without PostgreSQL skips.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

/// The variable naming an existing server to test against.
pub const URL_VAR: &str = "WORKER_REGISTRY_POSTGRES_URL";
/// The variable naming the directory of `initdb` and `pg_ctl` to use (instead of searching the
/// `PATH` and `/usr/lib/postgresql/*/bin`).
pub const BIN_VAR: &str = "WORKER_REGISTRY_POSTGRES_BIN";

/// A throwaway cluster. Stopped (`pg_ctl stop -m immediate`) and deleted on drop.
pub struct Cluster {
    dir: Option<tempfile::TempDir>,
    bin: PathBuf,
    user: Option<String>,
    port: u16,
    running: bool,
    /// Whether a commit waits for its WAL to be written (`synchronous_commit`): needed by tests
    /// that crash the server and expect committed work to survive; `fsync` is off either way
    /// (the machine does not crash, only the server).
    durable: bool,
}

impl Cluster {
    /// initdb + start, on a free port, with `synchronous_commit` off (fastest; a crash of the
    /// server may lose the last commits). `Err` says why (no binaries, or they failed).
    pub fn start() -> Result<Self, String> {
        Self::start_with(false)
    }

    /// As [`start_with`](Self::start_with), telling a machine without the binaries (the only
    /// case a test may skip) from binaries that failed (always a test failure).
    fn try_start(durable: bool) -> Result<Self, StartError> {
        if find_bin().is_none() {
            return Err(StartError::NoBinaries);
        }
        Self::start_with(durable).map_err(StartError::Failed)
    }

    /// As [`start`](Self::start); `durable` keeps `synchronous_commit` on, so that every
    /// committed transaction survives [`kill`](Self::kill).
    pub fn start_with(durable: bool) -> Result<Self, String> {
        let bin = find_bin().ok_or("no initdb/pg_ctl found")?;
        let user = if is_root() {
            Some(unprivileged_user()?)
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("wr-pg-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        if let Some(u) = &user {
            run(Command::new("chown").arg("-R").arg(u).arg(dir.path()))?;
        }
        let mut cluster = Cluster {
            dir: Some(dir),
            bin,
            user,
            port: 0,
            running: false,
            durable,
        };
        let data = cluster.data();
        cluster.run_as(&[
            cluster
                .bin
                .join("initdb")
                .as_os_str()
                .to_str()
                .unwrap_or("initdb"),
            "-D",
            data.to_str().ok_or("temp dir path is not UTF-8")?,
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        ])?;
        let mut last = String::new();
        for _ in 0..3 {
            cluster.port = free_port()?;
            match cluster.pg_ctl_start() {
                Ok(()) => return Ok(cluster),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The connection URL.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server as a crash would (`-m immediate`: no checkpoint, clients cut off).
    pub fn kill(&mut self) -> Result<(), String> {
        self.pg_ctl(&["stop", "-m", "immediate", "-w"])?;
        self.running = false;
        Ok(())
    }

    /// Starts it again, on the same port and data.
    pub fn restart(&mut self) -> Result<(), String> {
        self.pg_ctl_start()
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A streaming standby of this cluster: `pg_basebackup -R` (a copy that replicates, hot
    /// standby: read-only sessions) into a directory of its own, started on a free port.
    /// Replication is asynchronous, as the default deployment's.
    pub fn standby(&self) -> Result<Cluster, String> {
        let dir = tempfile::Builder::new()
            .prefix("wr-pg-standby-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        if let Some(u) = &self.user {
            run(Command::new("chown").arg("-R").arg(u).arg(dir.path()))?;
        }
        let mut standby = Cluster {
            dir: Some(dir),
            bin: self.bin.clone(),
            user: self.user.clone(),
            port: 0,
            running: false,
            durable: self.durable,
        };
        let data = standby.data();
        // Beside `pg_ctl`, or beside what it links to (a PATH with links to two tools only).
        let basebackup = Some(self.bin.join("pg_basebackup"))
            .filter(|p| p.is_file())
            .or_else(|| {
                let ctl = std::fs::canonicalize(self.bin.join("pg_ctl")).ok()?;
                Some(ctl.parent()?.join("pg_basebackup"))
            })
            .ok_or("no pg_basebackup beside pg_ctl")?;
        let port = self.port.to_string();
        standby.run_as(&[
            basebackup.to_str().unwrap_or("pg_basebackup"),
            "-D",
            data.to_str().ok_or("temp dir path is not UTF-8")?,
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        ])?;
        let mut last = String::new();
        for _ in 0..3 {
            standby.port = free_port()?;
            match standby.pg_ctl_start() {
                Ok(()) => return Ok(standby),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Promotes a standby to a primary (`pg_ctl promote`, waiting until it accepts writes).
    pub fn promote(&self) -> Result<(), String> {
        self.pg_ctl(&["promote", "-w", "-t", "60"])
    }

    fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .unwrap_or(Path::new("/nonexistent"))
    }

    fn data(&self) -> PathBuf {
        self.dir().join("data")
    }

    fn pg_ctl_start(&mut self) -> Result<(), String> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit={} \
             -c full_page_writes=off -c max_connections=300 -c shared_buffers=64MB",
            self.port,
            self.dir().display(),
            if self.durable { "on" } else { "off" },
        );
        let log = self.dir().join("log");
        self.pg_ctl(&[
            "start",
            "-w",
            "-t",
            "60",
            "-l",
            log.to_str().unwrap_or("log"),
            "-o",
            &opts,
        ])
        .map_err(|e| {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            format!("{e}\n{tail}")
        })?;
        self.running = true;
        Ok(())
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let ctl = self.bin.join("pg_ctl");
        let data = self.data();
        let mut all = vec![
            ctl.to_str().unwrap_or("pg_ctl"),
            "-D",
            data.to_str().unwrap_or("."),
        ];
        all.extend_from_slice(args);
        self.run_as(&all)
    }

    fn run_as(&self, args: &[&str]) -> Result<(), String> {
        let mut cmd = match &self.user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--"]);
                c
            }
            None => Command::new(args[0]),
        };
        if self.user.is_some() {
            cmd.args(args);
        } else {
            cmd.args(&args[1..]);
        }
        // Run from the cluster's directory: the unprivileged user may not be able to read ours.
        cmd.current_dir(self.dir());
        run(&mut cmd)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running {
            let _ = self.kill();
        }
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("free port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("free port: {e}"))
}

/// The user the throwaway clusters run as when this process is root (`None` otherwise): files a
/// server must read (TLS keys) are handed to it.
pub fn server_user() -> Option<String> {
    if is_root() {
        unprivileged_user().ok()
    } else {
        None
    }
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

pub(crate) fn unprivileged_user() -> Result<String, String> {
    for u in ["postgres", "nobody"] {
        if Command::new("id")
            .arg("-u")
            .arg(u)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return Ok(u.to_owned());
        }
    }
    Err("running as root and there is no postgres or nobody user to run PostgreSQL as".into())
}

/// The directory holding `initdb` and `pg_ctl`: the one [`BIN_VAR`] names, or on the PATH, or the
/// newest `/usr/lib/postgresql/*/bin`.
fn find_bin() -> Option<PathBuf> {
    let has = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    if let Some(d) = std::env::var_os(BIN_VAR) {
        let d = PathBuf::from(d);
        return has(&d).then_some(d);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            if has(&d) {
                return Some(d);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            has(&bin).then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

/// The path of one of the installed PostgreSQL's programs (`pg_dump`, `psql`): the one beside
/// the `initdb` the clusters are started with (where that `initdb` is a link, as in
/// `/usr/local/bin`, beside its target). `None` if there is none.
pub fn tool(name: &str) -> Option<PathBuf> {
    let bin = find_bin()?;
    let beside = |dir: &Path| Some(dir.join(name)).filter(|p| p.is_file());
    beside(&bin).or_else(|| {
        let initdb = std::fs::canonicalize(bin.join("initdb")).ok()?;
        beside(initdb.parent()?)
    })
}

/// Why no cluster could be started.
#[derive(Debug, Clone)]
enum StartError {
    /// No `initdb`/`pg_ctl` on this machine: the tests may skip (unless `CI` is set).
    NoBinaries,
    /// The binaries are there and failed (initdb, the user to run as, `runuser`, `pg_ctl
    /// start`): a broken start must never read as a pass.
    Failed(String),
}

/// The outcome of a start for a test: the cluster, or `None` after [`skip`] when the machine
/// has no PostgreSQL; a failed start panics with what failed.
fn started<T>(r: Result<T, StartError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(StartError::NoBinaries) => {
            skip("no initdb/pg_ctl found");
            None
        }
        Err(StartError::Failed(why)) => {
            panic!("PostgreSQL is installed but the test cluster did not start: {why}")
        }
    }
}

static SKIP_SAID: AtomicBool = AtomicBool::new(false);

/// Says, once per process, that the PostgreSQL tests were skipped, on stderr past the test
/// harness's capture. Panics instead when `CI` is set.
pub fn skip(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("CI is set, and what needs PostgreSQL cannot run: {why} (install postgresql or set {URL_VAR})");
    }
    if !SKIP_SAID.swap(true, Ordering::Relaxed) {
        let _ = writeln!(
            std::io::stderr(),
            "skipped: everything here that needs PostgreSQL ({why}; install postgresql or set {URL_VAR})"
        );
    }
}

/// The server every test of this process shares: the variable's, or one cluster started on first
/// use and stopped when the process exits (by a watchdog, since statics are never dropped).
/// `None` after [`skip`] when there is neither.
pub fn shared_url() -> Option<String> {
    static SHARED: OnceLock<Result<String, StartError>> = OnceLock::new();
    let r = SHARED.get_or_init(|| {
        if let Ok(url) = std::env::var(URL_VAR) {
            return Ok(url);
        }
        let mut cluster = Cluster::try_start(false)?;
        let url = cluster.url();
        watch(&cluster);
        // From now on the watchdog owns the cluster's end (and deletes its directory).
        cluster.running = false;
        if let Some(d) = cluster.dir.take() {
            let _ = d.keep();
        }
        Ok(url)
    });
    started(r.clone())
}

/// A fresh cluster of the test's own (for tests that stop and restart the server), or `None`
/// after [`skip`] when the machine has no PostgreSQL binaries. The server [`URL_VAR`] names is
/// never used here (a test must not restart it): with the variable set the test still starts its
/// own cluster, and without the binaries skips, or fails when `CI` is set, as everywhere else.
pub fn own_cluster() -> Option<Cluster> {
    let r = Cluster::try_start(true);
    if matches!(r, Err(StartError::NoBinaries)) && std::env::var_os(URL_VAR).is_some() {
        skip(&format!(
            "a test that restarts PostgreSQL needs initdb/pg_ctl: {URL_VAR} names a server it must not stop"
        ));
        return None;
    }
    started(r)
}

impl Cluster {
    /// Hands the cluster to a watchdog that stops and deletes it when this process exits, and
    /// returns its URL: for a cluster of a test binary's own kept in a static (never dropped).
    pub fn stop_at_exit(mut self) -> String {
        let url = self.url();
        watch(&self);
        self.running = false;
        if let Some(d) = self.dir.take() {
            let _ = d.keep();
        }
        url
    }
}

/// Starts a process that waits for this one to exit, then stops the cluster and deletes it.
fn watch(c: &Cluster) {
    let ctl = c.bin.join("pg_ctl");
    let stop = format!(
        "{} -D {} stop -m immediate -w",
        ctl.display(),
        c.data().display()
    );
    let stop = match &c.user {
        Some(u) => format!("runuser -u {u} -- {stop}"),
        None => stop,
    };
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; cd /; {stop} >/dev/null 2>&1; rm -rf {dir}",
        pid = std::process::id(),
        dir = c.dir().display()
    );
    let _ = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// A registry name no other test (in this process or another) uses.
pub fn unique_name(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{test}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
