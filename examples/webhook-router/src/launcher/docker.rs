//! The `docker` launcher (feature `docker`): one container per worker, through the Docker Engine
//! API ([bollard]) on the daemon `DOCKER_HOST` names (or the default socket).
//!
//! **Start.** A container of `--docker-image` (its entrypoint, normally the `webhook-worker`,
//! given this launcher's arguments), named `wr-<registry>-<worker id>` (so that the daemon itself
//! refuses a second container for one worker), on `--network host` (the default: it reaches the
//! router's worker protocol on loopback, and nothing a bridge would add) or `none`, with exactly
//! [`Launch::env`] added to the image's environment, the optional memory and CPU limits and
//! volumes ([`DockerLauncherBuilder::volumes`], `--docker-volume`), an init
//! process (`docker-init`) that reaps what the worker's command leaves, and three labels:
//! [`LABEL_REGISTRY`], [`LABEL_REPLICA`] and [`LABEL_WORKER`]. Its output is followed and logged
//! line by line, tagged with the worker id ([`super::output`]).
//!
//! **End.** The launcher waits for the container to stop, maps its status as the `process`
//! launcher does ([`exit_for`]: after a stop, [`Exit::Stopped`] with no jobs, since the router's
//! worker-protocol server holds the mailbox: [`Launcher::speaks_protocol`]),
//! then removes the container. [`Control::kill`] kills it (`SIGKILL`), [`Control::stop`] stops it
//! (`SIGTERM`, `SIGKILL` after the stop grace, counted by the daemon). Dropping
//! [`Launched::exit`] force-removes the container. A daemon that stops answering ends the wait as
//! [`Exit::Crashed`], the container's removal attempted; what cannot be removed then is found by
//! the next start's [`Launcher::leftovers`]: the containers with this registry's and this
//! replica's labels.

use super::external::exit_for;
use super::output::Lines;
use super::{BoxFuture, Control, Exit, Launch, LaunchError, Launched, Launcher, Leftover};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
    WaitContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::sync::OnceCell;
use worker_registry::WorkerId;

/// The label naming the registry a container's worker belongs to.
pub const LABEL_REGISTRY: &str = "io.worker-registry.registry";
/// The label naming the router replica that launched the container.
pub const LABEL_REPLICA: &str = "io.worker-registry.replica";
/// The label holding the container's worker id.
pub const LABEL_WORKER: &str = "io.worker-registry.worker";

/// How long a stopped container has between `SIGTERM` and `SIGKILL`.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);

/// How long, after a container stopped, its output is still read before it is removed.
pub const DEFAULT_OUTPUT_DRAIN: Duration = Duration::from_secs(1);

/// Whether containers get an init process (`docker-init`) by default.
pub const DEFAULT_INIT: bool = true;

/// A container's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Network {
    /// The host's network (`--network host`): the router's loopback listener is reachable.
    #[default]
    Host,
    /// No network but a loopback of the container's own (`--network none`).
    None,
}

impl Network {
    fn mode(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::None => "none",
        }
    }
}

/// Configures a [`DockerLauncher`].
pub struct DockerLauncherBuilder {
    image: String,
    registry: String,
    replica: String,
    args: Vec<String>,
    entrypoint: Option<Vec<String>>,
    network: Network,
    memory: Option<i64>,
    cpus: Option<f64>,
    volumes: Vec<String>,
    init: bool,
    stop_grace: Duration,
    output_drain: Duration,
}

impl DockerLauncherBuilder {
    /// The arguments given to the image's entrypoint (for the worker image: `--event-command
    /// CMD`); none by default.
    pub fn args(mut self, args: Vec<String>) -> Self {
        self.args = args;
        self
    }

    /// Replaces the image's entrypoint (default: the image's own).
    pub fn entrypoint(mut self, entrypoint: Vec<String>) -> Self {
        self.entrypoint = Some(entrypoint);
        self
    }

