//! Issue 13: the router under hostile and careless input, on paused time (every timeout below is
//! virtual: nothing sleeps on the wall clock). Slow sockets, slow bodies, a full house, deliveries
//! that can be refused before their body is read, ambiguous headers, and the admin API's order of
//! checks.

mod common;

use common::*;

use std::time::Duration;

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};
use webhook_router::github;
use webhook_router::server::ServerLimits;

const HEADER_TIMEOUT: Duration = Duration::from_secs(1);
const BODY_TIMEOUT: Duration = Duration::from_secs(2);
/// Far beyond every timeout configured here: a read still waiting then never ends by itself.
const NEVER: Duration = Duration::from_secs(300);

fn hardened(max_connections: usize, max_concurrent_webhooks: usize) -> Setup {
    Setup {
        body_timeout: BODY_TIMEOUT,
        limits: ServerLimits {
            header_timeout: HEADER_TIMEOUT,
            max_connections,
            max_concurrent_webhooks,
        },
        ..Setup::default()
    }
}

async fn connect(h: &Harness) -> TcpStream {
    TcpStream::connect(h.server.addr()).await.unwrap()
}

/// Reads until the server closes the connection (or `NEVER` passes: `None`).
async fn read_to_close(s: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    match timeout(NEVER, s.read_to_end(&mut buf)).await {
        Ok(_) => Some(String::from_utf8_lossy(&buf).into_owned()),
        Err(_) => None,
    }
}

/// Reads one response head (status line and headers).
async fn read_head(s: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match timeout(NEVER, s.read(&mut byte)).await {
            Ok(Ok(1)) => buf.push(byte[0]),
            Ok(_) => return (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned()),
            Err(_) => return None,
        }
        if buf.ends_with(b"\r\n\r\n") {
            return Some(String::from_utf8_lossy(&buf).into_owned());
        }
    }
}

fn status_of(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn delivery_head(id: &str, extra: &str, content_length: usize) -> String {
    format!(
        "POST /webhook HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n\
         X-GitHub-Event: pull_request\r\nX-GitHub-Delivery: {id}\r\n{extra}Content-Length: {content_length}\r\n\r\n"
    )
}

/// Slowloris: a socket that sent half a request line is disconnected after the header timeout,
/// and the router keeps serving everyone else meanwhile.
#[tokio::test(start_paused = true)]
async fn slow_request_heads_are_cut_off_and_others_still_served() {
    let h = start(hardened(64, 64)).await;
    let mut slow = Vec::new();
    for _ in 0..8 {
        let mut s = connect(&h).await;
        s.write_all(b"POST /webhook HT").await.unwrap();
        slow.push(s);
    }
    // Served while the slow sockets hang.
    let a = h.deliver("pull_request", "ok-1", &pr("o/r", 1)).await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    let started = Instant::now();
    for s in &mut slow {
        let closed = read_to_close(s).await;
        assert!(closed.is_some(), "a slow socket stayed open for {NEVER:?}");
    }
    let took = started.elapsed();
    assert!(took >= HEADER_TIMEOUT && took < NEVER, "{took:?}");
    // An idle keep-alive connection is closed the same way.
    let mut idle = connect(&h).await;
    let body = b"{}";
    let head = delivery_head("idle-1", "", body.len()).replace("pull_request", "push");
    idle.write_all(head.as_bytes()).await.unwrap();
    idle.write_all(body).await.unwrap();
    let answered = read_head(&mut idle).await.unwrap();
    assert_eq!(status_of(&answered), 202, "{answered}");
    assert!(
        read_to_close(&mut idle).await.is_some(),
        "idle keep-alive connection stayed open"
    );
}

/// The connection cap: with every slot taken by slow sockets, a newcomer waits in the backlog and is
/// served as soon as the header timeout frees a slot; nothing is refused, nothing runs out.
#[tokio::test(start_paused = true)]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let h = start(hardened(2, 64)).await;
    let mut hogs = Vec::new();
    for _ in 0..2 {
        let mut s = connect(&h).await;
        s.write_all(b"GET /work").await.unwrap();
        hogs.push(s);
    }
    let started = Instant::now();
    let a = h.deliver("pull_request", "cap-1", &pr("o/r", 1)).await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    let waited = started.elapsed();
    assert!(
        waited >= HEADER_TIMEOUT,
        "the third connection was served at once ({waited:?}): no cap"
    );
    assert!(waited < NEVER);
}

/// A body that trickles in is cut off at the body timeout with 408.
#[tokio::test(start_paused = true)]
async fn a_slow_body_is_timed_out() {
    let h = start(hardened(64, 64)).await;
    let mut s = connect(&h).await;
    s.write_all(delivery_head("slow-body", "", 100).as_bytes())
        .await
        .unwrap();
    s.write_all(b"{\"action\":").await.unwrap();
    let started = Instant::now();
    let head = read_head(&mut s)
        .await
        .expect("no answer to a stalled body");
    assert_eq!(status_of(&head), 408, "{head}");
    assert!(started.elapsed() >= BODY_TIMEOUT);
}

