//! Issue 37: `--github-ca-bundle`, for GitHub Enterprise Server behind a private certificate
//! authority. A local TLS server with a certificate from a CA made in the test (rcgen): the
//! reconciler's client reads a delivery log from it with that CA's bundle, and is refused without
//! it, or with another CA's.

use std::net::SocketAddr;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use webhook_router::reconcile::api::{http_client, Client, Hook};
use webhook_router::reconcile::auth::Auth;
use webhook_router::secrets::Secret;

/// A CA (its certificate's PEM) and a certificate it signed for 127.0.0.1 (DER, with its key).
fn throwaway_ca(name: &str) -> (String, CertificateDer<'static>, PrivateKeyDer<'static>) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, name);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    (ca.pem(), cert.der().clone(), key)
}

/// A TLS server on a free loopback port answering every request with an empty delivery log.
async fn ghes(cert: CertificateDer<'static>, key: PrivateKeyDer<'static>) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake: nothing to answer.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                              content-length: 2\r\nconnection: close\r\n\r\n[]";
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

fn client(addr: SocketAddr, bundle: Option<&str>) -> Client {
    let hook = Hook::Repo {
        repo: "o/r".into(),
        id: 1,
    };
    let token = Auth::Token(Secret::from(Some("t")));
    let base = format!("https://{addr}/api/v3");
    Client::with_roots(&base, hook, token, bundle.map(str::as_bytes)).unwrap()
}

/// The whole chain of an error, as text.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_is_trusted_with_its_bundle_only() {
    let (ca, cert, key) = throwaway_ca("GHES test CA");
    let (other_ca, _, _) = throwaway_ca("another CA");
    let addr = ghes(cert, key).await;

    let page = client(addr, Some(&ca)).page(100, None).await;
    assert!(page.is_ok_and(|p| p.attempts.is_empty() && p.next.is_none()));

    // Without the bundle (or with another CA's), the certificate is refused at the handshake.
    for bundle in [None, Some(other_ca.as_str())] {
        let http = http_client(bundle.map(str::as_bytes)).unwrap();
        let e = http
            .get(format!(
                "https://{addr}/api/v3/repos/o/r/hooks/1/deliveries"
            ))
            .send()
            .await
            .unwrap_err();
        let text = chain(&e).to_lowercase();
        assert!(text.contains("certificate"), "{text}");
        assert!(
            text.contains("unknownissuer") || text.contains("unknown issuer"),
            "{text}"
        );
    }
    // A bundle that is not PEM is refused when the client is made (at start, by the flag).
    let e = http_client(Some(b"-----BEGIN CERTIFICATE-----\nnope\n")).unwrap_err();
    assert!(e.contains("CA bundle"), "{e}");
}
