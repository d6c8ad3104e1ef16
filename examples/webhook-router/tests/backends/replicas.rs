//! Several router replicas on one shared registry: the simulator's 3-replica audit (one replica
//! killed mid-run), forwarding between replicas that each run their own containers (an event's
//! payload included), and claims that survive a restart of every replica (Redis with AOF); and
//! the simulator's audit of the bodies workers ran on, on the in-memory registry.

use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use reqwest::StatusCode;
use webhook_router::app::Options;
use webhook_router::backend::RegistryChoice;
use webhook_router::mailbox::Handover;
use webhook_router::runs::digest;
use webhook_router::server::Server;
use webhook_router::sim::{self, Plan, Probe};
use webhook_router::worker::Job;
use worker_registry::{
    Activity, Admission, DeliveryId, Payload, RegistryConfig, Target, WorkerId, WorkerRegistry,
};

use crate::harness::*;
use crate::hold::Hold;

/// Three router replicas in this process on the registry `name`, on loopback ports.
async fn three_replicas(
    choice: &RegistryChoice,
    name: &str,
    config: &RegistryConfig,
    options: &Options,
) -> (Vec<Server>, Probe) {
    sim::start(
        choice,
        name,
        config,
        options,
        Default::default(),
        loopback(),
        3,
    )
    .await
    .expect("three replicas start")
}

/// A small `--simulate` run's plan: `events` deliveries at 300/s over 8 clients to 16 pull
/// requests, `redeliveries` of them resent, workers crashed and drained every few heartbeats.
fn small_plan(
    choice: &RegistryChoice,
    name: String,
    events: usize,
    redeliveries: f64,
    seed: u64,
) -> Plan {
    Plan {
        events,
        rate: 300,
        clients: 8,
        repos: 4,
        prs: 4,
        redeliveries,
        crash_every: HEARTBEAT * 3,
        drain_every: HEARTBEAT * 4,
        max_time: Duration::from_secs(20),
        seed,
        secret: SECRET.as_bytes().to_vec(),
        admin_token: Some(TOKEN.to_owned()),
        shutdown_deadline: Duration::from_secs(2),
        registry: choice.to_string(),
        registry_name: name,
        workers: None,
    }
}

