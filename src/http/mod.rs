//! The HTTP faces. Handlers are thin: parse the request, call the stream service, render the
//! response. Protocol rules live in `service/` and `model/`.

mod auth;
mod buckets;
mod dispatch;
mod ds;
mod ds_view;
mod error;
mod extensions;
mod gather;
mod header_names;
mod live;
mod long_poll;
mod metrics;
mod observe;
mod origin;
mod process_metrics;
mod request;
mod route;
mod s2;
mod sse;
mod streamld;
mod taking;

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::FutureExt as _;

use crate::model::names;
use crate::service::StreamService;

pub use auth::AuthConfig;
pub use metrics::install_recorder as install_metrics_recorder;
pub use observe::{ClientAddr, access_log_enabled};
pub use request::BodyLimits;
pub use taking::{CloseConnection, ConnectionHandle};

/// Settings of the HTTP faces.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// How long a long-poll read waits for data before answering 204.
    pub long_poll_timeout: Duration,
    /// The largest request body accepted (413 beyond), and how long a body may stall (408).
    pub body: request::BodyLimits,
    /// How long one SSE connection stays open before the server ends it (clients reconnect).
    pub sse_max_duration: Duration,
    /// Bearer-token authentication, when on (`--auth`).
    pub auth: Option<Arc<AuthConfig>>,
    /// Live readers served at once; more get 503 with `Retry-After`.
    pub max_live_readers: usize,
    /// How long a live reader over HTTP/2 may leave an event untaken before its body ends and
    /// its slot is freed (over HTTP/1.1 the connection's own send timeout does it).
    pub send_timeout: Duration,
    /// The largest request head (request line and headers) taken; larger ones get 431 with the
    /// reason. The connection's own limit, at twice this, cuts off larger heads unread.
    pub max_header_bytes: usize,
}

/// What every handler shares. One `Arc`, because axum clones the state into each layer of every
/// request: cloning one pointer is cheaper than cloning (and dropping) each field's.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    pub service: Arc<StreamService>,
    pub config: HttpConfig,
    /// One permit per live reader (long-poll, SSE, S2S read session) being served.
    pub live_readers: Arc<tokio::sync::Semaphore>,
    /// Renders the process's metrics, when a Prometheus recorder is installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// What else `/readyz` asks (a mirror's upstreams), set once at start.
    pub readiness: std::sync::OnceLock<ReadinessCheck>,
}

/// Why the server should not be sent requests yet, one line per reason; empty when it may.
pub type ReadinessCheck = Box<dyn Fn() -> Vec<String> + Send + Sync>;

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    pub fn new(
        service: Arc<StreamService>,
        config: HttpConfig,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    ) -> AppState {
        AppState(Arc::new(Shared {
            service,
            live_readers: Arc::new(tokio::sync::Semaphore::new(config.max_live_readers)),
            config,
            metrics,
            readiness: std::sync::OnceLock::new(),
        }))
    }

    /// Makes `/readyz` answer 503 while `check` gives reasons (see [`ReadinessCheck`]).
    pub fn set_readiness(&self, check: ReadinessCheck) {
        // Set once, by the server as it starts; a second check would be a bug of the caller's.
        let _ = self.readiness.set(check);
    }

    /// Live readers being served now.
    pub fn live_reader_count(&self) -> usize {
        self.config.max_live_readers - self.live_readers.available_permits()
    }
}

/// What serves each request: its route, parsed once from its path (see `route.rs`), then the
/// front door (observation, authorization, live-reader admission, the common response
/// headers), then the route's handler (see `dispatch.rs`).
#[derive(Clone)]
pub struct Handler {
    app: AppState,
    s2_layers: dispatch::S2Service,
    /// Its connection is TLS: requests are marked [`origin::OverTls`].
    tls: bool,
}

impl Handler {
    pub fn new(state: AppState) -> Handler {
        Handler {
            s2_layers: dispatch::s2_service(state.clone()),
            app: state,
            tls: false,
        }
    }

    /// This handler, for a TLS connection.
    pub fn over_tls(&self) -> Handler {
        Handler {
            tls: true,
            ..self.clone()
        }
    }

