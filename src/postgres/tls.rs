//! TLS to PostgreSQL (feature `postgres-tls`): a tokio-postgres connector on rustls (ring). The
//! server's certificate is always verified, chain and host name (libpq's `verify-full`), against
//! the system's roots or the PEM the builder was given; `sslmode=verify-full` and `verify-ca` in
//! a URL are read as `require` (tokio-postgres knows only `disable`, `prefer`, `require`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_rustls::TlsConnector;

/// Makes a TLS connector per connection (what the pool, the listener and cancel requests use).
#[derive(Clone)]
pub(crate) struct MakeRustls {
    config: Arc<ClientConfig>,
}

impl MakeRustls {
    /// Verifying against `roots` (PEM) if given, else the system's store.
    pub(crate) fn new(roots: Option<&[u8]>) -> Result<Self, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut store = RootCertStore::empty();
        match roots {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| format!("tls_root_certificate: {e}"))?;
                    store
                        .add(cert)
                        .map_err(|e| format!("tls_root_certificate: {e}"))?;
                }
                if store.is_empty() {
                    return Err("tls_root_certificate: no PEM certificate in it".into());
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = store.add(cert);
                }
            }
        }
        let config = ClientConfig::builder()
            .with_root_certificates(store)
            .with_no_client_auth();
        Ok(Self {
            config: Arc::new(config),
        })
    }
}

/// `sslmode=verify-full` / `verify-ca` as tokio-postgres reads them (`require`; verification is
/// always full here).
pub(crate) fn normalize_sslmode(url: &str) -> String {
    url.replace("sslmode=verify-full", "sslmode=require")
        .replace("sslmode=verify-ca", "sslmode=require")
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, hostname: &str) -> Result<RustlsConnect, Self::Error> {
        Ok(RustlsConnect {
            name: ServerName::try_from(hostname.to_owned())?,
            connector: TlsConnector::from(self.config.clone()),
        })
    }
}

/// The connector of one connection.
pub(crate) struct RustlsConnect {
    name: ServerName<'static>,
    connector: TlsConnector,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            Ok(RustlsStream(
                self.connector.connect(self.name, stream).await?,
            ))
        })
    }
}

/// A TLS session over a connection's socket.
pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM channel binding is optional (`channel_binding=prefer`, the default).
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_modes_read_as_require_and_bad_roots_are_refused() {
        assert_eq!(
            normalize_sslmode("postgres://h/db?sslmode=verify-full"),
            "postgres://h/db?sslmode=require"
        );
        assert_eq!(
            normalize_sslmode("host=h sslmode=verify-ca"),
            "host=h sslmode=require"
        );
        assert!(MakeRustls::new(Some(b"not a certificate")).is_err());
    }
}
