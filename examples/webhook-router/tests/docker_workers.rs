//! End to end with real containers: the router's `docker` launcher starts the worker image (built
//! here once per test binary by `deploy/worker-image/build` from the `webhook-worker` next to this
//! test's binary) on `--network host`, so each container's `webhook-worker` reaches the router's
//! worker listener on loopback. The event command is `real_workers.rs`'s, its records in a
//! directory of the test's mounted into each container ([`DockerLauncherBuilder::volumes`]),
//! each run named by its worker id (a container's pids repeat). The registry is in memory on a
//! `ManualClock`; waits are for records, the daemon or the registry, capped by a hang bound.
//!
//! * a worker container killed mid-event (`Control::kill`: `docker kill`): its delivery runs
//!   again in a new container on a byte-equal body, exactly once more;
//! * drain: the current event completes, the container exits 0 and is removed;
//! * a router stopped while its worker's command runs leaves no container;
//! * a router "restarted" (a new one with the same registry and replica labels, on the same
//!   registry) after its previous incarnation vanished mid-event (its runtime gone, its container
//!   left behind) finds that container by its labels, removes it and deregisters its worker, and
//!   the released event runs again in a new container, exactly once more.
//!
//! The daemon is the one `DOCKER_HOST` names (`.ci/run` starts one), or else one this binary
//! starts as root (`tests/docker_daemon`). Without a daemon or the `webhook-worker` binary each
//! test says so in one line and passes; under `CI` it fails instead.
#![cfg(all(target_os = "linux", feature = "docker"))]

mod common;
mod docker_daemon;
mod real_common;

use docker_daemon::client;

use real_common::{body, event_command, real, scratch, until, worker_binary, Real, Start, HANG};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bollard::query_parameters::{ListContainersOptionsBuilder, WaitContainerOptionsBuilder};
use bollard::{Docker, API_DEFAULT_VERSION};
use futures_util::StreamExt;
use webhook_router::launcher::docker::{DockerLauncher, LABEL_REGISTRY};
use worker_registry::{InMemoryRegistry, ManualClock, WorkerId, WorkerRegistry};

const IMAGE: &str = "worker-registry/docker-workers-test:dev";
/// Where the records' directory is mounted in each container.
const RECORDS: &str = "/records";

/// The daemon's `DOCKER_HOST`, with the image built, after a one-line skip (or a panic under
/// `CI`) when there is none.
fn daemon() -> Option<&'static str> {
    let bin = worker_binary()?;
    docker_daemon::daemon("the docker workers' tests", HANG, |host| {
        // The event command's programs, besides the image's `sh`.
        let tools = ["sha256sum", "cut", "tr", "date", "sleep"];
        docker_daemon::build_image(host, &bin, IMAGE, &tools)
    })
}

/// A router whose workers are containers of the worker image, and the registry label its
/// containers carry (one per test: the tests of this binary run at once on one daemon).
struct Docked {
    real: Real,
    docker: Docker,
    registry: String,
}

async fn docked() -> Option<Docked> {
    let host = daemon()?;
    Some(docked_on(host, &fresh_label(), scratch(), None).await)
}

/// A registry label of its own.
fn fresh_label() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    // Relaxed: a counter for distinct names.
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("docker-workers-{}-{n}", std::process::id())
}

/// A router labelling its containers `registry` and replica `r1`, its records in `dir`, on the
/// registry given (a previous router's) or a new one.
async fn docked_on(
    host: &str,
    registry: &str,
    dir: PathBuf,
    on: Option<(&InMemoryRegistry<ManualClock>, &ManualClock)>,
) -> Docked {
    let args = vec![
        "--event-command".to_owned(),
        event_command(Path::new(RECORDS), "$WORKER_ID"),
        "--idle-exit".to_owned(),
        "0s".to_owned(),
    ];
    let launcher = DockerLauncher::builder(IMAGE, registry, "r1")
        .args(args)
        .volumes(vec![format!("{}:{RECORDS}", dir.display())])
        .stop_grace(Duration::from_secs(2))
        .build_on(client(host).await)
        .unwrap();
    let mut start = Start::new(dir, Arc::new(launcher));
    start.registry = on;
    Docked {
        real: real(start).await,
        docker: client(host).await,
        registry: registry.to_owned(),
    }
}

/// The names of the containers, running or not, with registry label `registry`.
async fn containers(docker: &Docker, registry: &str) -> Vec<String> {
    let filters = HashMap::from([("label", vec![format!("{LABEL_REGISTRY}={registry}")])]);
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let found = docker.list_containers(Some(options)).await.unwrap();
    found
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .collect()
}

impl Docked {
    /// Waits until worker `id`'s container has been removed (the daemon's own wait).
    async fn removed(&self, id: WorkerId) {
        let name = format!("wr-{}-{id}", self.registry);
        let options = WaitContainerOptionsBuilder::new()
            .condition("removed")
            .build();
        let mut wait = self.docker.wait_container(&name, Some(options));
        // An error is the container already gone (404) or its non-zero status.
        let _ = tokio::time::timeout(HANG, wait.next())
            .await
            .expect("hung waiting for the container's removal");
        let inspect = self.docker.inspect_container(&name, None).await;
        assert!(inspect.is_err(), "container {name} still there");
    }

