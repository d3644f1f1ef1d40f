//! What StreamLD replication needs from the stream service: the whole-stream state a mirror
//! reproduces, notifications of streams coming and going, and, on the mirror, applying the
//! upstream's records and state exactly (same offsets, ordinals, bytes and metadata).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tokio::sync::broadcast;

use super::{CreateRequest, MirrorStart, Stream, StreamError, StreamResult, StreamService};
use crate::model::ledger::create::RequestedConfig;
use crate::model::ledger::mirror::{MirrorBatch, MirrorMeta, SnapshotChange};
use crate::model::ledger::{Conflict, Refusal};
use crate::model::stream::SnapshotInfo;
use crate::model::{Offset, Record, names};
use crate::storage::{Change, StorageError, StreamId};

/// How many stream arrivals a bucket replication session may fall behind before it must look
/// at the whole bucket again.
pub const APPEARED_BACKLOG: usize = 1024;

/// A stream that came into being: created, or swapped in by a mirror's rebuild.
#[derive(Clone, Debug)]
pub struct Appeared {
    pub id: StreamId,
    pub name: Arc<str>,
}

impl Appeared {
    pub(super) fn of(stream: &Stream) -> Appeared {
        Appeared {
            id: stream.id,
            name: stream.name.clone(),
        }
    }
}

/// The create request for a mirror of `key` matching the upstream's `state`.
fn mirror_request(
    key: &str,
    upstream: &str,
    state: &ReplicatedState,
    snapshot_blob: Option<Bytes>,
) -> CreateRequest {
    CreateRequest {
        name: key.to_string(),
        content_type: Some(state.content_type.clone()),
        ttl_secs: state.ttl_secs,
        expires_at_ms: state.expires_at_ms,
        // Closed only once every record is here, and a new mirror has none yet.
        closed: state.closed && state.tail == state.retained_from,
        attrs: state.attrs.clone(),
        cipher: state.cipher.clone(),
        mirror: Some(MirrorStart {
            upstream: upstream.to_string(),
            at: state.retained_from,
            snapshot: state.snapshot.clone().zip(snapshot_blob),
            created_ms: state.created_ms,
        }),
        ..Default::default()
    }
}

/// A stream's state beside its records, as replication carries it.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicatedState {
    pub content_type: String,
    pub closed: bool,
    pub attrs: crate::model::attrs::Attrs,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub retained_from: Offset,
    pub tail: Offset,
    pub snapshot: Option<SnapshotInfo>,
    pub created_ms: i64,
    /// The cipher the records are sealed with: a mirror keeps them sealed, and its copy is
    /// encrypted the same way (readable only through S2 with the key).
    pub cipher: Option<String>,
    /// Which key sealed them, once one has.
    pub key_fingerprint: Option<String>,
}

/// The streams that come into being in one bucket, from the moment the watch was made.
pub struct AppearingIn {
    arrivals: broadcast::Receiver<Appeared>,
    bucket: String,
    prefix: String,
}

