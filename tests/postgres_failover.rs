//! The PostgreSQL connection layer against real servers: a multi-host URL with
//! `target_session_attrs=read-write` follows the primary when the one it used turns read-only
//! (as a demoted primary does), without a new handle; a call that timed out does not leave its
//! statement running on a connection the pool hands out again.
//!
//! The "standby" here is a cluster with `default_transaction_read_only = on` (what
//! `target_session_attrs` and the functions' writes see of a hot standby), which a test can flip
//! with `ALTER SYSTEM` and a reload: a failover without the cost of a streaming replica.
//!
//! And a real one: a streaming standby (`pg_basebackup -R`) whose replication is cut before the
//! last writes, the primary stopped, `pg_ctl promote` of the standby, followed by the same
//! handle through a multi-host URL: no id or token repeats, the loss is reported.

#[path = "support/pg_cluster.rs"]
mod pg_cluster;

use std::time::{Duration, Instant};
use worker_registry::WorkerRegistryExt;

use tokio_postgres::NoTls;
use worker_registry::postgres::PostgresRegistry;
use worker_registry::{
    Admission, DeliveryId, Maintenance, RegistryConfig, RegistryError, Target, WorkerRegistry,
};

fn t(n: u64) -> Target {
    Target::new("octo/repo", n).unwrap()
}

fn d(s: &str) -> DeliveryId {
    DeliveryId::new(s).unwrap()
}

async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}

