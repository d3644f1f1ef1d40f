//! Request ids, tracing spans and per-route request metrics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::Instant;

use metrics::{Counter, Histogram};

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::response::Response;
use tracing::Instrument as _;
use tracing::instrument::Instrumented;

use super::header_names::X_REQUEST_ID;

/// Request ids: a process-unique prefix and a counter, cheap and never repeated.
fn next_request_id() -> HeaderValue {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static PREFIX: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let prefix = *PREFIX.get_or_init(rand::random);
    request_id(prefix, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// `{prefix:08x}-{count:x}`, rendered on the stack: every request gets one.
fn request_id(prefix: u32, count: u64) -> HeaderValue {
    let mut text = [0u8; 8 + 1 + 16];
    let mut len = write_hex(&mut text, u64::from(prefix), 8);
    text[len] = b'-';
    len += 1;
    let digits = (64 - count.leading_zeros()).div_ceil(4).max(1) as usize;
    len += write_hex(&mut text[len..], count, digits);
    HeaderValue::from_bytes(&text[..len]).unwrap_or_else(|_| HeaderValue::from_static("unnamed"))
}

/// Writes the low `digits` hex digits of `value` at the start of `out`; returns `digits`.
fn write_hex(out: &mut [u8], value: u64, digits: usize) -> usize {
    for (i, slot) in out[..digits].iter_mut().enumerate() {
        let shift = 4 * (digits - 1 - i);
        *slot = b"0123456789abcdef"[((value >> shift) & 0xf) as usize];
    }
    digits
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

/// One request being observed: its id, route, method and start time.
pub struct Observation {
    started: Instant,
    id: HeaderValue,
    /// The route's label (see `Route::label`), or `unmatched`.
    route: &'static str,
    method: axum::http::Method,
    span: tracing::Span,
}

impl Observation {
    /// Gives the request an id (the client's `x-request-id` if it sent a sane one), and opens a
    /// span that carries it (at debug level: free at the default level, where an info span per
    /// request cost a fifth of the append throughput).
    ///
    /// `route` is the label the request is counted under.
    pub fn start(request: &Request, route: &'static str) -> Observation {
        let started = Instant::now();
        let id = match request.headers().get(X_REQUEST_ID) {
            Some(sent) if is_sane_id(sent) => sent.clone(),
            _ => next_request_id(),
        };
        let span = tracing::debug_span!("request", id = ?id);
        Observation {
            started,
            route,
            method: request.method().clone(),
            id,
            span,
        }
    }

    /// Runs the rest of the request inside the span. Not an `async fn`: that would hold `inner`
    /// twice in its state, as its argument and as the instrumented future, and every request's
    /// future is copied whole when it is boxed.
    pub fn run<F: Future<Output = Response>>(&self, inner: F) -> Instrumented<F> {
        inner.instrument(self.span.clone())
    }

    /// Logs a failure with the request id, records the request's count and latency by route,
    /// method and status, and echoes the id in the response.
    pub fn finish(self, response: &mut Response) {
        let status = response.status().as_u16();
        let elapsed = self.started.elapsed();
        let route = self.route;
        let method = &self.method;
        if status >= 500 {
            let id = self.id.to_str().unwrap_or_default();
            tracing::warn!(request_id = %id, %method, route, status, ?elapsed, "request failed");
        } else {
            self.span
                .in_scope(|| tracing::debug!(%method, status, ?elapsed, "served"));
        }
        record(route, method_label(method), status, elapsed.as_secs_f64());
        response.headers_mut().insert(X_REQUEST_ID, self.id);
    }
}

/// The method as a metric label: a client may invent any number of method names, and each
/// would be a series kept for the life of the process.
fn method_label(method: &axum::http::Method) -> &str {
    use axum::http::Method;
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    if KNOWN.contains(method) {
        method.as_str()
    } else {
        "other"
    }
}

fn is_sane_id(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(u8::is_ascii_graphic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invented_methods_share_one_metric_label() {
        use axum::http::Method;
        assert_eq!(method_label(&Method::POST), "POST");
        let invented = Method::from_bytes(b"FROBNICATE").unwrap();
        assert_eq!(method_label(&invented), "other");
    }

    #[test]
    fn request_ids_are_the_prefix_and_the_counter_in_hex() {
        for (prefix, count) in [(0, 0), (0xdead_beef, 1), (7, 0xff), (u32::MAX, u64::MAX)] {
            assert_eq!(
                request_id(prefix, count).to_str().unwrap(),
                format!("{prefix:08x}-{count:x}")
            );
        }
        let (first, second) = (next_request_id(), next_request_id());
        assert_ne!(first, second);
        assert!(is_sane_id(&first));
    }
}