impl AppearingIn {
    /// Waits for streams to appear in the bucket: each one as it is created; or, when this watch
    /// fell more than [`APPEARED_BACKLOG`] arrivals behind and so missed some, every stream the
    /// bucket holds (a caller follows each stream once, by id). `None` once the service is gone.
    pub async fn next(&mut self, service: &StreamService) -> Option<Vec<Appeared>> {
        loop {
            match self.arrivals.recv().await {
                Ok(appeared) if appeared.name.starts_with(&self.prefix) => {
                    return Some(vec![appeared]);
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Arrivals still queued are in the look at the bucket below: listen again
                    // from now on, before looking, so none is missed and none comes twice.
                    self.arrivals = self.arrivals.resubscribe();
                    let streams = service.bucket_streams(&self.bucket);
                    return Some(streams.iter().map(|s| Appeared::of(s)).collect());
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl StreamService {
    /// Tells the bucket replication sessions of a stream that came into being (none listening
    /// is not an error).
    pub(super) fn announce(&self, stream: &Stream) {
        let _ = self.appeared.send(Appeared::of(stream));
    }

    /// Refuses writes to a stream that mirrors another server.
    pub fn writable(stream: &Stream) -> StreamResult<()> {
        match &stream.mirror_of {
            Some(upstream) => Err(StreamError::Mirrored {
                upstream: upstream.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Refuses a stream created here under `key` when a mirror would later replace it, with
    /// whatever was written to it: in a bucket mirrored whole, or as the stream a mirror of one
    /// stream follows.
    pub(super) fn creatable(&self, key: &str) -> StreamResult<()> {
        if let Some(bucket) = names::bucket_of(key) {
            self.bucket_writable(bucket)?;
        }
        match self.config.mirrored_streams.get(key) {
            Some(upstream) => Err(StreamError::Mirrored {
                upstream: upstream.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Refuses changes to a bucket mirrored from another server (`--mirror-from`): its streams,
    /// their configuration and its own come from the upstream only.
    pub(super) fn bucket_writable(&self, bucket: &str) -> StreamResult<()> {
        match self.config.mirrored_buckets.get(bucket) {
            Some(upstream) => Err(StreamError::Mirrored {
                upstream: upstream.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Hears of every stream of `bucket` that comes into being from now on.
    pub fn streams_appearing_in(&self, bucket: &str) -> AppearingIn {
        AppearingIn {
            arrivals: self.appeared.subscribe(),
            bucket: bucket.to_string(),
            prefix: names::bucket_prefix(bucket),
        }
    }

    /// The streams of a bucket that clients can see, by key.
    pub fn bucket_streams(&self, bucket: &str) -> Vec<Arc<Stream>> {
        let prefix = names::bucket_prefix(bucket);
        let registry = self.lock_registry();
        registry
            .streams_from(&prefix)
            .take_while(|(key, _)| key.starts_with(&prefix))
            .filter(|(_, s)| {
                let state = s.lock();
                !state.removed && !state.meta.soft_deleted
            })
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// The durable state of a stream beside its records; a storage error once a metadata change
    /// to it has failed in storage, as what memory holds may not be on disk (see
    /// [`super::Durable::meta_write_failed`]).
    pub fn replicated_state(&self, stream: &Stream) -> StreamResult<ReplicatedState> {
        let durable = stream.durable();
        if durable.meta_write_failed {
            return Err(StorageError::Failed.into());
        }
        let state = stream.lock();
        Ok(ReplicatedState {
            content_type: stream.content_type.to_string(),
            closed: durable.closed,
            attrs: state.meta.extra().attrs.clone(),
            ttl_secs: state.meta.ttl_secs,
            expires_at_ms: state.meta.expires_at_ms,
            retained_from: durable.first,
            tail: durable.tail,
            snapshot: state.meta.extra().snapshot.clone(),
            created_ms: state.meta.created_ms,
            cipher: state.meta.extra().cipher.clone(),
            key_fingerprint: state.meta.extra().key_fingerprint.clone(),
        })
    }

    /// The mirror of `key`, created in one step to match the upstream's `state` when it does
    /// not exist yet (with the upstream's snapshot, `snapshot_blob`, fetched by the caller).
    pub async fn mirror_stream(
        &self,
        key: &str,
        upstream: &str,
        state: &ReplicatedState,
        snapshot_blob: Option<Bytes>,
    ) -> StreamResult<Arc<Stream>> {
        match self.find(key, false).await {
            Ok(stream) => return Ok(stream),
            Err(StreamError::NotFound) => {}
            Err(e) => return Err(e),
        }
        if let Some(bucket) = names::bucket_of(key)
            && self.bucket_info(bucket).is_err()
        {
            match self.create_bucket(bucket, None, None).await {
                Ok(_) | Err(StreamError::AlreadyExists(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.create(mirror_request(key, upstream, state, snapshot_blob))
            .await?;
        self.find(key, false).await
    }

    /// Appends the upstream's records to its mirror, exactly as they are upstream.
    pub async fn mirror_records(
        &self,
        stream: &Arc<Stream>,
        records: Vec<Record>,
    ) -> StreamResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        let batch = MirrorBatch::new(&records)?;
        let staged = self.stage(records.iter().map(|r| &r.body)).await?;
        let commit = {
            let mut state = stream.lock();
            state.ledger(stream).apply(batch, super::now_ms())?;
            self.submit(
                stream,
                &mut state,
                records,
                std::iter::empty(),
                false,
                staged,
            )
        };
        commit.await?;
        Ok(())
    }

    /// Brings the mirror's metadata to the upstream's: closed flag (once every record is here),
    /// attributes, retention and snapshot (its blob fetched by the caller when it changed).
    pub async fn mirror_state(
        &self,
        stream: &Arc<Stream>,
        upstream: &ReplicatedState,
        snapshot_blob: Option<Bytes>,
    ) -> StreamResult<()> {
        let staged = match &snapshot_blob {
            Some(blob) => self.stage(std::iter::once(blob)).await?,
            None => None,
        };
        let commit = {
            let mut state = stream.lock();
            let mirrored = MirrorMeta {
                closed: upstream.closed,
                tail: upstream.tail,
                attrs: &upstream.attrs,
                key_fingerprint: upstream.key_fingerprint.as_deref(),
                snapshot: upstream.snapshot.as_ref(),
                new_snapshot: snapshot_blob.is_some(),
                retained_from: upstream.retained_from,
            };
            let Some(changed) = state.ledger(stream).apply(mirrored, super::now_ms())? else {
                return Ok(());
            };
            let mut changes = vec![Change::PutStream(stream.id, Box::new(state.meta.clone()))];
            match (changed.snapshot, snapshot_blob) {
                (Some(SnapshotChange::Put), Some(blob)) => {
                    changes.push(Change::PutSnapshot(stream.id, blob, staged));
                }
                (Some(SnapshotChange::Remove), _) => {
                    changes.push(Change::RemoveSnapshot(stream.id));
                }
                _ => {}
            }
            if changed.retained {
                changes.extend(state.trim_records(stream.id));
            }
            state.submit_meta_change();
            self.engine.commit(changes)
        };
        let committed = commit.await;
        let (closed, first) = {
            let state = stream.lock();
            (state.meta.closed, state.meta.retained_from)
        };
        stream.publish_meta_change(committed.is_ok(), |d| {
            d.closed |= closed;
            d.first = d.first.max(first);
        });
        Ok(committed?)
    }

    /// On a mirror: how many records it is behind its upstream, and for how many seconds (the age
    /// of its newest record while it is behind, 0 when caught up).
    pub fn replication_lag(&self, stream: &Stream) -> Option<(u64, u64)> {
        stream.mirror_of.as_ref()?;
        let durable = stream.durable();
        let upstream = stream
            .upstream_tail
            .load(std::sync::atomic::Ordering::Relaxed);
        let records = upstream.saturating_sub(durable.tail.seq);
        let seconds = if records == 0 {
            0
        } else {
            u64::try_from((super::now_ms() - durable.last_timestamp_ms).max(0) / 1000).unwrap_or(0)
        };
        Some((records, seconds))
    }

    /// The replication lag of every mirrored stream: `(stream key, upstream, records, seconds)`.
    pub fn replication_lags(&self) -> Vec<(String, String, u64, u64)> {
        let mirrored = self.streams_where(
            |registry| &registry.streams,
            "",
            |s| s.mirror_of.is_some().then(|| s.clone()),
        );
        mirrored
            .iter()
            .filter_map(|s| {
                let (records, seconds) = self.replication_lag(s)?;
                Some((
                    s.name.to_string(),
                    s.mirror_of.clone().unwrap_or_default(),
                    records,
                    seconds,
                ))
            })
            .collect()
    }

    /// Whether the mirror already holds this snapshot.
    pub fn has_snapshot(&self, stream: &Stream, snapshot: &SnapshotInfo) -> bool {
        stream.lock().meta.extra().snapshot.as_ref() == Some(snapshot)
    }

    /// Starts a mirrored stream over from the upstream's state after a gap: at its retained
    /// start, with its snapshot (`snapshot_blob`, fetched by the caller beforehand). The old
    /// stream and the new one are swapped in one commit, and the name maps to the old one until
    /// the new one is durable, so no reader finds the stream missing or half built.
    pub async fn mirror_rebuild(
        &self,
        key: &str,
        upstream: &str,
        state: &ReplicatedState,
        snapshot_blob: Option<Bytes>,
    ) -> StreamResult<Arc<Stream>> {
        let old = match self.find(key, false).await {
            Ok(stream) => stream,
            Err(StreamError::NotFound) => {
                return self
                    .mirror_stream(key, upstream, state, snapshot_blob)
                    .await;
            }
            Err(e) => return Err(e),
        };
        self.engine.room()?;
        let request = mirror_request(key, upstream, state, snapshot_blob);
        let requested = RequestedConfig::resolve(request.ask(None), None, super::now_ms())?;
        let staged = self.stage_new(&[], request.mirror.as_ref(), None).await?;
        let (new, commit) = {
            // Held until the commit is submitted: nothing else changes the old stream meanwhile.
            let old_state = old.lock();
            if old_state.removed {
                return Err(StreamError::NotFound);
            }
            if old_state.forks > 0 {
                return Err(Refusal::Conflict(Conflict::RebuildUnderForks).into());
            }
            let (new, stored) =
                self.build_stream(key, &requested, None, &[], request.mirror.as_ref(), &staged)?;
            // The removal first: the disk engine commits whatever precedes a removal in a batch
            // on its own, before it looks for the removed stream's keys.
            let mut changes = vec![Change::RemoveStream(old.id)];
            changes.extend(stored);
            (new, self.engine.commit(changes))
        };
        commit.await?;
        new.upstream_tail
            .store(old.upstream_tail.load(Ordering::Relaxed), Ordering::Relaxed);
        new.publish(|d| d.ready = true);
        {
            let mut registry = self.lock_registry();
            registry.insert(new.clone());
            // After the swap, so a reader that finds the old one removed looks again and finds
            // the new one.
            old.lock().removed = true;
        }
        old.publish(|d| d.removed = true);
        self.announce(&new);
        Ok(new)
    }

    /// Removes a mirrored stream (it was deleted upstream).
    pub async fn mirror_remove(&self, key: &str) -> StreamResult<()> {
        match self.find(key, false).await {
            Ok(stream) => self.remove(&stream).await.map(|_| ()),
            Err(StreamError::NotFound) | Err(StreamError::Gone) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
