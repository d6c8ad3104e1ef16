//! Secret files re-read while the router runs: on SIGHUP, and every `--secret-poll-interval`
//! (the file's contents compared with what was loaded: a Kubernetes Secret volume swaps a
//! symlink, an editor rewrites the file, either way the contents tell). A changed file's value
//! replaces the [`Secret`] in place; for the webhook secret and the admin token the previous
//! value stays accepted for `--secret-rotation-window` (so GitHub's hook and the file can be
//! changed one after the other, and replicas that read the file a little apart still accept each
//! other's forwarded events), then is retired. A file that cannot be read, is empty or does not
//! check (an App key that is not one) leaves the value as it was, and says so in the log.
//!
//! The task handles SIGHUP from when it starts, whether or not a file is watched, so that a
//! SIGHUP never ends the process (its default action).

use crate::secrets::{self, Secret};

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

/// The default `--secret-rotation-window`: an hour for GitHub's hook settings and the file to be
/// brought in line, one after the other.
pub const DEFAULT_ROTATION_WINDOW: Duration = Duration::from_secs(3600);
/// The default `--secret-poll-interval`.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);

/// A secret file the router watches.
#[derive(Clone)]
pub struct Watched {
    /// The flag that named it (`--webhook-secret-file`), for the log.
    pub flag: &'static str,
    /// The file.
    pub path: PathBuf,
    /// The secret it fills.
    pub secret: Secret,
    /// What becomes of the value a new one replaces.
    pub rotation: Rotation,
    /// A check a new value must pass before it replaces the old one.
    pub check: fn(&[u8]) -> Result<(), String>,
}

impl fmt::Debug for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("flag", &self.flag)
            .field("path", &self.path)
            .field("rotation", &self.rotation)
            .finish()
    }
}

/// What becomes of a watched secret's value when its file brings a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// Replaced at once: a value the router only sends (a token, a key it signs with).
    Replace,
    /// Accepted beside the new one for `--secret-rotation-window`, then retired: a value the
    /// router checks, that its sender changes on its own schedule (the webhook secret, the admin
    /// token).
    Window,
    /// Accepted beside the new one until the file changes again: the worker key, whose
    /// credentials the workers hold for life.
    UntilNextChange,
}

/// A check that accepts any value.
pub fn any_value(_: &[u8]) -> Result<(), String> {
    Ok(())
}

/// How the watcher runs.
#[derive(Debug, Clone, Copy)]
pub struct ReloadOptions {
    /// How long a replaced webhook secret or admin token stays accepted (zero: not at all).
    pub window: Duration,
    /// How often the files are read (zero: only on SIGHUP).
    pub poll: Duration,
}

/// One watched file and what was last loaded from it.
struct Entry {
    watched: Watched,
    loaded: Vec<u8>,
    /// When the previous value stops being accepted, if one is.
    retire_at: Option<Instant>,
}

/// Starts watching `files` (their values as loaded at start are what `Secret` holds), and
/// handling SIGHUP.
pub fn spawn(files: Vec<Watched>, options: ReloadOptions) -> std::io::Result<JoinHandle<()>> {
    let mut hup = signal(SignalKind::hangup())?;
    let mut entries: Vec<Entry> = files
        .into_iter()
        .map(|watched| Entry {
            loaded: watched
                .secret
                .current()
                .map(|v| v.to_vec())
                .unwrap_or_default(),
            watched,
            retire_at: None,
        })
        .collect();
    Ok(tokio::spawn(async move {
        let mut next_poll = deadline(options.poll);
        loop {
            let retire = entries.iter().filter_map(|e| e.retire_at).min();
            tokio::select! {
                _ = hup.recv() => {
                    tracing::info!(files = entries.len(), "SIGHUP: reading the secret files again");
                    reload(&mut entries, options.window);
                }
                () = sleep_until(next_poll.unwrap_or_else(far)), if next_poll.is_some() => {
                    reload(&mut entries, options.window);
                    next_poll = deadline(options.poll);
                }
                () = sleep_until(retire.unwrap_or_else(far)), if retire.is_some() => {
                    retire_due(&mut entries);
                }
            }
        }
    }))
}

/// `now + every`, unless `every` is zero (off).
fn deadline(every: Duration) -> Option<Instant> {
    (!every.is_zero()).then(|| Instant::now() + every)
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

/// Reads every file; a changed, valid value replaces its secret.
fn reload(entries: &mut [Entry], window: Duration) {
    for e in entries.iter_mut() {
        let w = &e.watched;
        let value =
            match secrets::read_file(w.flag, &w.path).and_then(|v| (w.check)(&v).map(|()| v)) {
                Ok(v) => v,
                Err(err) => {
                    tracing::error!(flag = w.flag, "{err}: keeping the value loaded before");
                    continue;
                }
            };
        if value == e.loaded {
            continue;
        }
        let keep = match w.rotation {
            Rotation::Replace => false,
            Rotation::Window => !window.is_zero(),
            Rotation::UntilNextChange => true,
        };
        w.secret.replace(Arc::from(value.as_slice()), keep);
        e.loaded = value;
        e.retire_at = (keep && w.rotation == Rotation::Window).then(|| Instant::now() + window);
        if w.rotation == Rotation::UntilNextChange {
            tracing::info!(
                flag = w.flag,
                path = %w.path.display(),
                "secret file changed: the new value is in use, the previous one is accepted too until the file changes again"
            );
        } else if keep {
            tracing::info!(
                flag = w.flag,
                path = %w.path.display(),
                window = %humantime::format_duration(window),
                "secret file changed: the new value is in use, the previous one is accepted too until the rotation window ends"
            );
        } else {
            tracing::info!(flag = w.flag, path = %w.path.display(), "secret file changed: the new value is in use");
        }
    }
}

/// Retires the previous values whose window has ended.
fn retire_due(entries: &mut [Entry]) {
    let now = Instant::now();
    for e in entries.iter_mut() {
        if e.retire_at.is_some_and(|at| at <= now) {
            e.retire_at = None;
            e.watched.secret.retire_previous();
            tracing::info!(
                flag = e.watched.flag,
                "rotation window over: the previous value is no longer accepted"
            );
        }
    }
}
