//! TLS (feature `redis-tls`): a `redis-server` started with `--tls-port` and a certificate from a
//! certificate authority made for the test (rcgen), the conformance suite over `rediss://` with
//! that CA as the only root, and a server whose certificate the handle cannot verify refused.
//!
//! A `redis-server` built without TLS makes the file skip with one line (and fail when `CI` is
//! set).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;
use worker_registry::WorkerRegistryExt;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use worker_registry::redis::RedisRegistry;
use worker_registry::testkit::Fixture;
use worker_registry::{Admission, DeliveryId, RegistryConfig, Target};

use crate::harness::{self, Server};

/// The CA's certificate (PEM), and the directory of the files the server is started with
/// (removed once it started: it reads them at start).
struct Pki {
    ca_pem: String,
    dir: PathBuf,
}

impl Pki {
    fn new() -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "worker-registry test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let dir = std::env::temp_dir().join(format!("wr-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
        Self {
            ca_pem: ca.pem(),
            dir,
        }
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// Whether this `redis-server` was built with TLS (`--tls-port` is an unknown option otherwise).
fn server_has_tls() -> bool {
    let binary = test_servers::redis::server_binary();
    std::process::Command::new(&binary)
        .arg("--help")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("tls-port"))
        .unwrap_or(false)
        || std::process::Command::new("sh")
            .arg("-c")
            .arg("ldd \"$(command -v \"$1\")\" | grep -q libssl")
            .arg("sh")
            .arg(&binary)
            .status()
            .is_ok_and(|s| s.success())
}

/// The TLS server the tests of this file share, and its CA.
fn server() -> Option<&'static (Server, Pki)> {
    static SERVER: OnceLock<Option<(Server, Pki)>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            if !harness::have_binary() {
                // The skip line (or the CI failure) of the other Redis tests.
                let _ = harness::shared("Redis TLS tests");
                return None;
            }
            if !server_has_tls() {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "redis-server was built without TLS and CI is set"
                );
                eprintln!("skipped: Redis TLS tests (redis-server was built without TLS)");
                return None;
            }
            let pki = Pki::new();
            let args = [
                "--port",
                "0",
                "--tls-port",
                "$PORT",
                "--tls-cert-file",
                &pki.file("server.pem"),
                "--tls-key-file",
                &pki.file("server.key"),
                "--tls-ca-cert-file",
                &pki.file("ca.pem"),
                "--tls-auth-clients",
                "no",
            ]
            .map(String::from);
            let server = Server::start_args(&args, "Redis TLS tests");
            let _ = std::fs::remove_dir_all(&pki.dir);
            Some((server?, pki))
        })
        .as_ref()
}

fn url(server: &Server) -> String {
    format!("rediss://127.0.0.1:{}/", server.port)
}

struct TlsFixture {
    url: String,
    ca: String,
}

impl Fixture for TlsFixture {
    type Registry = RedisRegistry;

    async fn registry(&self, config: RegistryConfig) -> RedisRegistry {
        RedisRegistry::builder(&self.url)
            .tls_root_certificate(self.ca.clone())
            .name(harness::unique_name("tls"))
            .config(config)
            .connect()
            .await
            .expect("connect over TLS")
    }

    async fn replica(&self, of: &RedisRegistry) -> RedisRegistry {
        of.connect_replica().await.expect("connect a replica")
    }

    async fn advance(&self, of: &RedisRegistry, by: Duration) {
        of.advance_time_for_tests(by)
            .await
            .expect("advance the registry's time");
    }
}

fn fixture() -> Option<TlsFixture> {
    server().map(|(s, pki)| TlsFixture {
        url: url(s),
        ca: pki.ca_pem.clone(),
    })
}

mod suite {
    use super::fixture;

    worker_registry::conformance_suite!(fixture());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_server_the_roots_vouch_for_is_accepted() {
    let Some((server, pki)) = server() else {
        return;
    };
    let r = RedisRegistry::builder(url(server))
        .tls_root_certificate(pki.ca_pem.clone())
        .name(harness::unique_name("tls-ok"))
        .connect()
        .await
        .expect("the test CA vouches for the server");
    let t = Target::new("octo/repo", 1).unwrap();
    assert!(matches!(
        r.admit(&t, &DeliveryId::new("d").unwrap()).await.unwrap(),
        Admission::Assigned(_)
    ));
    // The system's store does not know the test CA.
    let refused = RedisRegistry::builder(url(server))
        .name(harness::unique_name("tls-untrusted"))
        .connect_timeout(Duration::from_millis(500))
        .reconnect_retries(0)
        .connect()
        .await;
    assert!(refused.is_err(), "an unverifiable certificate is refused");
    // Plain text to the TLS port is not an answer either.
    let plain = RedisRegistry::builder(format!("redis://127.0.0.1:{}/", server.port))
        .name(harness::unique_name("tls-plain"))
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .reconnect_retries(0)
        .connect()
        .await;
    assert!(plain.is_err(), "a plain-text client gets no registry");
}
