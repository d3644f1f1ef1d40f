//! Each route to its handler. The route was parsed once, in front of everything (see
//! `route.rs`); handlers get the names it carries and never parse the path again.
//!
//! Every branch but a stream request (which boxes all but its append inside) is boxed: a
//! request's future is as large as its largest branch, every level of it is copied as it
//! starts, and the appends, by far the most frequent requests, would otherwise carry the
//! others' state too (`tests.rs` holds the bound).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};
use tower_http::compression::CompressionLayer;
use tower_http::compression::predicate::{NotForContentType, Predicate, SizeAbove};
use tower_http::decompression::RequestDecompressionLayer;

use super::route::{Route, S2Route};
use super::{AppState, buckets, ds, extensions, metrics, s2, streamld, text_error};
use crate::model::names;
use crate::service::Principal;

/// S2's routes behind the layers S2 clients expect: unary responses are compressed as
/// `Accept-Encoding` asks (sessions compress per frame, or not at all), and request bodies may
/// be gzip or zstd. Built once per server; each request clones it (a few pointers).
pub(super) type S2Service = BoxCloneSyncService<Request, Response, Infallible>;

/// Responses smaller than this go uncompressed, as S2 does.
const COMPRESS_ABOVE_BYTES: u16 = 1024;

/// Builds [`S2Service`]. The route travels in the request's extensions through the layers.
pub(super) fn s2_service(app: AppState) -> S2Service {
    let compress_when = SizeAbove::new(COMPRESS_ABOVE_BYTES)
        .and(NotForContentType::SSE)
        .and(NotForContentType::const_new(s2::SESSION_CONTENT_TYPE));
    let service = ServiceBuilder::new()
        .map_response(|response: axum::http::Response<_>| response.map(Body::new))
        .layer(CompressionLayer::new().compress_when(compress_when))
        .layer(RequestDecompressionLayer::new())
        .map_request(|request: axum::http::Request<_>| request.map(Body::new))
        .service_fn(move |mut request: Request| {
            let app = app.clone();
            async move {
                let routed = request.extensions_mut().remove::<Routed>();
                Ok::<_, Infallible>(match routed {
                    Some(Routed(route, principal)) => {
                        serve_s2(app, route, principal, request).await
                    }
                    None => text_error(StatusCode::INTERNAL_SERVER_ERROR, "unrouted request"),
                })
            }
        });
    BoxCloneSyncService::new(service)
}

/// A request's route and principal, carried through S2's layers.
#[derive(Clone)]
struct Routed(S2Route, Arc<Principal>);

/// Serves `request` on `route`, for `principal` (authorized for it already).
pub(super) async fn dispatch(
    app: &AppState,
    s2_layers: &S2Service,
    route: Route,
    principal: Arc<Principal>,
    mut request: Request,
) -> Response {
    let method = request.method().clone();
    match route {
        Route::BaseStream { key } => ds::stream_request(app, key, request).await,
        Route::BucketStream { bucket, stream } => {
            match names::bucket_stream_key(&bucket, &stream) {
                Ok(key) => ds::stream_request(app, key, request).await,
                Err(e) => text_error(StatusCode::BAD_REQUEST, &e.to_string()),
            }
        }
        Route::S2(S2Route::Records { stream }) if s2::is_unary_append(&request) => {
            // Nothing for S2's layers to do: an uncompressed body, and an ack too small to
            // compress. Boxed like the others, so that a stream request's future stays small.
            Box::pin(s2::records(app.clone(), principal, stream, request)).await
        }
        Route::Health | Route::Ready | Route::Metrics if method == Method::PUT => text_error(
            StatusCode::BAD_REQUEST,
            &names::NameError::ReservedBucket.to_string(),
        ),
        Route::Health if is_read(&method) => (StatusCode::OK, "ok\n").into_response(),
        Route::Ready if is_read(&method) => readyz(app),
        Route::Metrics if is_read(&method) => Box::pin(metrics::metrics(app)).await,
        Route::Health | Route::Ready | Route::Metrics => not_allowed("GET, HEAD, PUT"),
        Route::Replication if method == Method::GET => {
            Box::pin(streamld::replication(app.clone(), principal, request)).await
        }
        Route::Replication => not_allowed("GET"),
        Route::Bucket { bucket } => {
            Box::pin(buckets::bucket(app.clone(), principal, bucket, request)).await
        }
        Route::Listing { bucket } => buckets::listing(app, &principal, &bucket, &request),
        Route::Extension {
            bucket,
            stream,
            extension,
        } => Box::pin(extensions::serve(app, &bucket, &stream, extension, request)).await,
        Route::S2(route) => {
            request.extensions_mut().insert(Routed(route, principal));
            let layers = s2_layers.clone();
            let Ok(response) = Box::pin(layers.oneshot(request)).await;
            response
        }
    }
}

/// An S2 route's handler, behind S2's layers.
async fn serve_s2(
    app: AppState,
    route: S2Route,
    principal: Arc<Principal>,
    request: Request,
) -> Response {
    let read = is_read(request.method());
    let post = request.method() == Method::POST;
    match route {
        S2Route::Basins if read => s2::list_basins(app, principal, request),
        S2Route::Basins if post => s2::create_basin(app, principal, request).await,
        S2Route::Streams if read => s2::list_streams(app, principal, request),
        S2Route::Streams if post => s2::create_stream(app, principal, request).await,
        S2Route::AccessTokens if read => s2::list_tokens(app, principal, request),
        S2Route::AccessTokens if post => s2::issue_token(app, principal, request).await,
        S2Route::Basins | S2Route::Streams | S2Route::AccessTokens => {
            s2::not_allowed("GET, HEAD, POST")
        }
        S2Route::Basin { basin } => s2::basin(app, principal, basin, request).await,
        S2Route::Stream { stream } => s2::stream(app, principal, stream, request).await,
        S2Route::Records { stream } => s2::records(app, principal, stream, request).await,
        S2Route::Tail { stream } if read => s2::check_tail(app, stream, request).await,
        S2Route::Tail { .. } => s2::not_allowed("GET, HEAD"),
        S2Route::AccessToken { id } if request.method() == Method::DELETE => {
            s2::revoke_token(app, id).await
        }
        S2Route::AccessToken { .. } => s2::not_allowed("DELETE"),
        S2Route::NotServed => s2::not_served(request.uri()),
    }
}

fn is_read(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

fn not_allowed(allowed: &'static str) -> Response {
    super::method_not_allowed(HeaderValue::from_static(allowed))
}

/// 200 while the server takes requests; 503 once it is shutting down, so load balancers stop
/// sending it new ones, and while a mirror does not follow its upstream (the reasons, a line
/// each, in the body).
fn readyz(app: &AppState) -> Response {
    if app.service.shutdown_signal().is_cancelled() {
        return text_error(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    }
    let problems = app.readiness.get().map(|check| check()).unwrap_or_default();
    if !problems.is_empty() {
        return text_error(StatusCode::SERVICE_UNAVAILABLE, &problems.join("\n"));
    }
    (StatusCode::OK, "ready\n").into_response()
}
