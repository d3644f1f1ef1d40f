//! The StreamLD faces of the upstream: the WebSocket replication binding (seed 003) at
//! `/v1/streamld/replication`, and the SSE binding at `/{bucket}/{stream}/streamld`. Both are
//! advertised only through `Link` headers on the stream (and bucket) responses.
//!
//! A replication session reads each subscribed stream at its own pace, like any reader: a slow
//! replica slows only its own session, never writers, and the session buffers a bounded number of
//! messages. A replica that stops reading for longer than `SEND_TIMEOUT` is disconnected; it
//! resumes from its persisted cursor when it reconnects.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{
    CloseFrame, Message as WsMessage, WebSocket, WebSocketUpgrade, close_code,
};
use axum::extract::{FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

mod pumps;
mod sse_binding;
#[cfg(test)]
mod tests;

use super::AppState;
use super::origin::Origin;
use crate::model::access::Operation;
use crate::model::names;
use crate::model::streamld::{self, GapSignal, Message, StreamDeleted};
use crate::service::{Principal, now_ms};

/// Messages queued per session before its pumps wait for the replica.
const SESSION_QUEUE: usize = 256;
/// How long one message may take to reach a replica before the session gives up on it.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest reason a WebSocket close frame carries (RFC 6455, 5.5: 125 bytes with the code).
const MAX_CLOSE_REASON_BYTES: usize = 123;
/// How long a replica may stay connected without following anything.
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The most per-stream cursors a join's log line lists.
const LOGGED_CURSORS: usize = 64;

/// `Link` header values advertising the StreamLD endpoints of a bucketed stream (or bucket) at
/// `path` (as the request spelled it), on the origin the request used.
pub fn links(origin: &Origin, path: &str, stream: bool) -> String {
    let websocket = format!(
        "<{}/v1/streamld/replication>; rel=\"{}\"",
        origin.websocket(),
        streamld::REL_WEBSOCKET
    );
    if stream {
        format!(
            "{websocket}, <{}{path}/streamld>; rel=\"{}\"",
            origin.http(),
            streamld::REL_SSE
        )
    } else {
        websocket
    }
}

pub async fn replication(app: AppState, principal: Arc<Principal>, request: Request) -> Response {
    let (mut parts, _) = request.into_parts();
    let origin = Origin::of(&parts.headers, &parts.uri, &parts.extensions).http();
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &app).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    // A replica sends only subscription requests; like any request body, none is larger than
    // `--max-body-bytes` (a bucket's cursors can make one large, so not a smaller bound).
    let limit = app.config.body.max_bytes;
    upgrade
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| session(app, principal, socket, origin))
}

/// Whether the caller may replicate a target: read it, and for a bucket every stream in it.
/// A target it may not read is answered like a missing one, revealing nothing.
fn may_replicate(principal: &Principal, target: &Target) -> bool {
    let scope = &principal.scope;
    if !scope.permits_operation(Operation::Read) {
        return false;
    }
    match target {
        Target::Bucket(bucket) => scope.covers_whole_basin(bucket),
        Target::Stream(key) => names::bucket_of(key).is_some_and(|bucket| {
            let stream = &key[bucket.len() + 2..];
            scope.covers_stream(bucket, stream)
        }),
    }
}

