//! The Function library on the server: a server that lost it (`FUNCTION FLUSH`, a new server)
//! gets it again from the next call, and a reply outside the schema (here a foreign library
//! under this build's name) is a non-retryable error naming the field, not a guess. Each test runs
//! its own `redis-server`: they flush or replace the server's functions.

use redis::aio::MultiplexedConnection;
use worker_registry::redis::RedisRegistry;
use worker_registry::WorkerRegistryExt;
use worker_registry::{Admission, DeliveryId, RegistryError, Target, WorkerRegistry};

use crate::harness::{self, Server};

fn t(n: u64) -> Target {
    Target::new("octo/repo", n).unwrap()
}

fn d(s: &str) -> DeliveryId {
    DeliveryId::new(s).unwrap()
}

/// The names of the libraries on the server.
async fn libraries(raw: &mut MultiplexedConnection) -> Vec<String> {
    let list: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(raw)
        .await
        .unwrap();
    let mut names = Vec::new();
    for lib in list {
        let redis::Value::Array(fields) = lib else {
            continue;
        };
        for pair in fields.chunks_exact(2) {
            if matches!(&pair[0], redis::Value::BulkString(b) if b == b"library_name") {
                names.push(redis::from_redis_value_ref::<String>(&pair[1]).unwrap());
            }
        }
    }
    names
}

#[tokio::test]
async fn a_server_that_lost_the_library_gets_it_again_from_the_next_call() {
    let Some(server) = Server::start(false, "fn-flush") else {
        return;
    };
    let url = server.url();
    let mut raw = harness::raw(&url).await;
    let r = RedisRegistry::builder(&url)
        .name("pool")
        .connect()
        .await
        .unwrap();
    let libs = libraries(&mut raw).await;
    assert_eq!(libs.len(), 1, "{libs:?}");
    assert!(libs[0].starts_with("wr_"), "{libs:?}");
    let Admission::Assigned(a) = r.admit(&t(1), &d("a")).await.unwrap() else {
        panic!("assigned")
    };

    // FLUSHALL keeps functions; FUNCTION FLUSH drops them: the next call loads them again.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(libraries(&mut raw).await.is_empty());
    r.heartbeat(a.worker).await.unwrap();
    assert_eq!(libraries(&mut raw).await, libs);
    assert!(matches!(
        r.admit(&t(1), &d("a")).await,
        Ok(Admission::Duplicate(_))
    ));

    // A second handle finds the library loaded and loads nothing.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut raw)
        .await
        .unwrap();
    let _second = RedisRegistry::builder(&url)
        .name("pool")
        .connect()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!info.contains("cmdstat_function|load"), "{info}");
    assert!(info.contains("cmdstat_function|list"), "{info}");
}

#[tokio::test]
async fn a_reply_outside_the_schema_is_an_error_naming_the_field() {
    let Some(server) = Server::start(false, "fn-foreign") else {
        return;
    };
    let url = server.url();
    let mut raw = harness::raw(&url).await;
    let r = RedisRegistry::builder(&url)
        .name("pool")
        .connect()
        .await
        .unwrap();
    let Admission::Assigned(a) = r.admit(&t(1), &d("a")).await.unwrap() else {
        panic!("assigned")
    };
    let name = libraries(&mut raw).await.remove(0);
    // A foreign library under this build's name: a heartbeat answers a word outside the
    // vocabulary, an admission a reply without its fields.
    let foreign = format!(
        "#!lua name={name}\n\
         redis.register_function('{name}_heartbeat', function() return {{ 'outcome', 'sleeping' }} end)\n\
         redis.register_function('{name}_admit', function() return {{ {{}}, {{ 'outcome', 'assigned', 'worker', '7' }}, false }} end)\n\
         redis.register_function('{name}_complete', function() return {{ 'outcome', 'released', 'holder', '', 'reason', 'worker_died', 'dead_reason', 'bored' }} end)\n"
    );
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(foreign)
        .query_async(&mut raw)
        .await
        .unwrap();
    let expect = |e: RegistryError, needle: &str| {
        let RegistryError::Backend {
            retryable, source, ..
        } = &e
        else {
            panic!("{e:?}")
        };
        assert!(!retryable, "{e}");
        assert!(source.to_string().contains(needle), "{source}");
    };
    expect(
        r.heartbeat(a.worker).await.unwrap_err(),
        "reply field \"outcome\" holds \"sleeping\" (from heartbeat)",
    );
    expect(
        r.admit(&t(2), &d("b")).await.unwrap_err(),
        "reply has no field \"seq\"",
    );
    expect(
        r.complete(&t(1), &d("a")).await.unwrap_err(),
        "reply field \"dead_reason\" holds \"bored\"",
    );
}
