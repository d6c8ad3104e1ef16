//! A throwaway `pgbouncer` in front of a PostgreSQL server, in transaction mode (the usual
//! deployment), on a free loopback port, stopped when dropped and when the test process exits (it
//! runs under a small shell that stops it when the pipe from this process closes). As root it runs
//! as the same unprivileged user as the throwaway clusters (PgBouncer refuses to run as root).
//!
//! Without the binary a test skips with one line; with `CI` set it fails instead (`.ci/run`
//! installs `pgbouncer`).

use std::process::Command;

use crate::postgres::{is_root, unprivileged_user};
use crate::process::{free_port, have_or_skip, Tethered};

/// A `pgbouncer` this process started.
pub struct PgBouncer {
    pub port: u16,
    /// Declared before `dir`: fields drop in order, and the process stops before its
    /// directory goes.
    child: Tethered,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts one in `pool_mode = transaction` in front of the server at `host:port`, any user
    /// let through (`auth_type = any`), at most `pool_size` server connections per database and
    /// user. `None` without the binary (after the skip line; a failure under `CI`).
    pub fn start(pg_port: u16, pool_size: u32, what: &str) -> Option<Self> {
        if !have_or_skip("pgbouncer", "pgbouncer", what) {
            return None;
        }
        let dir = tempfile::tempdir().expect("a directory for pgbouncer");
        let user = if is_root() {
            Some(unprivileged_user().expect("a user to run pgbouncer as"))
        } else {
            None
        };
        if let Some(u) = &user {
            let _ = Command::new("chown")
                .arg("-R")
                .arg(u)
                .arg(dir.path())
                .status();
        }
        let port = free_port();
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={pg_port} user=postgres\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = any\npool_mode = transaction\ndefault_pool_size = {pool_size}\n\
                 max_client_conn = 500\nlogfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n",
                dir = dir.path().display()
            ),
        )
        .expect("write pgbouncer.ini");
        if let Some(u) = &user {
            let _ = Command::new("chown").arg(u).arg(&ini).status();
        }
        let run = match &user {
            Some(u) => format!("runuser -u {u} -- pgbouncer"),
            None => "pgbouncer".to_owned(),
        };
        let child = Tethered::spawn(&run, &ini);
        let b = Self { port, dir, child };
        b.child.wait_listening(port, "pgbouncer", || b.log());
        Some(b)
    }

    /// The URL of database `postgres` as user `postgres` through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The pooler's log (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}
