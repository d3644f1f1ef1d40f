//! Accepting connections: plain TCP or TLS, HTTP/1.1 and HTTP/2 (h2c by prior knowledge, or h2
//! by ALPN) on one port, with the limits that keep hostile or broken clients from exhausting the
//! server, and a graceful drain on shutdown.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::{Builder, UpgradeableConnection};
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
    /// How long a client may take to send a request's headers, and how long an idle connection
    /// stays open waiting for the next request (over HTTP/2, one with no request open is idle).
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
    let connections = TaskTracker::new();
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
        let requests = Arc::new(Requests::default());
        let service = NotingRequests {
            inner: TowerToHyperService::new(if tls.is_some() {
                app.over_tls()
            } else {
                app.clone()
            }),
            requests: requests.clone(),
            connection: ConnectionHandle(stall.clone()),
            peer,
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
        let tls = tls.clone();
        let shutdown = shutdown.clone();
        let (send_timeout, idle_timeout) = (limits.send_timeout, limits.header_read_timeout);
        connections.spawn(async move {
            let closing = Closing {
                shutdown: &shutdown,
                requests: &requests,
                idle_timeout,
                idle_grace: send_timeout,
            };
            let serving = async {
                match tls {
                    None => {
                        let connection =
                            builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                        closing.drive(connection).await
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
                        closing.drive(connection).await
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
                () = requests.none_by(first_request_by) => {
                    tracing::debug!(%peer, "no request began within the header timeout; closing");
                }
            }
        });
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(limits.shutdown_timeout, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            timeout = ?limits.shutdown_timeout,
            "requests still in flight at the shutdown timeout; closing their connections"
        );
    }
}

/// When a connection is asked to close: at shutdown, or once it has been idle (over HTTP/2)
/// for its idle timeout.
struct Closing<'a> {
    shutdown: &'a CancellationToken,
    requests: &'a Requests,
    idle_timeout: Duration,
    /// How long a connection closing for idleness may take to send what its client has not
    /// taken yet (shutdown has its own timeout).
    idle_grace: Duration,
}

impl Closing<'_> {
    /// Serves `connection` until it ends. Asked to close, it finishes what it has begun and
    /// takes no more: over HTTP/2 it tells the client so (GOAWAY), which then opens a new
    /// connection for its next request rather than losing it to a reset.
    async fn drive<I>(
        self,
        connection: UpgradeableConnection<'_, I, Service, TokioExecutor>,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let mut connection = std::pin::pin!(connection);
        let idle = tokio::select! {
            served = connection.as_mut() => return served,
            () = self.shutdown.cancelled() => false,
            () = self.requests.idle_over_http2(self.idle_timeout) => true,
        };
        connection.as_mut().graceful_shutdown();
        if !idle {
            return connection.await;
        }
        tracing::debug!("an HTTP/2 connection had no request for the header timeout; closing");
        // Requests the client sent before it heard the GOAWAY are still served, for as long as
        // they take. Once none is open, what is left is a response whose body has ended but
        // whose client opens no window for it.
        loop {
            tokio::select! {
                served = connection.as_mut() => return served,
                () = tokio::time::sleep(self.idle_grace) => {
                    if !self.requests.any_open() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// What a connection's requests are doing: whether one has begun, and over HTTP/2 how many are
/// open, which tells an idle HTTP/2 connection from a busy one (hyper closes idle HTTP/1.1
/// connections itself).
#[derive(Default)]
struct Requests {
    /// Requests begun on the connection.
    begun: AtomicU64,
    /// HTTP/2 requests whose response has not ended.
    open: AtomicUsize,
    /// Told of the first HTTP/2 request, from which the connection is watched for idleness.
    http2: Notify,
}

impl Requests {
    fn begin(self: &Arc<Self>, version: hyper::Version) -> Option<Open> {
        let before = self.begun.fetch_add(1, Ordering::Relaxed);
        if version != hyper::Version::HTTP_2 {
            return None;
        }
        self.open.fetch_add(1, Ordering::Relaxed);
        if before == 0 {
            self.http2.notify_one();
        }
        Some(Open(self.clone()))
    }

    fn any_open(&self) -> bool {
        self.open.load(Ordering::Relaxed) > 0
    }

    /// Resolves once `timeout` has passed without the connection beginning a request.
    async fn none_by(&self, timeout: Duration) {
        tokio::time::sleep(timeout).await;
        if self.begun.load(Ordering::Relaxed) > 0 {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once an HTTP/2 connection has had no request open, and begun none, for
    /// `timeout` (noticed within twice that: it looks once per `timeout`). Never resolves for an
    /// HTTP/1.1 connection.
    async fn idle_over_http2(&self, timeout: Duration) {
        self.http2.notified().await;
        let mut quiet_since = None;
        loop {
            tokio::time::sleep(timeout).await;
            let begun = self.begun.load(Ordering::Relaxed);
            if self.any_open() {
                quiet_since = None;
            } else if quiet_since == Some(begun) {
                return;
            } else {
                quiet_since = Some(begun);
            }
        }
    }
}

/// An HTTP/2 request whose response has not ended: held by its response's body, or by the
/// request until it has a response.
struct Open(Arc<Requests>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The service a connection runs.
type Service = NotingRequests<TowerToHyperService<Handler>>;

/// A connection's service, noting the requests that begin and, over HTTP/2, when their responses
/// end; and giving HTTP/2 requests their connection, which a client that leaves a response
/// untaken loses.
#[derive(Clone)]
struct NotingRequests<S> {
    inner: S,
    requests: Arc<Requests>,
    connection: ConnectionHandle,
    peer: std::net::SocketAddr,
}

impl<S, B> hyper::service::Service<hyper::Request<B>> for NotingRequests<S>
where
    S: hyper::service::Service<hyper::Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Answering<S::Future>;

    fn call(&self, mut request: hyper::Request<B>) -> Self::Future {
        let open = self.requests.begin(request.version());
        // HTTP/1.1 requests go without: their stalls fill the socket, which is watched, and an
        // extension costs an allocation on every request.
        if open.is_some() {
            request.extensions_mut().insert(self.connection.clone());
        }
        // Likewise the client's address, which only the access log reads.
        if crate::http::access_log_enabled() {
            request
                .extensions_mut()
                .insert(crate::http::ClientAddr(self.peer));
        }
        Answering {
            response: self.inner.call(request),
            open,
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's response on its way; over HTTP/2 its body holds the request open until it
    /// ends.
    struct Answering<F> {
        #[pin]
        response: F,
        open: Option<Open>,
    }
}

impl<F, E> Future for Answering<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answered = std::task::ready!(this.response.poll(cx));
        Poll::Ready(match this.open.take() {
            None => answered,
            Some(open) => answered
                .map(|response| response.map(|body| Body::new(HoldingOpen { body, _open: open }))),
        })
    }
}

/// A response body that keeps its HTTP/2 request counted as open for as long as it lives.
struct HoldingOpen {
    body: Body,
    _open: Open,
}

impl http_body::Body for HoldingOpen {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

fn http_builder(limits: &ConnectionLimits) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // Room for twice the limit: a head between the two reaches the handler, which refuses it
        // with 431 and the reason; hyper cuts off larger ones with a bare 431. hyper needs room
        // for at least one read.
        .max_buf_size(
            limits
                .max_header_bytes
                .saturating_mul(2)
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