/// One replica's connection: any number of subscriptions, each pumped by its own task into one
/// bounded queue that the writer drains into the socket.
/// Stream IRIs sent on it are on `origin` (`scheme://authority`), the server as the replica
/// addressed it.
async fn session(app: AppState, principal: Arc<Principal>, socket: WebSocket, origin: String) {
    let (mut sink, mut incoming) = socket.split();
    let (queue, mut outgoing) = mpsc::channel::<(CancellationToken, Message)>(SESSION_QUEUE);
    // Why the session ends, when the replica sent something it cannot take part in.
    let (refuse, refusal) = oneshot::channel::<CloseFrame>();
    // The writer gave up on a replica too slow to read: the session ends with it, rather than
    // waiting on a replica that has nothing to send.
    let writer_gone = CancellationToken::new();
    let gone = writer_gone.clone();
    let writer_principal = principal.clone();
    let writer = tokio::spawn(async move {
        while let Some((subscription, message)) = outgoing.recv().await {
            if subscription.is_cancelled() {
                // Replaced by a later join (see `Outbox`).
                continue;
            }
            if writer_principal.has_ended(now_ms()) {
                // The token ended while this message waited: the session ends without it (the
                // reader loop, woken by the same revocation or expiry, sends the close frame).
                break;
            }
            let sent = tokio::time::timeout(
                SEND_TIMEOUT,
                sink.send(WsMessage::Text(message.to_json().into())),
            )
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                tracing::info!("replica too slow or gone; closing its session");
                break;
            }
        }
        gone.cancel();
        // Bounded too: a replica that reads nothing would not take the close frame either.
        let close = async {
            match refusal.await {
                Ok(frame) => sink.send(WsMessage::Close(Some(frame))).await,
                Err(_) => sink.close().await,
            }
        };
        let _ = tokio::time::timeout(SEND_TIMEOUT, close).await;
    });
    // One subscription per target: a new join for a target replaces the one before.
    let mut subscriptions = Subscriptions::default();
    // A single stream's subscription whose pump ended (the stream was deleted, or a gap the
    // replica must resolve): forgotten, so a session holds nothing for streams it is done with.
    let (ended_tx, mut ended) = mpsc::unbounded_channel::<(String, u64)>();
    let shutdown = app.service.shutdown_signal();
    let token_expired = super::token_expiry(principal.expires_ms);
    tokio::pin!(token_expired);
    let join_deadline = tokio::time::sleep(JOIN_TIMEOUT);
    tokio::pin!(join_deadline);
    let mut refuse = Some(refuse);
    let pump_failed = subscriptions.failed.clone();
    loop {
        // The session ends when the replica leaves, the server shuts down or the token that
        // opened it expires (the writer then sends a close frame and the replica resumes from
        // its cursors elsewhere or later).
        let frame = tokio::select! {
            frame = incoming.next() => frame,
            () = writer_gone.cancelled() => break,
            () = shutdown.cancelled() => break,
            () = &mut token_expired => break,
            () = principal.revoked.revoked() => break,
            () = pump_failed.cancelled() => {
                refuse_with(
                    &mut refuse,
                    close_code::ERROR,
                    "a stream could not be read here; join again to resume from your cursors"
                        .into(),
                );
                break;
            }
            Some((target, generation)) = ended.recv() => {
                subscriptions.finished(&target, generation);
                continue;
            }
            () = &mut join_deadline, if !subscriptions.joined() => {
                refuse_with(
                    &mut refuse,
                    close_code::POLICY,
                    format!(
                        "following nothing after {} s: no SubscriptionRequest named a stream or \
                         bucket this server serves to this replica",
                        JOIN_TIMEOUT.as_secs()
                    ),
                );
                break;
            }
        };
        let frame = match frame {
            Some(Ok(frame)) => frame,
            Some(Err(e)) if is_too_long(&e) => {
                refuse_with(
                    &mut refuse,
                    close_code::SIZE,
                    format!(
                        "a replica's message is at most {} bytes (--max-body-bytes)",
                        app.config.body.max_bytes
                    ),
                );
                break;
            }
            _ => break,
        };
        let text = match frame {
            WsMessage::Text(text) => text,
            WsMessage::Close(_) => break,
            WsMessage::Ping(_) | WsMessage::Pong(_) => continue,
            WsMessage::Binary(_) => {
                refuse_with(
                    &mut refuse,
                    close_code::UNSUPPORTED,
                    "binary frames are not part of StreamLD replication: send JSON text".into(),
                );
                break;
            }
        };
        let mut request = match Message::parse_from_replica(&text) {
            Ok(Message::Subscribe(request)) => request,
            Ok(_) => {
                refuse_with(
                    &mut refuse,
                    close_code::POLICY,
                    "a replica sends only SubscriptionRequest messages".into(),
                );
                break;
            }
            Err(e) => {
                tracing::info!(error = %e, "refusing a malformed replication message");
                refuse_with(
                    &mut refuse,
                    close_code::INVALID,
                    format!("not a StreamLD SubscriptionRequest: {e}"),
                );
                break;
            }
        };
        let not_served = GapSignal {
            stream: Some(request.stream.clone()),
            ..Default::default()
        };
        let Some(target) = streamld_target::of_iri(&request.stream)
            .filter(|target| may_replicate(&principal, target))
        else {
            let _ = queue
                .send((CancellationToken::new(), Message::Gap(not_served)))
                .await;
            continue;
        };
        // A bucket that does not exist is answered as a target the replica may not read, after
        // the deletion of every stream the replica holds of it (it was away when the bucket
        // went): a replica that may read the whole bucket learns nothing a GET would not say.
        if let Target::Bucket(bucket) = &target
            && app.service.bucket_info(bucket).is_err()
        {
            for name in request.cursors.iter().flat_map(|cursors| cursors.keys()) {
                let Ok(key) = names::stream_key_in(bucket, name) else {
                    continue;
                };
                let stream = streamld::stream_iri(&origin, &key);
                let deleted = Message::Deleted(StreamDeleted { stream });
                let _ = queue.send((CancellationToken::new(), deleted)).await;
            }
            let _ = queue
                .send((CancellationToken::new(), Message::Gap(not_served)))
                .await;
            continue;
        }
        if !subscriptions.has_room_for(&target) {
            refuse_with(
                &mut refuse,
                close_code::POLICY,
                format!(
                    "a session follows at most {MAX_SUBSCRIPTIONS} streams or buckets; follow \
                     their bucket instead"
                ),
            );
            break;
        }
        match target {
            Target::Stream(key) => {
                let cursor = Cursor {
                    after: request.after.unwrap_or(0),
                    last_timestamp: request.last_timestamp,
                };
                tracing::info!(stream = %key, after = cursor.after, "replication join");
                let (service, origin) = (app.service.clone(), origin.clone());
                let ended = ended_tx.clone();
                subscriptions.replace(key.clone(), &queue, |outbox, generation| async move {
                    stream_pump(service, outbox, origin, key.clone(), cursor).await;
                    let _ = ended.send((key, generation));
                });
            }
            Target::Bucket(bucket) => {
                let cursors = request.cursors.take().unwrap_or_default();
                let last_timestamps = request.last_timestamps.take().unwrap_or_default();
                // A replica of a large bucket sends a cursor per stream: listed only when few.
                if cursors.len() <= LOGGED_CURSORS {
                    tracing::info!(bucket = %bucket, cursors = ?cursors, "replication join");
                } else {
                    tracing::info!(bucket = %bucket, streams = cursors.len(), "replication join");
                }
                let name = Target::Bucket(bucket.clone()).name();
                let cursors = Cursors {
                    after: cursors,
                    last_timestamps,
                };
                let (service, origin) = (app.service.clone(), origin.clone());
                subscriptions.replace(name, &queue, |outbox, _| {
                    bucket_pump(service, outbox, origin, bucket, cursors)
                });
            }
        }
    }
    drop(subscriptions);
    drop(queue);
    drop(refuse);
    let _ = writer.await;
}

/// Ends the session with a close frame saying why. A close reason holds at most 123 bytes.
/// Whether reading a replica's message failed because it was over the size limit.
fn is_too_long(error: &axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error as WsError;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if let Some(WsError::Capacity(_)) = error.downcast_ref::<WsError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Ends the session with `code`, saying why (cut to the 123 bytes a close frame has room for).
fn refuse_with(refuse: &mut Option<oneshot::Sender<CloseFrame>>, code: u16, reason: String) {
    let end = reason.floor_char_boundary(MAX_CLOSE_REASON_BYTES);
    if let Some(refuse) = refuse.take() {
        let _ = refuse.send(CloseFrame {
            code,
            reason: reason[..end].into(),
        });
    }
}

use crate::model::wire::streamld_target::{self, Target};
use crate::service::sessions::replica_feed::{Cursor, Cursors, bucket_pump, stream_pump};
pub use pumps::MAX_SUBSCRIPTIONS;
use pumps::Subscriptions;
pub use sse_binding::sse;
