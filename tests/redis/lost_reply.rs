//! A lost reply leaves no phantom: an admission that created a worker is carried out by the
//! server, its reply lost on the way back (a proxy between the handle and the server drops it and
//! cuts the connection); the retry is a duplicate that names the new worker and says it never
//! started, so the router starts it.

use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use worker_registry::redis::RedisRegistry;
use worker_registry::{Admission, ClaimState, DeliveryId, RegistryConfig, Target, WorkerRegistry};

use crate::harness;
use crate::proxy::Proxy;

/// `host:port` of a `redis://[user@]host:port[/db]` URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// A proxy in front of the server at `url`, a handle of a fresh registry through it (its replies
/// can be dropped) and one straight to the server.
async fn through_a_proxy(url: &str, prefix: &str) -> (Proxy, RedisRegistry, RedisRegistry) {
    let proxy = Proxy::start(&host_port(url)).await;
    let name = harness::unique_name(prefix);
    let through = RedisRegistry::builder(format!("redis://{}/", proxy.addr()))
        .name(&name)
        .config(RegistryConfig::default())
        .response_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let direct = RedisRegistry::builder(url)
        .name(&name)
        .connect()
        .await
        .unwrap();
    (proxy, through, direct)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_of_an_admission_whose_reply_was_lost_is_an_unstarted_duplicate() {
    let Some(url) = harness::shared("lost-reply") else {
        return;
    };
    let (proxy, through, direct) = through_a_proxy(&url, "lost-reply").await;
    let (t, d) = (
        Target::new("octo/repo", 7).unwrap(),
        DeliveryId::new("lost").unwrap(),
    );

    // An admission first, so that the script is loaded on the server (an EVALSHA answered
    // NOSCRIPT is a request that did nothing).
    let warm = Target::new("octo/repo", 1).unwrap();
    assert!(matches!(
        through.admit(&warm, &d).await,
        Ok(Admission::Assigned(_))
    ));

    proxy.drop_next_reply();
    let err = through.admit(&t, &d).await.unwrap_err();
    assert!(err.is_retryable(), "a lost reply is retryable: {err:?}");
    assert_eq!(proxy.dropped(), 1);

    // The retry (the connection manager reconnects through the proxy), tried again while the
    // connection is down: only a hang (two minutes) ends the wait, not a slow machine.
    let started = std::time::Instant::now();
    let retry = loop {
        match through.admit(&t, &d).await {
            Ok(a) => break Some(a),
            Err(e) if e.is_retryable() && started.elapsed() < Duration::from_secs(120) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    let Some(Admission::Duplicate(dup)) = retry else {
        panic!("the admission was carried out, so its retry is a duplicate: {retry:?}")
    };
    let worker = dup.holder.expect("held by the worker it created");
    assert_eq!(dup.state, ClaimState::InFlight);
    assert!(dup.unstarted, "nothing started it: {dup:?}");
    assert_eq!(dup.needs_start(), Some(worker));
    let info = direct
        .worker(worker)
        .await
        .unwrap()
        .expect("the worker exists");
    assert!(info.status.is_alive() && !info.has_heartbeated);
    assert_eq!(info.target, Some(t.clone()));

    // Once started (its first heartbeat), a redelivery is a plain duplicate: no second start.
    direct.heartbeat(worker).await.unwrap();
    let Ok(Admission::Duplicate(after)) = through.admit(&t, &d).await else {
        panic!("still a duplicate")
    };
    assert_eq!(after.needs_start(), None);
}

/// An admission with a payload whose reply is lost (`testkit::payload_checks`): the retry is an
/// unstarted duplicate and the payload is there, byte for byte, through both handles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_an_admission_with_a_payload_leaves_the_payload_retrievable() {
    let Some(url) = harness::shared("lost-reply") else {
        return;
    };
    let (proxy, through, direct) = through_a_proxy(&url, "lost-reply-payload").await;
    worker_registry::testkit::payload_checks::a_lost_reply_leaves_the_payload_retrievable(
        &through,
        &direct,
        || proxy.drop_next_reply(),
    )
    .await;
    assert_eq!(proxy.dropped(), 1);
}
