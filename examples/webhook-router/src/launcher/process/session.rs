//! A worker's session: what the `process` launcher signals, read from `/proc`.
//!
//! Each worker process is started as the leader of a new session (`setsid`), hence of a new
//! process group with the same id. Everything it starts stays in that session, even a command it
//! puts in a process group of its own (as the `webhook-worker` does, to kill its command without
//! killing itself), so "the worker and everything it started" is the session: [`kill_session`]
//! kills every process in it, found in `/proc`. A process that calls `setsid` itself leaves the
//! session and escapes the launcher (a container's cgroup would not let it: the `docker`
//! launcher).
//!
//! **Pid reuse.** A session's or group's id cannot be handed to a new process while any process
//! is still in that session or group (the kernel keeps the id until its last user is gone), so
//! signalling a session with live members reaches only them. Each member found in `/proc` is
//! opened as a pidfd and its session read again through it before it is signalled, so a member
//! that exited between the scan and the signal (its pid reused since) is never hit.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// How many scans [`kill_session`] makes at most: a member forks only until it is killed, so a
/// scan after every member it saw was killed finds none, except for children forked meanwhile.
const KILL_ROUNDS: usize = 16;

/// What `/proc/<pid>/stat` says of a process (the fields the launcher needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Its process group.
    pub pgrp: i32,
    /// Its session.
    pub session: i32,
    /// When it started, in clock ticks since boot (with the boot id, identifies it across pid
    /// reuse).
    pub start: u64,
    /// Whether it has exited and waits to be reaped (a zombie: dead, nothing to signal).
    pub zombie: bool,
}

/// Reads process `pid`'s [`Stat`]; `None` when there is no such process.
pub fn stat(pid: i32) -> Option<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses `/proc/<pid>/stat` (the command name, in parentheses, may hold spaces and parentheses:
/// the fields are counted from the last `)`).
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state (field 3), ppid, pgrp (5), session (6), ..., starttime (22).
    Some(Stat {
        zombie: matches!(*fields.first()?, "Z" | "X"),
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`): a start time means something only within
/// one boot.
pub fn boot_id() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

/// The live (not zombie) processes of session `sid`, the leader included.
pub fn members(sid: i32) -> io::Result<Vec<i32>> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if matches!(stat(pid), Some(s) if s.session == sid && !s.zombie) {
            found.push(pid);
        }
    }
    Ok(found)
}

/// Sends `signal` to process group `pgid` (the worker's own group: its leader and what it did not
/// move to a group of its own). A group that is gone is not an error.
pub fn signal_group(pgid: i32, signal: i32) -> io::Result<()> {
    // SAFETY: kill(2) with a negative pid signals a process group; it touches no memory.
    if unsafe { libc::kill(-pgid, signal) } == 0 {
        return Ok(());
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        e => Err(e),
    }
}

/// Kills (`SIGKILL`) every process of session `sid` and returns once a scan finds none alive, or
/// an error naming how many are left after [`KILL_ROUNDS`] scans. Reads all of `/proc` per scan:
/// called when a worker is killed or has ended, never on a hot path.
pub fn kill_session(sid: i32) -> io::Result<()> {
    signal_group(sid, libc::SIGKILL)?;
    for _ in 0..KILL_ROUNDS {
        let alive = members(sid)?;
        if alive.is_empty() {
            return Ok(());
        }
        for pid in alive {
            kill_member(pid, sid)?;
        }
    }
    let left = members(sid)?.len();
    if left == 0 {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{left} processes of session {sid} still alive after {KILL_ROUNDS} rounds of SIGKILL"
    )))
}

/// Kills `pid` if, read through a pidfd (which pins the process), it is still in session `sid`.
fn kill_member(pid: i32, sid: i32) -> io::Result<()> {
    let Some(fd) = pidfd_open(pid)? else {
        return Ok(()); // gone already
    };
    if !matches!(stat(pid), Some(s) if s.session == sid) {
        return Ok(()); // the pid was reused between the scan and the open: not ours
    }
    // SAFETY: pidfd_send_signal(2) on a pidfd this function owns, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        return Ok(());
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        e => Err(e),
    }
}

/// Opens a pidfd for `pid`: `None` when there is no such process (Linux 5.3 or later).
pub fn pidfd_open(pid: i32) -> io::Result<Option<OwnedFd>> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
            e => Err(e),
        };
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("pidfd out of range"))?;
    // SAFETY: `fd` was just returned by the kernel, open, and owned by nobody else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_spaces_and_parentheses_is_skipped() {
        let text = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 98765 1000 10";
        let s = parse_stat(text).unwrap();
        assert_eq!(
            (s.pgrp, s.session, s.start, s.zombie),
            (42, 42, 98765, false)
        );
        let zombie = text.replace(") S ", ") Z ");
        assert!(parse_stat(&zombie).unwrap().zombie);
        assert_eq!(parse_stat("42 (x) S 1"), None);
    }

    #[test]
    fn this_process_reads_itself() {
        let me = i32::try_from(std::process::id()).unwrap();
        let s = stat(me).unwrap();
        assert!(!s.zombie && s.start > 0);
        assert!(members(s.session).unwrap().contains(&me));
    }
}