    /// The containers' network (default [`Network::Host`]).
    pub fn network(mut self, network: Network) -> Self {
        self.network = network;
        self
    }

    /// A memory limit per container, in bytes (`--docker-memory`; default none).
    pub fn memory(mut self, bytes: i64) -> Self {
        self.memory = Some(bytes);
        self
    }

    /// A CPU limit per container, in CPUs (`--docker-cpus`; default none).
    pub fn cpus(mut self, cpus: f64) -> Self {
        self.cpus = Some(cpus);
        self
    }

    /// Volumes mounted into every container, each in `docker run -v` form:
    /// `SOURCE:TARGET[:OPTIONS]`, `SOURCE` a host path (a bind mount) or a named volume, `TARGET`
    /// an absolute path in the container, `OPTIONS` for example `ro` (default none). For a
    /// workspace or a cache the event command shares with the host; the image's user (`nobody`
    /// for the worker image) must be allowed to use it. Checked by `build`: a source and an
    /// absolute target.
    pub fn volumes(mut self, volumes: Vec<String>) -> Self {
        self.volumes = volumes;
        self
    }

    /// Whether containers get an init process (default [`DEFAULT_INIT`]).
    pub fn init(mut self, init: bool) -> Self {
        self.init = init;
        self
    }

    /// The time between `SIGTERM` and `SIGKILL` of a stopped container (default
    /// [`DEFAULT_STOP_GRACE`]; the daemon counts it in whole seconds, rounded up).
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// How long output is read after a container stopped (default [`DEFAULT_OUTPUT_DRAIN`]).
    pub fn output_drain(mut self, drain: Duration) -> Self {
        self.output_drain = drain;
        self
    }

    /// Checks the limits and makes a client of the daemon `DOCKER_HOST` names (or the default
    /// socket). Nothing is asked of the daemon yet: the first call (normally
    /// [`Launcher::leftovers`], at start) agrees on an API version with it, and fails
    /// ([`LaunchError::Unavailable`]) if it does not answer.
    pub fn build(self) -> Result<DockerLauncher, LaunchError> {
        let docker =
            Docker::connect_with_local_defaults().map_err(|e| LaunchError::Unavailable {
                reason: format!("the Docker daemon: {e}"),
            })?;
        self.checked(docker)
    }

    /// As [`build`](Self::build), on a client of the caller's (its API version agreed again with
    /// the daemon at the first call).
    pub fn build_on(self, docker: Docker) -> Result<DockerLauncher, LaunchError> {
        self.checked(docker)
    }

    fn checked(self, raw: Docker) -> Result<DockerLauncher, LaunchError> {
        let unavailable = |reason: String| LaunchError::Unavailable { reason };
        let nano_cpus = match self.cpus {
            None => None,
            Some(c) if c.is_finite() && c > 0.0 && c <= 1024.0 => Some((c * 1e9) as i64),
            Some(c) => return Err(unavailable(format!("--docker-cpus {c}: not a CPU count"))),
        };
        if let Some(m) = self.memory.filter(|&m| m < 6 * 1024 * 1024) {
            return Err(unavailable(format!(
                "--docker-memory {m}: below the daemon's minimum of 6 MiB"
            )));
        }
        if self.image.is_empty() {
            return Err(unavailable("no --docker-image".into()));
        }
        if let Some(v) = self.volumes.iter().find(|v| !volume_is_valid(v)) {
            return Err(unavailable(format!(
                "volume {v:?}: not SOURCE:TARGET[:OPTIONS] with an absolute TARGET"
            )));
        }
        Ok(DockerLauncher {
            raw,
            agreed: OnceCell::new(),
            name_prefix: format!("wr-{}-", container_name_part(&self.registry)),
            config: Arc::new(self),
            nano_cpus,
        })
    }
}

