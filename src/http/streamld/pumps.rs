//! A replication session's subscriptions and the pumps behind them: each subscribed stream is
//! one follow of the stream (see `docs/live-reads.md`), its records, state changes, gaps and
//! deletion sent to the replica as StreamLD messages; a bucket subscription follows every stream
//! of its bucket, including streams created later.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::super::AppState;
use super::super::task::OwnedTask;
use crate::model::Offset;
use crate::model::names;
use crate::model::streamld::{self, GapSignal, Message, SnapshotRef, StreamDeleted, StreamState};
use crate::service::{Chunks, Event, Follow, FollowOptions, ReplicatedState, Stream, StreamError};
use crate::storage::StorageError;

/// Records per frame batch read from storage.
pub(super) const READ_BATCH: u64 = 1000;
/// The most targets one session follows at once. A replica of many streams follows their
/// bucket; without a bound, joins of streams that do not exist, sent to a session that reads
/// slowly, would each leave a pump waiting for room.
pub const MAX_SUBSCRIPTIONS: usize = 10_000;

/// Where one subscription's pumps send: the session's queue, each message tagged with the
/// subscription. Once a later join replaces the subscription (or the session ends) the writer
/// drops whatever of it is still queued or in flight, so the replica hears nothing more from
/// it, even from a pump whose abort has not taken effect yet.
#[derive(Clone)]
pub(super) struct Outbox {
    pub(super) queue: mpsc::Sender<(CancellationToken, Message)>,
    pub(super) subscription: CancellationToken,
    /// Cancelled when a pump cannot go on (its stream could not be read): the session ends, and
    /// the replica joins again, resuming from its cursors, rather than wait on a stream that
    /// went quiet for it.
    pub(super) failed: CancellationToken,
}

/// The session is over, or this subscription was replaced.
pub(super) struct Ended;

impl Outbox {
    pub(super) async fn send(&self, message: Message) -> Result<(), Ended> {
        if self.subscription.is_cancelled() {
            return Err(Ended);
        }
        (self.queue.send((self.subscription.clone(), message)).await).map_err(|_| Ended)
    }

    pub(super) fn is_closed(&self) -> bool {
        self.queue.is_closed() || self.subscription.is_cancelled()
    }

    pub(super) fn fail(&self) {
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
pub(super) struct Subscriptions {
    live: HashMap<String, Subscription>,
    started: u64,
    /// The parent of every subscription's token: cancelled when the session ends, it silences
    /// what finished subscriptions still have queued too.
    session: CancellationToken,
    /// A pump could not go on (see [`Outbox::failed`]).
    pub(super) failed: CancellationToken,
}

const SUBSCRIPTIONS_GAUGE: &str = "runnel_replication_subscriptions";

impl Subscriptions {
    /// Starts a subscription to `target`, replacing (and silencing) the one before. `pump`
    /// gets the outbox and the subscription's generation.
    pub(super) fn replace<F>(
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
    pub(super) fn has_room_for(&self, target: &Target) -> bool {
        self.live.len() < MAX_SUBSCRIPTIONS || self.live.contains_key(&target.name())
    }

    /// Forgets the subscription to `target` whose pump ended, unless a later join replaced it.
    /// What it queued before it ended is still sent.
    pub(super) fn finished(&mut self, target: &str, generation: u64) {
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
    pub(super) fn joined(&self) -> bool {
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

pub(super) enum Target {
    Stream(String),
    Bucket(String),
}

impl Target {
    /// The session's name for a subscription to it.
    pub(super) fn name(&self) -> String {
        match self {
            Target::Stream(key) => key.clone(),
            Target::Bucket(bucket) => format!("bucket:{bucket}"),
        }
    }
}

/// What a subscription's `stream` IRI names on this server: a bucketed stream or a bucket.
pub(super) fn target_of(iri: &str) -> Option<Target> {
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
pub(super) async fn bucket_pump(
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
pub(super) struct Cursor {
    pub(super) after: u64,
    pub(super) last_timestamp: Option<i64>,
}

/// A bucket subscription's cursors, by stream name.
pub(super) struct Cursors {
    pub(super) after: std::collections::BTreeMap<String, u64>,
    pub(super) last_timestamps: std::collections::BTreeMap<String, i64>,
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
pub(super) async fn stream_pump(
    app: AppState,
    queue: Outbox,
    origin: String,
    key: String,
    cursor: Cursor,
) {
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

pub(super) async fn pump(
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
