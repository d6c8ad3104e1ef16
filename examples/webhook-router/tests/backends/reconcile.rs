//! The reconciler's shared state on real Redis and PostgreSQL servers: one lease holder at a
//! time, positions written only by the holder and read by every replica (and after a restart),
//! the lease taken over once its holder stops renewing it; and two replicas' reconcilers, each
//! with its own connection, redelivering each failed delivery once.

use std::sync::Arc;
use std::time::Duration;

use super::fake_github::{nowhere, FakeGitHub, APP_ID, KEY_PEM};
use super::harness::{self, base, config, options, replica, shared, unique, Kind, SECRET};
use webhook_router::reconcile::shared::Shared;
use webhook_router::reconcile::{Config, Reconciler};
use webhook_router::secrets::Secret;

async fn lease_and_positions(kind: Kind) {
    let Some(choice) = shared(kind) else { return };
    let name = unique("reconcile-lease");
    let a = Shared::open(&choice, &name).await.unwrap();
    let b = Shared::open(&choice, &name).await.unwrap();
    let long = Duration::from_secs(60);
    assert_eq!(a.lease("a", long).await, Ok(true));
    assert_eq!(b.lease("b", long).await, Ok(false), "{kind:?}: held by a");
    assert_eq!(a.lease("a", long).await, Ok(true), "{kind:?}: renewed");
    assert_eq!(
        b.set_position("b", "app", 9).await,
        Ok(false),
        "{kind:?}: not the holder"
    );
    assert_eq!(a.set_position("a", "app", 7).await, Ok(true));
    assert_eq!(b.position("app").await, Ok(Some(7)), "{kind:?}: shared");
    assert_eq!(b.position("repo:o/r:1").await, Ok(None));
    // A restart (a fresh handle) resumes from the position.
    let c = Shared::open(&choice, &name).await.unwrap();
    assert_eq!(c.position("app").await, Ok(Some(7)));
    // The holder stops renewing (a short lease, then silence): another replica takes over.
    assert_eq!(a.lease("a", Duration::from_millis(200)).await, Ok(true));
    harness::eventually("the lease expires", Duration::from_secs(10), || async {
        (b.lease("b", long).await == Ok(true)).then_some(())
    })
    .await;
    assert_eq!(
        a.set_position("a", "app", 8).await,
        Ok(false),
        "{kind:?}: fenced"
    );
    assert_eq!(c.position("app").await, Ok(Some(7)));
}

#[tokio::test]
async fn lease_and_positions_on_redis() {
    lease_and_positions(Kind::Redis).await;
}

#[tokio::test]
async fn lease_and_positions_on_postgres() {
    lease_and_positions(Kind::Postgres).await;
}

fn reconcile_config(fake: &FakeGitHub) -> Config {
    Config {
        api_url: fake.base.clone(),
        app: Some((APP_ID.to_owned(), Secret::new(Some(Arc::from(KEY_PEM))))),
        hooks: Vec::new(),
        token: None,
        ca_bundle: None,
        interval: Duration::from_secs(300),
        horizon: Duration::from_secs(3600),
        settle: Duration::ZERO,
        per_page: 4,
    }
}

async fn two_replicas_redeliver_once(kind: Kind) {
    let Some(choice) = shared(kind) else { return };
    let name = unique("reconcile-replicas");
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    let mut failed = Vec::new();
    for i in 0..6u64 {
        failed.push(
            fake.deliver("pull_request", harness::pr("o/r", 1 + i))
                .await,
        );
    }
    let cfg = config(16);
    let opts = options(Duration::from_millis(10), Duration::from_secs(60), 8);
    let one = replica(&choice, &name, &cfg, &opts).await;
    let two = replica(&choice, &name, &cfg, &opts).await;
    fake.log().router = format!("{}/webhook", base(&one));
    let mut ra = Reconciler::new(
        one.app().clone(),
        reconcile_config(&fake),
        Shared::open(&choice, &name).await.unwrap(),
    )
    .unwrap();
    let mut rb = Reconciler::new(
        two.app().clone(),
        reconcile_config(&fake),
        Shared::open(&choice, &name).await.unwrap(),
    )
    .unwrap();
    let (pa, pb) = tokio::join!(ra.pass(), rb.pass());
    let (pa, pb) = (pa.unwrap(), pb.unwrap());
    fake.settled().await;
    assert!(pa.leased != pb.leased, "{kind:?}: {pa:?} {pb:?}");
    assert_eq!(
        pa.redelivered + pb.redelivered,
        6,
        "{kind:?}: {pa:?} {pb:?}"
    );
    for g in &failed {
        let codes: Vec<u16> = fake.attempts_of(g).iter().map(|a| a.status_code).collect();
        assert_eq!(codes, [0, 202], "{kind:?} {g}: redelivered once, admitted");
    }
    // The other replica's pass (the holder's lease still runs) redelivers nothing.
    let (pa, pb) = (ra.pass().await.unwrap(), rb.pass().await.unwrap());
    fake.settled().await;
    assert_eq!(pa.redelivered + pb.redelivered, 0);
    assert_eq!(fake.log().redeliver_requests.len(), 6);
    one.shutdown(Duration::from_secs(5)).await;
    two.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn two_replicas_redeliver_once_on_redis() {
    two_replicas_redeliver_once(Kind::Redis).await;
}

#[tokio::test]
async fn two_replicas_redeliver_once_on_postgres() {
    two_replicas_redeliver_once(Kind::Postgres).await;
}