    /// Stops the router (`deadline`: its shutdown's), and checks that it left no container.
    async fn stop(self, deadline: Duration) {
        let Docked {
            real,
            docker,
            registry,
        } = self;
        let Real { server, dir, .. } = real;
        server.shutdown(deadline).await;
        let left = containers(&docker, &registry).await;
        assert!(left.is_empty(), "containers left: {left:?}");
        drop(dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_container_killed_mid_event_runs_it_again_in_a_new_container_exactly_once_more() {
    let Some(d) = docked().await else {
        return;
    };
    let r = &d.real;
    let body = body();
    let first = WorkerId::new(r.deliver("d-1", &body).await);
    let started = r.until("start", 1).await;
    assert_eq!(
        started[0].run,
        first.get(),
        "the first worker's container ran it"
    );
    // Mid-event: the command has read its body and is waiting for go.
    let tick = r.dir.join(format!("tick-{}", started[0].run));
    until("the first run's first tick", || tick.exists().then_some(())).await;
    // `docker kill` of the worker's container (Control::kill).
    r.server.app().lifecycle().crash(first).await.unwrap();
    d.removed(first).await;
    r.pass_the_timeout().await;
    let again = r.until("start", 2).await;
    let second = WorkerId::new(again[1].run);
    assert_ne!(second, first, "a new worker");
    r.go("d-1");
    r.until("end", 1).await;
    r.assert_ran_twice_completed_once("d-1", &body).await;
    let dead = r.registry.worker(first).await.unwrap().unwrap();
    assert!(!dead.status.is_alive());
    d.stop(HANG).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_container_completes_its_event_exits_0_and_is_removed() {
    let Some(d) = docked().await else {
        return;
    };
    let r = &d.real;
    let id = r.drain_mid_event().await;
    d.removed(id).await;
    d.stop(HANG).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_stopped_mid_event_leaves_no_container() {
    let Some(d) = docked().await else {
        return;
    };
    let r = &d.real;
    r.deliver("d-1", &body()).await;
    r.until("start", 1).await;
    assert_eq!(containers(&d.docker, &d.registry).await.len(), 1);
    // The command never gets its go: the shutdown's deadline passes and the worker's container
    // is stopped (the event stays accepted, reported unfinished).
    d.stop(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_router_removes_what_its_previous_incarnation_left_and_runs_its_event_again() {
    let Some(host) = daemon() else {
        return;
    };
    let label = fresh_label();
    // The previous incarnation runs on a runtime of its own, which vanishes without a word: no
    // task of its runs again, so nothing removes its worker's container.
    let (before, runtime) = std::thread::scope(|s| {
        s.spawn(|| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let before = runtime.block_on(docked_on(host, &label, scratch(), None));
            (before, runtime)
        })
        .join()
        .unwrap()
    });
    let body = body();
    let first = WorkerId::new(before.real.deliver("d-1", &body).await);
    before.real.until("start", 1).await;
    runtime.shutdown_background();
    let Docked { real, docker, .. } = before;
    let Real {
        server,
        dir,
        registry,
        clock,
        ..
    } = real;
    std::mem::forget(server); // its tasks are gone with its runtime
    assert_eq!(containers(&docker, &label).await.len(), 1, "left behind");
    let after = docked_on(host, &label, dir.to_path_buf(), Some((&registry, &clock))).await;
    std::mem::forget(dir); // the new router's now
    let r = &after.real;
    assert_eq!(r.settled, 1);
    after.removed(first).await;
    let info = r.registry.worker(first).await.unwrap().unwrap();
    assert!(!info.status.is_alive(), "deregistered: {:?}", info.status);
    // Its event, released by the deregistration, runs again in a new container.
    r.pass_the_timeout().await;
    let again = r.until("start", 2).await;
    assert_ne!(WorkerId::new(again[1].run), first);
    r.go("d-1");
    r.until("end", 1).await;
    r.assert_ran_twice_completed_once("d-1", &body).await;
    after.stop(HANG).await;
}

#[tokio::test]
async fn volumes_are_checked() {
    // No daemon needed: building asks it nothing (a socket nobody listens on: bound, then closed).
    let path = std::env::temp_dir().join(format!("wr-no-docker-v-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let host = format!("unix://{}", path.display());
    let docker = Docker::connect_with_unix(&host, 5, API_DEFAULT_VERSION).unwrap();
    let with = |v: &str| {
        DockerLauncher::builder(IMAGE, "r", "r1")
            .volumes(vec![v.to_owned()])
            .build_on(docker.clone())
            .map(|_| ())
    };
    for good in ["/srv/work:/work", "/srv/work:/work:ro", "cache:/cache"] {
        assert!(with(good).is_ok(), "{good}");
    }
    for bad in ["/srv/work", ":/work", "/srv/work:work", "/a:/b:ro:x", ""] {
        assert!(with(bad).is_err(), "{bad}");
    }
    std::fs::remove_file(&path).unwrap();
}
