//! Snapshots, retention and bootstrap (seed 000 §2, §3), and stream attributes (§5).
//!
//! A stream has at most one visible snapshot: a blob that folds everything before its offset.
//! Retention may then move the first retained offset up to that snapshot, trimming records; an S2
//! trim moves it by the same rule ([`RetentionMove`]), taking a snapshot it passes with it.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};

use super::stream::State;
use super::{Stream, StreamError, StreamResult, StreamService};
use crate::model::Offset;
use crate::model::attrs::Attrs;
use crate::model::ledger::retention::Retain;
pub(super) use crate::model::ledger::retention::RetentionMove;
use crate::model::ledger::settings::{SetAttrs, Setting};
use crate::model::ledger::snapshot::{DeleteSnapshot, PublishSnapshot, Published};
use crate::model::records::RecordStart;
use crate::model::stream::SnapshotInfo;
use crate::storage::{Change, StorageError};

/// What `/bootstrap` returns: the visible snapshot (if any), then the records from `start` up to
/// `tail`, all as of one moment.
pub struct Bootstrap {
    pub stream: Arc<Stream>,
    pub snapshot: Option<(SnapshotInfo, Bytes)>,
    pub start: Offset,
    pub tail: Offset,
}

/// A metadata write, decided under the stream's lock and finished after it.
enum MetaWrite {
    /// Nothing to write: what was asked for is there already, by the changes submitted up to
    /// this count. Acknowledged once those are durable, as the first request was.
    Unchanged(u64),
    /// The change's commit.
    Commit(BoxFuture<'static, Result<(), StorageError>>),
}

impl MetaWrite {
    async fn finish(self, stream: &Arc<Stream>) -> StreamResult<()> {
        match self {
            MetaWrite::Unchanged(submitted) => stream.meta_settled(submitted).await,
            MetaWrite::Commit(commit) => {
                let stream = Arc::clone(stream);
                super::to_the_end(async move {
                    let committed = commit.await;
                    stream.publish_meta_change(committed.is_ok(), |_| {});
                    Ok(committed?)
                })
                .await
            }
        }
    }
}

/// Where a snapshot or retention boundary goes: an offset, or (on JSON streams) a record ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    Offset(Offset),
    Record(u64),
}

