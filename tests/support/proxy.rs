//! A TCP proxy on loopback in front of a real server that can lose one reply: once armed, the
//! first connection to send a request has that request delivered to the server, and the server's
//! answer swallowed and the connection cut (as a timeout or a dropped connection loses a reply
//! whose request the server carried out).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The proxy; dropped, it stops accepting (connections already open run on until they close).
pub struct Proxy {
    addr: SocketAddr,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`) on a free loopback port.
    pub async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let armed = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU64::new(0));
        let upstream = upstream.to_owned();
        let (a, d) = (armed.clone(), dropped.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(pipe(client, server, a.clone(), d.clone()));
            }
        });
        Proxy {
            addr,
            armed,
            dropped,
            accept,
        }
    }

    /// The proxy's `host:port`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Loses the reply to the next request any connection sends.
    pub fn drop_next_reply(&self) {
        // SeqCst: read by the connection tasks; one flag, no other data depends on it.
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Replies lost so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }
}

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // Set by the client side when this connection's request is the one whose reply is lost.
    let doomed = Arc::new(AtomicBool::new(false));
    let up = {
        let doomed = doomed.clone();
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if armed.swap(false, Ordering::SeqCst) {
                    doomed.store(true, Ordering::SeqCst);
                }
                if sw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if doomed.load(Ordering::SeqCst) {
                // The request was delivered and carried out; its answer never arrives.
                dropped.fetch_add(1, Ordering::SeqCst);
                break;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    // Either side ending ends the connection (both halves are dropped here).
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
