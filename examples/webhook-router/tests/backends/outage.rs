//! The registry's server stopped and restarted under a running router: meanwhile every delivery
//! is answered 503 with `Retry-After` (and the admin API's live reads too), nothing panics, and
//! once the server is back the same router (same handles, same sweeper) admits again and
//! completes what it had accepted. Each test runs its own server, since it stops it.

use std::time::Duration;

use reqwest::StatusCode;
use webhook_router::backend::RegistryChoice;
use webhook_router::server::Server;

use crate::harness::*;

async fn ride_out_an_outage(choice: RegistryChoice, stop: impl FnOnce(), start: impl FnOnce()) {
    let name = unique("outage");
    let config = config(4);
    let options = options(Duration::from_millis(20), Duration::from_secs(3600), 8);
    let router: Server = replica(&choice, &name, &config, &options).await;
    let b = base(&router);
    let http = client();

    let before = deliver(&http, &b, "out-1", &pr("o/r", 1)).await;
    assert_eq!(before.status, StatusCode::ACCEPTED, "{}", before.body);
    let w = before.worker();
    eventually("out-1 completed", || async {
        deliver(&http, &b, "out-1", &pr("o/r", 1))
            .await
            .completed()
            .then_some(())
    })
    .await;

    stop();
    let refused = deliver(&http, &b, "out-2", &pr("o/r", 1)).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.body
    );
    assert_eq!(refused.body["outcome"], "unavailable", "{}", refused.body);
    assert!(refused.retry_after.is_some_and(|s| s >= 1));
    let live_read = http
        .get(format!("{b}/workers/{w}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(live_read.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(live_read.headers().contains_key("retry-after"));
    // The cached snapshot is still served.
    let list = http
        .get(format!("{b}/workers"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), StatusCode::OK);

    start();
    // The same router recovers by itself: the delivery it refused is admitted now, and both are
    // completed (by the old worker or, if the sweep found it silent for too long, a new one).
    let admitted = eventually("out-2 admitted after the restart", || async {
        let a = try_deliver(&http, &b, "out-2", &pr("o/r", 1)).await?;
        (a.status == StatusCode::ACCEPTED || a.status == StatusCode::OK).then_some(a)
    })
    .await;
    assert_ne!(admitted.body["outcome"], "unavailable");
    for d in ["out-1", "out-2"] {
        eventually(&format!("{d} completed after the restart"), || async {
            deliver(&http, &b, d, &pr("o/r", 1))
                .await
                .completed()
                .then_some(())
        })
        .await;
    }
    let fresh = deliver(&http, &b, "out-3", &pr("o/r", 2)).await;
    assert_eq!(fresh.status, StatusCode::ACCEPTED, "{}", fresh.body);
    assert!(router.sweeper_running());
    router.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_and_restarted_under_the_router() {
    let Some(server) = rd::Server::start(true, "the router on Redis, restarted") else {
        return;
    };
    let server = std::sync::Mutex::new(server);
    let choice = RegistryChoice::Redis(server.lock().unwrap().url());
    ride_out_an_outage(
        choice,
        || server.lock().unwrap().stop(),
        || server.lock().unwrap().restart(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_and_restarted_under_the_router() {
    let Some(cluster) = pg::own_cluster() else {
        return;
    };
    let cluster = std::sync::Mutex::new(cluster);
    let choice = RegistryChoice::Postgres(cluster.lock().unwrap().url());
    ride_out_an_outage(
        choice,
        || cluster.lock().unwrap().kill().unwrap(),
        || cluster.lock().unwrap().restart().unwrap(),
    )
    .await;
}