/// The digest of a snapshot covers its content type and its bytes.
pub fn digest(content_type: &str, blob: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(content_type.as_bytes());
    hasher.update([0u8]);
    hasher.update(blob);
    let hex: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

impl StreamService {
    /// Checks that `at` is a retained record boundary at or before the tail. Beyond the tail is a
    /// conflict (409); before retention is gone (410); between boundaries is a bad request (400).
    async fn retained_boundary(&self, stream: &Arc<Stream>, at: Position) -> StreamResult<Offset> {
        let at = match at {
            Position::Offset(offset) => offset,
            Position::Record(record) => {
                return match self.resolve_record(stream, RecordStart::At(record)).await {
                    Err(StreamError::RecordBeyondTail { .. }) => Err(StreamError::Conflict(
                        "record is beyond the record tail of the stream",
                    )),
                    resolved => resolved,
                };
            }
        };
        let durable = stream.durable();
        if at > durable.tail {
            return Err(StreamError::Conflict(
                "offset is beyond the tail of the stream",
            ));
        }
        if at < durable.first {
            return Err(StreamError::Retained {
                first: durable.first,
            });
        }
        self.boundary(stream, at).await
    }

    /// Publishes the stream's snapshot at `at`. Returns its offset and digest.
    pub async fn publish_snapshot(
        &self,
        name: &str,
        at: Position,
        content_type: String,
        blob: Bytes,
        expected_digest: Option<&str>,
    ) -> StreamResult<(Offset, String)> {
        let stream = self.find(name, false).await?;
        Self::writable(&stream)?;
        self.engine.room()?;
        let at = self.retained_boundary(&stream, at).await?;
        let (content_type, blob, digest) = super::heavy::by_size(blob.len(), move || {
            let digest = digest(&content_type, &blob);
            (content_type, blob, digest)
        })
        .await;
        let staged = self.stage(std::iter::once(&blob)).await?;
        let write = {
            let mut state = stream.lock();
            let publish = PublishSnapshot {
                snapshot: SnapshotInfo {
                    offset: at,
                    content_type,
                    digest: digest.clone(),
                },
                expected_digest,
            };
            match state.ledger(&stream).apply(publish, super::now_ms())? {
                Published::Repeat => MetaWrite::Unchanged(state.meta_submitted),
                Published::Replaced => {
                    state.submit_meta_change();
                    MetaWrite::Commit(self.engine.commit(vec![
                        Change::PutSnapshot(stream.id, blob, staged),
                        Change::PutStream(stream.id, Box::new(state.meta.clone())),
                    ]))
                }
            }
        };
        write.finish(&stream).await?;
        Ok((at, digest))
    }

    /// The visible snapshot's description, if there is one: the latest whose publication is
    /// durable. Finding one is a read of the stream, and renews its TTL.
    pub async fn latest_snapshot(&self, stream: &Stream) -> StreamResult<Option<SnapshotInfo>> {
        let latest = (self.settled(stream, |state| state.meta.extra().snapshot.clone())).await?;
        if latest.is_some() {
            stream.renew();
        }
        Ok(latest)
    }

    /// What `read` takes from the stream's state, once every metadata change that state reflects
    /// is durable: readers never see attributes or a snapshot that a crash could still undo.
    pub(super) async fn settled<T>(
        &self,
        stream: &Stream,
        read: impl FnOnce(&State) -> T,
    ) -> StreamResult<T> {
        let (value, submitted) = {
            let state = stream.lock();
            (read(&state), state.meta_submitted)
        };
        stream.meta_settled(submitted).await?;
        Ok(value)
    }

    /// The visible snapshot, which must be the one at `at`.
    pub async fn read_snapshot(
        &self,
        name: &str,
        at: Offset,
    ) -> StreamResult<(Arc<Stream>, SnapshotInfo, Bytes)> {
        let stream = self.find(name, false).await?;
        let (info, blob) = self
            .visible_snapshot(&stream)
            .await?
            .ok_or(StreamError::SnapshotNotFound)?;
        if info.offset != at {
            return Err(StreamError::SnapshotNotFound);
        }
        stream.renew();
        Ok((stream, info, blob))
    }

    /// The visible snapshot with its blob, read consistently even while a new one is published:
    /// the stored blob is the one described once the description's publication is durable, as
    /// long as no other metadata change is submitted while it is read.
    pub(super) async fn visible_snapshot(
        &self,
        stream: &Stream,
    ) -> StreamResult<Option<(SnapshotInfo, Bytes)>> {
        loop {
            let (info, submitted) = self
                .settled(stream, |state| {
                    (state.meta.extra().snapshot.clone(), state.meta_submitted)
                })
                .await?;
            let Some(info) = info else {
                return Ok(None);
            };
            let blob = self.engine.read_snapshot(stream.id).await?;
            if stream.lock().meta_submitted == submitted {
                return Ok(blob.map(|blob| (info, blob)));
            }
        }
    }

    /// Deletes the visible snapshot at `at`, unless bootstrap needs it (retention moved past the
    /// stream's start).
    pub async fn delete_snapshot(&self, name: &str, at: Offset) -> StreamResult<()> {
        let stream = self.find(name, false).await?;
        Self::writable(&stream)?;
        let write = {
            let mut state = stream.lock();
            (state.ledger(&stream)).apply(DeleteSnapshot { at }, super::now_ms())?;
            state.submit_meta_change();
            MetaWrite::Commit(self.engine.commit(vec![
                Change::RemoveSnapshot(stream.id),
                Change::PutStream(stream.id, Box::new(state.meta.clone())),
            ]))
        };
        write.finish(&stream).await
    }

    /// Moves the first retained offset to `at`, which must not pass the visible snapshot.
    /// Returns the new first retained offset.
    pub async fn set_retention(&self, name: &str, at: Position) -> StreamResult<Offset> {
        let stream = self.find(name, false).await?;
        Self::writable(&stream)?;
        let first = stream.durable().first;
        let backward = match at {
            Position::Offset(offset) => offset < first,
            Position::Record(record) => record < first.seq,
        };
        if backward {
            return Err(StreamError::Conflict("retention cannot move backward"));
        }
        let at = self.retained_boundary(&stream, at).await?;
        if at < stream.lock().meta.retained_from {
            return Err(StreamError::Conflict("retention cannot move backward"));
        }
        self.move_retention(&stream, at, RetentionMove::KeepSnapshot)
            .await?;
        Ok(at)
    }

    /// Everything a client needs to start: the snapshot, then the records after it.
    pub async fn bootstrap(&self, name: &str) -> StreamResult<Bootstrap> {
        let stream = self.find(name, false).await?;
        if stream.encrypted {
            return Err(StreamError::Encrypted);
        }
        let snapshot = self.visible_snapshot(&stream).await?;
        stream.renew();
        let durable = stream.durable();
        let start = snapshot
            .as_ref()
            .map_or(durable.first, |(info, _)| info.offset.max(durable.first));
        Ok(Bootstrap {
            stream,
            snapshot,
            start,
            tail: durable.tail,
        })
    }

    pub async fn attrs(&self, name: &str) -> StreamResult<Attrs> {
        let stream = self.find(name, false).await?;
        stream.renew();
        self.settled(&stream, |state| state.meta.extra().attrs.clone())
            .await
    }

    /// Replaces the attributes. Allowed on closed streams: closing forbids appends only.
    pub async fn set_attrs(&self, name: &str, attrs: Attrs) -> StreamResult<()> {
        let stream = self.find(name, false).await?;
        Self::writable(&stream)?;
        self.engine.room()?;
        let write = {
            let mut state = stream.lock();
            match (state.ledger(&stream)).apply(SetAttrs(attrs), super::now_ms())? {
                Setting::Unchanged => MetaWrite::Unchanged(state.meta_submitted),
                Setting::Changed => {
                    state.submit_meta_change();
                    MetaWrite::Commit(self.engine.commit(vec![Change::PutStream(
                        stream.id,
                        Box::new(state.meta.clone()),
                    )]))
                }
            }
        };
        write.finish(&stream).await
    }
}

impl StreamService {
    /// Moves the first retained offset forward, by the rule of the face that asks (`why`).
    pub(super) async fn move_retention(
        &self,
        stream: &Arc<Stream>,
        at: Offset,
        why: RetentionMove,
    ) -> StreamResult<()> {
        let (moved, commit) = {
            let mut state = stream.lock();
            let retain = Retain { at, why };
            let Some(retained) = state.ledger(stream).apply(retain, super::now_ms())? else {
                return Ok(());
            };
            // One batch, committed whole: the order of its changes does not matter.
            let mut changes = Vec::with_capacity(3);
            if retained.moved {
                state.submit_meta_change();
                changes.extend(state.trim_records(stream.id));
            }
            if retained.snapshot_dropped {
                changes.push(Change::RemoveSnapshot(stream.id));
            }
            changes.push(Change::PutStream(stream.id, Box::new(state.meta.clone())));
            (retained.moved, self.engine.commit(changes))
        };
        let stream = Arc::clone(stream);
        super::to_the_end(async move {
            let committed = commit.await;
            if moved {
                stream.publish_meta_change(committed.is_ok(), |d| d.first = d.first.max(at));
            }
            Ok(committed?)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    use futures::FutureExt;
    use tokio::sync::Semaphore;

    use crate::service::ServiceConfig;
    use crate::service::tests::{FailingCommits, GatedEngine, create_text, text};
    use crate::storage::{MemoryEngine, SharedEngine};

    #[test]
    fn the_digest_covers_content_type_and_bytes() {
        assert_eq!(digest("a", b"x"), digest("a", b"x"));
        assert_ne!(digest("a", b"x"), digest("b", b"x"));
        assert_ne!(digest("a", b"x"), digest("a", b"y"));
        assert!(digest("a", b"").starts_with("sha256:"));
    }

    #[tokio::test]
    async fn attributes_whose_requester_went_away_are_still_published_once_durable() {
        let gate = Arc::new(Semaphore::new(1)); // lets the create through
        let engine = Arc::new(GatedEngine::new(gate.clone()));
        let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
        service.create(create_text("s")).await.unwrap();
        let attrs = crate::model::attrs::parse(br#"{"title":"set"}"#).unwrap();

        assert!(
            service
                .set_attrs("s", attrs.clone())
                .now_or_never()
                .is_none()
        );

        gate.add_permits(1);
        let read = tokio::time::timeout(Duration::from_secs(10), service.attrs("s")).await;
        let read = read.expect("reads of the stream's metadata do not wait forever");
        assert_eq!(read.unwrap(), attrs);
    }

    #[tokio::test]
    async fn a_trim_racing_a_delete_does_not_bring_the_stream_back() {
        let engine: SharedEngine = Arc::new(MemoryEngine::new());
        let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
        service.create(create_text("t")).await.unwrap();
        service.append("t", text("a")).await.unwrap();
        service.append("t", text("b")).await.unwrap();
        // A trim (a retention sweep, say) that found the stream just before it was deleted.
        let stream = service.find("t", false).await.unwrap();
        service.delete("t").await.unwrap();
        let trimmed = service
            .move_retention(&stream, Offset::new(1, 1), RetentionMove::Trim(1))
            .await;
        assert!(matches!(trimmed, Err(StreamError::NotFound)));
        assert!(
            engine.recover().unwrap().streams.is_empty(),
            "the deleted stream stays deleted"
        );
    }

    #[tokio::test]
    async fn retention_that_checked_a_snapshot_deleted_since_does_not_move() {
        let engine: SharedEngine = Arc::new(MemoryEngine::new());
        let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
        service.create(create_text("t")).await.unwrap();
        service.append("t", text("a")).await.unwrap();
        let at = service.append("t", text("b")).await.unwrap().tail;
        let snapshot = |service: Arc<StreamService>| async move {
            let blob = Bytes::from_static(b"ab");
            let at = Position::Offset(at);
            service
                .publish_snapshot("t", at, "text/plain".into(), blob, None)
                .await
        };
        snapshot(service.clone()).await.unwrap();
        // `set_retention` found the snapshot at `at`; before it moved retention there, the snapshot
        // was deleted (retention was still at the start, so the delete was allowed).
        let stream = service.find("t", false).await.unwrap();
        service.delete_snapshot("t", at).await.unwrap();
        let moved = service
            .move_retention(&stream, at, RetentionMove::KeepSnapshot)
            .await;
        assert!(matches!(moved, Err(StreamError::Conflict(_))), "{moved:?}");
        let bootstrap = service.bootstrap("t").await.unwrap();
        assert_eq!(bootstrap.start, Offset::START, "no record was dropped");
        // With the snapshot back, the same move goes through.
        snapshot(service.clone()).await.unwrap();
        service
            .move_retention(&stream, at, RetentionMove::KeepSnapshot)
            .await
            .unwrap();
        assert_eq!(service.bootstrap("t").await.unwrap().start, at);
    }

    #[tokio::test]
    async fn a_metadata_change_whose_write_fails_is_shown_to_no_reader() {
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let engine = FailingCommits {
            inner: MemoryEngine::new(),
            gate: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
            fail: fail.clone(),
        };
        let service = StreamService::open(Arc::new(engine), ServiceConfig::default()).unwrap();
        service.create(create_text("s")).await.unwrap();
        let attrs = |n: i64| serde_json::json!({ "n": n }).as_object().cloned();
        service.set_attrs("s", attrs(1)).await.unwrap();
        assert_eq!(service.attrs("s").await.unwrap(), attrs(1));
        fail.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(service.append("s", text("lost")).await.is_err());
        assert_eq!(
            service.attrs("s").await.unwrap(),
            attrs(1),
            "a failed append leaves the metadata as it was, and shown"
        );
        let refused = service.set_attrs("s", attrs(2)).await;
        assert!(
            matches!(refused, Err(StreamError::Storage(_))),
            "{refused:?}"
        );
        let read = service.attrs("s").await;
        assert!(
            matches!(read, Err(StreamError::Storage(_))),
            "a change that may not be on disk is not shown as the stream's: {read:?}"
        );
        let stream = service.find("s", false).await.unwrap();
        assert!(
            matches!(
                service.replicated_state(&stream),
                Err(StreamError::Storage(_))
            ),
            "nor sent to mirrors"
        );
    }

    #[tokio::test]
    async fn readers_see_a_new_snapshot_only_once_it_is_durable_and_only_with_its_own_blob() {
        let gate = Arc::new(Semaphore::new(3)); // the create, one append, the first snapshot
        let engine = Arc::new(GatedEngine::held(gate.clone()));
        let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
        service.create(create_text("s")).await.unwrap();
        let tail = service.append("s", text("one")).await.unwrap().tail;
        let publish = |at: Offset, blob: &'static [u8]| {
            let service = service.clone();
            async move {
                service
                    .publish_snapshot(
                        "s",
                        Position::Offset(at),
                        "text/plain".into(),
                        Bytes::from_static(blob),
                        None,
                    )
                    .await
            }
        };
        publish(Offset::START, b"old").await.unwrap();

        // The second snapshot is submitted; its commit (blob and description) is held.
        let stream = service.find("s", false).await.unwrap();
        let submitted = stream.lock().meta_submitted;
        let second = tokio::spawn(publish(tail, b"new"));
        while stream.lock().meta_submitted == submitted {
            tokio::task::yield_now().await;
        }
        let bootstrap = {
            let service = service.clone();
            tokio::spawn(async move { service.bootstrap("s").await })
        };
        let head = {
            let service = service.clone();
            tokio::spawn(async move { service.head("s").await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !bootstrap.is_finished() && !head.is_finished(),
            "readers wait for the snapshot they would describe"
        );

        gate.add_permits(1);
        second.await.unwrap().unwrap();
        let Bootstrap { snapshot, .. } = bootstrap.await.unwrap().unwrap();
        let (info, blob) = snapshot.unwrap();
        assert_eq!((info.offset, blob.as_ref()), (tail, b"new".as_ref()));
        let (_, info) = head.await.unwrap().unwrap();
        assert_eq!(info.snapshot.unwrap().offset, tail);
    }
}
