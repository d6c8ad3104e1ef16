//! Launchers: what starts, stops and watches one worker per pull request, behind one trait
//! ([`Launcher`]), chosen by `--launcher`.
//!
//! * [`task`]: the simulated worker ([`crate::worker`]), a tokio task of this process that calls
//!   the registry directly.
//! * [`process`] (Linux): a command per worker in a session of its own, speaking the worker
//!   protocol over HTTP.
//! * `docker` (feature `docker`, on by default): a container per worker through the Docker Engine
//!   API.
//! * [`output`]: a worker's output lines in the router's log, tagged with its id; [`external`]:
//!   the exit statuses both out-of-process launchers map alike.
//!
//! The router ([`crate::lifecycle`]) wins a worker's start claim, then asks its launcher for the
//! worker ([`Launcher::launch`]), keeps the returned [`Control`] by worker id (crash on request,
//! stop at the shutdown deadline) and awaits the exit ([`Launched::exit`]), which it maps to a
//! metric and its bookkeeping. At start it settles what a previous incarnation left running
//! ([`Launcher::leftovers`], [`Launcher::remove`]; not wired yet: the `task` launcher leaves
//! nothing). The contract every launcher keeps (what each call promises, who
//! deregisters, why a worker the router ends has stopped acting before its pull request is handed
//! on) is written once, in [`crate::docs::worker_protocol`].

#[cfg(feature = "docker")]
pub mod docker;
pub mod external;
pub mod output;
#[cfg(target_os = "linux")]
pub mod process;
pub mod task;

use crate::mailbox::{Job, Mailbox};

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use worker_registry::WorkerId;

/// A boxed, sendable future (the trait is used as `dyn Launcher`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The environment variable naming the worker's id.
pub const ENV_WORKER_ID: &str = "WORKER_ID";

/// Starts workers (see the [module documentation](self)). One launcher serves every worker of a
/// router replica; it is shared by reference and called concurrently.
pub trait Launcher: Send + Sync + 'static {
    /// The launcher's name, as `--launcher` spells it (`task`, `process`, `docker`), for logs and
    /// metrics.
    fn kind(&self) -> &'static str;

    /// Whether its workers run outside this process and speak the worker protocol
    /// ([`crate::docs::worker_protocol`]): then the router serves the worker's mailbox on
    /// `/worker/v1/next` itself, hands the launcher a closed, empty [`Launch::jobs`], and puts
    /// the worker's credential, fencing token and the router's URL in [`Launch::env`]. `false`
    /// (the default, and `task`): the launcher gets the mailbox and the environment naming the
    /// worker only.
    fn speaks_protocol(&self) -> bool {
        false
    }

    /// Starts the worker `spec` describes. Called once per worker id, by the replica that won the
    /// worker's start claim, after the registry has admitted a delivery for it and before the
    /// worker has heartbeated.
    ///
    /// `Ok` means the worker was started (it may die a moment later: that is its exit, reported by
    /// [`Launched::exit`]). `Err` means nothing runs for this id: the router logs it and the worker,
    /// never heartbeating, is declared dead by the sweep after its start-up grace, which releases
    /// its events for re-dispatch; nothing accepted is lost. A launcher does not retry a start on
    /// its own (a retry after an ambiguous failure could start a second worker for the id).
    fn launch(&self, spec: Launch) -> BoxFuture<'_, Result<Launched, LaunchError>>;

    /// What the launcher's platform runs for this router replica without a [`Launched`] in this
    /// process: the processes or containers a previous incarnation of the replica started (it was
    /// killed, or restarted). Called once at start, before the router serves; the router then
    /// settles each against the registry and [`remove`](Self::remove)s it: a worker the registry
    /// counts dead or does not know is removed; a live one is removed too (this incarnation holds
    /// neither its mailbox nor its control, and it may have been given another router URL), and
    /// then deregistered, which releases its events for re-dispatch (kill before deregister). So
    /// nothing is left running unaccounted.
    ///
    /// A launcher lists only what it started for this replica (a process launcher by its records
    /// or the process tree, a container launcher by labels naming the registry and the replica),
    /// never another live replica's workers. One whose workers cannot outlive the router (`task`)
    /// lists nothing.
    fn leftovers(&self) -> BoxFuture<'_, Result<Vec<Leftover>, LaunchError>>;

    /// Stops a [`leftovers`](Self::leftovers) entry (gracefully, then forced) and removes what is
    /// left of it (a container), returning once it is gone. Removing one already gone is not an
    /// error.
    fn remove(&self, leftover: Leftover) -> BoxFuture<'_, Result<(), LaunchError>>;
}

