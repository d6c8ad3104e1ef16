//! Issue 13, memory exhaustion without a credential: 40 connections announce 25 MiB deliveries
//! with a well-formed but wrong `X-Hub-Signature-256` and send them, 40 more send a malformed
//! signature. The process's allocation is measured throughout by a counting global allocator (this
//! test binary holds only this test, so nothing else allocates meanwhile): at its peak it stays
//! within the body budget plus connection buffers, and once the connections are gone it is back
//! near where it started. (Before: every body was buffered whole before the signature was
//! checked, and 40 such uploads grew the router by about a gigabyte.)

mod common;

use common::*;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use webhook_router::github;

/// Counts the bytes allocated now and the most ever allocated at once since the last reset.
struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    // Relaxed: a statistic; the peak is a running maximum, read after the work it measures.
    let now = NOW.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated around it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        // Relaxed: as in `grew`.
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                // Relaxed: as in `grew`.
                NOW.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: usize = 1 << 20;
const BUDGET: usize = 32 * MIB;
static CHUNK: [u8; 64 * 1024] = [b' '; 64 * 1024];

/// One hostile upload: headers announcing `len` bytes, then as much of the body as the router
/// takes. Returns the status it got.
async fn upload(addr: std::net::SocketAddr, id: usize, signature: &str, len: usize) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /webhook HTTP/1.1\r\nHost: router\r\nConnection: close\r\nContent-Type: application/json\r\n\
         X-GitHub-Event: pull_request\r\nX-GitHub-Delivery: hostile-{id}\r\n\
         X-Hub-Signature-256: {signature}\r\nContent-Length: {len}\r\n\r\n"
    );
    if s.write_all(head.as_bytes()).await.is_err() {
        return 0;
    }
    let mut sent = 0;
    while sent < len {
        let n = CHUNK.len().min(len - sent);
        if s.write_all(&CHUNK[..n]).await.is_err() {
            break; // the router answered and closed: it will not read the rest
        }
        sent += n;
    }
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn hostile_uploads_stay_within_the_body_budget_and_memory_is_given_back() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let h = start(Setup {
            secret: Some("the real secret"),
            body_budget: BUDGET,
            body_timeout: Duration::from_secs(60),
            ..Setup::default()
        })
        .await;
        // Warm up: one ordinary delivery, so lazily built state is not counted as growth.
        assert_eq!(
            upload(h.server.addr(), 0, &github::sign(b"x", b""), 0).await,
            401
        );
        let baseline = NOW.load(Ordering::Relaxed);
        PEAK.store(baseline, Ordering::Relaxed);

        let addr = h.server.addr();
        let wrong = format!("sha256={}", "ab".repeat(32));
        let mut tasks = Vec::new();
        for i in 0..40 {
            let sig = wrong.clone();
            tasks.push(tokio::spawn(async move {
                upload(addr, 100 + i, &sig, github::MAX_PAYLOAD_BYTES).await
            }));
            tasks.push(tokio::spawn(async move {
                upload(addr, 200 + i, "sha256=not-hex", github::MAX_PAYLOAD_BYTES).await
            }));
        }
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        for t in tasks {
            *statuses.entry(t.await.unwrap()).or_default() += 1;
        }
        let peak = PEAK.load(Ordering::Relaxed).saturating_sub(baseline);
        // Every upload was refused: wrong signatures with 401 once read, or 503 once the budget was
        // spent; malformed ones with 401 before their body.
        assert_eq!(
            statuses.get(&401).copied().unwrap_or(0) + statuses.get(&503).copied().unwrap_or(0),
            80,
            "{statuses:?}"
        );
        // Connection buffers (64 KiB each) and the clients' own share come on top of the budget.
        let allowed = BUDGET + 80 * 64 * 1024 + 16 * MIB;
        eprintln!(
            "hostile uploads: peak allocation {:.1} MiB above the baseline (budget {} MiB, allowed {:.1} MiB); answers {statuses:?}",
            peak as f64 / MIB as f64,
            BUDGET / MIB,
            allowed as f64 / MIB as f64
        );
        assert!(peak <= allowed, "peak {peak} bytes above the baseline");

        // Once the connections are gone, the memory is given back (polled: connection tasks end
        // asynchronously after their peers close).
        let mut after = usize::MAX;
        let started = std::time::Instant::now();
        while started.elapsed() < HANG {
            after = NOW.load(Ordering::Relaxed).saturating_sub(baseline);
            if after < 4 * MIB {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        eprintln!("after: {:.2} MiB above the baseline", after as f64 / MIB as f64);
        assert!(after < 4 * MIB, "{after} bytes still allocated");
    });
}
