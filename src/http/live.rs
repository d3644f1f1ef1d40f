//! Live reads: long-polls, SSE and S2S read sessions. They are counted against
//! `--max-live-readers` (beyond it, 503 with `Retry-After`), and their bodies end cleanly,
//! between two events, when the server starts shutting down or when the access token that
//! opened them expires; clients then reconnect from where they were.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt as _;

use super::{AppState, text_error, until_ms};
use crate::service::Principal;

/// How long a refused live reader is asked to wait before trying again.
const RETRY_AFTER_SECS: &str = "1";

/// Whether a request waits for data that does not exist yet.
fn is_live(request: &Request) -> bool {
    let path = request.uri().path();
    let query = request.uri().query().unwrap_or("");
    let param = |name: &str| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.into_owned())
    };
    let first_media_type = |name: header::HeaderName| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_default()
    };
    if request.method() != Method::GET {
        return false;
    }
    param("live").is_some()
        || path.ends_with("/streamld")
        || first_media_type(header::ACCEPT).starts_with("text/event-stream")
        || first_media_type(header::CONTENT_TYPE).starts_with("s2s/proto")
        || (path.ends_with("/records") && param("wait").is_some_and(|w| w != "0"))
}

fn is_streaming(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream") || t.starts_with("s2s/proto"))
}

/// Runs the request, counting it against the live-reader limit if it is a live read, and ending a
/// streaming body at shutdown or token expiry.
pub async fn serve(app: &AppState, request: Request, next: Next) -> Response {
    if !is_live(&request) {
        return next.run(request).await;
    }
    let Ok(permit) = app.live_readers.clone().try_acquire_owned() else {
        let mut response = text_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many live readers; retry shortly",
        );
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECS),
        );
        return response;
    };
    let token_expiry = request
        .extensions()
        .get::<Arc<Principal>>()
        .and_then(|p| p.expires_ms);
    let response = next.run(request).await;
    if !is_streaming(&response) {
        // A long-poll: it held its permit while it waited.
        return response;
    }
    let shutdown = app.service.shutdown_signal();
    let end = async move {
        let expiry = async {
            match token_expiry {
                Some(at) => tokio::time::sleep(until_ms(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = expiry => {}
        }
    };
    let (parts, body) = response.into_parts();
    // The permit lives as long as the body does.
    let body = body
        .into_data_stream()
        .take_until(Box::pin(end))
        .map(move |chunk| {
            let _held = &permit;
            chunk
        });
    Response::from_parts(parts, Body::from_stream(body))
}
