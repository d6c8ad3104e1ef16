//! The flags that choose and configure the router's launcher and its worker protocol
//! (`--launcher`, `--event-command`, `--worker-command`, `--docker-image`, `--worker-bind`,
//! `--worker-key-file`, `--kill-margin`, `--timer-slack`, `--launcher-state-dir`), validated
//! into [`LaunchSettings`], and the launcher they build ([`LaunchSettings::launcher`]).

use crate::credential::{self, WorkerKey};
use crate::launcher::Launcher;
use crate::protocol::ProtocolSettings;
use crate::reload::{Rotation, Watched};

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use worker_registry::config::MAX_DURATION;

/// The ready-made worker's binary name, looked for next to the router's own executable.
pub const WORKER_BINARY: &str = "webhook-worker";

/// Which launcher starts the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LauncherKind {
    /// A tokio task of the router per worker, calling the registry directly (no process).
    Task,
    /// A `webhook-worker` process per worker, speaking the worker protocol.
    Process,
    /// A `webhook-worker` container per worker (Docker Engine API).
    Docker,
}

/// The launcher flags (flattened into [`crate::cli::Args`]).
#[derive(Args, Debug, Clone)]
pub struct LaunchArgs {
    /// What starts a pull request's worker: `process` (a `webhook-worker` per PR, running
    /// --event-command per event), `docker` (the same in a container of --docker-image), or
    /// `task` (a simulated worker, a tokio task) [default: process with --event-command, else
    /// task].
    #[arg(long, env = "WEBHOOK_ROUTER_LAUNCHER")]
    pub launcher: Option<LauncherKind>,
    /// The command each worker runs per event, through `sh -c`, with the event's body on stdin
    /// (see webhook-worker's README).
    #[arg(long, env = "WEBHOOK_ROUTER_EVENT_COMMAND")]
    pub event_command: Option<String>,
    /// The worker program the process launcher starts [default: webhook-worker next to this
    /// executable].
    #[arg(long, env = "WEBHOOK_ROUTER_WORKER_COMMAND")]
    pub worker_command: Option<PathBuf>,
    /// The image the docker launcher runs (with webhook-worker as its entrypoint).
    #[arg(long, env = "WEBHOOK_ROUTER_DOCKER_IMAGE")]
    pub docker_image: Option<String>,
    /// A volume mounted into every worker container, `SOURCE:TARGET[:OPTIONS]` as `docker run -v`
    /// takes it (a host path or a named volume; e.g. a workspace); repeatable.
    #[arg(long = "docker-volume", value_name = "SOURCE:TARGET[:OPTIONS]")]
    pub docker_volumes: Vec<String>,
    /// A memory limit per worker container, in bytes (docker launcher) [default: none].
    #[arg(long, env = "WEBHOOK_ROUTER_DOCKER_MEMORY")]
    pub docker_memory: Option<i64>,
    /// A CPU limit per worker container, in CPUs, e.g. `0.5` (docker launcher) [default: none].
    #[arg(long, env = "WEBHOOK_ROUTER_DOCKER_CPUS")]
    pub docker_cpus: Option<f64>,
    /// Where the worker protocol (/worker/v1) listens: its own address, never the webhook's or
    /// the admin's [default: 127.0.0.1:0, an ephemeral loopback port].
    #[arg(long, env = "WEBHOOK_ROUTER_WORKER_BIND")]
    pub worker_bind: Option<SocketAddr>,
    /// A file holding the key (at least 32 bytes) that signs worker credentials, shared by every
    /// replica [default: a random key per process, right for one replica only].
    #[arg(long, env = "WEBHOOK_ROUTER_WORKER_KEY_FILE")]
    pub worker_key_file: Option<PathBuf>,
    /// K in the lease: how long a worker may take to kill its command and see it gone
    /// (e.g. `1s`).
    #[arg(long, env = "WEBHOOK_ROUTER_KILL_MARGIN", default_value = "1s", value_parser = humantime::parse_duration)]
    pub kill_margin: Duration,
    /// S in the lease: how late a loaded worker's timer may fire (e.g. `1s`).
    #[arg(long, env = "WEBHOOK_ROUTER_TIMER_SLACK", default_value = "1s", value_parser = humantime::parse_duration)]
    pub timer_slack: Duration,
    /// A directory of this replica's own where the process launcher records its workers, so that
    /// the next start finds and removes what a killed router left running.
    #[arg(long, env = "WEBHOOK_ROUTER_LAUNCHER_STATE_DIR")]
    pub launcher_state_dir: Option<PathBuf>,
}

