//! A registry on the application's own redis-rs connection
//! (`RedisRegistryBuilder::connection_manager`): the registry's commands go over it, the registry
//! opens only its event listener's pub/sub connection beside it, a replica opens its own, and the
//! application's connection keeps working after the registry is gone. On a server of its own, so
//! that its connections can be counted.

use redis::aio::ConnectionManager;
use worker_registry::redis::RedisRegistry;
use worker_registry::WorkerRegistryExt;
use worker_registry::{Admission, DeliveryId, Target};

use crate::harness;

/// `CLIENT LIST`, one line per connection.
async fn clients(raw: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(raw)
        .await
        .unwrap();
    list.lines().map(str::to_owned).collect()
}

/// The connection named `name`: its `CLIENT LIST` line.
fn named<'a>(list: &'a [String], name: &str) -> &'a str {
    let needle = format!(" name={name} ");
    list.iter()
        .find(|l| l.contains(&needle))
        .unwrap_or_else(|| panic!("no connection named {name} in {list:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_on_the_applications_connection_manager_sends_its_commands_over_it() {
    let Some(server) = harness::Server::start(false, "Redis given-connection test") else {
        return;
    };
    let url = server.url();
    let mut raw = harness::raw(&url).await;
    let mut app = ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg("the-app")
        .query_async(&mut app)
        .await
        .unwrap();
    let before = clients(&mut raw).await.len();
    assert_eq!(before, 2, "the inspector and the application");

    let registry = RedisRegistry::builder(url.as_str())
        .name(harness::unique_name("given"))
        .connection_manager(app.clone())
        .connect()
        .await
        .expect("connect over the application's connection");
    assert_eq!(
        clients(&mut raw).await.len(),
        before + 1,
        "the registry opened its listener's pub/sub connection and nothing else"
    );

    let target = Target::new("octo/repo", 1).unwrap();
    assert!(harness::admit_fresh(&registry, &target).await.new);
    let list = clients(&mut raw).await;
    assert!(
        named(&list, "the-app").contains(" cmd=fcall "),
        "the admit's FCALL went over the application's connection: {list:#?}"
    );

    // The application's own commands interleave with the registry's on the one connection.
    let _: () = redis::cmd("SET")
        .arg("app-key")
        .arg("v")
        .query_async(&mut app)
        .await
        .unwrap();
    assert!(matches!(
        registry
            .admit(&target, &DeliveryId::new("fresh").unwrap())
            .await
            .unwrap(),
        Admission::Duplicate(_)
    ));

    // A replica is another router process: connections of its own.
    let replica = registry.connect_replica().await.unwrap();
    assert_eq!(clients(&mut raw).await.len(), before + 3);
    drop((registry, replica));

    let got: String = redis::cmd("GET")
        .arg("app-key")
        .query_async(&mut app)
        .await
        .expect("the application's connection outlives the registry");
    assert_eq!(got, "v");
}