/// A worker a previous incarnation of this replica started, found running at start
/// ([`Launcher::leftovers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// The worker it runs for.
    pub worker: WorkerId,
    /// The platform's handle on it (a process group id, a container id), for logs and for
    /// [`Launcher::remove`].
    pub handle: String,
}

/// What a launcher is given to start one worker.
pub struct Launch {
    /// The worker's id in the registry.
    pub id: WorkerId,
    /// The worker's events, in arrival order (its mailbox, then the overflow behind it), with
    /// whatever was queued before the start. An in-process launcher hands it to its worker; an
    /// out-of-process one hands it to the router's worker protocol, whose "next event" call serves
    /// it to the worker. Closed by the router at shutdown (drain: finish what is queued).
    pub jobs: Mailbox,
    /// The environment the worker is started with, exactly: its identity (and, with the worker
    /// protocol, its credential and the router's URL). Never the admin token or the webhook
    /// secret. An in-process launcher has no use for it.
    pub env: Vec<(String, String)>,
}

impl Launch {
    /// A start of worker `id` with its events `jobs`, and the environment naming it.
    pub fn new(id: WorkerId, jobs: Mailbox) -> Self {
        Self {
            id,
            jobs,
            env: vec![(ENV_WORKER_ID.to_owned(), id.to_string())],
        }
    }
}

impl fmt::Debug for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("id", &self.id)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// A started worker.
pub struct Launched {
    /// Resolves once the worker has ended, with how ([`Exit`]). Dropping it before then ends the
    /// worker at once, with no goodbye to the registry, as the death of its router would (what a
    /// killed replica's workers see: [`Shutdown::kill`](crate::shutdown::Shutdown::kill)); a launcher whose
    /// workers outlive a dropped future (a process, a container) kills them on drop, the
    /// self-fencing lease being the backstop if the router itself is killed.
    pub exit: BoxFuture<'static, Exit>,
    /// Controls the running worker.
    pub control: Box<dyn Control>,
}

/// Controls one running worker. Every call returns at once (the effect is seen in
/// [`Launched::exit`]); calling one after the worker has ended does nothing.
pub trait Control: Send + Sync {
    /// Kills the worker with no goodbye (`SIGKILL` of a process group; a simulated crash): it
    /// stops heartbeating and working at once, tells the registry nothing, and its events are
    /// released when the sweep declares it dead. Its exit is [`Exit::Crashed`].
    fn kill(&self);

    /// The shutdown deadline passed: the worker stops now and does not finish what it holds. The
    /// worker is deregistered (which releases its claims) only once it has stopped acting: the
    /// simulated worker deregisters itself as its last act; an out-of-process worker is stopped
    /// (gracefully, then forced) and the router deregisters it after its exit. Its exit is
    /// [`Exit::Stopped`] with the events it was handed and did not complete.
    fn stop(&self);
}

/// How a worker ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It finished after a drain (or its idle time) and the registry recorded a clean exit.
    Exited,
    /// The registry refused it (declared dead while it was silent or slow): it stopped at once.
    Fenced,
    /// It was killed with no goodbye ([`Control::kill`], or it crashed by itself).
    Crashed,
    /// It was stopped at the shutdown deadline ([`Control::stop`]) and deregistered (releasing its
    /// claims through the registry); these events, handed to it, were not completed.
    Stopped(Vec<Job>),
}

impl Exit {
    /// The label of the `webhook_router_worker_exits_total` metric.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Exited => "exited",
            Self::Fenced => "fenced",
            Self::Crashed => "crashed",
            Self::Stopped(_) => "stopped",
        }
    }

    /// Every label value of [`as_str`](Self::as_str).
    pub const ALL: [&'static str; 4] = ["exited", "fenced", "crashed", "stopped"];
}

/// A worker could not be started.
#[derive(Debug)]
#[non_exhaustive]
pub enum LaunchError {
    /// The launcher's platform refused or failed a call about one worker (a command not found,
    /// a daemon that did not answer); for a start: nothing runs for the worker.
    Refused {
        /// The worker.
        worker: WorkerId,
        /// What the platform said.
        reason: String,
    },
    /// The launcher's platform could not be asked ([`Launcher::leftovers`]: the daemon is not
    /// there, the records cannot be read).
    Unavailable {
        /// What the platform said.
        reason: String,
    },
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused { worker, reason } => {
                write!(f, "the launcher refused worker {worker}: {reason}")
            }
            Self::Unavailable { reason } => {
                write!(f, "the launcher's platform is unavailable: {reason}")
            }
        }
    }
}

impl std::error::Error for LaunchError {}
