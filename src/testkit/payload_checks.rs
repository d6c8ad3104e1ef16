//! Payload checks that need more than a [`Fixture`](super::Fixture): a restart of a shared
//! backend's server, a reply lost between a handle and its server. A networked backend's own
//! tests call them where they have those means (a restartable server with persistence, the
//! reply-dropping proxy of `tests/support/proxy.rs`); `tests/payloads.rs` runs them on the
//! in-memory backend (a restart that loses nothing, a wrapper that loses the next reply), so they
//! are known to pass where nothing is lost. Also the payload the conformance cases use,
//! [`sample`].

use std::future::Future;
use std::time::Duration;

use super::support::{assigned, d, duplicate, sweep};
use crate::api::contract::{Maintenance, WorkerRegistry};
use crate::api::ids::Target;
use crate::api::outcome::{Admission, ClaimState};
use crate::api::payload::Payload;
use crate::api::report::ReleaseReason;
use crate::api::status::DeadReason;
use crate::config::RegistryConfigBuilder;

/// A payload as a `pull_request` delivery has it, whose body is `len` bytes that take every byte
/// value (zero, invalid UTF-8, ...) once it is 256 long, in an order set by `tag`; its metadata
/// depends only on `tag`'s length, so two samples of equal tag lengths and `len` are of equal
/// [`size`](Payload::size). A backend that mangles any byte, any header or any field shows.
///
/// # Examples
///
/// ```
/// use worker_registry::testkit::payload_checks::sample;
///
/// let (a, b) = (sample("a", 300), sample("b", 300));
/// assert_eq!(a.size(), b.size());
/// assert_ne!(a, b);
/// assert!((0..=255u8).all(|v| a.body().contains(&v)));
/// ```
pub fn sample(tag: &str, len: usize) -> Payload {
    let seed = tag
        .bytes()
        .fold(0u8, |h, b| h.wrapping_mul(31).wrapping_add(b));
    // 167 is odd, so i * 167 runs through every residue mod 256.
    let body: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(167).wrapping_add(seed))
        .collect();
    Payload::builder("pull_request", body)
        .action("synchronize")
        .header("X-GitHub-Hook-ID", tag)
        .header("X-Hub-Signature-256", format!("sha256={}", "0f".repeat(32)))
        .build()
        .expect("a valid sample payload")
}

/// The configuration [`payloads_survive_a_restart`] needs: one worker, a waiting room.
///
/// # Examples
///
/// ```
/// let c = worker_registry::testkit::payload_checks::restart_config().build().unwrap();
/// assert_eq!((c.max_workers(), c.max_waiting()), (1, 8));
/// ```
pub fn restart_config() -> RegistryConfigBuilder {
    super::support::config().max_workers(1).max_waiting(8)
}

/// How often, and how long apart, a check retries a call a restart or a lost connection
/// refused (a bound, not a timing: the call is retried until it is answered).
const RETRIES: usize = 100;
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// `call` until it is answered, retrying retryable errors a bounded number of times.
async fn answered<T, Fut>(mut call: impl FnMut() -> Fut) -> T
where
    Fut: Future<Output = Result<T, crate::RegistryError>>,
{
    for _ in 0..RETRIES {
        match call().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() => tokio::time::sleep(RETRY_PAUSE).await,
            Err(e) => panic!("{e:?}"),
        }
    }
    panic!("not answered after {RETRIES} retries")
}

fn target(n: u64) -> Target {
    Target::new("payload-checks/repo", n).expect("a valid target")
}

