//! The HTTP faces. Handlers are thin: parse the request, call the stream service, render the
//! response. Protocol rules live in `service/` and `model/`.

mod auth;
mod buckets;
mod ds;
mod error;
mod extensions;
mod gather;
mod header_names;
mod live;
mod metrics;
mod observe;
mod origin;
mod request;
mod s2;
mod sse;
mod streamld;
mod taking;
mod task;

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};

use crate::model::names;
use crate::service::StreamService;

pub use auth::AuthConfig;
pub use metrics::install_recorder as install_metrics_recorder;
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
}

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
        }))
    }

    /// Live readers being served now.
    pub fn live_reader_count(&self) -> usize {
        self.config.max_live_readers - self.live_readers.available_permits()
    }
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }).put(reserved_bucket))
        .route("/readyz", get(readyz).put(reserved_bucket))
        .route("/metrics", get(metrics::metrics).put(reserved_bucket))
        .route(ds::BASE_ROUTE, any(ds::base_stream))
        .merge(s2::routes())
        .route("/v1/streamld/replication", get(streamld::replication))
        .route("/{bucket}", any(buckets::bucket))
        .route("/{bucket}/{stream}", any(buckets::stream))
        .route("/{bucket}/{stream}/{extension}", any(extensions::extension))
        .route(
            "/{bucket}/{stream}/{extension}/{offset}",
            any(extensions::extension_at),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "no such route\n") })
        .layer(middleware::from_fn_with_state(state.clone(), front_door))
        .with_state(state)
}

/// What every request passes through, outermost first: observation (id, span, metrics), the
/// common response headers, authorization, and live-reader admission. One layer, because each
/// axum layer costs a boxed future and a clone of the inner service on every request.
async fn front_door(State(app): State<AppState>, request: Request, next: Next) -> Response {
    through_front_door(&app, request, None, |request| {
        live::serve(&app, request, next)
    })
    .await
}

/// The front door's work around `inner`; `route` as for [`observe::Observation::start`].
async fn through_front_door<F>(
    app: &AppState,
    mut request: Request,
    route: Option<&'static str>,
    inner: impl FnOnce(Request) -> F,
) -> Response
where
    F: Future<Output = Response>,
{
    let observation = observe::Observation::start(&request, route);
    let sent_body = sent_body(&request);
    let s2_route = s2::serves(request.uri().path());
    let mut response = observation
        .run(async {
            match auth::authorize(app, &mut request) {
                // Decoders elsewhere keep a stray '%' as it is, so `a%zz` and `a%25zz` would
                // name one stream: refused here, for every route.
                Ok(()) if !names::escapes_are_whole(request.uri().path()) => refusal(
                    request.uri().path(),
                    StatusCode::BAD_REQUEST,
                    "bad_path",
                    &names::NameError::BadEncoding.to_string(),
                ),
                Ok(()) if s2_route && request.method() == Method::OPTIONS => s2::preflight(),
                Ok(()) => inner(request).await,
                Err(refusal) => *refusal,
            }
        })
        .await;
    explain_method_not_allowed(&mut response, s2_route);
    add_common_headers(&mut response, sent_body);
    observation.finish(&mut response);
    response
}

/// What serves each request: the router, and a shortcut past it for appends on the base
/// protocol's route and S2's unary appends, the most frequent requests by far. The router's matching, its per-request
/// extensions and its boxed layers and futures cost 5-10% of an append's server CPU (about
/// 37-51 µs per append at 500 writers through the router, 35-38 µs through the shortcut).
/// The shortcut goes through the same front door and handler the router would have used; the
/// front door's live-reader admission is left out because an append is never a live read.
#[derive(Clone)]
pub struct Handler {
    app: AppState,
    router: Router,
    /// Its connection is TLS: requests are marked [`origin::OverTls`].
    tls: bool,
}

impl Handler {
    pub fn new(state: AppState) -> Handler {
        Handler {
            router: router(state.clone()),
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
}

type Shortcut = std::pin::Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl tower::Service<axum::http::Request<hyper::body::Incoming>> for Handler {
    type Response = Response;
    type Error = Infallible;
    type Future = futures::future::Either<Shortcut, axum::routing::future::RouteFuture<Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<hyper::body::Incoming>) -> Self::Future {
        let mut request = request.map(Body::new);
        normalize_path(&mut request);
        if self.tls {
            request.extensions_mut().insert(origin::OverTls);
        }
        if request.method() == Method::POST && ds::is_base_stream(&request) {
            let app = self.app.clone();
            return futures::future::Either::Left(Box::pin(async move {
                let response = through_front_door(&app, request, Some(ds::BASE_ROUTE), |request| {
                    ds::base_stream_request(&app, request)
                })
                .await;
                Ok(response)
            }));
        }
        if let Some(name) = s2::unary_append_target(&request) {
            let app = self.app.clone();
            return futures::future::Either::Left(Box::pin(async move {
                let response =
                    through_front_door(&app, request, Some(s2::RECORDS_ROUTE), |request| {
                        s2::unary_append(&app, name, request)
                    })
                    .await;
                Ok(response)
            }));
        }
        futures::future::Either::Right(self.router.call(request))
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

/// `PUT` of a route the server keeps for itself, which would otherwise create a bucket there.
async fn reserved_bucket() -> Response {
    text_error(
        StatusCode::BAD_REQUEST,
        &names::NameError::ReservedBucket.to_string(),
    )
}

/// 200 while the server takes requests; 503 once it is shutting down, so load balancers stop
/// sending it new ones.
async fn readyz(State(app): State<AppState>) -> Response {
    if app.service.shutdown_signal().is_cancelled() {
        return text_error(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    }
    (StatusCode::OK, "ready\n").into_response()
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

fn sent_body(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_LENGTH)
        .is_some_and(|len| len != "0")
        || request.headers().contains_key(header::TRANSFER_ENCODING)
}

/// axum's routers answer a method a route does not take with a bare 405 (an `Allow` header and
/// no body): give it a reason, in S2's error shape on S2's routes.
fn explain_method_not_allowed(response: &mut Response, s2_route: bool) {
    use http_body::Body as _;
    if response.status() != StatusCode::METHOD_NOT_ALLOWED || !response.body().is_end_stream() {
        return;
    }
    let allow = response.headers_mut().remove(header::ALLOW);
    *response = match (s2_route, allow) {
        (false, Some(allow)) => method_not_allowed(allow),
        (false, None) => text_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here"),
        (true, allow) => {
            let mut explained = s2::method_not_allowed_response();
            if let Some(allow) = allow {
                explained.headers_mut().insert(header::ALLOW, allow);
            }
            explained
        }
    };
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

/// A refusal made in front of the handlers, in the error shape of the face `path` belongs to:
/// S2's JSON `{code, message}` on S2's routes, plain text elsewhere.
pub(crate) fn refusal(path: &str, status: StatusCode, code: &str, reason: &str) -> Response {
    if s2::serves(path) {
        s2::error_response(status, code, reason)
    } else {
        text_error(status, reason)
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
