//! The reconciler's shared state on real Redis and PostgreSQL servers: one lease holder at a
//! time, positions and chased GUIDs written only by the holder and read by every replica (and
//! after a restart), the lease taken over once its holder stops renewing it; two replicas'
//! reconcilers, each with its own connection, redelivering each failed delivery once; and an
//! outage recovered by three replicas while GitHub drops and holds back redeliveries and the
//! reconciling replica is killed mid-recovery.

use std::sync::Arc;
use std::time::Duration;

use super::fake_github::{nowhere, FakeGitHub, APP_ID, KEY_PEM};
use super::harness::{self, base, config, options, replica, shared, unique, Kind, SECRET};
use webhook_router::reconcile::shared::{Chased, Shared};
use webhook_router::reconcile::{Config, Reconciler, DEFAULT_CHASE_BACKOFF};
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
    harness::eventually("the lease expires", || async {
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

/// The chase's records: written only by the lease holder, read by any replica (and a fresh
/// handle), due on the server's clock, given-up ones kept but not counted, per hook.
async fn chased_guids(kind: Kind) {
    let Some(choice) = shared(kind) else { return };
    let name = unique("reconcile-chase");
    let a = Shared::open(&choice, &name).await.unwrap();
    let b = Shared::open(&choice, &name).await.unwrap();
    let long = Duration::from_secs(3600);
    assert_eq!(a.lease("a", long).await, Ok(true));
    let chased = |guid: &str, failed_at| Chased {
        guid: guid.into(),
        attempt: 7,
        key: format!("{guid}@hook-1"),
        targets: vec!["o/r#1".into(), "o/r#2".into()],
        failed_at,
        redeliveries: 1,
        given_up: false,
    };
    let (mut g1, g2) = (chased("g1", 200), chased("g2", 100));
    let hook = "repo:o/r:1";
    assert_eq!(
        b.chase("b", hook, &g1, Duration::ZERO).await,
        Ok(false),
        "{kind:?}: fenced"
    );
    assert_eq!(a.chase("a", hook, &g1, Duration::ZERO).await, Ok(true));
    assert_eq!(a.chase("a", hook, &g2, long).await, Ok(true));
    assert_eq!(b.due(hook, 10).await.unwrap(), [g1.clone()], "{kind:?}");
    assert_eq!(b.chased(hook, "g2").await.unwrap(), Some(g2.clone()));
    let (n, mut shown) = b.chasing(hook, 10).await.unwrap();
    shown.sort();
    assert_eq!((n, shown), (2, vec!["g1".to_owned(), "g2".to_owned()]));
    assert_eq!(b.chasing(hook, 1).await.unwrap().1.len(), 1, "{kind:?}");
    assert_eq!(b.chasing("app", 10).await.unwrap(), (0, vec![]), "per hook");
    // Given up: kept, not due for a long while, not counted.
    g1.given_up = true;
    assert_eq!(a.chase("a", hook, &g1, long).await, Ok(true));
    assert!(b.due(hook, 10).await.unwrap().is_empty());
    assert_eq!(
        b.chasing(hook, 10).await.unwrap(),
        (1, vec!["g2".to_owned()])
    );
    assert_eq!(
        b.forget("b", hook, "g2").await,
        Ok(false),
        "{kind:?}: fenced"
    );
    assert_eq!(a.forget("a", hook, "g2").await, Ok(true));
    let c = Shared::open(&choice, &name).await.unwrap();
    assert_eq!(c.chasing(hook, 10).await.unwrap(), (0, vec![]));
    assert_eq!(c.chased(hook, "g1").await.unwrap(), Some(g1), "{kind:?}");
    assert_eq!(c.chased(hook, "g2").await.unwrap(), None);
}

#[tokio::test]
async fn chased_guids_on_redis() {
    chased_guids(Kind::Redis).await;
}

#[tokio::test]
async fn chased_guids_on_postgres() {
    chased_guids(Kind::Postgres).await;
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
        chase_backoff: DEFAULT_CHASE_BACKOFF,
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
        one.app().for_reconciler(),
        reconcile_config(&fake),
        Shared::open(&choice, &name).await.unwrap(),
    )
    .unwrap();
    let mut rb = Reconciler::new(
        two.app().for_reconciler(),
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

/// Deliveries that fail during the outage.
const OUTAGE: u64 = 12;

/// The chase on a short backoff, so a test sees several rounds of it; a short interval, so the
/// lease lasts its floor (30 s) and a survivor takes it over after that.
fn outage_config(fake: &FakeGitHub) -> Config {
    Config {
        interval: Duration::from_secs(1),
        chase_backoff: Duration::from_millis(200),
        ..reconcile_config(fake)
    }
}

/// Waits until `guid`, sent once more by hand to `router`, is a duplicate that every pull request
/// it names completed.
async fn completed(fake: &FakeGitHub, guid: &str, router: &str, kind: Kind) {
    harness::eventually(&format!("{kind:?} {guid} completed"), || async {
        let (status, body) = fake.resend(guid, router).await?;
        let done = status == 200
            && body["targets"]
                .as_array()
                .is_some_and(|ts| !ts.is_empty() && ts.iter().all(|t| t["state"] == "completed"));
        done.then_some(())
    })
    .await;
}

/// Where each redelivery of `guid` went and how it was answered.
fn attempts(fake: &FakeGitHub, guid: &str) -> Vec<String> {
    fake.attempts_of(guid)
        .iter()
        .map(|a| format!("#{} to {}: {} {}", a.id, a.router, a.status_code, a.answer))
        .collect()
}

/// The outage phase on three replicas of one registry: 12 deliveries fail while the router is
/// down; then GitHub drops the first three redelivery requests and holds the others back, and the
/// replica whose reconciler holds the lease is killed (its lease is not given up, its containers
/// stop) before they are sent, so those sent to it fail. A surviving replica takes the lease over
/// once it expires and carries on chasing from the shared state (the dropped GUIDs are nowhere in
/// GitHub's log after the position), until the registry knows every GUID; each is then completed:
/// 0 lost.
async fn three_replicas_recover_an_outage_with_the_reconciler_killed(kind: Kind) {
    let Some(choice) = shared(kind) else { return };
    let name = unique("reconcile-outage");
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    let mut failed = Vec::new();
    for i in 0..OUTAGE {
        failed.push(
            fake.deliver("pull_request", harness::pr("o/r", 1 + i % 4))
                .await,
        );
    }
    let cfg = config(16);
    let opts = options(Duration::from_millis(10), Duration::from_secs(60), 8);
    let mut servers = Vec::new();
    let mut reconcilers = Vec::new();
    for _ in 0..3 {
        let s = replica(&choice, &name, &cfg, &opts).await;
        let shared = Shared::open(&choice, &name).await.unwrap();
        reconcilers.push(Some(
            Reconciler::new(s.app().for_reconciler(), outage_config(&fake), shared).unwrap(),
        ));
        servers.push(Some(s));
    }
    let routers: Vec<String> = servers
        .iter()
        .flatten()
        .map(|s| format!("{}/webhook", base(s)))
        .collect();
    {
        let mut log = fake.log();
        log.routers = routers.clone();
        log.drop_redeliveries = 3;
        log.redelivery_delay = Duration::from_millis(100);
    }
    fake.hold_redeliveries();
    let [Some(a), Some(b), Some(c)] = &mut reconcilers[..] else {
        unreachable!()
    };
    let (pa, pb, pc) = tokio::join!(a.pass(), b.pass(), c.pass());
    let first = [pa.unwrap(), pb.unwrap(), pc.unwrap()];
    let holder = first
        .iter()
        .position(|p| p.leased)
        .expect("one holds the lease");
    assert_eq!(first.iter().filter(|p| p.leased).count(), 1, "{first:?}");
    assert_eq!(
        (first[holder].redelivered, first[holder].chasing),
        (OUTAGE, OUTAGE),
        "{kind:?}: {first:?}"
    );

    // Mid-recovery: the reconciling replica dies; then GitHub sends what it held back.
    servers[holder].take().unwrap().kill().await;
    reconcilers[holder] = None;
    fake.release_redeliveries();
    fake.settled().await;
    let dead = &routers[holder];
    assert!(
        fake.log()
            .attempts
            .iter()
            .any(|a| &a.router == dead && a.status_code == 0),
        "{kind:?}: some redeliveries reached the killed replica"
    );

    // The survivors pass in turn until one holds the lease and finds nothing left to chase.
    let hang = std::time::Instant::now() + Duration::from_secs(300);
    let (taker, last) = loop {
        let mut leased = None;
        for (i, r) in reconcilers.iter_mut().enumerate() {
            if let Some(r) = r {
                let p = r.pass().await.unwrap();
                if p.leased {
                    leased = Some((i, p));
                }
            }
        }
        if let Some((i, p)) = leased {
            if p.chasing == 0 && p.errors == 0 {
                break (i, p);
            }
        }
        if std::time::Instant::now() > hang {
            let s = Shared::open(&choice, &name).await.unwrap();
            let chased = s.chasing("app", 100).await.unwrap();
            let detail: Vec<String> = chased
                .1
                .iter()
                .map(|g| format!("{g}: {:?}", attempts(&fake, g)))
                .collect();
            panic!("{kind:?}: still chasing {chased:?} after 300 s: {leased:?}\n{detail:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(taker, holder, "{kind:?}: {last:?}");
    fake.settled().await;

    // 0 lost: every GUID, sent once more as by hand, is a duplicate its pull request completed.
    for g in &failed {
        completed(&fake, g, &routers[taker], kind).await;
    }
    // The dropped ones were found again only through the chase: each has an admitted attempt.
    let dropped = fake.log().dropped.clone();
    assert_eq!(dropped.len(), 3);
    for id in dropped {
        let guid = fake
            .log()
            .attempts
            .iter()
            .find(|a| a.id == id)
            .unwrap()
            .guid
            .clone();
        assert!(
            fake.attempts_of(&guid).iter().any(|a| a.status_code == 202),
            "{kind:?} {guid}: {:?}",
            attempts(&fake, &guid)
        );
    }
    // Every redeliver request is counted: once each in `redelivered`, the rest in
    // `redelivered_again`, by whichever replica made it.
    let again: u64 = servers
        .iter()
        .flatten()
        .map(|s| s.app().metrics().reconciled("redelivered_again"))
        .sum();
    assert!(again >= 3, "{kind:?}: the dropped ones at least");
    assert_eq!(
        fake.log().redeliver_requests.len() as u64,
        OUTAGE + again,
        "{kind:?}"
    );
    for s in servers.into_iter().flatten() {
        s.shutdown(Duration::from_secs(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_recover_an_outage_with_the_reconciler_killed_on_redis() {
    three_replicas_recover_an_outage_with_the_reconciler_killed(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_recover_an_outage_with_the_reconciler_killed_on_postgres() {
    three_replicas_recover_an_outage_with_the_reconciler_killed(Kind::Postgres).await;
}

/// A redelivery the router parks in the waiting room (no capacity) is answered 202: the next pass
/// finds that in the log and stops chasing the GUID, without probing it (a bare claim of a parked
/// pair reads as unknown on the shared backends, and one taken while a promotion runs would take
/// the delivery out of the room). Once room is made, the parked delivery is completed.
async fn a_parked_redelivery_is_caught_not_probed(kind: Kind) {
    let Some(choice) = shared(kind) else { return };
    let name = unique("reconcile-parked");
    let cfg = harness::configured(1, harness::PATIENT_MISSED, 16);
    let opts = options(Duration::from_millis(10), Duration::from_secs(3600), 8);
    let router = replica(&choice, &name, &cfg, &opts).await;
    let b = base(&router);
    let http = harness::client();
    // The one slot is taken by PR 1's worker, idle for an hour.
    let busy = harness::deliver(&http, &b, "p-1", &harness::pr("o/r", 1)).await;
    assert_eq!(busy.status, reqwest::StatusCode::ACCEPTED, "{}", busy.body);
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    let g = fake.deliver("pull_request", harness::pr("o/r", 2)).await;
    fake.log().router = format!("{b}/webhook");
    let cfg = Config {
        chase_backoff: Duration::ZERO,
        ..reconcile_config(&fake)
    };
    let shared = Shared::open(&choice, &name).await.unwrap();
    let mut r = Reconciler::new(router.app().for_reconciler(), cfg, shared).unwrap();
    let first = r.pass().await.unwrap();
    fake.settled().await;
    assert_eq!(
        (first.redelivered, first.chasing),
        (1, 1),
        "{kind:?}: {first:?}"
    );
    let parked = fake.attempts_of(&g);
    assert!(
        parked.last().is_some_and(|a| a.answer.contains("waiting")),
        "{kind:?}: parked: {}",
        attempts(&fake, &g).join("; ")
    );
    // Due at once (a zero backoff), but caught from the log first: no probe, no redelivery.
    let second = r.pass().await.unwrap();
    fake.settled().await;
    assert_eq!(
        (second.caught, second.redelivered_again, second.chasing),
        (1, 0, 0),
        "{kind:?}: {second:?}; {}",
        attempts(&fake, &g).join("; ")
    );
    assert_eq!(fake.log().redeliver_requests.len(), 1);
    // Room is made: PR 1's worker drains and exits, and the parked delivery is promoted.
    let w = busy.worker();
    let drained = http
        .post(format!("{b}/workers/{w}/drain"))
        .bearer_auth(harness::TOKEN)
        .send()
        .await
        .unwrap();
    assert!(drained.status().is_success(), "{}", drained.status());
    completed(&fake, &g, &format!("{b}/webhook"), kind).await;
    router.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_redelivery_is_caught_not_probed_on_redis() {
    a_parked_redelivery_is_caught_not_probed(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_redelivery_is_caught_not_probed_on_postgres() {
    a_parked_redelivery_is_caught_not_probed(Kind::Postgres).await;
}
