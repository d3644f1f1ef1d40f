//! The StreamLD faces of the upstream: the WebSocket replication binding (seed 003) at
//! `/v1/streamld/replication`, and the SSE binding at `/{bucket}/{stream}/streamld`. Both are
//! advertised only through `Link` headers on the stream (and bucket) responses.
//!
//! A replication session reads each subscribed stream at its own pace, like any reader: a slow
//! replica slows only its own session, never writers, and the session buffers a bounded number of
//! messages. A replica that stops reading for longer than `SEND_TIMEOUT` is disconnected; it
//! resumes from its persisted cursor when it reconnects.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{
    CloseFrame, Message as WsMessage, WebSocket, WebSocketUpgrade, close_code,
};
use axum::extract::{FromRequestParts, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::AppState;
use super::origin::Origin;
use super::task::OwnedTask;
use crate::model::Offset;
use crate::model::access::Operation;
use crate::model::names;
use crate::model::streamld::{self, GapSignal, Message, SnapshotRef, StreamDeleted, StreamState};
use crate::service::{
    Chunks, Ends, Event, Follow, FollowOptions, FrameView, LiveFrame, Principal, ReplicatedState,
    Stream, StreamError,
};
use crate::storage::StorageError;

/// Messages queued per session before its pumps wait for the replica.
const SESSION_QUEUE: usize = 256;
/// How long one message may take to reach a replica before the session gives up on it.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest reason a WebSocket close frame carries (RFC 6455, 5.5: 125 bytes with the code).
const MAX_CLOSE_REASON_BYTES: usize = 123;
/// Records per frame batch read from storage.
const READ_BATCH: u64 = 1000;
/// How long a replica may stay connected without following anything.
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The most per-stream cursors a join's log line lists.
const LOGGED_CURSORS: usize = 64;
/// The most targets one session follows at once. A replica of many streams follows their
/// bucket; without a bound, joins of streams that do not exist, sent to a session that reads
/// slowly, would each leave a pump waiting for room.
pub const MAX_SUBSCRIPTIONS: usize = 10_000;

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
    let writer = tokio::spawn(async move {
        while let Some((subscription, message)) = outgoing.recv().await {
            if subscription.is_cancelled() {
                // Replaced by a later join (see `Outbox`).
                continue;
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
            () = principal.revoked.cancelled() => break,
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
        let Some(target) =
            target_of(&request.stream).filter(|target| may_replicate(&principal, target))
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
                let (app, origin, ended) = (app.clone(), origin.clone(), ended_tx.clone());
                subscriptions.replace(key.clone(), &queue, |outbox, generation| async move {
                    stream_pump(app, outbox, origin, key.clone(), cursor).await;
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
                let (app, origin) = (app.clone(), origin.clone());
                subscriptions.replace(name, &queue, |outbox, _| {
                    bucket_pump(app, outbox, origin, bucket, cursors)
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

/// Where one subscription's pumps send: the session's queue, each message tagged with the
/// subscription. Once a later join replaces the subscription (or the session ends) the writer
/// drops whatever of it is still queued or in flight, so the replica hears nothing more from
/// it, even from a pump whose abort has not taken effect yet.
#[derive(Clone)]
struct Outbox {
    queue: mpsc::Sender<(CancellationToken, Message)>,
    subscription: CancellationToken,
    /// Cancelled when a pump cannot go on (its stream could not be read): the session ends, and
    /// the replica joins again, resuming from its cursors, rather than wait on a stream that
    /// went quiet for it.
    failed: CancellationToken,
}

/// The session is over, or this subscription was replaced.
struct Ended;

impl Outbox {
    async fn send(&self, message: Message) -> Result<(), Ended> {
        if self.subscription.is_cancelled() {
            return Err(Ended);
        }
        (self.queue.send((self.subscription.clone(), message)).await).map_err(|_| Ended)
    }

    fn is_closed(&self) -> bool {
        self.queue.is_closed() || self.subscription.is_cancelled()
    }

    fn fail(&self) {
        self.failed.cancel();
    }
}

/// A live subscription of the session: dropping it (replaced, or the session ended) silences
/// its outbox, then aborts its pump.
struct Subscription {
    /// Which of the session's subscriptions this is, so a pump's end is not taken for that of
    /// a later subscription to the same target.
    generation: u64,
    ended: tokio_util::sync::DropGuard,
    /// Stops the pump when the subscription goes.
    _pump: OwnedTask,
}

/// A session's live subscriptions, by target. How many there are across sessions is
/// `runnel_replication_subscriptions` on `/metrics`.
#[derive(Default)]
struct Subscriptions {
    live: HashMap<String, Subscription>,
    started: u64,
    /// The parent of every subscription's token: cancelled when the session ends, it silences
    /// what finished subscriptions still have queued too.
    session: CancellationToken,
    /// A pump could not go on (see [`Outbox::failed`]).
    failed: CancellationToken,
}

const SUBSCRIPTIONS_GAUGE: &str = "runnel_replication_subscriptions";

impl Subscriptions {
    /// Starts a subscription to `target`, replacing (and silencing) the one before. `pump`
    /// gets the outbox and the subscription's generation.
    fn replace<F>(
        &mut self,
        target: String,
        queue: &mpsc::Sender<(CancellationToken, Message)>,
        pump: impl FnOnce(Outbox, u64) -> F,
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        // The old subscription (if any) ends before the new one starts.
        self.forget(&target);
        self.started += 1;
        let subscription = self.session.child_token();
        let outbox = Outbox {
            queue: queue.clone(),
            subscription: subscription.clone(),
            failed: self.failed.clone(),
        };
        let started = Subscription {
            generation: self.started,
            ended: subscription.drop_guard(),
            _pump: OwnedTask::spawn(pump(outbox, self.started)),
        };
        self.live.insert(target, started);
        metrics::gauge!(SUBSCRIPTIONS_GAUGE).increment(1.0);
    }

    /// Whether a join of `target` may start: it replaces one, or the session follows fewer
    /// than [`MAX_SUBSCRIPTIONS`].
    fn has_room_for(&self, target: &Target) -> bool {
        self.live.len() < MAX_SUBSCRIPTIONS || self.live.contains_key(&target.name())
    }

    /// Forgets the subscription to `target` whose pump ended, unless a later join replaced it.
    /// What it queued before it ended is still sent.
    fn finished(&mut self, target: &str, generation: u64) {
        if self
            .live
            .get(target)
            .is_some_and(|s| s.generation == generation)
            && let Some(done) = self.live.remove(target)
        {
            done.ended.disarm();
            metrics::gauge!(SUBSCRIPTIONS_GAUGE).decrement(1.0);
        }
    }

    fn forget(&mut self, target: &str) {
        if self.live.remove(target).is_some() {
            metrics::gauge!(SUBSCRIPTIONS_GAUGE).decrement(1.0);
        }
    }

    /// Whether the replica ever joined anything on this session.
    fn joined(&self) -> bool {
        self.started > 0
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        self.session.cancel();
        metrics::gauge!(SUBSCRIPTIONS_GAUGE).decrement(self.live.len() as f64);
    }
}

/// The stream pumps of one bucket subscription, by stream incarnation (internal id). How many
/// there are across sessions is `runnel_replication_streams_followed` on `/metrics`.
#[derive(Default)]
struct Followed(HashMap<u64, OwnedTask>);

const FOLLOWED_GAUGE: &str = "runnel_replication_streams_followed";

impl Followed {
    fn insert_with(&mut self, id: u64, spawn: impl FnOnce() -> OwnedTask) {
        if let std::collections::hash_map::Entry::Vacant(slot) = self.0.entry(id) {
            slot.insert(spawn());
            metrics::gauge!(FOLLOWED_GAUGE).increment(1.0);
        }
    }

    fn remove(&mut self, id: u64) {
        if self.0.remove(&id).is_some() {
            metrics::gauge!(FOLLOWED_GAUGE).decrement(1.0);
        }
    }
}

impl Drop for Followed {
    fn drop(&mut self) {
        metrics::gauge!(FOLLOWED_GAUGE).decrement(self.0.len() as f64);
    }
}

enum Target {
    Stream(String),
    Bucket(String),
}

impl Target {
    /// The session's name for a subscription to it.
    fn name(&self) -> String {
        match self {
            Target::Stream(key) => key.clone(),
            Target::Bucket(bucket) => format!("bucket:{bucket}"),
        }
    }
}

/// What a subscription's `stream` IRI names on this server: a bucketed stream or a bucket.
fn target_of(iri: &str) -> Option<Target> {
    let path = streamld::iri_path(iri)?;
    let mut segments = path.trim_start_matches('/').splitn(2, '/');
    match (segments.next(), segments.next()) {
        (Some(bucket), None | Some("")) => names::validate_bucket_id(bucket)
            .ok()
            .map(|()| Target::Bucket(bucket.to_string())),
        (Some(bucket), Some(stream)) => names::stream_key_in(bucket, stream)
            .ok()
            .map(Target::Stream),
        _ => None,
    }
}

/// Follows every stream of a bucket, including streams created later; the streams the replica
/// has (its `cursors`) that the bucket no longer holds get a `StreamDeleted` first.
async fn bucket_pump(
    app: AppState,
    queue: Outbox,
    origin: String,
    bucket: String,
    cursors: Cursors,
) {
    // Subscribed before the first look at the bucket, so no stream slips between the two.
    let mut appearing = app.service.streams_appearing_in(&bucket);
    // One pump per stream incarnation (internal id): a stream recreated under the same name is a
    // new stream, followed from its start; a pump that ended (gap, deletion) is not restarted
    // here; the replica subscribes again when it is ready. A stream's pump is forgotten once
    // the stream is deleted (ids are never reused), so a long session holds one per stream that
    // exists, not one per stream it ever saw.
    let mut pumps = Followed::default();
    let (ended_tx, mut ended) = mpsc::unbounded_channel::<u64>();
    let prefix = names::bucket_prefix(&bucket);
    let follow = |pumps: &mut Followed, id: u64, key: &str, cursor: Cursor| {
        pumps.insert_with(id, || {
            let (app, queue, origin) = (app.clone(), queue.clone(), origin.clone());
            let (key, ended) = (key.to_string(), ended_tx.clone());
            OwnedTask::spawn(async move {
                stream_pump(app.clone(), queue, origin, key.clone(), cursor).await;
                // Ended on a gap while the stream lives on: it stays followed (and is not
                // restarted) until the replica asks again or the stream goes.
                if let Ok(stream) = app.service.find(&key, false).await
                    && stream.id == id
                {
                    stream.until_deleted().await;
                }
                let _ = ended.send(id);
            })
        });
    };
    // The replica holds a cursor for every stream it has; those gone from the bucket since (it
    // was away when they were deleted) are deleted on the replica too, before anything else.
    let streams = app.service.bucket_streams(&bucket);
    let present: HashSet<&str> = streams.iter().map(|s| &*s.name).collect();
    for name in cursors.after.keys() {
        let Ok(key) = names::stream_key_in(&bucket, name) else {
            continue;
        };
        if !present.contains(key.as_str()) {
            let stream = streamld::stream_iri(&origin, &key);
            if queue
                .send(Message::Deleted(StreamDeleted { stream }))
                .await
                .is_err()
            {
                return;
            }
        }
    }
    for stream in &streams {
        let cursor = cursors.of(&stream.name[prefix.len()..]);
        follow(&mut pumps, stream.id, &stream.name, cursor);
    }
    drop(streams);
    // Streams that appear later are followed from their start.
    loop {
        tokio::select! {
            appeared = appearing.next(&app.service) => {
                let Some(appeared) = appeared else { break };
                for stream in appeared {
                    follow(&mut pumps, stream.id, &stream.name, Cursor::default());
                }
                if queue.is_closed() {
                    break;
                }
            }
            Some(id) = ended.recv() => pumps.remove(id),
        }
    }
}

/// Where a replica's copy of a stream ends: the cursor it joined with (its next record), and the
/// timestamp of its last record when it said (see `SubscriptionRequest::last_timestamp`).
#[derive(Clone, Copy, Debug, Default)]
struct Cursor {
    after: u64,
    last_timestamp: Option<i64>,
}

/// A bucket subscription's cursors, by stream name.
struct Cursors {
    after: std::collections::BTreeMap<String, u64>,
    last_timestamps: std::collections::BTreeMap<String, i64>,
}

impl Cursors {
    fn of(&self, name: &str) -> Cursor {
        Cursor {
            after: self.after.get(name).copied().unwrap_or(0),
            last_timestamp: self.last_timestamps.get(name).copied(),
        }
    }
}

/// Sends one stream's state, then its records after the replica's cursor, then every change,
/// until the stream is deleted or the session ends.
async fn stream_pump(app: AppState, queue: Outbox, origin: String, key: String, cursor: Cursor) {
    let url = streamld::stream_iri(&origin, &key);
    let stream = match app.service.find(&key, false).await {
        Ok(stream) => stream,
        Err(_) => {
            let _ = queue
                .send(Message::Deleted(StreamDeleted { stream: url }))
                .await;
            return;
        }
    };
    // A pump ends on its own only when the replica must act (a gap, a deletion) or its
    // session or subscription is over; anything else leaves the replica waiting. A read that
    // failed on I/O may succeed when the replica joins again; corrupt data would not, and ending
    // the session for it would only cut every other stream's catch-up short, again and again.
    match pump(&app, &queue, &url, &stream, cursor).await {
        Err(_) if queue.is_closed() => {}
        Err(StreamError::Storage(StorageError::Io(e))) => {
            tracing::warn!(stream = %key, error = %e, "replication read failed; ending its session");
            queue.fail();
        }
        Err(e) => {
            tracing::error!(stream = %key, error = %e, "replication of this stream stopped");
        }
        Ok(()) => {}
    }
}

async fn pump(
    app: &AppState,
    queue: &Outbox,
    url: &str,
    stream: &Arc<Stream>,
    cursor: Cursor,
) -> Result<(), StreamError> {
    let after = cursor.after;
    let send = |message: Message| async move {
        queue.send(message).await.map_err(|_| StreamError::NotFound)
    };
    // What the replica was last told beside the records; a new state goes out when it changes.
    // Taken before the state it stands for: the state may wait for room in the session's queue,
    // and a change made meanwhile must go out after it, not count as told.
    let described = |d: &crate::service::Durable| (d.meta_version, d.closed, d.first);
    let mut told = described(&stream.durable());
    let state = app.service.replicated_state(stream)?;
    send(state_message(url, &state)).await?;
    // A replica applies a close only once it holds every record before it: a closed stream's
    // state goes out again after the backlog.
    told.1 &= after >= state.tail.seq;
    let gap = |first: u64| GapSignal {
        oldest_available: Some(streamld::sequence_of(first)),
        stream: Some(url.to_string()),
        ..Default::default()
    };
    if after < state.retained_from.seq || after > state.tail.seq {
        return send(Message::Gap(gap(state.retained_from.seq))).await;
    }
    if let Some(timestamp_ms) = cursor.last_timestamp
        && after > state.retained_from.seq
    {
        match last_record_is(app, stream, after - 1, timestamp_ms, state.tail).await {
            Ok(true) => {}
            Ok(false) => {
                let diverged = GapSignal {
                    diverged: true,
                    ..gap(state.retained_from.seq)
                };
                return send(Message::Gap(diverged)).await;
            }
            // Trimmed while this pump looked.
            Err(StreamError::RecordRetained { first, .. }) => {
                return send(Message::Gap(gap(first))).await;
            }
            Err(StreamError::Retained { first }) => {
                return send(Message::Gap(gap(first.seq))).await;
            }
            Err(e) => return Err(e),
        }
    }
    let start = match app.service.record_offset(stream, after, state.tail).await {
        Ok(at) => at,
        Err(StreamError::RecordRetained { first, .. }) => {
            return send(Message::Gap(gap(first))).await;
        }
        Err(e) => return Err(e),
    };
    let source = Chunks::from(start, Some(READ_BATCH));
    let mut follow = Follow::new(
        &app.service,
        stream.clone(),
        source,
        FollowOptions::replica(),
    );
    loop {
        match follow.next().await {
            Event::Records(chunk) => {
                let upstream_next = streamld::sequence_of(stream.durable().tail.seq);
                for record in &chunk.records {
                    let frame = streamld::frame(url, &stream.content_type, record, upstream_next);
                    send(Message::Frame(Box::new(frame))).await?;
                }
            }
            Event::CaughtUp(durable) | Event::Changed(durable) => {
                if described(&durable) != told {
                    told = described(&durable);
                    send(state_message(url, &app.service.replicated_state(stream)?)).await?;
                }
            }
            // Trimmed under this pump: the replica hears of the gap.
            Event::Gap { first } => return send(Message::Gap(gap(first.seq))).await,
            // Deleted, for good or while forks still read through it: gone for the replica
            // either way.
            Event::Deleted(_) => {
                return send(Message::Deleted(StreamDeleted {
                    stream: url.to_string(),
                }))
                .await;
            }
            Event::Failed(e) => return Err(e),
            // The server is shutting down, and the session with it.
            Event::Ended(_) => return Ok(()),
            Event::Shared(_) | Event::Idle | Event::Closed => {}
        }
    }
}

fn state_message(url: &str, state: &ReplicatedState) -> Message {
    Message::State(Box::new(StreamState {
        stream: url.to_string(),
        content_type: state.content_type.clone(),
        closed: state.closed,
        attrs: state.attrs.clone(),
        ttl_secs: state.ttl_secs,
        expires_at_ms: state.expires_at_ms,
        retained_from: state.retained_from.to_string(),
        first_sequence: streamld::sequence_of(state.retained_from.seq),
        tail: state.tail.to_string(),
        next_sequence: streamld::sequence_of(state.tail.seq),
        snapshot: state.snapshot.as_ref().map(|s| SnapshotRef {
            offset: s.offset.to_string(),
            content_type: s.content_type.clone(),
            digest: s.digest.clone(),
        }),
        created_ms: state.created_ms,
        cipher: state.cipher.clone(),
        key_fingerprint: state.key_fingerprint.clone(),
    }))
}

/// Whether record `seq` of `stream` carries `timestamp_ms`, as the replica's copy of it does.
/// Another timestamp there means the stream was written anew past that point since the replica
/// copied it (restored from an older backup, say): same ordinals, other records.
async fn last_record_is(
    app: &AppState,
    stream: &Arc<Stream>,
    seq: u64,
    timestamp_ms: i64,
    tail: Offset,
) -> Result<bool, StreamError> {
    let at = app.service.record_offset(stream, seq, tail).await?;
    let chunk = app.service.read_at(stream, at, Some(1)).await?;
    Ok(chunk
        .records
        .first()
        .is_some_and(|r| r.seq == seq && r.timestamp_ms == timestamp_ms))
}

/// The SSE binding's answer to a cursor it cannot serve: 409 with a `GapSignal` naming the first
/// record it holds.
fn gap_response(first: u64) -> Response {
    let gap = Message::Gap(GapSignal {
        oldest_available: Some(streamld::sequence_of(first)),
        ..Default::default()
    });
    (
        StatusCode::CONFLICT,
        [(header::CONTENT_TYPE, "application/ld+json")],
        gap.to_json(),
    )
        .into_response()
}

/// The SSE binding: one event per record, `id` = its cursor; `Last-Event-ID` (or `?after=`)
/// resumes; a cursor that cannot be served answers 409 with a `GapSignal`.
pub async fn sse(
    app: &AppState,
    key: &str,
    origin: &str,
    after: u64,
) -> Result<Response, StreamError> {
    let stream = app.service.find(key, false).await?;
    if stream.encrypted {
        return Err(StreamError::Encrypted);
    }
    let url = streamld::stream_iri(origin, key);
    let durable = stream.durable();
    if after < durable.first.seq || after > durable.tail.seq {
        return Ok(gap_response(durable.first.seq));
    }
    if durable.closed && after == durable.tail.seq {
        // Nothing will ever follow: 204 tells an EventSource to stop reconnecting.
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let start = match app
        .service
        .record_offset(&stream, after, durable.tail)
        .await
    {
        Ok(at) => at,
        Err(StreamError::RecordRetained { first, .. }) => return Ok(gap_response(first)),
        Err(e) => return Err(e),
    };
    let (keepalive, deadline) = super::sse::live_timing(app);
    // Readers at one place render the same events: they share one rendering (see `LiveFrame`).
    let view = FrameView::StreamLd(origin.into());
    let options = FollowOptions {
        ends: Ends::At(deadline),
        frames: Some(view.clone()),
        ..FollowOptions::live(keepalive)
    };
    let source = Chunks::from(start, Some(READ_BATCH));
    let mut follow = Follow::new(&app.service, stream, source, options);
    let events = async_stream::stream! {
        loop {
            match follow.next().await {
                Event::Shared(frame) => yield Ok::<Bytes, std::io::Error>(frame.bytes),
                Event::Records(mut chunk) => {
                    let stream = follow.stream();
                    let mut out = Vec::new();
                    for record in &chunk.records {
                        let event = streamld::envelope(&url, &stream.content_type, record);
                        streamld::write_sse_event(&mut out, &event);
                    }
                    let events = Bytes::from(out);
                    if chunk.up_to_date {
                        let frame = LiveFrame {
                            view: view.clone(),
                            start: chunk.start,
                            next: chunk.next,
                            closed: chunk.closed,
                            bytes: events.clone(),
                            records_len: events.len(),
                            tag: 0,
                        };
                        follow.share(frame, &mut chunk.lease);
                    }
                    yield Ok(events);
                }
                // A comment line: EventSource ignores it, proxies see the connection alive.
                Event::Idle => yield Ok(Bytes::from_static(b": keep-alive\n\n")),
                Event::CaughtUp(_) | Event::Changed(_) => {}
                // Records trimmed under the reader end the stream rather than being skipped:
                // the client's reconnect (Last-Event-ID) is then answered with the GapSignal.
                Event::Gap { .. }
                | Event::Closed
                | Event::Deleted(_)
                | Event::Ended(_)
                | Event::Failed(_) => return,
            }
        }
    };
    let mut response = (StatusCode::OK, Body::from_stream(events)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::super::live::tests::app_over;
    use super::*;

    #[test]
    fn subscription_targets_are_buckets_or_bucketed_streams() {
        assert!(matches!(target_of("http://up:1/docs"), Some(Target::Bucket(b)) if b == "docs"));
        assert!(matches!(target_of("http://up:1/docs/"), Some(Target::Bucket(b)) if b == "docs"));
        assert!(
            matches!(target_of("http://up:1/docs/a%20b"), Some(Target::Stream(k)) if k == "/docs/a b")
        );
        assert!(target_of("http://up:1/v1/stream/x").is_none());
        assert!(target_of("http://up:1/").is_none());
    }

    fn outbox_of(queue: mpsc::Sender<(CancellationToken, Message)>) -> Outbox {
        Outbox {
            queue,
            subscription: CancellationToken::new(),
            failed: CancellationToken::new(),
        }
    }

    /// A memory engine whose reads fail with `failure` once it is set.
    struct FailingReads {
        inner: crate::storage::MemoryEngine,
        failure: std::sync::Mutex<Option<StorageError>>,
    }

    impl crate::storage::Engine for FailingReads {
        fn commit(
            &self,
            changes: Vec<crate::storage::Change>,
        ) -> futures::future::BoxFuture<'static, Result<(), crate::storage::StorageError>> {
            self.inner.commit(changes)
        }

        fn read(
            &self,
            id: crate::storage::StreamId,
            from: u64,
            until: u64,
            max_bytes: usize,
        ) -> futures::future::BoxFuture<
            'static,
            Result<Vec<crate::model::Record>, crate::storage::StorageError>,
        > {
            if let Some(failure) = self.failure.lock().unwrap().clone() {
                return Box::pin(futures::future::ready(Err(failure)));
            }
            self.inner.read(id, from, until, max_bytes)
        }

        fn read_snapshot(
            &self,
            id: crate::storage::StreamId,
        ) -> futures::future::BoxFuture<'static, Result<Option<Bytes>, crate::storage::StorageError>>
        {
            self.inner.read_snapshot(id)
        }

        fn recover(&self) -> Result<crate::storage::Recovered, crate::storage::StorageError> {
            self.inner.recover()
        }
    }

    /// Follows stream `s`, whose one record cannot be read (`failure`), as a replication session
    /// would: whether the pump asks for the session to end, once the pump has stopped.
    async fn session_ended_by(failure: StorageError) -> bool {
        use crate::service::{AppendRequest, CreateRequest, ServiceConfig, StreamService};

        let engine = Arc::new(FailingReads {
            inner: crate::storage::MemoryEngine::new(),
            failure: std::sync::Mutex::new(None),
        });
        let writer = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
        let create = CreateRequest {
            name: "s".into(),
            content_type: Some("text/plain".into()),
            ..Default::default()
        };
        writer.create(create).await.unwrap();
        let append = AppendRequest {
            content_type: Some("text/plain"),
            body: Bytes::from_static(b"on disk"),
            ..Default::default()
        };
        writer.append("s", append).await.unwrap();
        // Opened again, with nothing in its caches: its records are read from the engine.
        let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
        *engine.failure.lock().unwrap() = Some(failure);

        let (queue, _sent) = mpsc::channel(16);
        let outbox = outbox_of(queue);
        let failed = outbox.failed.clone();
        let cursor = Cursor {
            after: 0,
            last_timestamp: None,
        };
        let pumping = stream_pump(
            app_over(service),
            outbox,
            "http://up".into(),
            "s".into(),
            cursor,
        );
        let stopped = tokio::time::timeout(Duration::from_secs(5), pumping).await;
        assert!(stopped.is_ok(), "the pump stops");
        failed.is_cancelled()
    }

    #[tokio::test]
    async fn a_stream_that_cannot_be_read_for_an_io_error_ends_its_replication_session() {
        let failure = StorageError::Io("a test's disk".into());
        assert!(session_ended_by(failure).await, "the replica joins again");
    }

    #[tokio::test]
    async fn a_stream_whose_data_is_corrupt_stops_alone_and_the_session_goes_on() {
        let failure = StorageError::Corrupt("a test's record".into());
        assert!(
            !session_ended_by(failure).await,
            "the other streams of the session go on"
        );
    }

    #[tokio::test]
    async fn a_close_made_while_a_stream_state_waits_for_room_goes_out_after_it() {
        use crate::service::AppendRequest;

        let (service, stream) = crate::service::one_text_stream().await;
        let app = app_over(service.clone());
        // A session's queue with no room: the pump's first state waits.
        let (queue, mut sent) = mpsc::channel(1);
        let outbox = outbox_of(queue);
        let filler = || {
            Message::Deleted(StreamDeleted {
                stream: "filler".into(),
            })
        };
        assert!(outbox.send(filler()).await.is_ok());
        let pumping = tokio::spawn(async move {
            let cursor = Cursor {
                after: 0,
                last_timestamp: None,
            };
            pump(&app, &outbox, "http://up/s", &stream, cursor).await
        });
        // The pump runs until its state finds no room (one runtime thread: it runs now).
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let close = AppendRequest {
            content_type: Some("text/plain"),
            close: true,
            ..Default::default()
        };
        service.append("s", close).await.unwrap();

        let mut closed_told = false;
        while !closed_told {
            let next = tokio::time::timeout(Duration::from_secs(5), sent.recv()).await;
            let (_, message) = next
                .expect("the close goes out after the state")
                .expect("a message");
            closed_told = matches!(message, Message::State(state) if state.closed);
        }
        pumping.abort();
    }

    /// The service and its stream `s`, holding `count` records.
    async fn stream_of(count: usize) -> (Arc<crate::service::StreamService>, Arc<Stream>) {
        let (service, stream) = crate::service::one_text_stream().await;
        for _ in 0..count {
            let append = crate::service::AppendRequest {
                content_type: Some("text/plain"),
                body: Bytes::from_static(b"r"),
                ..Default::default()
            };
            service.append("s", append).await.unwrap();
        }
        (service, stream)
    }

    #[tokio::test]
    async fn records_trimmed_under_a_replication_pump_are_a_gap_signal_to_its_replica() {
        let (service, stream) = stream_of(READ_BATCH as usize * 2).await;
        let trimmed = stream.clone();
        let app = app_over(service.clone());
        // Room for one message: the pump sends its state, reads its first batch and waits for
        // room for the batch's first frame.
        let (queue, mut sent) = mpsc::channel(1);
        let outbox = outbox_of(queue);
        let cursor = Cursor {
            after: 0,
            last_timestamp: None,
        };
        let pumping =
            tokio::spawn(async move { pump(&app, &outbox, "http://up/s", &stream, cursor).await });
        assert!(matches!(sent.recv().await, Some((_, Message::State(_)))));
        service.trim_for_test(&trimmed, READ_BATCH * 3 / 2).await;
        let mut last = None;
        while let Some((_, message)) = sent.recv().await {
            last = Some(message);
        }
        assert!(pumping.await.unwrap().is_ok());
        let Some(Message::Gap(signal)) = last else {
            panic!("expected a gap signal last, got {last:?}");
        };
        let first = streamld::sequence_of(READ_BATCH * 3 / 2);
        assert_eq!(signal.oldest_available, Some(first));
    }

    #[tokio::test]
    async fn records_trimmed_under_a_streamld_sse_reader_end_its_response() {
        let (service, stream) = stream_of(3).await;
        let app = app_over(service.clone());
        let response = sse(&app, "s", "http://up", 0).await.unwrap();
        // The body is read once the response goes out: the trim passes its reader first.
        service.trim_for_test(&stream, 2).await;
        let body = axum::body::to_bytes(response.into_body(), usize::MAX);
        let body = tokio::time::timeout(Duration::from_secs(5), body).await;
        assert!(body.expect("it ends").unwrap().is_empty());
    }
}
