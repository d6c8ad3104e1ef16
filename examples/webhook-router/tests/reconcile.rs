//! The reconciler of failed deliveries against a fake GitHub (tests/fake_github): a router that was
//! down recovers every delivery, exactly once; what the registry knows is not redelivered; a 403
//! secondary rate limit is waited out; two replicas do not both redeliver; two hooks' copies of
//! one GUID are two deliveries; a redelivery GitHub drops is chased until the registry knows it,
//! and one the router never gets is redelivered ever more rarely, then given up for good.

mod common;
mod fake_github;

use std::sync::Arc;
use std::time::Duration;

use common::{pr, start, Setup};
use fake_github::{nowhere, FakeGitHub, APP_ID, KEY_PEM, OTHER_KEY_PEM};
use reqwest::StatusCode;
use webhook_router::app::App;
use webhook_router::github;
use webhook_router::reconcile::chase::backoff;
use webhook_router::reconcile::shared::Shared;
use webhook_router::reconcile::{Config, Pass, Reconciler, DEFAULT_CHASE_BACKOFF};
use webhook_router::secrets::Secret;

const SECRET: &str = "s3cret";

fn config(fake: &FakeGitHub, key: &[u8]) -> Config {
    Config {
        api_url: fake.base.clone(),
        app: Some((APP_ID.to_owned(), Secret::new(Some(Arc::from(key))))),
        hooks: Vec::new(),
        token: None,
        ca_bundle: None,
        interval: Duration::from_secs(300),
        horizon: Duration::from_secs(3600),
        settle: Duration::ZERO,
        // Small pages: a burst spans several, through the Link header's cursor.
        per_page: 4,
        chase_backoff: DEFAULT_CHASE_BACKOFF,
    }
}

fn reconciler(app: &App, fake: &FakeGitHub, shared: &Shared) -> Reconciler {
    Reconciler::new(app.for_reconciler(), config(fake, KEY_PEM), shared.clone()).unwrap()
}

fn setup() -> Setup {
    Setup {
        secret: Some(SECRET),
        capacity: 32,
        ..Setup::default()
    }
}

