//! Request ids, tracing spans, the access log and per-route request metrics.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};
use std::time::Instant;

use metrics::{Counter, Histogram};

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::response::Response;
use tracing::Instrument as _;
use tracing::instrument::Instrumented;

use super::header_names::X_REQUEST_ID;

/// A new request id: 96 random bits. Ids are returned on public routes (`/healthz`), so they
/// must not count anything: a counter would tell anyone the server's request rate.
fn next_request_id() -> HeaderValue {
    request_id(rand::random())
}

/// The low 96 bits of `bits` as 24 hex digits, rendered on the stack: every request gets one.
fn request_id(bits: u128) -> HeaderValue {
    const DIGITS: usize = 24;
    let mut text = [0u8; DIGITS];
    for (i, slot) in text.iter_mut().enumerate() {
        let shift = 4 * (DIGITS - 1 - i);
        *slot = b"0123456789abcdef"[((bits >> shift) & 0xf) as usize];
    }
    HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static("unnamed"))
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

/// The log target of the access log: a line per request at INFO, off unless `RUST_LOG` names
/// it (`RUST_LOG=info`, or `warn,runnel=info,runnel::access=info`), as a line per request costs
/// throughput.
const ACCESS: &str = "runnel::access";

/// Whether the access log is written: checked per request before anything is kept for it.
pub fn access_log_enabled() -> bool {
    tracing::enabled!(target: ACCESS, tracing::Level::INFO)
}

/// The address a request came from, kept on the request only while the access log is on.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub std::net::SocketAddr);

/// One request being observed: its id, route, method and start time.
pub struct Observation {
    started: Instant,
    id: HeaderValue,
    /// The route's label (see `Route::label`), or `unmatched`.
    route: &'static str,
    method: axum::http::Method,
    span: tracing::Span,
    /// The path as sent and the client's address, kept only while the access log is on: the
    /// path is a copy, which a request that nobody logs should not pay for.
    access: Option<(String, Option<std::net::SocketAddr>)>,
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
            access: access_log_enabled().then(|| {
                let client = request.extensions().get::<ClientAddr>().map(|c| c.0);
                (request.uri().path().to_string(), client)
            }),
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
        let id = self.id.to_str().unwrap_or_default();
        let path = self.access.as_ref().map(|(path, _)| path.as_str());
        if let Some((path, client)) = &self.access {
            let client = client.map(|c| c.to_string()).unwrap_or_default();
            let elapsed_ms = elapsed.as_secs_f64() * 1e3;
            // A streaming body's size is not known when it starts: then no `bytes`.
            let bytes = http_body::Body::size_hint(response.body()).exact();
            tracing::info!(target: ACCESS, request_id = %id, %client, %method, path, route, status, bytes, elapsed_ms, "request");
        }
        if status >= 500 {
            tracing::warn!(request_id = %id, %method, ?path, route, status, ?elapsed, "request failed");
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
    fn request_ids_are_24_hex_digits_of_the_random_bits() {
        for (bits, text) in [
            (0, "000000000000000000000000"),
            (0xdead_beef, "0000000000000000deadbeef"),
            (u128::MAX, "ffffffffffffffffffffffff"),
        ] {
            assert_eq!(request_id(bits).to_str().unwrap(), text);
        }
    }

    #[test]
    fn request_ids_reveal_nothing_about_how_many_came_before() {
        // With a counter, the ids of one process share a prefix and count up by one: a client
        // reading two of them learns the request rate between.
        let ids: Vec<u128> = (0..256)
            .map(|_| {
                let id = next_request_id();
                assert!(is_sane_id(&id));
                u128::from_str_radix(id.to_str().unwrap(), 16).unwrap()
            })
            .collect();
        let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        let in_sequence = ids.windows(2).filter(|w| w[1].wrapping_sub(w[0]) < 1 << 16);
        assert!(in_sequence.count() < 4, "ids follow each other: {ids:x?}");
        let top_bytes: std::collections::BTreeSet<_> = ids.iter().map(|id| id >> 88).collect();
        assert!(top_bytes.len() > 64, "ids share a prefix");
    }
}