/// Whether `volume` is `SOURCE:TARGET[:OPTIONS]` with a source and an absolute target.
fn volume_is_valid(volume: &str) -> bool {
    let mut parts = volume.split(':');
    let (source, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    !source.is_empty() && target.starts_with('/') && parts.count() <= 1
}

/// `text` with every character a container name may not hold replaced by `_`.
fn container_name_part(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '.' | '-' => c,
            _ => '_',
        })
        .collect()
}

/// The `docker` launcher (see the [module documentation](self)).
pub struct DockerLauncher {
    /// The client as made, at the crate's API version.
    raw: Docker,
    /// The client at the version agreed with the daemon, from the first call on.
    agreed: OnceCell<Docker>,
    config: Arc<DockerLauncherBuilder>,
    name_prefix: String,
    nano_cpus: Option<i64>,
}

impl DockerLauncher {
    /// Containers of `image` for the workers of registry `registry` launched by router replica
    /// `replica` (the two label values).
    pub fn builder(
        image: impl Into<String>,
        registry: impl Into<String>,
        replica: impl Into<String>,
    ) -> DockerLauncherBuilder {
        DockerLauncherBuilder {
            image: image.into(),
            registry: registry.into(),
            replica: replica.into(),
            args: Vec::new(),
            entrypoint: None,
            network: Network::default(),
            memory: None,
            cpus: None,
            volumes: Vec::new(),
            init: DEFAULT_INIT,
            stop_grace: DEFAULT_STOP_GRACE,
            output_drain: DEFAULT_OUTPUT_DRAIN,
        }
    }

    /// The client, at the API version agreed with the daemon (negotiated by the first call).
    async fn docker(&self) -> Result<&Docker, DockerError> {
        self.agreed
            .get_or_try_init(|| self.raw.clone().negotiate_version())
            .await
    }

    /// The container's configuration for worker `id`.
    fn body(&self, id: WorkerId, env: &[(String, String)]) -> ContainerCreateBody {
        let c = &self.config;
        let labels = HashMap::from([
            (LABEL_REGISTRY.to_owned(), c.registry.clone()),
            (LABEL_REPLICA.to_owned(), c.replica.clone()),
            (LABEL_WORKER.to_owned(), id.to_string()),
        ]);
        ContainerCreateBody {
            image: Some(c.image.clone()),
            cmd: Some(c.args.clone()),
            entrypoint: c.entrypoint.clone(),
            env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                network_mode: Some(c.network.mode().to_owned()),
                memory: c.memory,
                nano_cpus: self.nano_cpus,
                binds: (!c.volumes.is_empty()).then(|| c.volumes.clone()),
                init: Some(c.init),
                ..HostConfig::default()
            }),
            ..ContainerCreateBody::default()
        }
    }

    async fn start(&self, spec: Launch) -> Result<Launched, LaunchError> {
        // `jobs` is closed and empty: the router serves the mailbox (`speaks_protocol`).
        let Launch { id, env, .. } = spec;
        let refused = |e: DockerError| LaunchError::Refused {
            worker: id,
            reason: e.to_string(),
        };
        let name = format!("{}{id}", self.name_prefix);
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        let docker = self.docker().await.map_err(refused)?;
        let created = docker
            .create_container(Some(options), self.body(id, &env))
            .await
            .map_err(refused)?;
        let container = created.id;
        if let Err(e) = docker.start_container(&container, None).await {
            remove(docker, &container).await;
            return Err(refused(e));
        }
        tracing::info!(worker = %id, container = %container, %name, image = %self.config.image, "worker container started");
        let handle = Handle::current();
        let (state, _) = watch::channel(Ending::Running);
        let shared = Arc::new(Shared {
            docker: docker.clone(),
            id,
            container,
            handle,
            state,
            grace: self.config.stop_grace,
        });
        let output = tokio::spawn(follow_output(shared.clone()));
        let guard = RemoveOnDrop(Some(shared.clone()));
        let exit = run(shared.clone(), guard, output, self.config.output_drain);
        Ok(Launched {
            exit: Box::pin(exit),
            control: Box::new(DockerControl(shared)),
        })
    }

    async fn labelled(&self) -> Result<Vec<Leftover>, LaunchError> {
        let c = &self.config;
        let filters = HashMap::from([(
            "label",
            vec![
                format!("{LABEL_REGISTRY}={}", c.registry),
                format!("{LABEL_REPLICA}={}", c.replica),
            ],
        )]);
        let options = ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&filters)
            .build();
        let unavailable = |e: DockerError| LaunchError::Unavailable {
            reason: format!("listing the containers: {e}"),
        };
        let docker = self.docker().await.map_err(unavailable)?;
        let containers = docker
            .list_containers(Some(options))
            .await
            .map_err(unavailable)?;
        let mut found = Vec::new();
        for container in containers {
            let id = container.id.unwrap_or_default();
            let worker = container
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_WORKER))
                .and_then(|w| w.parse().ok());
            match worker {
                Some(worker) => found.push(Leftover { worker, handle: id }),
                None => {
                    tracing::error!(container = %id, "a container with this replica's labels names no worker: left alone")
                }
            }
        }
        found.sort_by_key(|l| l.worker);
        Ok(found)
    }
}

