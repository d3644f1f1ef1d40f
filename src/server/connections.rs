//! Accepting connections: plain TCP or TLS, HTTP/1.1 and HTTP/2 (h2c by prior knowledge, or h2
//! by ALPN) on one port, with the limits that keep hostile or broken clients from exhausting the
//! server, and a graceful drain on shutdown.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_util::sync::CancellationToken;

use super::file_sending::FileSending;
use super::watched::Watched;
use crate::http::{ConnectionHandle, Handler};

/// How long a client has to finish its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle HTTP/2 connection is pinged, and how long a ping may go unanswered.
const H2_KEEPALIVE: Duration = Duration::from_secs(30);
/// A pause after a failed accept (out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Limits on connections and request heads.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// How long a client may take to send a request's headers, and how long an idle HTTP/1.1
    /// keep-alive connection stays open waiting for the next request.
    pub header_read_timeout: Duration,
    /// The largest request head (HTTP/1.1) or header list (HTTP/2); larger ones get 431.
    pub max_header_bytes: usize,
    /// Connections open at once; further ones are closed as soon as they are accepted.
    pub max_connections: usize,
    /// How long shutdown waits for in-flight requests before closing connections anyway.
    pub shutdown_timeout: Duration,
    /// How long a response may wait on a client that takes nothing before the connection is
    /// closed.
    pub send_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read certificate chain {path}: {source}")]
    Certificate {
        path: String,
        source: rustls_pki_types::pem::Error,
    },
    #[error("cannot read private key {path}: {source}")]
    Key {
        path: String,
        source: rustls_pki_types::pem::Error,
    },
    #[error("certificate file {0} holds no certificate")]
    NoCertificate(String),
    #[error("invalid certificate or key: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A TLS acceptor for a PEM certificate chain and private key, offering HTTP/2 and HTTP/1.1.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Certificate {
            path: cert.display().to_string(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(cert.display().to_string()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Key {
        path: key.display().to_string(),
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `app` on every connection `listener` accepts until `shutdown` is cancelled, then
/// stops accepting, lets in-flight requests finish (up to the shutdown timeout) and returns.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Handler,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let builder = Arc::new(http_builder(&limits));
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max = limits.max_connections, "too many connections; closing a new one");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let socket = std::os::fd::AsRawFd::as_raw_fd(&tcp);
        let tcp = if tls.is_some() {
            FileSending::plain(tcp)
        } else {
            FileSending::new(tcp)
        };
        let (tcp, stall) = Watched::new(tcp, Some(socket), slot);
        let begun = Arc::new(AtomicBool::new(false));
        let service = NotingFirst {
            inner: TowerToHyperService::new(if tls.is_some() {
                app.over_tls()
            } else {
                app.clone()
            }),
            begun: begun.clone(),
            connection: ConnectionHandle(stall.clone()),
        };
        // hyper's header timeout starts once it knows the connection's HTTP version, which a
        // client that sends nothing (or half the HTTP/2 preface) never lets it learn.
        let first_request_by = limits.header_read_timeout
            + if tls.is_some() {
                TLS_HANDSHAKE_TIMEOUT
            } else {
                Duration::ZERO
            };
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let send_timeout = limits.send_timeout;
        tokio::spawn(async move {
            let serving = async move {
                match tls {
                    None => {
                        let connection =
                            builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                        watcher.watch(connection.into_owned()).await
                    }
                    Some(acceptor) => {
                        let handshake =
                            tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
                        let stream = match handshake {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(error)) => {
                                tracing::debug!(%peer, %error, "TLS handshake failed");
                                return Ok(());
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "TLS handshake timed out");
                                return Ok(());
                            }
                        };
                        let connection =
                            builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                        watcher.watch(connection.into_owned()).await
                    }
                }
            };
            // Dropping the connection closes it, and ends whatever response it was sending.
            tokio::select! {
                biased;
                served = serving => {
                    if let Err(error) = served {
                        tracing::debug!(%peer, %error, "connection ended with an error");
                    }
                }
                () = stall.stalled(send_timeout) => {
                    tracing::debug!(%peer, "the client read nothing for the send timeout; closing");
                }
                () = no_request_by(first_request_by, &begun) => {
                    tracing::debug!(%peer, "no request began within the header timeout; closing");
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            timeout = ?limits.shutdown_timeout,
            "requests still in flight at the shutdown timeout; closing their connections"
        );
    }
}

/// Resolves once `timeout` has passed without the connection beginning a request.
async fn no_request_by(timeout: Duration, begun: &AtomicBool) {
    tokio::time::sleep(timeout).await;
    if begun.load(Ordering::Relaxed) {
        std::future::pending::<()>().await;
    }
}

/// A connection's service, noting that the connection has begun a request, and giving HTTP/2
/// requests their connection, which a client that leaves a response untaken loses.
#[derive(Clone)]
struct NotingFirst<S> {
    inner: S,
    begun: Arc<AtomicBool>,
    connection: ConnectionHandle,
}

impl<S, B> hyper::service::Service<hyper::Request<B>> for NotingFirst<S>
where
    S: hyper::service::Service<hyper::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, mut request: hyper::Request<B>) -> Self::Future {
        self.begun.store(true, Ordering::Relaxed);
        // HTTP/1.1 requests go without: their stalls fill the socket, which is watched, and an
        // extension costs an allocation on every request.
        if request.version() == hyper::Version::HTTP_2 {
            request.extensions_mut().insert(self.connection.clone());
        }
        self.inner.call(request)
    }
}

fn http_builder(limits: &ConnectionLimits) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // hyper needs room for at least one read; heads beyond the limit get 431.
        .max_buf_size(
            limits
                .max_header_bytes
                .max(crate::config::MIN_MAX_HEADER_BYTES),
        );
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(H2_KEEPALIVE)
        .keep_alive_timeout(H2_KEEPALIVE);
    builder
}
