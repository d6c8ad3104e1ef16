//! The event command: `sh -c CMD` in a process group of its own, the event's body on its stdin,
//! the event in its environment, its stdout and stderr the worker's own (the launcher tags the
//! lines). A waiter thread records its exit in the shared state; the main thread kills its whole
//! group when the lease, a verdict or a stop says so.

use crate::client::Event;
use crate::state::Shared;

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;

/// Variables of the worker's own environment the command never sees: the power to act as the
/// worker (the design page: "not `WORKER_CREDENTIAL`").
pub const WITHHELD: &[&str] = &[
    "WORKER_CREDENTIAL",
    "WORKER_ROUTER_URL",
    "WEBHOOK_EVENT_COMMAND",
];

/// A started command: its process group, whose id is the shell's pid.
#[derive(Debug, Clone, Copy)]
pub struct Running {
    pgid: libc::pid_t,
}

impl Running {
    /// Sends `signal` to the command's whole process group (a grandchild too, unless it left
    /// the group). Sending to a group already gone does nothing.
    pub fn signal(self, signal: libc::c_int) {
        // SAFETY: kill(2) has no memory effects; a negative pid names the process group, which
        // the guard keeps in existence until it is released.
        unsafe {
            libc::kill(-self.pgid, signal);
        }
    }
}

/// The script of the guard: ignore the signals a stop sends, wait for the end of its stdin,
/// then `SIGKILL` its own process group, the command's.
const GUARD: &str = "trap '' TERM INT HUP; read -r _; kill -9 0";

/// A process in the command's group that kills the whole group once its stdin, whose only
/// writer is the worker, is closed: when the worker releases it after the command ended (which
/// ends what the command left running in its group), or when the worker dies, whatever killed
/// it (`PR_SET_PDEATHSIG` reaches only the shell, not what the shell started).
pub struct Guard {
    child: std::process::Child,
}

impl Guard {
    fn start(pgid: libc::pid_t) -> std::io::Result<Self> {
        let child = Command::new("sh")
            .arg("-c")
            .arg(GUARD)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(pgid)
            .spawn()?;
        Ok(Self { child })
    }

    /// Closes the guard's stdin (it kills the command's group, what is left of it) and reaps
    /// it. Called once the command's shell has ended.
    pub fn release(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Starts `sh -c cmd` for `event`, the worker's id `worker`, and its [`Guard`]. Must be called
/// from the main thread: `PR_SET_PDEATHSIG` fires when the thread that forked the child ends.
pub fn start(
    cmd: &str,
    worker: u64,
    event: &Event,
    shared: &Arc<Shared>,
) -> std::io::Result<(Running, Guard)> {
    let mut c = Command::new("sh");
    c.arg("-c").arg(cmd);
    for name in WITHHELD {
        c.env_remove(name);
    }
    c.env("WEBHOOK_EVENT", &event.event)
        .env("WEBHOOK_DELIVERY", &event.delivery)
        .env("WEBHOOK_TARGET", &event.target)
        .env("WORKER_ID", worker.to_string())
        .env("WORKER_TOKEN", &event.token);
    for (name, value) in [
        ("WEBHOOK_ACTION", &event.action),
        ("WEBHOOK_CONTENT_TYPE", &event.content_type),
        ("TRACEPARENT", &event.traceparent),
    ] {
        match value {
            Some(v) => c.env(name, v),
            None => c.env_remove(name),
        };
    }
    c.stdin(Stdio::piped()).process_group(0);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid, _exit).
    unsafe {
        c.pre_exec(move || {
            // The command dies with the worker, even a worker killed by SIGKILL.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The worker died between the fork and the prctl: nobody would kill the command.
            if libc::getppid() != parent {
                libc::_exit(137);
            }
            Ok(())
        });
    }
    let mut child = c.spawn()?;
    let running = Running {
        pgid: child.id() as libc::pid_t,
    };
    // Started before the waiter can reap the shell, so the group still exists to join.
    let guard = match Guard::start(running.pgid) {
        Ok(g) => g,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let body = event.body.clone();
    // The body on a thread of its own: a command that reads nothing, or reads after writing a
    // lot, must not stall the worker. A command that exits without reading it all is not an
    // error (EPIPE is ignored: SIGPIPE is ignored by Rust programs).
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            let _ = stdin.write_all(&body);
        })?;
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name("waiter".into())
        .spawn(move || {
            let status = child.wait();
            shared.update(|s| s.command_exit = Some(status));
        })?;
    Ok((running, guard))
}