impl Launcher for DockerLauncher {
    fn kind(&self) -> &'static str {
        "docker"
    }

    /// Its workers speak the protocol: the router serves their mailboxes.
    fn speaks_protocol(&self) -> bool {
        true
    }

    fn launch(&self, spec: Launch) -> BoxFuture<'_, Result<Launched, LaunchError>> {
        Box::pin(self.start(spec))
    }

    /// Every container, running or not, labelled with this registry and this replica.
    fn leftovers(&self) -> BoxFuture<'_, Result<Vec<Leftover>, LaunchError>> {
        Box::pin(self.labelled())
    }

    /// Stops the container (`SIGTERM`, `SIGKILL` after the stop grace) and removes it.
    fn remove(&self, leftover: Leftover) -> BoxFuture<'_, Result<(), LaunchError>> {
        Box::pin(async move {
            let refused = |e: DockerError| LaunchError::Refused {
                worker: leftover.worker,
                reason: format!("removing container {}: {e}", leftover.handle),
            };
            let stop = StopContainerOptionsBuilder::new()
                .t(grace_seconds(self.config.stop_grace))
                .build();
            let docker = self.docker().await.map_err(refused)?;
            match docker.stop_container(&leftover.handle, Some(stop)).await {
                Ok(()) => {}
                Err(e) if is_gone(&e) || is_not_modified(&e) => {}
                Err(e) => return Err(refused(e)),
            }
            let force = RemoveContainerOptionsBuilder::new().force(true).build();
            match docker.remove_container(&leftover.handle, Some(force)).await {
                Err(e) if !is_gone(&e) => Err(refused(e)),
                _ => Ok(()),
            }
        })
    }
}

/// How a container is being ended by the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Running,
    Killed,
    Stopping,
}

/// What a container's exit, control and output share.
struct Shared {
    docker: Docker,
    id: WorkerId,
    container: String,
    /// Where the control's calls run (its methods return at once).
    handle: Handle,
    state: watch::Sender<Ending>,
    grace: Duration,
}

/// Awaits the container's end (see the [module documentation](self)) and removes it.
async fn run(
    shared: Arc<Shared>,
    mut guard: RemoveOnDrop,
    output: tokio::task::JoinHandle<()>,
    drain: Duration,
) -> Exit {
    let options = WaitContainerOptionsBuilder::new()
        .condition("not-running")
        .build();
    let mut wait = shared
        .docker
        .wait_container(&shared.container, Some(options));
    let status = match wait.next().await {
        Some(Ok(r)) => Some(r.status_code),
        Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Some(code),
        Some(Err(e)) => {
            tracing::error!(worker = %shared.id, container = %shared.container, "waiting for the container: {e}");
            None
        }
        None => None,
    };
    let abort = output.abort_handle();
    if tokio::time::timeout(drain, output).await.is_err() {
        abort.abort();
    }
    remove(&shared.docker, &shared.container).await;
    guard.0 = None; // removed (or tried): nothing for the guard to do
    let ending = *shared.state.borrow();
    let exit = exit_for(status, ending == Ending::Killed, ending == Ending::Stopping);
    tracing::info!(worker = %shared.id, container = %shared.container, status = ?status, exit = exit.as_str(), "worker container ended");
    exit
}