    /// Everything a request passes through, outermost first.
    async fn serve(self, mut request: Request) -> Response {
        if let Some(refused) = head_too_large(&request, self.app.config.max_header_bytes) {
            return refused;
        }
        let route = route::Route::parse(request.uri().path());
        let label = route.as_ref().map_or("unmatched", route::Route::label);
        let observation = observe::Observation::start(&request, label);
        let sent_body = sent_body(&request);
        let app = &self.app;
        let mut response = observation
            .run(async {
                let route = match route {
                    Ok(route) => route,
                    Err(e @ route::RouteError::Unknown) => {
                        return text_error(StatusCode::NOT_FOUND, &e.to_string());
                    }
                    Err(route::RouteError::BadName(face, e)) => {
                        return refusal(face, StatusCode::BAD_REQUEST, "bad_path", &e.to_string());
                    }
                };
                let principal = match auth::authorize(app, &route, &mut request) {
                    Ok(principal) => principal,
                    Err(refusal) => return *refusal,
                };
                if route.face() == route::Face::S2 && request.method() == Method::OPTIONS {
                    return s2::preflight();
                }
                live::serve(app, route, request, |route, request| {
                    dispatch::dispatch(app, &self.s2_layers, route, principal, request)
                })
                .await
            })
            .await;
        add_common_headers(&mut response, sent_body);
        observation.finish(&mut response);
        response
    }
}

impl tower::Service<axum::http::Request<hyper::body::Incoming>> for Handler {
    type Response = Response;
    type Error = Infallible;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<hyper::body::Incoming>) -> Self::Future {
        let mut request = request.map(Body::new);
        normalize_path(&mut request);
        if self.tls {
            request.extensions_mut().insert(origin::OverTls);
        }
        Box::pin(self.clone().serve(request).map(Ok))
    }
}

/// Decodes escaped unreserved characters in the path before anything reads it, so routing,
/// authorization and the handlers all see one spelling of each segment: `r%65tention` would
/// otherwise be routed to the retention extension yet authorized as some other one.
fn normalize_path(request: &mut Request) {
    let uri = request.uri();
    if !uri.path().contains('%') {
        return;
    }
    let Some(path) = names::normalize_unreserved(uri.path()) else {
        return;
    };
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = axum::http::uri::PathAndQuery::from_maybe_shared(path_and_query).ok();
    if let Ok(normalized) = axum::http::Uri::from_parts(parts) {
        *request.uri_mut() = normalized;
    }
}

/// Completes when a token that expires at `expires_ms` (milliseconds since the epoch) has
/// expired; never for a token without an expiry. Live connections end with their token.
pub(crate) async fn token_expiry(expires_ms: Option<i64>) {
    let Some(at_ms) = expires_ms else {
        return std::future::pending().await;
    };
    let left = at_ms.saturating_sub(crate::service::now_ms());
    tokio::time::sleep(Duration::from_millis(u64::try_from(left).unwrap_or(0))).await;
}

/// 431 with the reason for a request whose head passes `max_bytes`, counted as HTTP/1.1 spells
/// it: the request line, and each header's name, value, `: ` and line end.
fn head_too_large(request: &Request, max_bytes: usize) -> Option<Response> {
    let target = request
        .uri()
        .path_and_query()
        .map_or(1, |p| p.as_str().len());
    let line = request.method().as_str().len() + target + " HTTP/1.1\r\n".len() + 1;
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    let head = line + headers;
    (head > max_bytes).then(|| {
        let reason = format!(
            "the request head is {head} bytes, more than this server takes (--max-header-bytes {max_bytes})"
        );
        text_error(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, &reason)
    })
}

fn sent_body(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_LENGTH)
        .is_some_and(|len| len != "0")
        || request.headers().contains_key(header::TRANSFER_ENCODING)
}

/// Headers every response carries: browser security headers and CORS.
fn add_common_headers(response: &mut Response, sent_body: bool) {
    let rejected = response.status().is_client_error() || response.status().is_server_error();
    let headers = response.headers_mut();
    if sent_body && rejected {
        // A rejected request's body may be partly unread; this connection cannot be reused, and
        // saying so keeps clients from sending their next request into it.
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    headers.insert(
        header_names::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header_names::CROSS_ORIGIN_RESOURCE_POLICY,
        HeaderValue::from_static("cross-origin"),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(ds::EXPOSED_HEADERS),
    );
}

/// A refusal made in front of the handlers, in the error shape of `face`: S2's JSON
/// `{code, message}` on S2's routes, plain text elsewhere.
fn refusal(face: route::Face, status: StatusCode, code: &str, reason: &str) -> Response {
    match face {
        route::Face::S2 => s2::error_response(status, code, reason),
        route::Face::DurableStreams => text_error(status, reason),
    }
}

/// 405 for a method the resource does not take, with the ones it does in `Allow` and in the
/// reason.
pub(crate) fn method_not_allowed(allow: HeaderValue) -> Response {
    let reason = format!(
        "method not allowed here (allowed: {})",
        allow.to_str().unwrap_or_default()
    );
    let mut response = text_error(StatusCode::METHOD_NOT_ALLOWED, &reason);
    response.headers_mut().insert(header::ALLOW, allow);
    response
}

/// A plain-text error response with a short reason.
pub(crate) fn text_error(status: StatusCode, reason: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{reason}\n"),
    )
        .into_response()
}

#[cfg(test)]
mod tests;
