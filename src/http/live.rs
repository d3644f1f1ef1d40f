//! Live reads: long-polls, SSE and S2S read sessions. They are counted against
//! `--max-live-readers` (beyond it, 503 with `Retry-After`), and their bodies end cleanly,
//! between two events, when the server starts shutting down, when the access token that opened
//! them expires or is revoked, or (over HTTP/2) when their client has taken nothing for the send
//! timeout; clients then reconnect from where they were. A long-poll still waiting when its
//! token expires or is revoked is answered 401, as a new request with that token would be.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, Version, header};
use axum::response::Response;
use std::task::Poll;

use futures::stream::{AbortHandle, Abortable};
use futures::{Stream, StreamExt as _};

use super::route::{Extension, Face, Route, S2Route};
use super::taking::{self, ConnectionHandle, Taking};
use super::{AppState, auth, token_expiry};
use crate::service::sessions::OwnedTask;
use crate::service::{Principal, Revocation, TokenError, now_ms};

/// How long a refused live reader is asked to wait before trying again.
const RETRY_AFTER_SECS: &str = "1";

/// Whether a request on `route` waits for data that does not exist yet. Runs on every request,
/// so it allocates nothing.
fn is_live(route: &Route, request: &Request) -> bool {
    if request.method() != Method::GET {
        return false;
    }
    let query = request.uri().query().unwrap_or("");
    let param = |name: &str| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(key, _)| key == name)
            .map(|(_, value)| value)
    };
    match route {
        Route::BaseStream { .. } | Route::BucketStream { .. } => param("live").is_some(),
        Route::Extension {
            extension: Extension::StreamLd,
            ..
        } => true,
        Route::S2(S2Route::Records { .. }) => {
            first_media_type_is(request, header::ACCEPT, "text/event-stream")
                || first_media_type_is(request, header::CONTENT_TYPE, "s2s/proto")
                || param("wait").is_some_and(|w| w != "0")
        }
        _ => false,
    }
}

/// Whether the first media type a header lists begins with `wanted`, in any case (as the
/// handlers compare them).
fn first_media_type_is(request: &Request, name: header::HeaderName, wanted: &str) -> bool {
    request
        .headers()
        .get(name)
        .and_then(|v| v.as_bytes().split(|b| *b == b',').next())
        .map(<[u8]>::trim_ascii)
        .and_then(|v| v.get(..wanted.len()))
        .is_some_and(|v| v.eq_ignore_ascii_case(wanted.as_bytes()))
}

fn is_streaming(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream") || t.starts_with("s2s/proto"))
}

/// Whether a request on `route` opens an S2S append session: it streams like a live read,
/// though it reads nothing.
fn is_append_session(route: &Route, request: &Request) -> bool {
    matches!(route, Route::S2(S2Route::Records { .. }))
        && request.method() == Method::POST
        && first_media_type_is(request, header::CONTENT_TYPE, "s2s/proto")
}

/// Runs the request, counting it against the live-reader limit if it is a live read, and ending a
/// streaming body (a live read or an append session) when the token that opened it expires or is
/// revoked, and a live read's also at shutdown or, over HTTP/2, once its client has taken nothing
/// for the send timeout. Over HTTP/2 a finished response (a catch-up, a long-poll's answer, a
/// bootstrap) costs its client the connection if it takes none of it (see `taking`).
pub async fn serve<F: Future<Output = Response>>(
    app: &AppState,
    route: Route,
    request: Request,
    inner: impl FnOnce(Route, Request) -> F,
) -> Response {
    let live = is_live(&route, &request);
    // Only HTTP/2 requests carry their connection. A HEAD's body is dropped before it is sent.
    let connection = match request.method() {
        &Method::HEAD => None,
        _ => request.extensions().get::<ConnectionHandle>().cloned(),
    };
    if !live && !is_append_session(&route, &request) {
        return finished(app, connection, inner(route, request).await);
    }
    // Boxed: the streaming requests' state would otherwise ride in every append's future.
    Box::pin(serve_streaming(
        app, route, request, inner, live, connection,
    ))
    .await
}

/// A finished response, watched over HTTP/2 (see `taking`).
fn finished(app: &AppState, connection: Option<ConnectionHandle>, response: Response) -> Response {
    match connection {
        Some(connection) => taking::watch_finished(response, app.config.send_timeout, connection),
        None => response,
    }
}

