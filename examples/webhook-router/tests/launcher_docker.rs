//! The `docker` launcher against a real daemon: the one `DOCKER_HOST` names (`.ci/run` starts one
//! and exports it), or else one this test binary starts as root (`dockerd --bridge=none
//! --iptables=false --ip6tables=false`, socket and data root in a temporary directory, stopped by
//! a watchdog once the tests exit). Without either the tests say so in one line and pass; under
//! `CI` they fail. The image is built by `deploy/worker-image/build` (the router's binary standing
//! in for the worker's, plus `tail` and `bash`), and the containers run `sh -c` scripts.
//!
//! No sleep stands for a duration: every wait is on the daemon (a container's wait), a log line or
//! a connection, bounded only to turn a hang into a failure.
#![cfg(all(target_os = "linux", feature = "docker"))]

mod docker_daemon;
mod launcher_common;

use docker_daemon::client;

use launcher_common::*;

use std::path::Path;

use bollard::query_parameters::WaitContainerOptionsBuilder;
use bollard::{Docker, API_DEFAULT_VERSION};
use futures_util::StreamExt;
use tokio::io::AsyncReadExt;
use webhook_router::launcher::docker::{DockerLauncher, DockerLauncherBuilder, Network};
use webhook_router::launcher::{Exit, Launch, Launched, Launcher};
use webhook_router::mailbox::{self, OverflowMetrics};
use worker_registry::WorkerId;

const IMAGE: &str = "worker-registry/launcher-test:dev";
const REGISTRY: &str = "launcher-test";

/// The daemon's `DOCKER_HOST`, after a one-line skip (or a panic under `CI`) when there is none.
fn daemon() -> Option<&'static str> {
    docker_daemon::daemon("the docker launcher's tests", HUNG, build_image)
}

/// The test image, by the project's script: the router's binary standing in for the worker's.
fn build_image(host: &str) -> Result<(), String> {
    docker_daemon::build_image(
        host,
        Path::new(env!("CARGO_BIN_EXE_webhook-router")),
        IMAGE,
        &["tail", "bash"],
    )
}

fn sh(script: &str, replica: &str) -> DockerLauncherBuilder {
    log(); // the capture is installed before any worker logs
    DockerLauncher::builder(IMAGE, REGISTRY, replica)
        .entrypoint(vec!["/bin/sh".into(), "-c".into()])
        .args(vec![script.into()])
}

async fn launch(launcher: &DockerLauncher, id: u64, env: &[(&str, &str)]) -> Launched {
    let (_tx, jobs) = mailbox::channel(4, 4, OverflowMetrics::default());
    let mut spec = Launch::new(WorkerId::new(id), jobs);
    spec.env
        .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    launcher.launch(spec).await.unwrap()
}

async fn exit_of(launched: Launched) -> Exit {
    tokio::time::timeout(HUNG, launched.exit)
        .await
        .expect("hung waiting for the worker's exit")
}

/// Waits until worker `id`'s container has been removed (the daemon's own wait).
async fn removed(docker: &Docker, id: u64) {
    let name = format!("wr-{REGISTRY}-{id}");
    let options = WaitContainerOptionsBuilder::new()
        .condition("removed")
        .build();
    let mut wait = docker.wait_container(&name, Some(options));
    // An error is the container already gone (404) or its non-zero status.
    let _ = tokio::time::timeout(HUNG, wait.next()).await.expect("hung");
    let inspect = docker.inspect_container(&name, None).await;
    assert!(inspect.is_err(), "container {name} still there");
}

#[tokio::test]
async fn exit_zero_is_exited_with_its_environment_and_output_and_the_container_is_removed() {
    let Some(host) = daemon() else { return };
    let launcher = sh("export -p; echo to-stderr >&2; exit 0", "r1")
        .build_on(client(host).await)
        .unwrap();
    let launched = launch(&launcher, 201, &[("WORKER_CREDENTIAL", "v1.201.x.y")]).await;
    assert_eq!(exit_of(launched).await, Exit::Exited);
    assert_eq!(wait_line(201, "stdout", "export WORKER_ID=").await, "'201'");
    assert_eq!(
        wait_line(201, "stdout", "export WORKER_CREDENTIAL=").await,
        "'v1.201.x.y'"
    );
    wait_line(201, "stderr", "to-stderr").await;
    let leaked = log().borrow().iter().any(|e| {
        e.field("worker") == Some("201") && e.field("message").is_some_and(|m| m.contains("CARGO"))
    });
    assert!(!leaked, "the test's environment reached the container");
    removed(&client(host).await, 201).await;
}

#[tokio::test]
async fn exit_statuses_map() {
    let Some(host) = daemon() else { return };
    let launcher = sh("exit $HOW", "r1").build_on(client(host).await).unwrap();
    for (id, how, exit) in [(210, "3", Exit::Fenced), (211, "4", Exit::Crashed)] {
        let launched = launch(&launcher, id, &[("HOW", how)]).await;
        assert_eq!(exit_of(launched).await, exit, "exit {how}");
    }
}

#[tokio::test]
async fn kill_mid_run_is_crashed_and_the_container_removed() {
    let Some(host) = daemon() else { return };
    let launcher = sh("echo ready; exec tail -f /dev/null", "r1")
        .build_on(client(host).await)
        .unwrap();
    let launched = launch(&launcher, 220, &[]).await;
    wait_line(220, "stdout", "ready").await;
    launched.control.kill();
    assert_eq!(exit_of(launched).await, Exit::Crashed);
    removed(&client(host).await, 220).await;
}

