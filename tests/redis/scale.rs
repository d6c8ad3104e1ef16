//! What bounded maintenance makes observable on the server: a mass death is worked off in many
//! small script calls, not one, and a sweep in which no worker changed publishes only a header.
//! (The timings are the scale bench's, `benches/redis_scale.rs`; these tests count calls and
//! read the change log.)

use std::time::Duration;

use worker_registry::redis::RedisRegistry;

/// The backend's step sizes (private: `SWEEP_STEP_BUDGET` in `src/redis/sweep.rs`,
/// `PUBLISH_STEP` in `src/redis/publish.rs`, both stated in `docs::redis`); raising either there
/// fails the floor below until these follow.
const SWEEP_STEP_BUDGET: usize = 100;
const PUBLISH_STEP: usize = 64;
use worker_registry::{Maintenance, RegistryConfig, WorkerRegistry};

use crate::harness;

const WORKERS: usize = 1_000;

/// FCALL calls since the last `CONFIG RESETSTAT`.
async fn fcall_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_mass_death_is_worked_off_in_bounded_steps_and_an_idle_sweep_publishes_a_header() {
    // A server of its own: the test counts the server's script calls.
    let Some(server) = harness::Server::start(false, "scale") else {
        return;
    };
    let url = server.url();
    let config = RegistryConfig::builder()
        .max_workers(WORKERS)
        .startup_grace(Duration::ZERO)
        .brake_fraction(1.0)
        .build()
        .unwrap();
    let r: RedisRegistry = harness::registry(&url, "scale", config.clone()).await;
    for _ in 0..WORKERS {
        r.register().await.unwrap();
    }
    // (No sweep before the silence: a gap of two intervals after one would be a stall.)
    let mut raw = harness::raw(&url).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut raw)
        .await
        .unwrap();

    r.advance_time_for_tests(config.heartbeat_timeout() + Duration::from_secs(1))
        .await
        .unwrap();
    let report = r.sweep().await.unwrap();
    assert_eq!(report.died.len(), WORKERS, "one sweep, every death");
    assert_eq!(r.status().counts.dead, WORKERS);
    // A death costs a step about 20 of its commands: no step kills more than budget / 20, and
    // the publish moves at most PUBLISH_STEP workers per call.
    let calls = fcall_calls(&mut raw).await;
    let floor = (WORKERS / (SWEEP_STEP_BUDGET / 20) + WORKERS / PUBLISH_STEP) as u64;
    assert!(
        calls >= floor,
        "{calls} script calls, at least {floor} expected"
    );

    // Nothing changed since: the next version is its header alone.
    let before = r.status().version;
    let quiet = r.sweep().await.unwrap();
    assert!(quiet.died.is_empty() && quiet.released.is_empty());
    assert_eq!(r.status().version, before + 1);
    let key = format!("{{{}}}:changes", r.name());
    let last: Vec<(String, Vec<String>)> = redis::cmd("XREVRANGE")
        .arg(&key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(2)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(last.len(), 2);
    let (id, fields) = &last[0];
    assert!(id.starts_with(&format!("{}-", before + 1)), "{id}");
    assert_eq!(fields.len(), 2, "one field: {fields:?}");
    assert_eq!(fields[0], "h");
    assert!(
        last[1].0.starts_with(&format!("{before}-")),
        "the entry before belongs to the previous version: {}",
        last[1].0
    );
    drop(server);
}
