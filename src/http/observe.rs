//! Request ids, tracing spans and per-route request metrics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::Instant;

use metrics::{Counter, Histogram};

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

/// The request counter of one route, method and status, and the latency histogram of its route
/// and method.
struct RouteMetrics {
    method: String,
    status: u16,
    requests: Counter,
    latency: Histogram,
}

/// Metric handles by route, registered once: the hot path allocates nothing and takes a read
/// lock.
fn record(route: &str, method: &str, status: u16, seconds: f64) {
    static HANDLES: OnceLock<RwLock<HashMap<String, Vec<RouteMetrics>>>> = OnceLock::new();
    let handles = HANDLES.get_or_init(Default::default);
    let seen = |by_route: &HashMap<String, Vec<RouteMetrics>>| {
        by_route.get(route).and_then(|all| {
            all.iter()
                .find(|m| m.status == status && m.method == method)
                .map(|m| {
                    m.requests.increment(1);
                    m.latency.record(seconds);
                })
        })
    };
    if seen(&handles.read().unwrap_or_else(|e| e.into_inner())).is_some() {
        return;
    }
    let mut by_route = handles.write().unwrap_or_else(|e| e.into_inner());
    if seen(&by_route).is_some() {
        return;
    }
    let metrics = RouteMetrics {
        method: method.to_string(),
        status,
        requests: metrics::counter!(
            "runnel_http_requests_total",
            "route" => route.to_string(),
            "method" => method.to_string(),
            "status" => status.to_string()
        ),
        latency: metrics::histogram!(
            "runnel_http_request_duration_seconds",
            "route" => route.to_string(),
            "method" => method.to_string()
        ),
    };
    metrics.requests.increment(1);
    metrics.latency.record(seconds);
    by_route.entry(route.to_string()).or_default().push(metrics);
}

/// Gives every request an id (the client's `x-request-id` if it sent a sane one), runs it in a
/// span that carries the id (at debug level), logs failures with it, echoes it in the response,
/// and records the request's count and latency by route, method and status.
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
    let route = request.extensions().get::<MatchedPath>().cloned();
    let method = request.method().clone();
    // A debug-level span: free at the default level, where an info span per request would cost
    // a fifth of the append throughput. Failures are logged with their id at any level.
    let span = tracing::debug_span!("request", id = %id);
    let mut response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    if status >= 500 {
        tracing::warn!(request_id = %id, %method, route, status, ?elapsed, "request failed");
    } else {
        span.in_scope(|| tracing::debug!(%method, status, ?elapsed, "served"));
    }
    record(route, method.as_str(), status, elapsed.as_secs_f64());
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}