/// [`serve`] for a live read or an append session.
async fn serve_streaming<F: Future<Output = Response>>(
    app: &AppState,
    route: Route,
    request: Request,
    inner: impl FnOnce(Route, Request) -> F,
    live: bool,
    connection: Option<ConnectionHandle>,
) -> Response {
    let permit = if live {
        match app.live_readers.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => return too_many_live_readers(route.face()),
        }
    } else {
        None
    };
    let principal = request.extensions().get::<Arc<Principal>>().cloned();
    let version = request.version();
    let face = route.face();
    let response = match &principal {
        // A long-poll still waiting when its token ends delivers nothing more: it is answered as
        // a new request with that token would be. Looked at first, so that a record appended
        // after the revocation is never sent.
        Some(principal) if live => tokio::select! {
            biased;
            ended = token_end(principal) => return auth::token_ended(face, ended),
            response = inner(route, request) => response,
        },
        _ => inner(route, request).await,
    };
    if !is_streaming(&response) {
        // A long-poll: it held its permit while it waited.
        return finished(app, connection, response);
    }
    // A live read ends at shutdown; an append session carries on while the server drains, so
    // that the batches it sent are acknowledged.
    let shutdown = live.then(|| app.service.shutdown_signal());
    if shutdown.is_none() && principal.is_none() {
        // Nothing can end it early: an append session opened without a token.
        return response;
    }
    let body_principal = principal.clone();
    let end = async move {
        let (expires_ms, revoked) = match &principal {
            Some(p) => (p.expires_ms, p.revoked.clone()),
            None => (None, Revocation::default()),
        };
        let shutdown = async {
            match &shutdown {
                Some(shutdown) => shutdown.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown => {}
            () = token_expiry(expires_ms) => {}
            () = revoked.revoked() => {}
        }
    };
    // Over HTTP/2 a client that takes nothing does not stall the connection (its other streams
    // and pings go on), so the connection's send timeout never fires: the body itself is watched.
    let watch_taking = live && version == Version::HTTP_2;
    let send_timeout = app.config.send_timeout;
    let taking = Taking::new();
    let stall = {
        let taking = taking.clone();
        async move {
            if watch_taking {
                taking.stalled(send_timeout).await;
            } else {
                std::future::pending::<()>().await;
            }
        }
    };
    let (parts, body) = response.into_parts();
    // The ways the body ends are watched by a task of their own, which lives as long as the
    // body: a frame then costs one atomic load. Polled with every frame instead, they locked two
    // cancellation tokens per frame, a few percent of a fan-out's CPU.
    let (abort, registration) = AbortHandle::new_pair();
    let watcher = OwnedTask::spawn(async move {
        // The permit goes when the body does, or once its client has stopped taking it.
        let _permit = permit;
        tokio::select! {
            () = end => {}
            () = stall => {
                tracing::debug!("an HTTP/2 live reader took nothing for the send timeout; ending it");
            }
        }
        abort.abort();
    });
    let body = Abortable::new(body.into_data_stream(), registration);
    let body = ends_with_token(body, body_principal);
    Response::from_parts(parts, Body::from_stream(taking.track(body, watcher)))
}

/// Ends `body` before the first frame it has ready once `principal`'s token has stopped
/// working. The watcher task ends the body too, but only once it runs: a frame ready in between
/// (a record appended just after the revocation) would still go out.
fn ends_with_token<S: Stream + Unpin>(
    mut body: S,
    principal: Option<Arc<Principal>>,
) -> impl Stream<Item = S::Item> + Unpin {
    let principal = principal.filter(|p| p.token_id.is_some());
    futures::stream::poll_fn(move |cx| match body.poll_next_unpin(cx) {
        Poll::Ready(Some(_)) if principal.as_ref().is_some_and(|p| p.has_ended(now_ms())) => {
            Poll::Ready(None)
        }
        polled => polled,
    })
}

/// Completes when `principal`'s token stops working: revoked (it is then unknown) or expired.
async fn token_end(principal: &Principal) -> TokenError {
    tokio::select! {
        () = token_expiry(principal.expires_ms) => TokenError::Expired,
        () = principal.revoked.revoked() => TokenError::Unknown,
    }
}

fn too_many_live_readers(face: Face) -> Response {
    let (status, reason) = (
        StatusCode::SERVICE_UNAVAILABLE,
        "too many live readers; retry shortly",
    );
    let mut response = super::refusal(face, status, "unavailable", reason);
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_static(RETRY_AFTER_SECS),
    );
    response
}

#[cfg(test)]
pub(super) mod tests;