/// Beyond the concurrency limit, a webhook request gets 503 and Retry-After at once.
#[tokio::test(start_paused = true)]
async fn beyond_the_concurrency_limit_deliveries_are_shed_at_once() {
    let h = start(hardened(64, 1)).await;
    // One request holds the only slot, stalled in its body.
    let mut holder = connect(&h).await;
    holder
        .write_all(delivery_head("hold", "", 100).as_bytes())
        .await
        .unwrap();
    tokio::task::yield_now().await;
    // Let the router start on it.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = Instant::now();
    let shed = h.deliver("pull_request", "shed-1", &pr("o/r", 1)).await;
    assert_eq!(
        shed.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        shed.body
    );
    assert!(shed.retry_after.is_some_and(|s| s >= 1));
    assert!(shed.body["reason"].as_str().unwrap().contains("at once"));
    assert!(
        started.elapsed() < HEADER_TIMEOUT,
        "it was shed, not queued"
    );
    // Once the holder is gone, deliveries go through again.
    drop(holder);
    let ok = eventually(|| async {
        let a = h.deliver("pull_request", "shed-2", &pr("o/r", 1)).await;
        (a.status == StatusCode::ACCEPTED).then_some(a)
    })
    .await;
    assert_eq!(ok.body["outcome"], "assigned");
}

/// What cannot be a valid delivery is refused from its headers alone: the answer comes while the
/// announced 25 MiB body has not been sent at all.
#[tokio::test(start_paused = true)]
async fn deliveries_that_cannot_be_valid_are_refused_before_their_body() {
    let h = start(Setup {
        secret: Some("s3cret"),
        ..hardened(64, 64)
    })
    .await;
    let big = github::MAX_PAYLOAD_BYTES;
    let good_sig = format!("X-Hub-Signature-256: sha256={}\r\n", "0".repeat(64));
    for (what, head, status) in [
        (
            "malformed signature",
            delivery_head("e-1", "X-Hub-Signature-256: sha256=xyz\r\n", big),
            401,
        ),
        ("missing signature", delivery_head("e-2", "", big), 401),
        (
            "no event header",
            delivery_head("e-3", &good_sig, big).replace("X-GitHub-Event: pull_request\r\n", ""),
            400,
        ),
        (
            "wrong content type",
            delivery_head("e-4", &good_sig, big).replace("application/json", "text/plain"),
            415,
        ),
        (
            "two delivery ids",
            delivery_head("e-5", &format!("{good_sig}X-GitHub-Delivery: e-6\r\n"), big),
            400,
        ),
        (
            "over the cap",
            delivery_head("e-7", &good_sig, big + 1),
            413,
        ),
    ] {
        let mut s = connect(&h).await;
        s.write_all(head.as_bytes()).await.unwrap();
        let started = Instant::now();
        let answer = read_head(&mut s)
            .await
            .unwrap_or_else(|| panic!("{what}: no answer without the body"));
        assert_eq!(status_of(&answer), status, "{what}: {answer}");
        assert!(
            started.elapsed() < BODY_TIMEOUT,
            "{what}: waited for the body"
        );
        assert!(
            !answer.to_ascii_lowercase().contains("www-authenticate"),
            "{what}"
        );
    }
}

/// Two `X-GitHub-Delivery` headers make the delivery ambiguous: 400, and nothing is claimed.
#[tokio::test(start_paused = true)]
async fn two_delivery_ids_are_refused() {
    let h = start(Setup::default()).await;
    let res = h
        .http
        .post(format!("{}/webhook", h.base))
        .header("content-type", "application/json")
        .header(github::EVENT_HEADER, "pull_request")
        .header(github::DELIVERY_HEADER, "a")
        .header(github::DELIVERY_HEADER, "b")
        .body(pr("o/r", 1).to_string())
        .send()
        .await
        .unwrap();
    let a = answer(res).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.body["error"].as_str().unwrap().contains("more than once"));
    assert_eq!(h.memory.direct().claim_count(), 0);
}

/// Form-encoded deliveries are accepted up to the same 25 MiB as JSON (not axum's 2 MiB).
#[tokio::test(start_paused = true)]
async fn form_encoded_deliveries_are_accepted_up_to_the_same_cap() {
    let secret = "It's a Secret to Everybody";
    let h = start(Setup {
        secret: Some(secret),
        ..Setup::default()
    })
    .await;
    let mut payload = pr("o/r", 5);
    payload["pull_request"]["body"] = serde_json::Value::from("x".repeat(3 << 20));
    let body = format!("payload={}", form_encode(&payload.to_string()));
    assert!(body.len() > 3 << 20);
    let res = h
        .http
        .post(format!("{}/webhook", h.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .header(github::EVENT_HEADER, "pull_request")
        .header(github::DELIVERY_HEADER, "big-form")
        .header(
            github::SIGNATURE_HEADER,
            github::sign(secret.as_bytes(), body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    let a = answer(res).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
}

/// A wrong method is 405 before the token is checked, on the admin API and the debug endpoint.
#[tokio::test(start_paused = true)]
async fn a_wrong_method_is_405_before_401() {
    let h = start(Setup {
        token: Some("t0ken"),
        ..Setup::default()
    })
    .await;
    for path in ["/workers/1/drain", "/debug/workers/1/crash"] {
        let a = h.get(path).await;
        assert_eq!(
            a.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{path}: {:?}",
            a.body
        );
    }
    let a = h
        .http
        .delete(format!("{}/workers", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), StatusCode::METHOD_NOT_ALLOWED);
    // The right method without the token is 401.
    let mut anon = h;
    anon.token = None;
    assert_eq!(
        anon.post("/workers/1/drain").await.status,
        StatusCode::UNAUTHORIZED
    );
}

/// `Retry-After` arithmetic saturates: any duration gives a valid header.
#[test]
fn retry_after_saturates() {
    use webhook_router::http::retry_after_secs;
    assert_eq!(retry_after_secs(Duration::ZERO), 1);
    assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
    assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    assert_eq!(retry_after_secs(Duration::new(u64::MAX, 1)), u64::MAX);
}
