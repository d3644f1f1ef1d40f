//! What a StreamLD replica is sent (seed 003): for each stream it follows, the stream's state,
//! then its records after the replica's cursor, then every change, as StreamLD messages, until
//! a gap or a deletion the replica must act on. Each stream is one follow of the stream (see
//! `docs/live-reads.md`); a bucket's feed follows every stream of the bucket, including streams
//! created later. The WebSocket face carries the messages; nothing here is about its transport.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::OwnedTask;
use crate::model::Offset;
use crate::model::names;
use crate::model::streamld::{self, GapSignal, Message, SnapshotRef, StreamDeleted, StreamState};
use crate::service::{
    Chunks, Durable, Event, Follow, FollowOptions, ReplicatedState, Stream, StreamError,
    StreamService,
};
use crate::storage::StorageError;

/// Records per frame batch read from storage.
pub const READ_BATCH: u64 = 1000;

/// Where one subscription's pumps send: the session's queue, each message tagged with the
/// subscription. Once a later join replaces the subscription (or the session ends) the writer
/// drops whatever of it is still queued or in flight, so the replica hears nothing more from
/// it, even from a pump whose abort has not taken effect yet.
#[derive(Clone)]
pub struct Outbox {
    pub queue: mpsc::Sender<(CancellationToken, Message)>,
    pub subscription: CancellationToken,
    /// Cancelled when a pump cannot go on (its stream could not be read): the session ends, and
    /// the replica joins again, resuming from its cursors, rather than wait on a stream that
    /// went quiet for it.
    pub failed: CancellationToken,
}

/// The session is over, or this subscription was replaced.
pub struct Ended;

impl Outbox {
    pub async fn send(&self, message: Message) -> Result<(), Ended> {
        if self.subscription.is_cancelled() {
            return Err(Ended);
        }
        (self.queue.send((self.subscription.clone(), message)).await).map_err(|_| Ended)
    }

    pub fn is_closed(&self) -> bool {
        self.queue.is_closed() || self.subscription.is_cancelled()
    }

    pub fn fail(&self) {
        self.failed.cancel();
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

/// Follows every stream of a bucket, including streams created later; the streams the replica
/// has (its `cursors`) that the bucket no longer holds get a `StreamDeleted` first.
pub async fn bucket_pump(
    service: Arc<StreamService>,
    queue: Outbox,
    origin: String,
    bucket: String,
    cursors: Cursors,
) {
    // Subscribed before the first look at the bucket, so no stream slips between the two.
    let mut appearing = service.streams_appearing_in(&bucket);
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
            let (service, queue, origin) = (service.clone(), queue.clone(), origin.clone());
            let (key, ended) = (key.to_string(), ended_tx.clone());
            OwnedTask::spawn(async move {
                stream_pump(service.clone(), queue, origin, key.clone(), cursor).await;
                // Ended on a gap while the stream lives on: it stays followed (and is not
                // restarted) until the replica asks again or the stream goes.
                if let Ok(stream) = service.find(&key, false).await
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
    let streams = service.bucket_streams(&bucket);
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
            appeared = appearing.next(&service) => {
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
pub struct Cursor {
    pub after: u64,
    pub last_timestamp: Option<i64>,
}

/// A bucket subscription's cursors, by stream name.
pub struct Cursors {
    pub after: std::collections::BTreeMap<String, u64>,
    pub last_timestamps: std::collections::BTreeMap<String, i64>,
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
pub async fn stream_pump(
    service: Arc<StreamService>,
    queue: Outbox,
    origin: String,
    key: String,
    cursor: Cursor,
) {
    let url = streamld::stream_iri(&origin, &key);
    let stream = match service.find(&key, false).await {
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
    match pump(&service, &queue, &url, &stream, cursor).await {
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

pub async fn pump(
    service: &Arc<StreamService>,
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
    let described = |d: &Durable| (d.meta_version, d.closed, d.first);
    let mut told = described(&stream.durable());
    let state = service.replicated_state(stream)?;
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
        match last_record_is(service, stream, after - 1, timestamp_ms, state.tail).await {
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
    let start = match service.record_offset(stream, after, state.tail).await {
        Ok(at) => at,
        Err(StreamError::RecordRetained { first, .. }) => {
            return send(Message::Gap(gap(first))).await;
        }
        Err(e) => return Err(e),
    };
    let source = Chunks::from(start, Some(READ_BATCH));
    let mut follow = Follow::new(service, stream.clone(), source, FollowOptions::replica());
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
                    send(state_message(url, &service.replicated_state(stream)?)).await?;
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
    service: &Arc<StreamService>,
    stream: &Arc<Stream>,
    seq: u64,
    timestamp_ms: i64,
    tail: Offset,
) -> Result<bool, StreamError> {
    let at = service.record_offset(stream, seq, tail).await?;
    let chunk = service.read_at(stream, at, Some(1)).await?;
    Ok(chunk
        .records
        .first()
        .is_some_and(|r| r.seq == seq && r.timestamp_ms == timestamp_ms))
}