/// Status codes of `guid`'s attempts, oldest first.
fn statuses(fake: &FakeGitHub, guid: &str) -> Vec<u16> {
    fake.attempts_of(guid)
        .iter()
        .map(|a| a.status_code)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_router_down_for_a_burst_recovers_every_delivery_exactly_once() {
    let down = nowhere().await;
    let fake = FakeGitHub::start(down, Some(SECRET)).await;
    // The burst: 10 deliveries on 5 pull requests while the router is down.
    let mut failed = Vec::new();
    for i in 0..10u64 {
        failed.push(fake.deliver("pull_request", pr("o/r", 1 + i % 5)).await);
    }
    for g in &failed {
        assert_eq!(statuses(&fake, g), [0], "sent while the router was down");
    }
    // The router (re)starts; GitHub does not retry by itself.
    let h = start(setup()).await;
    fake.log().router = format!("{}/webhook", h.base);
    let ok = fake.deliver("pull_request", pr("o/r", 9)).await;
    assert_eq!(statuses(&fake, &ok), [202]);

    let shared = Shared::default();
    let mut r = reconciler(h.server.app(), &fake, &shared);
    let pass = r.pass().await.unwrap();
    fake.settled().await;
    assert!(pass.leased);
    assert_eq!(pass.redelivered, 10, "{pass:?}");
    assert_eq!(pass.guids, 11);
    assert!(pass.pages >= 3, "11 attempts at 4 a page: {pass:?}");
    for g in &failed {
        // One redelivery each, admitted (202), none a duplicate.
        assert_eq!(statuses(&fake, g), [0, 202], "{g}");
    }
    assert_eq!(
        statuses(&fake, &ok),
        [202],
        "a delivered GUID is not redelivered"
    );
    assert_eq!(h.server.app().metrics().reconciled("redelivered"), 10);

    // The next pass finds every latest attempt succeeded: nothing more is sent.
    let again = r.pass().await.unwrap();
    fake.settled().await;
    assert_eq!(again.redelivered, 0, "{again:?}");
    for g in &failed {
        assert_eq!(fake.attempts_of(g).len(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn guids_the_registry_knows_are_not_redelivered() {
    let h = start(setup()).await;
    let fake = FakeGitHub::start(format!("{}/webhook", h.base), Some(SECRET)).await;
    // The router admitted these, but GitHub logged them failed (its 10 s timeout, say).
    fake.log().log_as_failed = true;
    let mut admitted = Vec::new();
    for i in 0..3u64 {
        admitted.push(fake.deliver("pull_request", pr("o/r", 20 + i)).await);
    }
    fake.log().log_as_failed = false;
    let shared = Shared::default();
    let mut r = reconciler(h.server.app(), &fake, &shared);
    let pass = r.pass().await.unwrap();
    fake.settled().await;
    assert_eq!((pass.known, pass.redelivered), (3, 0), "{pass:?}");
    assert!(fake.log().redeliver_requests.is_empty());
    // The probe left no claim behind that would change the answer: each GUID is still a
    // duplicate, not admitted afresh.
    for g in &admitted {
        let a = fake.attempts_of(g);
        assert_eq!(a.len(), 1);
        let res = h
            .http
            .post(format!("{}/webhook", h.base))
            .header("content-type", "application/json")
            .header(github::EVENT_HEADER, "pull_request")
            .header(github::DELIVERY_HEADER, g.as_str())
            .header(github::HOOK_ID_HEADER, fake_github::HOOK_ID.to_string())
            .header(
                github::SIGNATURE_HEADER,
                github::sign(
                    SECRET.as_bytes(),
                    &serde_json::to_vec(&a[0].payload).unwrap(),
                ),
            )
            .body(serde_json::to_vec(&a[0].payload).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{g} is a duplicate");
    }
}

#[tokio::test(start_paused = true)]
async fn a_secondary_rate_limit_is_waited_out() {
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    let g = fake.deliver("pull_request", pr("o/r", 1)).await;
    let h = start(setup()).await;
    fake.log().router = format!("{}/webhook", h.base);
    {
        let mut log = fake.log();
        log.throttle = 2;
        log.retry_after = 90;
    }
    let mut r = reconciler(h.server.app(), &fake, &Shared::default());
    let pass = r.pass().await.unwrap();
    fake.settled().await;
    assert_eq!(pass.rate_limited, 2, "{pass:?}");
    assert_eq!(pass.redelivered, 1, "{pass:?}");
    assert_eq!(statuses(&fake, &g), [0, 202]);
    let calls = fake.log().calls.clone();
    let statuses: Vec<u16> = calls.iter().map(|c| c.status).collect();
    assert_eq!(&statuses[..3], [403, 403, 200], "{calls:?}");
    // Each retry came after the Retry-After the 403 asked for (tokio's paused clock).
    for w in calls.windows(2).take(2) {
        assert!(
            w[1].at - w[0].at >= Duration::from_secs(90),
            "retried after {:?}",
            w[1].at - w[0].at
        );
    }
    assert_eq!(h.server.app().metrics().reconciled("rate_limited"), 2);
}

#[tokio::test(start_paused = true)]
async fn two_replicas_do_not_both_redeliver() {
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    let mut failed = Vec::new();
    for i in 0..6u64 {
        failed.push(fake.deliver("pull_request", pr("o/r", 1 + i)).await);
    }
    let h = start(setup()).await;
    fake.log().router = format!("{}/webhook", h.base);
    // Two replicas' reconcilers on one shared state (here in one process).
    let shared = Shared::default();
    let mut a = reconciler(h.server.app(), &fake, &shared);
    let mut b = reconciler(h.server.app(), &fake, &shared);
    let (pa, pb) = tokio::join!(a.pass(), b.pass());
    let (pa, pb): (Pass, Pass) = (pa.unwrap(), pb.unwrap());
    fake.settled().await;
    assert!(pa.leased != pb.leased, "one holds the lease: {pa:?} {pb:?}");
    assert_eq!(pa.redelivered + pb.redelivered, 6);
    for g in &failed {
        assert_eq!(statuses(&fake, g), [0, 202], "{g}: redelivered once");
    }
    // The holder keeps the lease from pass to pass; the other still does nothing.
    let (pa, pb) = (a.pass().await.unwrap(), b.pass().await.unwrap());
    assert!(pa.leased != pb.leased);
    assert_eq!(fake.log().redeliver_requests.len(), 6);
}

#[tokio::test(start_paused = true)]
async fn a_jwt_signed_by_another_key_is_refused_and_nothing_advances() {
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    fake.deliver("pull_request", pr("o/r", 1)).await;
    let h = start(setup()).await;
    fake.log().router = format!("{}/webhook", h.base);
    let shared = Shared::default();
    let mut bad = Reconciler::new(
        h.server.app().for_reconciler(),
        config(&fake, OTHER_KEY_PEM),
        shared.clone(),
    )
    .unwrap();
    let pass = bad.pass().await.unwrap();
    assert_eq!((pass.errors, pass.redelivered), (1, 0), "{pass:?}");
    assert_eq!(shared.position("app").await.unwrap(), None);
    assert_eq!(fake.log().calls[0].status, 401);
}

/// Issue 37: the App key read again from its file (the `Secret` replaced): the next JWT is
/// minted with the new key, without restarting the reconciler. A wrong key is refused by GitHub
/// (401), the right one put back works.
#[tokio::test(start_paused = true)]
async fn a_replaced_app_key_signs_the_next_jwt() {
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    fake.deliver("pull_request", pr("o/r", 1)).await;
    let h = start(setup()).await;
    fake.log().router = format!("{}/webhook", h.base);
    let cfg = config(&fake, OTHER_KEY_PEM);
    let key = cfg.app.as_ref().unwrap().1.clone();
    let mut r = Reconciler::new(h.server.app().for_reconciler(), cfg, Shared::default()).unwrap();
    let pass = r.pass().await.unwrap();
    assert_eq!((pass.errors, pass.redelivered), (1, 0), "{pass:?}");
    key.replace(Arc::from(KEY_PEM), false);
    let pass = r.pass().await.unwrap();
    assert_eq!((pass.errors, pass.redelivered), (0, 1), "{pass:?}");
}

#[tokio::test(start_paused = true)]
async fn two_hooks_copies_of_one_guid_are_both_admitted() {
    let h = start(setup()).await;
    let payload = serde_json::to_vec(&pr("o/r", 5)).unwrap();
    let send = |hook: Option<&'static str>| {
        let mut req = h
            .http
            .post(format!("{}/webhook", h.base))
            .header("content-type", "application/json")
            .header(github::EVENT_HEADER, "pull_request")
            .header(
                github::DELIVERY_HEADER,
                "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            )
            .header(
                github::SIGNATURE_HEADER,
                github::sign(SECRET.as_bytes(), &payload),
            )
            .body(payload.clone());
        if let Some(id) = hook {
            req = req.header(github::HOOK_ID_HEADER, id);
        }
        async move { common::answer(req.send().await.unwrap()).await }
    };
    // A repository hook's copy and an organisation hook's copy of one event.
    let repo = send(Some("11")).await;
    let org = send(Some("22")).await;
    assert_eq!(repo.status, StatusCode::ACCEPTED, "{}", repo.body);
    assert_eq!(org.status, StatusCode::ACCEPTED, "{}", org.body);
    assert_eq!(repo.body["outcome"], "assigned");
    assert_eq!(org.body["outcome"], "assigned");
    // Each one's redelivery is still a duplicate.
    assert_eq!(send(Some("11")).await.status, StatusCode::OK);
    assert_eq!(send(Some("22")).await.status, StatusCode::OK);
    // An App's copy (installation target headers, no hook id) is a third.
    let app = h
        .http
        .post(format!("{}/webhook", h.base))
        .header("content-type", "application/json")
        .header(github::EVENT_HEADER, "pull_request")
        .header(
            github::DELIVERY_HEADER,
            "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        )
        .header(github::HOOK_TARGET_TYPE_HEADER, "integration")
        .header(github::HOOK_TARGET_ID_HEADER, "4242")
        .header(
            github::SIGNATURE_HEADER,
            github::sign(SECRET.as_bytes(), &payload),
        )
        .body(payload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(app.status(), StatusCode::ACCEPTED);
    // A malformed hook id is refused before the body is read.
    assert_eq!(send(Some("x1")).await.status, StatusCode::BAD_REQUEST);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_reconciler_resumes_from_the_shared_position() {
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    for i in 0..9u64 {
        fake.deliver("pull_request", pr("o/r", 1 + i % 3)).await;
    }
    let h = start(setup()).await;
    fake.log().router = format!("{}/webhook", h.base);
    let shared = Shared::default();
    let mut r1 = reconciler(h.server.app(), &fake, &shared);
    let first = r1.pass().await.unwrap();
    fake.settled().await;
    assert_eq!((first.redelivered, first.pages), (9, 3), "{first:?}");
    let newest = fake.log().attempts.iter().map(|a| a.id).max().unwrap();
    assert!(shared.position("app").await.unwrap().is_some());
    // The replica shuts down (giving its lease up), one more delivery fails while the router is
    // down; then a new reconciler (the restarted replica) on the same shared state reads only
    // what is newer than the position.
    r1.spawn().stop().await;
    fake.log().router = nowhere().await;
    let late = fake.deliver("pull_request", pr("o/r", 7)).await;
    fake.log().router = format!("{}/webhook", h.base);
    let second = reconciler(h.server.app(), &fake, &shared)
        .pass()
        .await
        .unwrap();
    fake.settled().await;
    assert_eq!(second.redelivered, 1, "{second:?}");
    // It stopped at the position: the first pass's 9 redeliveries (newer than the position it
    // set) and the late one are read (3 pages of 4), not the 9 originals (5 pages).
    assert_eq!((second.guids, second.pages), (10, 3), "{second:?}");
    assert_eq!(statuses(&fake, &late), [0, 202]);
    assert!(shared.position("app").await.unwrap().unwrap() > newest);
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_primary_rate_limit_is_waited_for_until_its_reset() {
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    for i in 0..6u64 {
        fake.deliver("pull_request", pr("o/r", 1 + i)).await;
    }
    let h = start(setup()).await;
    fake.log().router = format!("{}/webhook", h.base);
    // The first page's answer says the limit is spent for two minutes.
    fake.log().exhaust_for = Some(120);
    let mut r = reconciler(h.server.app(), &fake, &Shared::default());
    let pass = r.pass().await.unwrap();
    fake.settled().await;
    assert_eq!(pass.redelivered, 6, "{pass:?}");
    let calls = fake.log().calls.clone();
    let waited = calls[1].at - calls[0].at;
    // The reset is in whole seconds of the wall clock; the wait is on tokio's paused clock.
    assert!(
        waited >= Duration::from_secs(118),
        "the next call came {waited:?} after the exhausted answer"
    );
    // Only that one wait: the later calls follow at once.
    assert!(calls[2].at - calls[1].at < Duration::from_secs(1));
}

/// The gap the reconciler left: GitHub accepts a redeliver request and never sends it, so nothing
/// new is logged and the position has moved past the failure. The GUID is chased: checked again
/// once its backoff has passed (not before), redelivered again while the registry does not know
/// it, and no longer chased once the router has accepted it (its 202 in the log).
#[tokio::test(start_paused = true)]
async fn a_dropped_redelivery_is_chased_until_the_registry_knows_it() {
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    let mut failed = Vec::new();
    for i in 0..3u64 {
        failed.push(fake.deliver("pull_request", pr("o/r", 1 + i)).await);
    }
    let h = start(setup()).await;
    {
        let mut log = fake.log();
        log.router = format!("{}/webhook", h.base);
        log.drop_redeliveries = 2;
    }
    let shared = Shared::default();
    let mut r = reconciler(h.server.app(), &fake, &shared);
    let first = r.pass().await.unwrap();
    fake.settled().await;
    assert_eq!((first.redelivered, first.chasing), (3, 3), "{first:?}");
    let dropped: Vec<&String> = failed
        .iter()
        .filter(|g| statuses(&fake, g) == [0])
        .collect();
    assert_eq!(dropped.len(), 2, "GitHub lost two redeliveries");
    assert!(shared.position("app").await.unwrap().is_some());

    // The one admitted is caught from its 202 in the log; within the backoff nothing is sent
    // again and nothing is probed.
    let early = r.pass().await.unwrap();
    assert_eq!(
        (
            early.redelivered,
            early.redelivered_again,
            early.caught,
            early.chasing
        ),
        (0, 0, 1, 2),
        "{early:?}"
    );
    assert_eq!(h.server.app().metrics().reconcile_chasing(), 2);

    tokio::time::advance(DEFAULT_CHASE_BACKOFF).await;
    let due = r.pass().await.unwrap();
    fake.settled().await;
    assert_eq!(
        (due.caught, due.redelivered_again, due.chasing),
        (0, 2, 2),
        "the two dropped are sent again: {due:?}"
    );
    for g in &failed {
        assert_eq!(statuses(&fake, g), [0, 202], "{g}");
    }
    let last = r.pass().await.unwrap();
    assert_eq!(
        (last.caught, last.redelivered_again, last.chasing),
        (2, 0, 0),
        "{last:?}"
    );
    let m = h.server.app().metrics();
    assert_eq!(
        (
            m.reconciled("redelivered"),
            m.reconciled("redelivered_again"),
            m.reconciled("caught"),
            m.reconcile_chasing()
        ),
        (3, 2, 3, 0)
    );
    assert_eq!(fake.log().redeliver_requests.len(), 5);
}

/// A GUID the router never gets (GitHub cannot reach it): redelivered at most once per backoff,
/// the backoff doubling (1, 2, 4 minutes); once its first failure is out of the horizon, given up
/// (counted, the chase gauge back to 0) and kept as given up, so a later failed attempt of it
/// starts no new chase.
#[tokio::test(start_paused = true)]
async fn a_guid_never_delivered_is_redelivered_ever_more_rarely_then_given_up() {
    let fake = FakeGitHub::start(nowhere().await, Some(SECRET)).await;
    let g = fake.deliver("pull_request", pr("o/r", 1)).await;
    // The router runs, but GitHub's URL for it is still wrong: every redelivery fails.
    let h = start(setup()).await;
    let shared = Shared::default();
    let mut r = reconciler(h.server.app(), &fake, &shared);
    let started = tokio::time::Instant::now();
    let mut sent_at = Vec::new();
    // A pass every 10 s for 8 minutes.
    for _ in 0..48 {
        let p = r.pass().await.unwrap();
        fake.settled().await;
        assert_eq!(p.chasing, 1, "{p:?}");
        for _ in 0..p.redelivered + p.redelivered_again {
            sent_at.push(started.elapsed());
        }
        tokio::time::advance(Duration::from_secs(10)).await;
    }
    assert_eq!(sent_at.len(), 4, "at 0, 1, 3 and 7 minutes: {sent_at:?}");
    for (n, w) in sent_at.windows(2).enumerate() {
        let gap = w[1] - w[0];
        let due = backoff(DEFAULT_CHASE_BACKOFF, n as u32 + 1);
        assert!(
            gap >= due && gap < due + Duration::from_secs(20),
            "redelivery {} came {gap:?} after the one before, due after {due:?}",
            n + 2
        );
    }
    assert_eq!(statuses(&fake, &g), [0, 0, 0, 0, 0]);

    // Its first failure is older than the horizon now (the record says so).
    let mut c = shared.chased("app", &g).await.unwrap().unwrap();
    assert_eq!(c.redeliveries, 4);
    c.failed_at = 0;
    assert_eq!(
        shared.chase(r.holder(), "app", &c, Duration::ZERO).await,
        Ok(true)
    );
    let p = r.pass().await.unwrap();
    assert_eq!(
        (p.gave_up, p.redelivered_again, p.chasing),
        (1, 0, 0),
        "{p:?}"
    );
    assert!(shared.chased("app", &g).await.unwrap().unwrap().given_up);
    assert_eq!(h.server.app().metrics().reconcile_chasing(), 0);
    assert_eq!(h.server.app().metrics().reconciled("gave_up"), 1);

    // A late failed attempt of it (logged after the position moved) starts no new chase.
    {
        let mut log = fake.log();
        let mut late = log.attempts.last().unwrap().clone();
        late.id = log.next_id;
        log.next_id += 1;
        log.attempts.push(late);
    }
    let requests = fake.log().redeliver_requests.len();
    tokio::time::advance(Duration::from_secs(3600)).await;
    let p = r.pass().await.unwrap();
    assert_eq!(
        (p.redelivered, p.redelivered_again, p.chasing),
        (0, 0, 0),
        "{p:?}"
    );
    assert_eq!(fake.log().redeliver_requests.len(), requests);
}