/// `--simulate --replicas 3`, smaller: three replicas in this process on one registry, each
/// delivery and its redeliveries sent to different replicas, workers crashed and drained, the
/// third replica killed when half the traffic is sent; the audit must pass and show the kill.
async fn three_replicas_audit(kind: Kind) {
    let Some(choice) = shared(kind) else {
        return;
    };
    let name = unique("audit");
    let config = config(12);
    let options = options(Duration::from_millis(20), HEARTBEAT * 2, 16);
    let (servers, probe) = three_replicas(&choice, &name, &config, &options).await;
    let plan = small_plan(&choice, name, 600, 0.15, 7);
    let report = sim::run(servers, plan, probe).await;
    // Settled: the server held nothing unfinished before the audit (else the audit would judge
    // work still being re-dispatched).
    assert_eq!(
        report.settle_cut,
        None,
        "not settled within {:?}: {report:?}",
        sim::SETTLE_CAP
    );
    assert!(report.passed(), "the audit failed: {report:?}");
    assert!(report.killed.is_some(), "a replica was killed: {report:?}");
    assert!(report.accepted > 300, "{report:?}");
    assert_eq!(report.completed, report.accepted, "{report:?}");
    assert_eq!(report.containers.max_per_worker, 1);
    assert!(
        report.samples > 10,
        "capacity sampled throughout: {report:?}"
    );
    assert!(report.crashes > 0 && report.died > 0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_audit_on_redis() {
    three_replicas_audit(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_audit_on_postgres() {
    three_replicas_audit(Kind::Postgres).await;
}

/// `--simulate` on the in-memory registry (which keeps payloads): workers crashed and drained,
/// deliveries parked and promoted; the audit compares, for every completed delivery, the body
/// its worker ran on with the body sent, and finds every one equal, released and promoted ones
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_on_memory_finds_every_body_as_sent() {
    let choice = RegistryChoice::Memory;
    let name = unique("bodies");
    let config = configured(6, MISSED, 256);
    let options = options(Duration::from_millis(20), HEARTBEAT * 2, 16);
    let (servers, probe) = sim::start(
        &choice,
        &name,
        &config,
        &options,
        Default::default(),
        loopback(),
        1,
    )
    .await
    .expect("the router starts");
    let plan = small_plan(&choice, name, 600, 0.1, 5);
    let report = sim::run(servers, plan, probe).await;
    let b = &report.bodies;
    assert!(b.mismatched.is_empty(), "{:?}", b.mismatched);
    assert!(b.matched > 300, "{report:?}");
    assert!(
        b.handed_on > 0,
        "released or promoted ones checked too: {report:?}"
    );
    assert!(report.promoted > 0 && report.crashes > 0, "{report:?}");
    assert_eq!(report.completed, report.accepted, "{report:?}");
}

/// The simulator's summary reports the waiting room as the server holds it: with two slots for
/// three replicas the room fills, the third replica is killed while deliveries wait, and once
/// the run has settled the summary's "still waiting" is what a fresh handle on the registry
/// reads, not the replicas' gauges summed (the killed replica's frozen one included).
async fn three_replicas_report_the_room_the_server_holds(kind: Kind) {
    let Some(choice) = shared(kind) else {
        return;
    };
    let name = unique("room");
    let config = configured(2, MISSED, 512);
    let options = options(Duration::from_millis(20), HEARTBEAT * 2, 16);
    let (servers, probe) = three_replicas(&choice, &name, &config, &options).await;
    let plan = small_plan(&choice, name.clone(), 300, 0.1, 11);
    let report = sim::run(servers, plan, probe).await;
    assert!(report.passed(), "the audit failed: {report:?}");
    assert!(report.killed.is_some(), "a replica was killed: {report:?}");
    assert!(report.parked > 0, "the room was used: {report:?}");
    let fresh = open_registry(&choice, &config, &name).await;
    assert_eq!(
        report.waiting,
        fresh.status().waiting,
        "the summary's room is the server's: {report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_report_the_room_the_server_holds_on_redis() {
    three_replicas_report_the_room_the_server_holds(Kind::Redis).await;
}

// Not yet on PostgreSQL: there the settle phase's `Store::unfinished` does not count the
// waiting room, so this run settles with deliveries still waiting and the audit fails.

/// Replicas as separate processes would be (each its own containers, reaching the others'
/// through the owner records and `POST /internal/workers/{id}/jobs`): a sticky event that lands
/// on the other replica is forwarded to the owner's container; an event for a worker whose owner
/// was killed is accepted, and once the sweep declares the worker dead it is re-dispatched to a
/// new worker on the surviving replica; an event for a worker nobody published is refused with a
/// 503 and no claim left behind.
async fn forwarding(kind: Kind) {
    let Some(choice) = shared(kind) else {
        return;
    };
    let name = unique("fwd");
    // Patient: the owner's worker must still be alive (and sticky) a moment after the kill, however
    // long a loaded machine takes to deliver in between.
    let config = patient_config(8);
    let options = options(Duration::from_millis(20), Duration::from_secs(3600), 8);
    let a = replica(&choice, &name, &config, &options).await;
    let b = replica(&choice, &name, &config, &options).await;
    let (ba, bb) = (base(&a), base(&b));
    let http = client();

    let first = deliver(&http, &ba, "f-1", &pr("o/r", 1)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    assert_eq!(first.body["new"], true);
    let w = first.worker();
    let second = deliver(&http, &bb, "f-2", &pr("o/r", 1)).await;
    assert_eq!(second.status, StatusCode::ACCEPTED, "{}", second.body);
    assert_eq!((second.worker(), &second.body["new"]), (w, &false.into()));
    let id = WorkerId::new(w);
    assert!(a.app().containers().is_running(id), "A runs the container");
    assert!(!b.app().containers().is_running(id), "B never started one");
    for d in ["f-1", "f-2"] {
        eventually(&format!("{d} completed"), || async {
            let again = deliver(&http, &bb, d, &pr("o/r", 1)).await;
            again.completed().then_some(())
        })
        .await;
    }

    // An event that carries its payload reaches the owner's container with the body as sent:
    // admitted through B's handle (sticky on A's worker), forwarded by B's `Remote` to A.
    a.app().containers().runs().keep();
    let (t, d) = (
        Target::new("o/r", 1).unwrap(),
        DeliveryId::new("f-body").unwrap(),
    );
    let Ok(Admission::Assigned(placed)) = b.app().registry().admit(&t, &d).await else {
        panic!("f-body is placed on the live worker");
    };
    assert_eq!(placed.worker, id);
    let sent = b"{\n  \"action\": \"synchronize\",\n  \"raw\": \"\\u00e9\\n\"\n}\n\0\xff".to_vec();
    let payload = Payload::builder("pull_request", sent.clone())
        .action("synchronize")
        .header("X-GitHub-Delivery", "f-body")
        .header(
            "X-Hub-Signature-256",
            webhook_router::github::sign(b"s", &sent),
        )
        .build()
        .unwrap();
    let job = Job {
        target: t.clone(),
        event: d.clone(),
        token: placed.token,
        trace: Default::default(),
        payload: Some(payload.clone()),
    };
    let remote = b.app().remote().expect("B forwards");
    assert_eq!(remote.post(&ba, id, job).await, Handover::Queued);
    let runs = eventually("f-body run on A", || async {
        let r = a.app().containers().runs().of(&t, &d);
        (!r.is_empty()).then_some(r)
    })
    .await;
    assert_eq!(
        (runs[0].worker, runs[0].body),
        (id, Some(digest(&sent))),
        "A's worker ran on the bytes B forwarded"
    );

    // The internal endpoint takes the admin token.
    let open = http
        .post(format!("{ba}/internal/workers/{w}/jobs"))
        .json(&serde_json::json!({"target": "o/r#1", "delivery": "x", "token": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(open.status(), StatusCode::UNAUTHORIZED);

    // The owner dies with its container; the worker is still alive in the registry.
    let killed = a.kill().await;
    assert_eq!(killed.containers, 1);
    let held = deliver(&http, &bb, "f-3", &pr("o/r", 1)).await;
    assert_eq!(held.status, StatusCode::ACCEPTED, "{}", held.body);
    assert_eq!(held.worker(), w, "still the dead owner's worker");
    // Once the sweep declares the worker dead, f-3 is placed again by whichever comes first: B's
    // sweeper callback (a re-dispatch) or one of these resends (admitted as new, since a released
    // claim is; the callback's admission is then a duplicate). Either way B's registry handle
    // admits f-3 exactly once more, onto a new worker, and nothing sticks a second copy onto it.
    let before = b.app().registry().stats();
    let done = eventually("f-3 re-dispatched and completed", || async {
        let again = deliver(&http, &bb, "f-3", &pr("o/r", 1)).await;
        again.completed().then_some(again)
    })
    .await;
    let after = b.app().registry().stats();
    let w2 = done.body["targets"][0]["worker"].as_u64().unwrap();
    assert!(w2 > w, "a new worker ({w2}) took over from {w}");
    assert_eq!(
        (
            after.admitted_new - before.admitted_new,
            after.admitted_sticky - before.admitted_sticky
        ),
        (1, 0),
        "f-3 placed once after its release: {before:?} -> {after:?}"
    );
    assert!(b.app().redispatcher().redispatched() <= 1);
    assert!(b.app().containers().is_running(WorkerId::new(w2)), "on B");
    let audit = b.app().containers().ledger().audit();
    assert_eq!(
        (audit.started, audit.max_per_worker),
        (1, 1),
        "B started one container, for {w2}: {audit:?}"
    );

    // A worker whose container nobody published (created here behind the routers' backs): B waits
    // a heartbeat interval for its owner, then gives the claim back and answers 503.
    let registry = open_registry(&choice, &config, &name).await;
    let t = Target::new("o/orphan", 1).unwrap();
    let Ok(Admission::Assigned(orphan)) =
        registry.admit(&t, &DeliveryId::new("o-0").unwrap()).await
    else {
        panic!("admitted");
    };
    let refused = deliver(&http, &bb, "o-1", &pr("o/orphan", 1)).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.body
    );
    assert_eq!(refused.body["outcome"], "unavailable");
    assert_eq!(refused.worker(), orphan.worker.get());
    assert!(refused.retry_after.is_some_and(|s| s >= 1));
    // Nothing was left behind: once the orphan is declared dead, the delivery is completed by a
    // worker whose container B started.
    let done = eventually("o-1 completed", || async {
        let again = deliver(&http, &bb, "o-1", &pr("o/orphan", 1)).await;
        again.completed().then_some(again)
    })
    .await;
    let by = done.body["targets"][0]["worker"].as_u64().unwrap();
    assert!(by > orphan.worker.get(), "{}", done.body);
    assert!(b.app().containers().is_running(WorkerId::new(by)), "on B");
    b.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_between_replicas_on_redis() {
    forwarding(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_between_replicas_on_postgres() {
    forwarding(Kind::Postgres).await;
}

/// The start claim across processes, made deterministic: replica A's admission creates a worker
/// and its reply is held back (as on a loaded machine); a redelivery reaches replica B (its own
/// containers), is a duplicate whose worker never started, and B wins the worker's start claim
/// (its owner record, written before the start), starts it and hands it the event. A, let go,
/// loses the claim to a claim made for that very delivery, and leaves the handover to B. One
/// container in all, on B; A started none and refused nothing; the event ran once, completed.
async fn start_claim_across_replicas(kind: Kind) {
    let Some(choice) = shared(kind) else {
        return;
    };
    let name = unique("claim");
    // Patient: the worker must not be declared dead while A's reply is held.
    let config = patient_config(8);
    let options = options(Duration::from_millis(20), Duration::from_secs(3600), 8);
    let mut hold = None;
    let a = replica_with(&choice, &name, &config, &options, |registry| {
        let (held, registry) = Hold::wrap(registry);
        hold = Some(held);
        registry
    })
    .await;
    let mut counted = None;
    let b = replica_with(&choice, &name, &config, &options, |registry| {
        let (loops, registry) = Hold::wrap(registry);
        counted = Some(loops);
        registry
    })
    .await;
    let (ba, bb) = (base(&a), base(&b));
    let http = client();
    let held = hold.unwrap().hold("c-1");
    let payload = pr("o/r", 1);
    let (first, retry) = tokio::join!(deliver(&http, &ba, "c-1", &payload), async {
        held.reached().await;
        let retry = deliver(&http, &bb, "c-1", &payload).await;
        held.release();
        retry
    });
    assert_eq!(retry.status, StatusCode::ACCEPTED, "{}", retry.body);
    assert_eq!(retry.body["outcome"], "assigned", "{}", retry.body);
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    assert_eq!(first.body["new"], true, "{}", first.body);
    let w = first.worker();
    assert_eq!(retry.worker(), w);
    let id = WorkerId::new(w);
    assert!(b.app().containers().is_running(id), "B won the claim");
    assert!(!a.app().containers().knows(id), "A started none");
    let owner = b.app().remote().unwrap().store().owner(id).await.unwrap();
    assert_eq!(owner.as_deref(), Some(bb.as_str()), "B's record holds");
    eventually("c-1 completed", || async {
        deliver(&http, &ba, "c-1", &payload)
            .await
            .completed()
            .then_some(())
    })
    .await;
    // Idle again: whatever was queued for it has run.
    eventually("the worker idle", || async {
        b.app()
            .registry()
            .worker(id)
            .await
            .unwrap()
            .filter(|i| i.activity == Activity::Idle)
    })
    .await;
    assert_eq!(counted.unwrap().loops(id), 1, "the event ran once");
    let (on_a, on_b) = (
        a.app().containers().ledger().audit(),
        b.app().containers().ledger().audit(),
    );
    // A lost the claim at least once: its creating admission did; a poll above that reached A
    // before the worker's first heartbeat asked for its start again and lost it again (a run at
    // load 12 counted 2).
    assert_eq!(
        (on_a.started, on_a.refused),
        (0, 0),
        "A started nothing and refused nothing: {on_a:?}"
    );
    assert!(
        on_a.lost_claims >= 1,
        "A lost the claim and handed over: {on_a:?}"
    );
    assert_eq!(
        (on_b.started, on_b.refused, on_b.lost_claims),
        (1, 0, 0),
        "{on_b:?}"
    );
    a.shutdown(Duration::from_secs(2)).await;
    b.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_claim_across_replicas_on_redis() {
    start_claim_across_replicas(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_claim_across_replicas_on_postgres() {
    start_claim_across_replicas(Kind::Postgres).await;
}

/// A replica whose admission of k-1 created a worker, and which won the worker's start claim and
/// was killed before it started the container: its owner record names an address nobody listens
/// on, and the worker never heartbeats. GitHub's redelivery of k-1 reaches replica B: a duplicate
/// whose worker never started; B loses the start claim to the record, made for k-1 itself, and
/// answers a plain duplicate (the event is with the worker). A later event for the same pull
/// request, k-2, is placed on the worker and forwarded to the dead address: the refused
/// connection leaves it with the worker (202). The sweep declares the worker dead, B forgets the
/// record, and both events are re-dispatched to a new worker on B and completed.
async fn a_claim_won_by_a_replica_killed_before_the_start(kind: Kind) {
    let Some(choice) = shared(kind) else {
        return;
    };
    let name = unique("gone");
    // Patient: the worker must still be alive when k-2 is placed, however slow the machine.
    let config = patient_config(8);
    let options = options(Duration::from_millis(20), Duration::from_secs(3600), 8);
    let b = replica(&choice, &name, &config, &options).await;
    let bb = base(&b);
    let http = client();
    // The dead replica's admission created the worker, and its claim was written.
    let registry = open_registry(&choice, &config, &name).await;
    let t = Target::new("o/gone", 1).unwrap();
    let Ok(Admission::Assigned(a)) = registry.admit(&t, &DeliveryId::new("k-1").unwrap()).await
    else {
        panic!("admitted");
    };
    let gone = {
        let l = std::net::TcpListener::bind(loopback()).unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let store = b.app().remote().unwrap().store();
    let record = store.claim(a.worker, &gone, 1, "k-1").await.unwrap();
    assert_eq!(record.address, gone);

    let retry = deliver(&http, &bb, "k-1", &pr("o/gone", 1)).await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert_eq!(retry.body["outcome"], "duplicate", "{}", retry.body);
    assert_eq!(retry.worker(), a.worker.get(), "{}", retry.body);
    assert_eq!(b.app().containers().ledger().audit().lost_claims, 1);
    let held = deliver(&http, &bb, "k-2", &pr("o/gone", 1)).await;
    assert_eq!(held.status, StatusCode::ACCEPTED, "{}", held.body);
    assert_eq!(held.worker(), a.worker.get(), "{}", held.body);
    assert!(!b.app().containers().knows(a.worker), "B started nothing");
    for d in ["k-1", "k-2"] {
        let done = eventually(&format!("{d} re-dispatched and completed"), || async {
            let again = deliver(&http, &bb, d, &pr("o/gone", 1)).await;
            again.completed().then_some(again)
        })
        .await;
        let by = done.body["targets"][0]["worker"].as_u64().unwrap();
        assert!(by > a.worker.get(), "{}", done.body);
        assert!(b.app().containers().knows(WorkerId::new(by)), "on B");
    }
    eventually("the dead worker's record forgotten", || async {
        store.owner(a.worker).await.unwrap().is_none().then_some(())
    })
    .await;
    // Every resend before the death lost the claim to the dead replica's record again.
    let audit = b.app().containers().ledger().audit();
    assert_eq!(
        (audit.started, audit.max_per_worker, audit.refused),
        (1, 1, 0),
        "{audit:?}"
    );
    assert!(audit.lost_claims >= 1, "{audit:?}");
    b.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_won_by_a_replica_killed_before_the_start_on_redis() {
    a_claim_won_by_a_replica_killed_before_the_start(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_won_by_a_replica_killed_before_the_start_on_postgres() {
    a_claim_won_by_a_replica_killed_before_the_start(Kind::Postgres).await;
}

/// A forwarded event for a busy worker whose mailbox is full waits in the owner's overflow: the
/// forwarding replica answers `202 waiting` with the position the owner gave; once the overflow is
/// full too it answers 503 with `Retry-After`, and the claim is released. Redis only (the
/// forwarding path is the same on every shared backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_event_behind_a_full_mailbox_waits_in_the_owners_overflow() {
    let Some(choice) = shared(Kind::Redis) else {
        return;
    };
    let name = unique("ovf");
    let config = patient_config(8);
    let mut options = options(Duration::from_secs(60), Duration::from_secs(3600), 1);
    options.overflow = 2;
    let a = replica(&choice, &name, &config, &options).await;
    let b = replica(&choice, &name, &config, &options).await;
    let (ba, bb) = (base(&a), base(&b));
    let http = client();
    let first = deliver(&http, &ba, "o-0", &pr("o/r", 1)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    let w = first.worker();
    let mut positions = Vec::new();
    let mut refused = None;
    for i in 1..=5 {
        let id = format!("o-{i}");
        let got = deliver(&http, &bb, &id, &pr("o/r", 1)).await;
        if got.status == StatusCode::SERVICE_UNAVAILABLE {
            refused = Some((id, got));
            break;
        }
        assert_eq!(got.status, StatusCode::ACCEPTED, "{}", got.body);
        assert_eq!(got.worker(), w, "{}", got.body);
        if got.body["outcome"] == "waiting" {
            positions.push(got.body["position"].as_u64().unwrap());
        }
    }
    assert_eq!(positions, vec![1, 2], "the owner's overflow positions");
    let (id, got) = refused.expect("a full overflow is a 503");
    assert_eq!(got.body["outcome"], "overflow_full", "{}", got.body);
    assert!(got.retry_after.is_some(), "Retry-After");
    let again = deliver(&http, &bb, &id, &pr("o/r", 1)).await;
    assert_ne!(
        again.body["outcome"], "duplicate",
        "no claim left: {}",
        again.body
    );
    a.shutdown(Duration::from_secs(1)).await;
    b.shutdown(Duration::from_secs(1)).await;
}

/// With AOF on, claims survive a restart of every replica (and of the server): three replicas
/// accept deliveries, some completed and some in flight, then all three are killed and Redis is
/// restarted; three new replicas answer the completed ones as duplicates, and re-dispatch the ones
/// the dead containers held once the sweep declares those workers dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_survive_a_restart_of_every_replica_with_aof() {
    let Some(mut server) = rd::Server::start(true, "the router on Redis with AOF") else {
        return;
    };
    let choice = webhook_router::backend::RegistryChoice::Redis(server.url());
    let name = unique("aof");
    let config = config(8);
    // Long enough work that the second batch is still in flight when the replicas die.
    let work = HEARTBEAT * 10;
    let options = options(work, Duration::from_secs(3600), 8);
    let http = client();

    let (servers, _) = three_replicas(&choice, &name, &config, &options).await;
    let bases: Vec<String> = servers.iter().map(base).collect();
    for i in 0..3u64 {
        let a = deliver(
            &http,
            &bases[i as usize],
            &format!("done-{i}"),
            &pr("o/r", i + 1),
        )
        .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    }
    for i in 0..3u64 {
        let id = format!("done-{i}");
        eventually(&format!("{id} completed"), || async {
            let again = deliver(
                &http,
                &bases[((i + 1) % 3) as usize],
                &id,
                &pr("o/r", i + 1),
            )
            .await;
            again.completed().then_some(())
        })
        .await;
    }
    let mut old_workers = Vec::new();
    for i in 0..3u64 {
        let a = deliver(
            &http,
            &bases[i as usize],
            &format!("busy-{i}"),
            &pr("o/r", i + 1),
        )
        .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
        old_workers.push(a.worker());
    }
    for s in servers {
        s.kill().await;
    }
    server.restart();

    let (servers, _) = three_replicas(&choice, &name, &config, &options).await;
    let bases: Vec<String> = servers.iter().map(base).collect();
    for i in 0..3u64 {
        let id = format!("done-{i}");
        let again = deliver(&http, &bases[i as usize], &id, &pr("o/r", i + 1)).await;
        assert!(
            again.completed(),
            "{id} remembered as completed: {}",
            again.body
        );
    }
    for i in 0..3u64 {
        let id = format!("busy-{i}");
        let done = eventually(&format!("{id} re-dispatched and completed"), || async {
            let again = deliver(&http, &bases[i as usize], &id, &pr("o/r", i + 1)).await;
            again.completed().then_some(again)
        })
        .await;
        let w = done.body["targets"][0]["worker"].as_u64().unwrap();
        assert!(
            old_workers.iter().all(|old| w > *old),
            "worker ids go on from where they were: {w} after {old_workers:?}"
        );
    }
    let audit = servers[0].app().containers().ledger().audit();
    assert_eq!(audit.max_per_worker, 1);
    for s in servers {
        s.shutdown(Duration::from_secs(2)).await;
    }
}