/// Payloads survive a restart of the backend's server with persistence: `r` (a fresh registry
/// with [`restart_config`], on a server that `restart` stops and starts again, keeping its data)
/// holds one payload in flight and one parked; after the restart the lookups find both, byte for
/// byte, the worker's exit hands the first over and promotes the second with theirs, and the
/// registry holds each once.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
/// # async fn main() {
/// use worker_registry::testkit::{payload_checks, Fixture, MemoryFixture};
///
/// let r = MemoryFixture::new().registry(payload_checks::restart_config().build().unwrap()).await;
/// // The in-memory registry is its process: a "restart" that keeps its data does nothing.
/// payload_checks::payloads_survive_a_restart(&r, || async {}).await;
/// # }
/// ```
pub async fn payloads_survive_a_restart<R, Fut>(r: &R, restart: impl FnOnce() -> Fut)
where
    R: WorkerRegistry + Maintenance,
    Fut: Future<Output = ()>,
{
    let (inflight, parked) = (sample("restart-1", 30_000), sample("restart-2", 12_345));
    let (t1, t2) = (target(1), target(2));
    let w = assigned(r.admit_with(&t1, &d("in-flight"), Some(&inflight)).await).worker;
    assert!(matches!(
        r.admit_with(&t2, &d("parked"), Some(&parked)).await,
        Ok(Admission::Waiting(_))
    ));

    restart().await;

    let (d1, d2) = (d("in-flight"), d("parked"));
    let found = answered(|| r.payload(&t1, &d1)).await;
    assert_eq!(
        found,
        Some(inflight.clone()),
        "in flight, across the restart"
    );
    let found = answered(|| r.payload(&t2, &d2)).await;
    assert_eq!(found, Some(parked.clone()), "parked, across the restart");
    assert_eq!(answered(|| r.deregister(w)).await, DeadReason::Deregistered);
    let report = sweep(r).await;
    let of = |name: &str| {
        report
            .released
            .iter()
            .find(|e| e.delivery.as_str() == name)
            .unwrap_or_else(|| panic!("{name} handed over: {report:?}"))
    };
    assert_eq!(of("in-flight").payload.as_ref(), Some(&inflight));
    let promoted = of("parked");
    assert_eq!(promoted.reason, ReleaseReason::Promoted);
    assert_eq!(promoted.payload.as_ref(), Some(&parked));
    r.acknowledge(&report.released).await.expect("acknowledge");
    let dup = duplicate(r.admit_with(&t2, &d("parked"), Some(&inflight)).await);
    assert_eq!(dup.state, ClaimState::InFlight);
    assert_eq!(r.payload(&t2, &d("parked")).await, Ok(Some(parked.clone())));
    sweep(r).await;
    let usage = r.status().payloads;
    assert_eq!(
        (usage.held, usage.bytes),
        (1, parked.size()),
        "the promoted one, once; the released one was handed over and acknowledged"
    );
}

/// A reply lost after the server carried out an admission that carried a payload leaves the
/// payload retrievable: `lose_next_reply` arranges for the next reply `through` gets to be lost
/// (the proxy drops it and cuts the connection); the admission's error is retryable, its retry a
/// duplicate of the claim it made (unstarted: its worker was never started), and the payload is
/// there, byte for byte, through `through` and through `direct` (another handle on the registry).
///
/// # Examples
///
/// See `tests/payloads.rs`, which runs it on the in-memory backend behind a wrapper that loses
/// the next reply.
pub async fn a_lost_reply_leaves_the_payload_retrievable<R: WorkerRegistry>(
    through: &R,
    direct: &R,
    lose_next_reply: impl FnOnce(),
) {
    let p = sample("lost-reply", 50_000);
    // An admission first, so that whatever the backend loads on first use is loaded (a call
    // refused for that did nothing).
    let warm = sample("lost-reply-warm", 10);
    assigned(
        through
            .admit_with(&target(1), &d("warm"), Some(&warm))
            .await,
    );

    let (t, delivery) = (target(2), d("lost"));
    lose_next_reply();
    let err = through
        .admit_with(&t, &delivery, Some(&p))
        .await
        .expect_err("the reply was lost");
    assert!(err.is_retryable(), "a lost reply is retryable: {err:?}");
    let retry = answered(|| through.admit_with(&t, &delivery, Some(&p))).await;
    let Admission::Duplicate(dup) = retry else {
        panic!("the admission was carried out: its retry is a duplicate: {retry:?}")
    };
    assert!(dup.unstarted, "nothing started its worker: {dup:?}");
    assert_eq!(through.payload(&t, &delivery).await, Ok(Some(p.clone())));
    assert_eq!(direct.payload(&t, &delivery).await, Ok(Some(p)));
}
