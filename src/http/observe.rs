//! Request ids, tracing spans and per-route request metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument as _;

const REQUEST_ID: &str = "x-request-id";

/// Request ids: a process-unique prefix and a counter, cheap and never repeated.
fn next_request_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static PREFIX: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let prefix = PREFIX.get_or_init(rand::random);
    format!("{prefix:08x}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Gives every request an id (the client's `x-request-id` if it sent a sane one), runs it in a
/// span that carries the id, echoes the id in the response, and records the request's count and
/// latency by route, method and status.
pub async fn observe(mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(next_request_id);
    if let Ok(value) = HeaderValue::from_str(&id) {
        request.headers_mut().insert(REQUEST_ID, value);
    }
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let method = request.method().to_string();
    let span = tracing::info_span!("request", id = %id, %method, path = %request.uri().path());
    let mut response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16().to_string();
    let elapsed = started.elapsed();
    span.in_scope(|| tracing::debug!(%status, ?elapsed, "served"));
    metrics::counter!(
        "runnel_http_requests_total",
        "route" => route.clone(),
        "method" => method.clone(),
        "status" => status
    )
    .increment(1);
    metrics::histogram!(
        "runnel_http_request_duration_seconds",
        "route" => route,
        "method" => method
    )
    .record(elapsed.as_secs_f64());
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}
