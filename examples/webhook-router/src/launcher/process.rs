//! The `process` launcher: one command per worker (for example the `webhook-worker` binary with
//! `--event-command CMD`), a child process of the router speaking the worker protocol.
//!
//! * `session` — the worker's session, read from `/proc` and signalled.
//! * `record` — the state directory's records, from which the next incarnation finds leftovers.
//!
//! **Start.** The command is started with exactly [`Launch::env`] and `PATH` (a cleared
//! environment: the router's own variables, the admin token's and the webhook secret's files
//! among them, never reach it), standard input from `/dev/null`, as the leader of a new session
//! and process group (`setsid`), with `PR_SET_PDEATHSIG(SIGKILL)` so that a killed router leaves
//! no worker behind. Starts are made by one thread of the launcher's that never exits, since the
//! parent-death signal follows the *thread* that forked. Each line of its standard output and
//! error is logged through `tracing`, tagged with the worker id ([`super::output`]).
//!
//! **End.** The launcher waits for the process on a pidfd, which sees the exit without reaping it,
//! so the process's id stays its own until the launcher is done with it: it then kills whatever
//! the worker left running in its session (its command, its command's children), reaps it, and
//! deletes its record. Its status is mapped by [`exit_for`] (0 [`Exit::Exited`], 3
//! [`Exit::Fenced`], anything else [`Exit::Crashed`]).
//!
//! **Control.** [`Control::kill`] is `SIGKILL` of the worker's process group at once, then of its
//! whole session ([`Exit::Crashed`]); [`Control::stop`] is `SIGTERM` of the group, and `SIGKILL` of
//! the session after the stop grace ([`DEFAULT_STOP_GRACE`]): its exit is then [`Exit::Stopped`]
//! with **no** jobs, whatever its status: the router's worker-protocol server serves the worker's
//! mailbox ([`Launcher::speaks_protocol`]), so the router accounts its remainder itself. Dropping
//! [`Launched::exit`] kills the whole session.
//!
//! **Leftovers** come from the records of the state directory (`--launcher-state-dir`; `record`
//! argues why records and not the process tree). Without one, [`Launcher::leftovers`] lists
//! nothing: a worker dies with its router (the parent-death signal), but a command it had started
//! may outlive both, for as long as that command runs.

mod record;
mod session;

use super::external::exit_for;
use super::output::Lines;
use super::{BoxFuture, Control, Exit, Launch, LaunchError, Launched, Launcher, Leftover};
use record::{Record, Records};

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use worker_registry::WorkerId;

/// How long a stopped worker has between `SIGTERM` and `SIGKILL`.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);

/// How long, after a worker's process ended, its output is still read (from a process that left
/// its session and kept the pipe open) before the launcher stops reading.
pub const DEFAULT_OUTPUT_DRAIN: Duration = Duration::from_secs(1);

/// The `PATH` a worker gets when the router has none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Configures a [`ProcessLauncher`].
pub struct ProcessLauncherBuilder {
    argv: Vec<String>,
    path: Option<String>,
    stop_grace: Duration,
    output_drain: Duration,
    state_dir: Option<PathBuf>,
}

impl ProcessLauncherBuilder {
    /// The `PATH` workers get (default: the router's own, or [`DEFAULT_PATH`]). A `PATH` in
    /// [`Launch::env`] wins over it.
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// The time between `SIGTERM` and `SIGKILL` of a stopped worker (default
    /// [`DEFAULT_STOP_GRACE`]).
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// How long output is read after a worker ended (default [`DEFAULT_OUTPUT_DRAIN`]).
    pub fn output_drain(mut self, drain: Duration) -> Self {
        self.output_drain = drain;
        self
    }

    /// The directory of this replica's worker records (`--launcher-state-dir`; see the
    /// [module documentation](self)). One directory per replica: two replicas sharing one would
    /// each remove the other's workers at start.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// The launcher; an empty command, or a state directory that cannot be created, is refused.
    pub fn build(self) -> Result<ProcessLauncher, LaunchError> {
        if self.argv.first().is_none_or(|p| p.is_empty()) {
            return Err(LaunchError::Unavailable {
                reason: "the worker command is empty".into(),
            });
        }
        let records = match &self.state_dir {
            None => None,
            Some(dir) => Some(Records::open(dir).map_err(|e| LaunchError::Unavailable {
                reason: format!("the launcher's state directory {}: {e}", dir.display()),
            })?),
        };
        let path = self
            .path
            .or_else(|| std::env::var("PATH").ok())
            .unwrap_or_else(|| DEFAULT_PATH.to_owned());
        Ok(ProcessLauncher {
            argv: self.argv,
            path,
            stop_grace: self.stop_grace,
            output_drain: self.output_drain,
            records,
        })
    }
}