#[tokio::test]
async fn stop_is_stopped() {
    let Some(host) = daemon() else { return };
    let launcher = sh(
        "trap 'echo term; exit 0' TERM; echo ready; tail -f /dev/null & wait",
        "r1",
    )
    .build_on(client(host).await)
    .unwrap();
    let launched = launch(&launcher, 230, &[]).await;
    wait_line(230, "stdout", "ready").await;
    launched.control.stop();
    assert_eq!(exit_of(launched).await, Exit::Stopped(Vec::new()));
    wait_line(230, "stdout", "term").await;
}

#[tokio::test]
async fn a_previous_incarnations_container_is_found_by_its_labels_and_removed() {
    let Some(host) = daemon() else { return };
    let before = sh("echo ready; exec tail -f /dev/null", "r-left")
        .build_on(client(host).await)
        .unwrap();
    let launched = launch(&before, 240, &[]).await;
    wait_line(240, "stdout", "ready").await;
    // The incarnation vanishes without a word: its container keeps running.
    std::mem::forget(launched);

    let after = sh("true", "r-left").build_on(client(host).await).unwrap();
    let found = after.leftovers().await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].worker, WorkerId::new(240));
    // Another replica's launcher does not see it.
    let other = sh("true", "r-other").build_on(client(host).await).unwrap();
    assert!(other.leftovers().await.unwrap().is_empty());
    after.remove(found[0].clone()).await.unwrap();
    removed(&client(host).await, 240).await;
    assert!(after.leftovers().await.unwrap().is_empty());
    after.remove(found[0].clone()).await.unwrap();
}

#[tokio::test]
async fn dropping_the_exit_removes_the_container() {
    let Some(host) = daemon() else { return };
    let launcher = sh("echo ready; exec tail -f /dev/null", "r1")
        .build_on(client(host).await)
        .unwrap();
    let launched = launch(&launcher, 250, &[]).await;
    wait_line(250, "stdout", "ready").await;
    drop(launched);
    removed(&client(host).await, 250).await;
}

#[tokio::test]
async fn network_host_reaches_a_loopback_listener_and_none_does_not() {
    let Some(host) = daemon() else { return };
    log(); // the capture is installed before any worker logs
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!("echo hello-from-the-container > /dev/tcp/127.0.0.1/{port}");
    let on = |network| {
        DockerLauncher::builder(IMAGE, REGISTRY, "r1")
            .entrypoint(vec!["/bin/bash".into(), "-c".into()])
            .args(vec![script.clone()])
            .network(network)
    };
    let launcher = on(Network::Host).build_on(client(host).await).unwrap();
    let launched = launch(&launcher, 260, &[]).await;
    let (mut conn, _) = tokio::time::timeout(HUNG, listener.accept())
        .await
        .expect("hung waiting for the container's connection")
        .unwrap();
    let mut got = String::new();
    conn.read_to_string(&mut got).await.unwrap();
    assert_eq!(got, "hello-from-the-container\n");
    assert_eq!(exit_of(launched).await, Exit::Exited);

    let isolated = on(Network::None).build_on(client(host).await).unwrap();
    let launched = launch(&isolated, 261, &[]).await;
    assert_eq!(exit_of(launched).await, Exit::Crashed);
    // Its own loopback has no listener on the port.
    wait_event(261, |e| {
        e.field("stream") == Some("stderr")
            && e.field("message")
                .is_some_and(|m| m.contains("Connection refused"))
    })
    .await;
}

#[tokio::test]
async fn a_daemon_that_is_not_there_is_unavailable_at_the_first_call() {
    // No daemon needed: a socket nobody listens on (bound, then closed). Building asks the
    // daemon nothing.
    let path = format!("/tmp/wr-no-docker-{}.sock", std::process::id());
    let _ = std::fs::remove_file(&path);
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let docker =
        Docker::connect_with_unix(&format!("unix://{path}"), 5, API_DEFAULT_VERSION).unwrap();
    let launcher = sh("true", "r1").build_on(docker).unwrap();
    let err = launcher.leftovers().await.unwrap_err();
    assert!(
        matches!(
            err,
            webhook_router::launcher::LaunchError::Unavailable { .. }
        ),
        "{err}"
    );
    std::fs::remove_file(&path).unwrap();
}

#[tokio::test]
async fn limits_are_checked_and_set() {
    let Some(host) = daemon() else { return };
    let bad = sh("true", "r1").cpus(0.0).build_on(client(host).await);
    assert!(bad.is_err());
    let bad = sh("true", "r1").memory(1024).build_on(client(host).await);
    assert!(bad.is_err());
    let launcher = sh("echo ready; exec tail -f /dev/null", "r1")
        .memory(64 * 1024 * 1024)
        .cpus(0.5)
        .build_on(client(host).await)
        .unwrap();
    let launched = launch(&launcher, 270, &[]).await;
    wait_line(270, "stdout", "ready").await;
    let docker = client(host).await;
    let inspect = docker
        .inspect_container(&format!("wr-{REGISTRY}-270"), None)
        .await
        .unwrap();
    let hc = inspect.host_config.unwrap();
    assert_eq!(hc.memory, Some(64 * 1024 * 1024));
    assert_eq!(hc.nano_cpus, Some(500_000_000));
    assert_eq!(hc.network_mode.as_deref(), Some("host"));
    let labels = inspect.config.unwrap().labels.unwrap();
    assert_eq!(labels["io.worker-registry.worker"], "270");
    assert_eq!(labels["io.worker-registry.registry"], REGISTRY);
    assert_eq!(labels["io.worker-registry.replica"], "r1");
    launched.control.kill();
    assert_eq!(exit_of(launched).await, Exit::Crashed);
}
