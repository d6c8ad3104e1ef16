//! TLS to PostgreSQL (feature `postgres-tls`): a throwaway cluster with `ssl = on` and a
//! certificate from a certificate authority made in the test (rcgen); the conformance suite over
//! `sslmode=verify-full` with that CA as the only root (events included: the listener's
//! connection is TLS too), and a handle that cannot verify the server refused.

#[path = "support/pg_cluster.rs"]
mod pg_cluster;

use std::sync::OnceLock;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tokio_postgres::NoTls;
use worker_registry::postgres::PostgresRegistry;
use worker_registry::testkit::Fixture;
use worker_registry::{ConnectError, RegistryConfig};

/// The cluster's plain URL (TLS on; stopped when the process exits) and the test CA's certificate.
fn server() -> Option<&'static (String, String)> {
    static SERVER: OnceLock<Option<(String, String)>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let cluster = pg_cluster::own_cluster()?.stop_at_exit();
            let ca = std::thread::spawn({
                let url = cluster.clone();
                move || {
                    tokio::runtime::Runtime::new()
                        .unwrap()
                        .block_on(enable_tls(&url))
                }
            })
            .join()
            .unwrap();
            Some((cluster, ca))
        })
        .as_ref()
}

/// Makes a CA and a server certificate for 127.0.0.1, and turns TLS on (a reload: `ssl` is a
/// reloadable setting). Returns the CA's PEM.
async fn enable_tls(url: &str) -> String {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "worker-registry test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let dir = std::env::temp_dir().join(format!("wr-pg-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_file, key_file) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    if let Some(user) = pg_cluster::server_user() {
        let ok = std::process::Command::new("chown")
            .arg("-R")
            .arg(&user)
            .arg(&dir)
            .status()
            .unwrap();
        assert!(ok.success(), "chown the key to {user}");
    }
    let (c, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    for setting in [
        format!("ssl_cert_file = '{}'", cert_file.display()),
        format!("ssl_key_file = '{}'", key_file.display()),
        "ssl = on".to_owned(),
    ] {
        c.batch_execute(&format!("ALTER SYSTEM SET {setting}"))
            .await
            .unwrap();
    }
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    // The reload is asynchronous: wait (bounded) until new sessions see TLS on.
    for _ in 0..200 {
        let (c, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
        tokio::spawn(conn);
        let on: String = c.query_one("SHOW ssl", &[]).await.unwrap().get(0);
        if on == "on" {
            // Read at the reload, held by the server from now on.
            let _ = std::fs::remove_dir_all(&dir);
            return ca.pem();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("ssl did not turn on");
}

fn tls_url(plain: &str) -> String {
    format!("{plain}?sslmode=verify-full")
}

struct TlsFixture {
    url: String,
    ca: String,
}

impl Fixture for TlsFixture {
    type Registry = PostgresRegistry;

    async fn registry(&self, config: RegistryConfig) -> PostgresRegistry {
        PostgresRegistry::builder(&self.url)
            .tls_root_certificate(self.ca.clone())
            .name(pg_cluster::unique_name("tls"))
            .config(config)
            .pool_size(4)
            .connect()
            .await
            .expect("connect over TLS")
    }

    async fn replica(&self, of: &PostgresRegistry) -> PostgresRegistry {
        of.connect_replica().await.expect("connect a replica")
    }

    async fn advance(&self, of: &PostgresRegistry, by: Duration) {
        of.advance_time_for_tests(by)
            .await
            .expect("advance the registry's time");
    }
}

fn fixture() -> Option<TlsFixture> {
    server().map(|(c, ca)| TlsFixture {
        url: tls_url(c),
        ca: ca.clone(),
    })
}

worker_registry::conformance_suite!(fixture());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_encrypted_and_an_unverifiable_server_is_refused() {
    let Some((cluster, ca)) = server() else {
        return;
    };
    let r = PostgresRegistry::builder(tls_url(cluster))
        .tls_root_certificate(ca.clone())
        .name(pg_cluster::unique_name("tls-check"))
        .connect()
        .await
        .unwrap();
    r.ping().await.unwrap();
    // Every session of this server but the test's own plain one runs over TLS.
    let (c, conn) = tokio_postgres::connect(cluster, NoTls).await.unwrap();
    tokio::spawn(conn);
    let encrypted: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
             WHERE ssl AND application_name = 'worker-registry'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        encrypted >= 2,
        "the pool's and the listener's sessions: {encrypted}"
    );
    // The system's store does not know the test CA.
    let err = PostgresRegistry::builder(tls_url(cluster))
        .name(pg_cluster::unique_name("tls-untrusted"))
        .call_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::Backend(_)), "{err:?}");
}