/// Force-removes `container`, logging a failure (a container already gone is not one).
async fn remove(docker: &Docker, container: &str) {
    let force = RemoveContainerOptionsBuilder::new().force(true).build();
    match docker.remove_container(container, Some(force)).await {
        Err(e) if !is_gone(&e) => {
            tracing::error!(%container, "could not remove the container (the next start's leftovers will): {e}")
        }
        _ => {}
    }
}

fn is_gone(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    ) || matches!(e, DockerError::DockerResponseServerError { status_code: 409, message } if message.contains("already in progress"))
}

fn is_not_modified(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 304,
            ..
        }
    )
}

/// `grace` in whole seconds, rounded up, as the daemon takes it.
fn grace_seconds(grace: Duration) -> i32 {
    let secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// Follows the container's output to its end, logging each line.
async fn follow_output(shared: Arc<Shared>) {
    let options = LogsOptionsBuilder::new()
        .follow(true)
        .stdout(true)
        .stderr(true)
        .build();
    let mut logs = shared.docker.logs(&shared.container, Some(options));
    let mut stdout = Lines::new(shared.id, "stdout");
    let mut stderr = Lines::new(shared.id, "stderr");
    while let Some(chunk) = logs.next().await {
        match chunk {
            Ok(bollard::container::LogOutput::StdErr { message }) => stderr.push(&message),
            Ok(bollard::container::LogOutput::StdOut { message })
            | Ok(bollard::container::LogOutput::Console { message }) => stdout.push(&message),
            Ok(bollard::container::LogOutput::StdIn { .. }) => {}
            Err(e) => {
                tracing::debug!(worker = %shared.id, "the container's output ended: {e}");
                break;
            }
        }
    }
}

/// Force-removes the container when its exit future is dropped before the end.
struct RemoveOnDrop(Option<Arc<Shared>>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let Some(shared) = self.0.take() else { return };
        shared.state.send_replace(Ending::Killed);
        let handle = shared.handle.clone();
        handle.spawn(async move { remove(&shared.docker, &shared.container).await });
    }
}

/// Controls one container.
struct DockerControl(Arc<Shared>);

impl Control for DockerControl {
    fn kill(&self) {
        let shared = self.0.clone();
        shared.state.send_replace(Ending::Killed);
        self.0.handle.spawn(async move {
            let options = KillContainerOptionsBuilder::new().signal("SIGKILL").build();
            match shared.docker.kill_container(&shared.container, Some(options)).await {
                Err(e) if !is_gone(&e) && !is_not_running(&e) => {
                    tracing::warn!(worker = %shared.id, container = %shared.container, "could not kill the container: {e}")
                }
                _ => {}
            }
        });
    }

    fn stop(&self) {
        let shared = self.0.clone();
        let first = shared.state.send_if_modified(|s| {
            let running = *s == Ending::Running;
            if running {
                *s = Ending::Stopping;
            }
            running
        });
        if !first {
            return;
        }
        self.0.handle.spawn(async move {
            let options = StopContainerOptionsBuilder::new()
                .t(grace_seconds(shared.grace))
                .build();
            match shared.docker.stop_container(&shared.container, Some(options)).await {
                Err(e) if !is_gone(&e) && !is_not_modified(&e) => {
                    tracing::warn!(worker = %shared.id, container = %shared.container, "could not stop the container: {e}")
                }
                _ => {}
            }
        });
    }
}

fn is_not_running(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 409,
            ..
        }
    )
}