/// The launcher flags, validated.
#[derive(Debug, Clone)]
pub struct LaunchSettings {
    /// Which launcher.
    pub kind: LauncherKind,
    /// The worker program and its arguments (process launcher).
    pub worker_argv: Vec<String>,
    /// The image (docker launcher).
    pub docker_image: Option<String>,
    /// The volumes mounted into every container (docker launcher).
    pub docker_volumes: Vec<String>,
    /// The memory limit per container, in bytes (docker launcher).
    pub docker_memory: Option<i64>,
    /// The CPU limit per container (docker launcher).
    pub docker_cpus: Option<f64>,
    /// Where the worker protocol listens.
    pub worker_bind: SocketAddr,
    /// The protocol's key and margins.
    pub protocol: ProtocolSettings,
    /// The process launcher's state directory.
    pub state_dir: Option<PathBuf>,
}

impl LaunchArgs {
    /// Validates the flags; `simulate`: for `--simulate`, whose default is real processes and
    /// whose event command is its own.
    pub fn settings(&self, simulate: bool) -> Result<LaunchSettings, String> {
        let kind = self.kind(simulate);
        if simulate && kind == LauncherKind::Docker {
            return Err("--simulate runs --launcher process or task".into());
        }
        if self.kill_margin > MAX_DURATION || self.timer_slack > MAX_DURATION {
            return Err("--kill-margin and --timer-slack are at most a year".into());
        }
        let key = match &self.worker_key_file {
            Some(path) => Some(
                WorkerKey::from_file(path)
                    .map_err(|e| format!("--worker-key-file {}: {e}", path.display()))?,
            ),
            None => None,
        };
        let worker_argv = match kind {
            LauncherKind::Task => Vec::new(),
            LauncherKind::Process if simulate => vec![self.worker_program()?],
            LauncherKind::Docker => match &self.event_command {
                // The image's entrypoint is the worker; the program named here is not run.
                Some(cmd) => vec![
                    WORKER_BINARY.to_owned(),
                    "--event-command".to_owned(),
                    cmd.clone(),
                ],
                None => return Err("--launcher docker needs --event-command".into()),
            },
            LauncherKind::Process => {
                let Some(cmd) = &self.event_command else {
                    return Err(format!(
                        "--launcher {} needs --event-command: what each worker runs per event",
                        kind.as_str()
                    ));
                };
                vec![
                    self.worker_program()?,
                    "--event-command".to_owned(),
                    cmd.clone(),
                ]
            }
        };
        if kind == LauncherKind::Docker && self.docker_image.is_none() {
            return Err("--launcher docker needs --docker-image".into());
        }
        if kind != LauncherKind::Docker
            && (!self.docker_volumes.is_empty()
                || self.docker_memory.is_some()
                || self.docker_cpus.is_some())
        {
            return Err(
                "--docker-volume, --docker-memory and --docker-cpus are for --launcher docker"
                    .into(),
            );
        }
        Ok(LaunchSettings {
            kind,
            worker_argv,
            docker_image: self.docker_image.clone(),
            docker_volumes: self.docker_volumes.clone(),
            docker_memory: self.docker_memory,
            docker_cpus: self.docker_cpus,
            worker_bind: self
                .worker_bind
                .unwrap_or(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
            protocol: ProtocolSettings {
                key,
                kill_margin: self.kill_margin,
                timer_slack: self.timer_slack,
            },
            state_dir: self.launcher_state_dir.clone(),
        })
    }
}

impl LaunchArgs {
    /// The launcher the flags choose (see `--launcher`).
    pub fn kind(&self, simulate: bool) -> LauncherKind {
        self.launcher
            .unwrap_or(if simulate || self.event_command.is_some() {
                LauncherKind::Process
            } else {
                LauncherKind::Task
            })
    }

    /// `--worker-command`, or `webhook-worker` next to this executable.
    fn worker_program(&self) -> Result<String, String> {
        let program = match &self.worker_command {
            Some(p) => p.clone(),
            None => default_worker_command()?,
        };
        Ok(program.to_string_lossy().into_owned())
    }
}

impl LauncherKind {
    /// As `--launcher` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Task => "task",
            Self::Process => "process",
            Self::Docker => "docker",
        }
    }
}

/// `webhook-worker` next to this executable; when this router was started by `cargo run` (which
/// builds only the router) and the worker is not built yet, built first, with the same profile.
fn default_worker_command() -> Result<PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this executable to find {WORKER_BINARY}: {e}"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no directory", exe.display()))?;
    // Test binaries live in target/<profile>/deps; the worker in target/<profile>.
    let candidates = [dir.join(WORKER_BINARY), dir.join("..").join(WORKER_BINARY)];
    let found = || candidates.iter().find(|p| p.is_file()).cloned();
    if found().is_none() {
        build_under_cargo_run(dir)?;
    }
    found().ok_or_else(|| {
        format!(
            "{WORKER_BINARY} is not next to {} (build it: cargo build -p webhook-worker), or \
                 name it with --worker-command",
            exe.display()
        )
    })
}

