//! A TCP forwarder on a free loopback port that can be pointed at another server: what a
//! virtual IP or a DNS name moved by a failover tool is to a client. Pointing it elsewhere cuts
//! every connection it carries, so that clients reconnect, and reach the new server.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

/// A forwarder; dropped, it cuts its connections (its accept thread ends at the next attempt).
pub struct Forward {
    port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: AtomicU16,
    /// Both ends of every connection carried, to cut them.
    open: Mutex<Vec<TcpStream>>,
    closed: std::sync::atomic::AtomicBool,
}

impl Forward {
    /// A forwarder to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the forwarder");
        let port = listener.local_addr().expect("its address").port();
        let shared = Arc::new(Shared {
            upstream: AtomicU16::new(upstream),
            open: Mutex::new(Vec::new()),
            closed: Default::default(),
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.closed.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                // Acquire: the port stored by `point_at` before it cut the old connections.
                let Ok(server) =
                    TcpStream::connect(("127.0.0.1", s.upstream.load(Ordering::Acquire)))
                else {
                    continue; // the client sees its connection closed
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                {
                    let mut open = s.open.lock().unwrap();
                    open.extend([c2, s2]);
                }
                let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                std::thread::spawn(move || copy(client, server));
                std::thread::spawn(move || copy(s3, c3));
            }
        });
        Self { port, shared }
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The forwarder's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sends new connections to `127.0.0.1:upstream` and cuts the ones open now.
    pub fn point_at(&self, upstream: u16) {
        // Release: a connection accepted after the cut below reads the new port.
        self.shared.upstream.store(upstream, Ordering::Release);
        self.cut();
    }

    fn cut(&self) {
        for s in self.shared.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.cut();
        // Wake the accept loop so that it sees `closed`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies `from` to `to` until either end closes, then closes both.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