/// The `process` launcher (see the [module documentation](self)).
pub struct ProcessLauncher {
    argv: Vec<String>,
    path: String,
    stop_grace: Duration,
    output_drain: Duration,
    records: Option<Records>,
}

impl ProcessLauncher {
    /// A launcher running `argv` (the program, then its arguments) for each worker.
    pub fn builder(argv: Vec<String>) -> ProcessLauncherBuilder {
        ProcessLauncherBuilder {
            argv,
            path: None,
            stop_grace: DEFAULT_STOP_GRACE,
            output_drain: DEFAULT_OUTPUT_DRAIN,
            state_dir: None,
        }
    }

    /// The command, with the environment and the process attributes of the
    /// [module documentation](self).
    fn command(&self, env: &[(String, String)]) -> Command {
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .env_clear()
            .env("PATH", &self.path)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: getpid(2) has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: setsid(2), prctl(2) and getppid(2) are, and the
        // errors are built from an errno without allocating.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) < 0
                {
                    return Err(io::Error::last_os_error());
                }
                // The router died between the fork and the prctl: the signal will never come.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        cmd
    }

    async fn start(&self, spec: Launch) -> Result<Launched, LaunchError> {
        // `jobs` is closed and empty: the router serves the mailbox (`speaks_protocol`).
        let Launch { id, env, .. } = spec;
        let refused = |reason: String| LaunchError::Refused { worker: id, reason };
        let child = spawn(self.command(&env))
            .await
            .map_err(|e| refused(format!("{}: {e}", self.argv[0])))?;
        let worker = Started::watch(id, child, self.records.clone())
            .map_err(|e| refused(format!("watching the started process: {e}")))?;
        let shared = worker.shared.clone();
        let exit = worker.exit(self.stop_grace, self.output_drain);
        tracing::info!(worker = %id, pid = shared.sid, command = %self.argv[0], "worker process started");
        Ok(Launched {
            exit: Box::pin(exit),
            control: Box::new(ProcessControl(shared)),
        })
    }

    async fn remove_record(&self, records: &Records, worker: WorkerId) -> io::Result<()> {
        let Some(record) = records.list()?.into_iter().find(|r| r.worker == worker) else {
            return Ok(());
        };
        if record.is_live(&session::boot_id()?)? {
            stop_leftover(&record, self.stop_grace).await?;
        }
        records.remove(worker)
    }
}

impl Launcher for ProcessLauncher {
    fn kind(&self) -> &'static str {
        "process"
    }

    /// Its workers speak the protocol: the router serves their mailboxes.
    fn speaks_protocol(&self) -> bool {
        true
    }

    fn launch(&self, spec: Launch) -> BoxFuture<'_, Result<Launched, LaunchError>> {
        Box::pin(self.start(spec))
    }

    /// The live workers of the state directory's records (none without one); a record whose
    /// session is gone is deleted on the way.
    fn leftovers(&self) -> BoxFuture<'_, Result<Vec<Leftover>, LaunchError>> {
        Box::pin(async move {
            let Some(records) = &self.records else {
                return Ok(Vec::new());
            };
            let unavailable = |e: io::Error| LaunchError::Unavailable {
                reason: format!(
                    "the launcher's state directory {}: {e}",
                    records.dir().display()
                ),
            };
            let boot = session::boot_id().map_err(unavailable)?;
            let mut found = Vec::new();
            for record in records.list().map_err(unavailable)? {
                if record.is_live(&boot).map_err(unavailable)? {
                    found.push(Leftover {
                        worker: record.worker,
                        handle: format!("session {}", record.sid),
                    });
                } else {
                    records.remove(record.worker).map_err(unavailable)?;
                }
            }
            Ok(found)
        })
    }

    /// `SIGTERM` of the leftover's process group, `SIGKILL` of its session once the leader has
    /// exited or the stop grace has passed, then its record deleted.
    fn remove(&self, leftover: Leftover) -> BoxFuture<'_, Result<(), LaunchError>> {
        Box::pin(async move {
            let Some(records) = &self.records else {
                return Ok(());
            };
            self.remove_record(records, leftover.worker)
                .await
                .map_err(|e| LaunchError::Refused {
                    worker: leftover.worker,
                    reason: format!("removing {}: {e}", leftover.handle),
                })
        })
    }
}

/// Stops a previous incarnation's worker: `SIGTERM`, the leader's exit or the grace, `SIGKILL` of
/// the session.
async fn stop_leftover(record: &Record, grace: Duration) -> io::Result<()> {
    session::signal_group(record.sid, libc::SIGTERM)?;
    // Not our child: the pidfd says when it exits; someone else (init) reaps it.
    if let Some(fd) = session::pidfd_open(record.sid)? {
        let fd = readiness(fd)?;
        let _ = tokio::time::timeout(grace, fd.readable()).await;
    }
    let sid = record.sid;
    tokio::task::spawn_blocking(move || session::kill_session(sid))
        .await
        .map_err(io::Error::other)?
}