/// Makes the server read-only (or writable again) for every session, as promotion and demotion do.
async fn set_read_only(url: &str, on: bool) {
    let c = sql(url).await;
    c.batch_execute(&format!(
        "ALTER SYSTEM SET default_transaction_read_only = {}",
        if on { "on" } else { "off" }
    ))
    .await
    .unwrap();
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    // The reload is asynchronous: the postmaster rereads the file and then signals every session.
    // Once a new session sees the value, the postmaster has reloaded and signalled the pooled
    // ones, so the handle's next statement on any of them runs under it. (A condition, polled;
    // the cap only bounds a test that would hang.)
    let want = if on { "on" } else { "off" };
    let cap = Instant::now() + Duration::from_secs(30);
    loop {
        let seen: String = sql(url)
            .await
            .query_one("SHOW default_transaction_read_only", &[])
            .await
            .unwrap()
            .get(0);
        if seen == want {
            return;
        }
        assert!(Instant::now() < cap, "the server never took {want}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_host_url_follows_the_primary_when_the_one_in_use_turns_read_only() {
    let Some(a) = pg_cluster::own_cluster() else {
        return;
    };
    let b = pg_cluster::own_cluster().expect("a second cluster where the first started");
    let name = pg_cluster::unique_name("multi-host");
    // The registry exists on both (both fresh clusters: the same registry id); A is the standby.
    for url in [a.url(), b.url()] {
        PostgresRegistry::builder(&url)
            .name(&name)
            .listen(false)
            .connect()
            .await
            .expect("open on each server");
    }
    set_read_only(&a.url(), true).await;
    let port = |url: &str| {
        url.rsplit(':')
            .next()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_owned()
    };
    let multi = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
         target_session_attrs=read-write",
        port(&a.url()),
        port(&b.url())
    );
    let r = PostgresRegistry::builder(&multi)
        .name(&name)
        .config(RegistryConfig::default())
        .pool_size(2)
        .migrate(false)
        .listen(false)
        .call_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect past the read-only host");
    assert!(matches!(
        r.admit(&t(1), &d("on-b")).await.unwrap(),
        Admission::Assigned(_)
    ));
    // Fail over: B is demoted, A promoted. The pooled connections are still to B.
    set_read_only(&a.url(), false).await;
    set_read_only(&b.url(), true).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        match r.admit(&t(2), &d("on-a")).await {
            Ok(a) => break a,
            Err(e) => {
                assert!(e.is_retryable(), "only retryable errors meanwhile: {e}");
                assert!(Instant::now() < deadline, "did not follow the primary: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(matches!(answer, Admission::Assigned(_)), "{answer:?}");
    // It was written on A: B never saw delivery "on-a".
    let on_a: i64 = sql(&a.url())
        .await
        .query_one(
            "SELECT count(*) FROM wr_claims WHERE delivery = 'on-a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(on_a, 1, "the new primary has the claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_timed_out_leaves_no_statement_running_on_a_pooled_connection() {
    let Some(url) = pg_cluster::shared_url() else {
        return;
    };
    let name = pg_cluster::unique_name("timeout");
    // The handle's sessions are told apart by their application name.
    let app = format!(
        "wr-{}",
        name.len() as u64 * 1_000_003 + std::process::id() as u64
    );
    // The migrations and the registry's creation first, under the default call timeout (on a
    // loaded machine they take longer than the 300 ms the handle under test allows).
    drop(
        PostgresRegistry::builder(&url)
            .name(&name)
            .listen(false)
            .connect()
            .await
            .unwrap(),
    );
    let sep = if url.contains('?') { '&' } else { '?' };
    // Migrated first: on a fresh cluster the migrations and the functions file take longer than
    // the short call timeout below is meant for (it is for the blocked admit).
    PostgresRegistry::migrate(&url).await.unwrap();
    let r = PostgresRegistry::builder(format!("{url}{sep}application_name={app}"))
        .name(&name)
        .pool_size(1)
        .listen(false)
        .call_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let watch = sql(&url).await;
    let pids = || async {
        let rows = watch
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                &[&app],
            )
            .await
            .unwrap();
        rows.iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<_>>()
    };
    let before = pids().await;
    assert_eq!(before.len(), 1, "the pool's one connection");
    // Another session holds the registry's capacity row: an admit that creates a worker waits.
    let mut holder = sql(&url).await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM wr_capacity WHERE registry = (SELECT id FROM wr_registries WHERE name = $1) \
         FOR UPDATE",
        &[&name],
    )
    .await
    .unwrap();
    let err = r.admit(&t(1), &d("blocked")).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    // The statement that waited was cancelled and its connection closed, not pooled: the
    // session goes away (pooled, it would stay, its statement queued ahead of the next call).
    let deadline = Instant::now() + Duration::from_secs(30);
    while pids().await.contains(&before[0]) {
        assert!(
            Instant::now() < deadline,
            "the timed-out call's session is still there"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.rollback().await.unwrap();
    assert!(matches!(
        r.admit(&t(2), &d("after")).await.unwrap(),
        Admission::Assigned(_)
    ));
}

/// Retries `f` until it answers; only retryable errors meanwhile (capped at 60 s: a hang).
async fn until_answered<T>(what: &str, mut f: impl AsyncFnMut() -> Result<T, RegistryError>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(e.is_retryable(), "{what}: only retryable errors: {e}");
                assert!(
                    Instant::now() < deadline,
                    "{what}: no answer within 60 s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Polls the single-value query `q` on `url` until `ok` holds (capped at 60 s: a hang).
async fn wait_until(url: &str, q: &str, ok: impl Fn(&str) -> bool) {
    let c = sql(url).await;
    let cap = Instant::now() + Duration::from_secs(60);
    loop {
        let v: String = c.query_one(q, &[]).await.unwrap().get(0);
        if ok(&v) {
            return;
        }
        assert!(Instant::now() < cap, "{q} still {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_that_lagged_repeats_no_id_or_token_and_the_handle_follows_it() {
    let Some(mut primary) = pg_cluster::own_cluster() else {
        return;
    };
    let standby = primary.standby().expect("a streaming standby");
    let name = pg_cluster::unique_name("promote");
    let multi = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
         target_session_attrs=read-write connect_timeout=2",
        primary.port(),
        standby.port()
    );
    let r = PostgresRegistry::builder(&multi)
        .name(&name)
        .config(RegistryConfig::default())
        .pool_size(2)
        .listen(false)
        .call_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect to the primary (the standby is read-only)");
    let mut earlier = Vec::new();
    let mut kept = Vec::new();
    for i in 1..=3 {
        let Admission::Assigned(a) = r.admit(&t(i), &d("before")).await.unwrap() else {
            panic!("assigned")
        };
        kept.push(a);
    }
    r.sweep().await.unwrap();
    // The standby has replayed everything so far.
    let lsn: String = sql(&primary.url())
        .await
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    wait_until(
        &standby.url(),
        &format!("SELECT (pg_last_wal_replay_lsn() >= '{lsn}')::text"),
        |v| v == "true",
    )
    .await;
    // Replication is cut: the standby forgets its primary (its WAL receiver stops).
    let s = sql(&standby.url()).await;
    s.batch_execute("ALTER SYSTEM SET primary_conninfo = ''")
        .await
        .unwrap();
    s.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    wait_until(
        &standby.url(),
        "SELECT count(*)::text FROM pg_stat_wal_receiver",
        |v| v == "0",
    )
    .await;
    // Committed on the primary, never replicated.
    let mut lost = Vec::new();
    for i in 4..=6 {
        let Admission::Assigned(a) = r.admit(&t(i), &d("lost")).await.unwrap() else {
            panic!("assigned")
        };
        lost.push(a);
    }
    r.sweep().await.unwrap();
    earlier.extend(kept.iter().chain(&lost).cloned());

    // The primary dies; the standby is promoted. The same handle follows it.
    primary.kill().unwrap();
    standby.promote().expect("pg_ctl promote");
    until_answered("sweep", async || r.sweep().await).await;
    assert_eq!(r.stats().data_losses, 1, "the rewind is reported");
    let newest = earlier.iter().map(|a| a.token).max().unwrap();
    for i in 4..=9 {
        let a = until_answered("admit", async || r.admit(&t(i), &d("after")).await).await;
        let Admission::Assigned(a) = a else {
            panic!("assigned: {a:?}")
        };
        assert!(a.new, "a new worker for {}", t(i));
        assert!(
            earlier.iter().all(|e| e.worker != a.worker),
            "worker id {} handed out again",
            a.worker
        );
        assert!(a.token > newest, "token {} not above {newest}", a.token);
    }
    // What had replicated is there; a lost worker is unknown.
    assert!(matches!(
        r.admit(&t(1), &d("before")).await.unwrap(),
        Admission::Duplicate(_)
    ));
    assert!(matches!(
        r.heartbeat(lost[0].worker).await,
        Err(RegistryError::UnknownWorker { .. })
    ));
}
