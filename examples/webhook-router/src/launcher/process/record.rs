//! The `process` launcher's records: one file per live worker in the state directory
//! (`--launcher-state-dir`), naming its session and its leader's start, so that the next
//! incarnation of the replica finds what this one left running ([`Launcher::leftovers`]).
//!
//! Why records and not the process tree: a worker outlives its router only as an orphan (the
//! router was killed and `PR_SET_PDEATHSIG` killed the worker, but not the command the worker had
//! started, which the kernel re-parents to init), and an orphan has no parent link back to any
//! router: the tree cannot say whose it is, nor tell this replica's from another replica's on the
//! same host. A record can: it is written before [`Launcher::launch`] returns and deleted only
//! once the worker's whole session is gone.
//!
//! A file holds `v1 <session id> <leader start ticks> <boot id>`. A record is **live** when its
//! boot is this boot and its session still has a live member: the session id cannot have been
//! reused while a member is alive, and if the leader is alive its start time must match the
//! record's (a leader started later under the same pid is someone else's, its session another).
//!
//! [`Launcher::leftovers`]: crate::launcher::Launcher::leftovers
//! [`Launcher::launch`]: crate::launcher::Launcher::launch

use super::session;

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use worker_registry::WorkerId;

/// A file's name: this prefix and the worker id.
const PREFIX: &str = "worker-";

/// One worker's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The worker.
    pub worker: WorkerId,
    /// Its session (and process group) id: the leader's pid.
    pub sid: i32,
    /// The leader's start, in clock ticks since boot.
    pub start: u64,
    /// The boot it was started in.
    pub boot: String,
}

impl Record {
    /// Whether the worker's session still has a live member (see the [module documentation](self)).
    pub fn is_live(&self, boot: &str) -> io::Result<bool> {
        if self.boot != boot {
            return Ok(false);
        }
        if let Some(leader) = session::stat(self.sid) {
            if !leader.zombie && leader.session == self.sid {
                return Ok(leader.start == self.start);
            }
        }
        Ok(!session::members(self.sid)?.is_empty())
    }
}

/// The state directory's records.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    /// The records in `dir`, created (mode 0700) when missing.
    pub fn open(dir: &Path) -> io::Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, worker: WorkerId) -> PathBuf {
        self.dir.join(format!("{PREFIX}{worker}"))
    }

    /// Writes `record`, replacing any record of its worker, atomically (a temporary file renamed).
    pub fn write(&self, record: &Record) -> io::Result<()> {
        let tmp = self.dir.join(format!(".{PREFIX}{}.tmp", record.worker));
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        writeln!(file, "v1 {} {} {}", record.sid, record.start, record.boot)?;
        file.sync_all()?;
        fs::rename(&tmp, self.path(record.worker))
    }

    /// Deletes `worker`'s record; one already gone is not an error.
    pub fn remove(&self, worker: WorkerId) -> io::Result<()> {
        match fs::remove_file(self.path(worker)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every record in the directory. A file that does not parse is an error naming it (the
    /// directory is the launcher's alone; a stranger's file there is a configuration mistake).
    pub fn list(&self) -> io::Result<Vec<Record>> {
        let mut records = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
                continue; // temporary files, and anything not a record
            };
            let text = fs::read_to_string(entry.path())?;
            let record = id
                .parse()
                .ok()
                .and_then(|worker| parse(worker, &text))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: not a worker record: {text:?}", entry.path().display()),
                    )
                })?;
            records.push(record);
        }
        records.sort_by_key(|r| r.worker);
        Ok(records)
    }
}

fn parse(worker: WorkerId, text: &str) -> Option<Record> {
    let mut fields = text.split_whitespace();
    if fields.next()? != "v1" {
        return None;
    }
    let record = Record {
        worker,
        sid: fields.next()?.parse().ok()?,
        start: fields.next()?.parse().ok()?,
        boot: fields.next()?.to_owned(),
    };
    fields.next().is_none().then_some(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_stray_file_is_named() {
        let dir = std::env::temp_dir().join(format!("wr-records-{}", std::process::id()));
        let records = Records::open(&dir).unwrap();
        let r = Record {
            worker: WorkerId::new(7),
            sid: 1234,
            start: 99,
            boot: "b00t".into(),
        };
        records.write(&r).unwrap();
        assert_eq!(records.list().unwrap(), vec![r.clone()]);
        // Another boot's record is never live.
        assert!(!r.is_live("another").unwrap());
        records.remove(r.worker).unwrap();
        records.remove(r.worker).unwrap();
        assert!(records.list().unwrap().is_empty());
        fs::write(dir.join("worker-8"), "v2 1 2 3\n").unwrap();
        let err = records.list().unwrap_err().to_string();
        assert!(err.contains("worker-8"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