/// Under `cargo run` (cargo sets `CARGO` and `CARGO_MANIFEST_DIR` for the program it runs), builds
/// `webhook-worker` into this executable's directory `dir` (`target/<profile>`), so that the
/// README's `cargo run --release --bin webhook-router -- --simulate` works on a fresh clone.
/// Otherwise does nothing: an installed router never runs cargo.
fn build_under_cargo_run(dir: &std::path::Path) -> Result<(), String> {
    let (Some(cargo), Some(manifest_dir)) = (
        std::env::var_os("CARGO"),
        std::env::var_os("CARGO_MANIFEST_DIR"),
    ) else {
        return Ok(());
    };
    // A test binary runs from target/<profile>/deps: its profile is the parent's name.
    let profile_dir = if dir.ends_with("deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    let profile = profile_dir
        .file_name()
        .and_then(|p| p.to_str())
        .unwrap_or("debug");
    let mut build = std::process::Command::new(cargo);
    build
        .current_dir(manifest_dir)
        .args(["build", "--quiet", "-p", "webhook-worker"]);
    match profile {
        "debug" => {}
        "release" => {
            build.arg("--release");
        }
        other => {
            build.args(["--profile", other]);
        }
    }
    eprintln!(
        "webhook-router: building {WORKER_BINARY} ({profile}): cargo run builds only the router"
    );
    let status = build
        .status()
        .map_err(|e| format!("cannot run cargo to build {WORKER_BINARY}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo build -p webhook-worker failed ({status})"))
    }
}

impl LaunchSettings {
    /// The worker key's file, to read again on SIGHUP and when it changes (see
    /// [`WorkerKey`]): none without `--worker-key-file`.
    pub fn watched_key(&self, args: &LaunchArgs) -> Option<Watched> {
        let (path, key) = (args.worker_key_file.as_ref()?, self.protocol.key.as_ref()?);
        Some(Watched {
            flag: "--worker-key-file",
            path: path.clone(),
            secret: key.secret().clone(),
            rotation: Rotation::UntilNextChange,
            check: credential::check_key,
        })
    }

    /// The launcher to start workers with; `None`: the router's default, `task`. A docker
    /// launcher labels its containers with `registry` (the registry's name) and `replica` (this
    /// replica's stable name: its webhook address), which is how the next start finds them.
    pub fn launcher(
        &self,
        registry: &str,
        replica: &str,
    ) -> Result<Option<Arc<dyn Launcher>>, String> {
        match self.kind {
            LauncherKind::Task => Ok(None),
            LauncherKind::Process => process_launcher(self),
            LauncherKind::Docker => docker_launcher(self, registry, replica),
        }
    }
}

#[cfg(feature = "docker")]
fn docker_launcher(
    s: &LaunchSettings,
    registry: &str,
    replica: &str,
) -> Result<Option<Arc<dyn Launcher>>, String> {
    let image = s.docker_image.clone().unwrap_or_default();
    let mut b = crate::launcher::docker::DockerLauncher::builder(image, registry, replica)
        // The image's entrypoint is the worker: it gets the worker's arguments only.
        .args(s.worker_argv.iter().skip(1).cloned().collect())
        .volumes(s.docker_volumes.clone());
    if let Some(bytes) = s.docker_memory {
        b = b.memory(bytes);
    }
    if let Some(cpus) = s.docker_cpus {
        b = b.cpus(cpus);
    }
    let launcher = b.build().map_err(|e| e.to_string())?;
    Ok(Some(Arc::new(launcher)))
}

#[cfg(not(feature = "docker"))]
fn docker_launcher(
    _: &LaunchSettings,
    _registry: &str,
    _replica: &str,
) -> Result<Option<Arc<dyn Launcher>>, String> {
    Err("--launcher docker needs the router built with its `docker` feature".into())
}

#[cfg(target_os = "linux")]
fn process_launcher(s: &LaunchSettings) -> Result<Option<Arc<dyn Launcher>>, String> {
    let mut b = crate::launcher::process::ProcessLauncher::builder(s.worker_argv.clone());
    if let Some(dir) = &s.state_dir {
        b = b.state_dir(dir);
    }
    let launcher = b.build().map_err(|e| e.to_string())?;
    Ok(Some(Arc::new(launcher)))
}

#[cfg(not(target_os = "linux"))]
fn process_launcher(_: &LaunchSettings) -> Result<Option<Arc<dyn Launcher>>, String> {
    Err("--launcher process runs on Linux only".into())
}