/// A request to the spawning thread, and where its answer goes.
type SpawnRequest = (Command, oneshot::Sender<io::Result<Child>>);

/// Starts `cmd` on the launcher's spawning thread, which lives as long as the process: the
/// parent-death signal is sent when the thread that forked the child exits, so no worker may be
/// forked by a thread that can end (a runtime's blocking thread, a runtime shut down).
async fn spawn(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Result<mpsc::Sender<SpawnRequest>, String>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("worker-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .map(|_| tx)
            .map_err(|e| e.to_string())
    });
    let spawner = spawner
        .as_ref()
        .map_err(|e| io::Error::other(format!("no spawning thread: {e}")))?;
    let (reply, answer) = oneshot::channel();
    spawner
        .send((cmd, reply))
        .map_err(|_| io::Error::other("the spawning thread is gone"))?;
    answer
        .await
        .map_err(|_| io::Error::other("the spawning thread is gone"))?
}

/// What the worker's exit and its control share.
struct Shared {
    id: WorkerId,
    /// The worker's pid, which is its session's and its process group's id.
    sid: i32,
    state: Mutex<State>,
    /// Wakes the exit future when a stop begins.
    stopping: Notify,
    records: Option<Records>,
}

#[derive(Default)]
struct State {
    /// The process has been reaped: its pid is no longer ours to signal.
    reaped: bool,
    killed: bool,
    stopping: bool,
}

impl Shared {
    /// **Locking behaviour:** a per-worker mutex, held for a flag and a `kill(2)`, never across an
    /// await; contended only by the worker's own control and exit.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `signal` to the worker's process group unless it has been reaped.
    fn signal(state: &State, sid: i32, signal: i32) {
        if !state.reaped {
            if let Err(e) = session::signal_group(sid, signal) {
                tracing::warn!(
                    pgid = sid,
                    signal,
                    "could not signal a worker's process group: {e}"
                );
            }
        }
    }

    /// Kills what is left of the session, reaps the leader, deletes the record: the end of every
    /// worker, whether its exit future completed or was dropped. Blocking (`/proc` is read).
    fn finish(&self) -> Option<ExitStatus> {
        if let Err(e) = session::kill_session(self.sid) {
            tracing::error!(worker = %self.id, session = self.sid, "the worker's session could not be killed whole: {e}");
        }
        let mut state = self.state();
        state.reaped = true;
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child, which has exited (or was just killed): it is
        // reaped here and nowhere else.
        let r = unsafe { libc::waitpid(self.sid, &mut status, 0) };
        drop(state);
        if let Some(records) = &self.records {
            if let Err(e) = records.remove(self.id) {
                tracing::error!(worker = %self.id, "could not delete the worker's record: {e}");
            }
        }
        (r == self.sid).then(|| ExitStatus::from_raw(status))
    }
}

/// A started worker process, before its exit is awaited.
struct Started {
    shared: Arc<Shared>,
    pidfd: AsyncFd<OwnedFd>,
    output: Vec<JoinHandle<()>>,
}

impl Started {
    /// Opens the child's pidfd, writes its record and starts reading its output; on failure the
    /// child is killed and reaped.
    fn watch(id: WorkerId, mut child: Child, records: Option<Records>) -> io::Result<Self> {
        let sid = i32::try_from(child.id()).map_err(io::Error::other)?;
        let shared = Arc::new(Shared {
            id,
            sid,
            state: Mutex::new(State::default()),
            stopping: Notify::new(),
            records,
        });
        let watched = open_watch(&shared);
        let pidfd = match watched {
            Ok(pidfd) => pidfd,
            Err(e) => {
                shared.finish();
                return Err(e);
            }
        };
        let mut output = Vec::new();
        for (stream, fd) in [
            ("stdout", child.stdout.take().map(OwnedFd::from)),
            ("stderr", child.stderr.take().map(OwnedFd::from)),
        ] {
            if let Some(fd) = fd {
                output.push(tokio::spawn(read_output(id, stream, fd)));
            }
        }
        Ok(Self {
            shared,
            pidfd,
            output,
        })
    }

    /// Awaits the worker's end (see the [module documentation](self)).
    fn exit(
        self,
        grace: Duration,
        drain: Duration,
    ) -> impl std::future::Future<Output = Exit> + Send + 'static {
        // Made now, not at the first poll: a future dropped unpolled kills the worker too.
        let guard = KillOnDrop(Some(self.shared.clone()));
        self.run(guard, grace, drain)
    }

    async fn run(self, mut guard: KillOnDrop, grace: Duration, drain: Duration) -> Exit {
        let shared = &self.shared;
        // A stop arms the escalation once; the escalation fires once.
        let escalate = tokio::time::sleep(Duration::MAX);
        tokio::pin!(escalate);
        let (mut stop_seen, mut armed) = (false, false);
        loop {
            tokio::select! {
                ready = self.pidfd.readable() => {
                    if let Err(e) = ready {
                        tracing::error!(worker = %shared.id, "waiting on the worker's pidfd: {e}");
                    }
                    break;
                }
                () = shared.stopping.notified(), if !stop_seen => {
                    (stop_seen, armed) = (true, true);
                    escalate.as_mut().reset(tokio::time::Instant::now() + grace);
                }
                () = &mut escalate, if armed => {
                    armed = false;
                    tracing::warn!(worker = %shared.id, ?grace, "the worker did not stop within its grace: killing it");
                    Shared::signal(&shared.state(), shared.sid, libc::SIGKILL);
                }
            }
        }
        let finishing = shared.clone();
        let status = tokio::task::spawn_blocking(move || finishing.finish())
            .await
            .ok()
            .flatten();
        guard.0 = None; // finished: nothing for the guard to do
        for task in self.output {
            let abort = task.abort_handle();
            if tokio::time::timeout(drain, task).await.is_err() {
                abort.abort();
            }
        }
        let (killed, stopping) = {
            let state = shared.state();
            (state.killed, state.stopping)
        };
        let exit = exit_for(
            status.and_then(|s| s.code()).map(i64::from),
            killed,
            stopping,
        );
        let status = status.map_or_else(|| "unknown".to_owned(), |s| s.to_string());
        tracing::info!(worker = %shared.id, %status, exit = exit.as_str(), "worker process ended");
        exit
    }
}

/// Opens the pidfd of `shared`'s process and writes its record.
fn open_watch(shared: &Shared) -> io::Result<AsyncFd<OwnedFd>> {
    let sid = shared.sid;
    let pidfd = session::pidfd_open(sid)?
        .ok_or_else(|| io::Error::other("the child vanished before it was reaped"))?;
    if let Some(records) = &shared.records {
        let start = session::stat(sid)
            .ok_or_else(|| io::Error::other("no /proc entry for the child"))?
            .start;
        let boot = session::boot_id()?;
        records.write(&Record {
            worker: shared.id,
            sid,
            start,
            boot,
        })?;
    }
    readiness(pidfd)
}

/// A pidfd registered with the runtime, readable once its process has exited.
fn readiness(pidfd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is open for as long as it is owned, here by the `AsyncFd`, and its
    // `as_raw_fd` always returns that same descriptor.
    Ok(unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }?)
}

/// Kills and reaps the worker when its exit future is dropped before the end.
struct KillOnDrop(Option<Arc<Shared>>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(shared) = self.0.take() else { return };
        {
            let mut state = shared.state();
            state.killed = true;
            Shared::signal(&state, shared.sid, libc::SIGKILL);
        }
        // The rest blocks (reading /proc, reaping): off whatever thread dropped the future.
        let spawned = std::thread::Builder::new()
            .name("worker-reaper".into())
            .spawn(move || shared.finish());
        if let Err(e) = spawned {
            tracing::error!("no thread to reap a dropped worker: {e}");
        }
    }
}

/// Reads one output stream of worker `id` to its end, logging each line.
async fn read_output(id: WorkerId, stream: &'static str, fd: OwnedFd) {
    let mut lines = Lines::new(id, stream);
    let pipe = match pipe::Receiver::from_owned_fd(fd) {
        Ok(pipe) => pipe,
        Err(e) => {
            tracing::error!(worker = %id, stream, "cannot read the worker's output: {e}");
            return;
        }
    };
    let mut buf = vec![0; 8192];
    loop {
        if pipe.readable().await.is_err() {
            break;
        }
        match pipe.try_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => lines.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => break,
        }
    }
    lines.finish();
}

/// Controls one worker process.
struct ProcessControl(Arc<Shared>);

impl Control for ProcessControl {
    fn kill(&self) {
        let mut state = self.0.state();
        state.killed = true;
        Shared::signal(&state, self.0.sid, libc::SIGKILL);
    }

    fn stop(&self) {
        let mut state = self.0.state();
        if state.stopping || state.reaped {
            return;
        }
        state.stopping = true;
        Shared::signal(&state, self.0.sid, libc::SIGTERM);
        drop(state);
        self.0.stopping.notify_one();
    }
}
