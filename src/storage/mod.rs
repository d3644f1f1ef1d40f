//! The durable log. An engine stores stream metadata, records and producer states, and applies
//! batches of changes atomically and in submission order.
//!
//! Two engines implement [`Engine`]: [`FjallEngine`] on disk (the default) and [`MemoryEngine`]
//! for tests and `--memory`. Both pass the same contract tests at the bottom of this file.

pub mod codec;
pub mod file_bytes;
mod fjall_engine;
mod memory;
pub mod staged;

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::model::access::TokenRecord;
use crate::model::producer::ProducerState;
use crate::model::stream::{BucketMeta, StreamMeta};
use crate::model::{Offset, Record};

#[cfg(all(test, target_os = "linux"))]
pub(crate) use fjall_engine::mapped_body_files;
pub use fjall_engine::{
    BackupError, BackupSummary, DataDir, FjallEngine, SyncMode, VerifySummary, check_backup,
    restore as restore_backup,
};
pub use memory::MemoryEngine;
pub use staged::Staged;

/// Internal stream identifier: small, never reused, independent of the stream's name.
pub type StreamId = u64;

/// One change in a commit batch.
#[derive(Clone, Debug)]
pub enum Change {
    /// Create or replace the stream's metadata.
    PutStream(StreamId, Box<StreamMeta>),
    /// Add records (their `seq` values are the keys). Bodies that are among the staged ones
    /// are stored as references into the staged file (see [`Engine::stage`]).
    PutRecords(StreamId, Vec<Record>, Option<Staged>),
    PutProducer(StreamId, String, ProducerState),
    /// Remove the stream with its records, producers and snapshot.
    RemoveStream(StreamId),
    /// Remove the stream's records with `seq < before` (retention moved past them). Reads stop
    /// returning them once the batch is durable, and after a restart; an engine may delete them
    /// physically later, in the background. The point never moves back: a lower one is ignored.
    TrimRecords(StreamId, u64),
    /// Store the blob of the stream's visible snapshot, replacing any earlier one; by reference
    /// when it is the staged file's one body.
    PutSnapshot(StreamId, Bytes, Option<Staged>),
    RemoveSnapshot(StreamId),
    PutBucket(String, BucketMeta),
    RemoveBucket(String),
    /// Store an access token (its digest, never its secret), replacing one with the same id.
    PutToken(TokenRecord),
    RemoveToken(String),
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage I/O failed: {0}")]
    Io(String),
    /// Another process (another Runnel, most likely) has the data directory open.
    #[error(
        "the data directory is in use by {}; stop it, or give this server another --data-dir",
        match .holder { Some(pid) => format!("process {pid}"), None => "another process".into() }
    )]
    Locked { holder: Option<u32> },
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("storage is unavailable after an earlier write failure")]
    Failed,
    /// The disk holding the data has less free space than the configured reserve; writes are
    /// refused (before anything is sequenced) until space returns.
    #[error("the disk is full: less than {reserve} bytes free; retry once space is freed")]
    Full { reserve: u64 },
}

/// What an engine holds after a restart.
#[derive(Debug, Default)]
pub struct Recovered {
    pub streams: Vec<RecoveredStream>,
    pub buckets: Vec<(String, BucketMeta)>,
    pub tokens: Vec<TokenRecord>,
    /// The smallest id never used by any stream.
    pub next_id: StreamId,
}

#[derive(Debug)]
pub struct RecoveredStream {
    pub id: StreamId,
    pub meta: StreamMeta,
    pub producers: Vec<(String, ProducerState)>,
    /// Where the stream's last stored record ends, and its timestamp. Appends need not rewrite
    /// the metadata, so the tail is the later of `meta.tail` and this.
    pub stored_end: Option<StoredEnd>,
    /// Every record below this seq is deleted (or being purged). Where the stream's retention
    /// has passed it, forks may have held records back when retention moved, and nothing deleted
    /// them after (the last fork went just before a crash): the service deletes them now. (A
    /// fork or a mirror that starts past 0 was never trimmed either; its first such trim finds
    /// nothing to delete.)
    pub trimmed_before: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredEnd {
    pub next: Offset,
    pub timestamp_ms: i64,
}

impl StoredEnd {
    pub fn of(record: &Record) -> StoredEnd {
        StoredEnd {
            next: record.next_offset(),
            timestamp_ms: record.timestamp_ms,
        }
    }
}

/// A storage engine. Implementations are internally synchronised.
/// Where a stream's first record at or after a timestamp lies (see [`Engine::time_bounds`]).
/// Either bound may be missing (no index entry on that side); both are only hints about records
/// still stored, and a reader checks the records themselves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeBounds {
    /// A record with an earlier timestamp: the one sought comes after it.
    pub earlier: Option<u64>,
    /// A record at or after the timestamp: the one sought is this one or an earlier one.
    pub at_most: Option<u64>,
}

pub trait Engine: Send + Sync + 'static {
    /// Submits a batch. Batches become durable in the order `commit` is called, each one
    /// all-or-nothing; the returned future resolves once this batch is durable (or failed).
    /// Enqueueing happens before `commit` returns, so callers may hold a lock across the call
    /// to fix the order, and await the future after releasing it.
    fn commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>>;

    /// Whether bodies of `bytes` in all are better staged (see [`Engine::stage`]) than copied
    /// into their commit. Never, by default.
    fn stages(&self, _bytes: usize) -> bool {
        false
    }

    /// Writes `bodies` to a file of their own and syncs it, so that a commit carrying them (by
    /// [`Change::PutRecords`] or [`Change::PutSnapshot`] with the returned [`Staged`]) stores
    /// only references and holds up no other commit while the bodies are copied. Call it before
    /// taking any lock: it does I/O. Only for bodies [`Engine::stages`] says are worth it.
    fn stage(&self, _bodies: Vec<Bytes>) -> BoxFuture<'static, Result<Staged, StorageError>> {
        Box::pin(futures::future::ready(Err(StorageError::Io(
            "this engine stages no bodies".into(),
        ))))
    }

    /// Records of one stream with `from <= seq < until`, in order, stopping before the record
    /// whose body would take the read past `max_bytes` (but at least one record when any is in
    /// range).
    fn read(
        &self,
        id: StreamId,
        from: u64,
        until: u64,
        max_bytes: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StorageError>>;

    /// Bounds on where stream `id`'s first record (of its own, not a fork source's) with a
    /// timestamp at or after `timestamp_ms` lies, from a timestamp index: one lookup, whatever
    /// the stream's length. No bounds, by default (an engine without an index).
    fn time_bounds(
        &self,
        _id: StreamId,
        _timestamp_ms: u64,
    ) -> BoxFuture<'static, Result<TimeBounds, StorageError>> {
        Box::pin(futures::future::ready(Ok(TimeBounds::default())))
    }

    /// The blob of the stream's visible snapshot.
    fn read_snapshot(
        &self,
        id: StreamId,
    ) -> BoxFuture<'static, Result<Option<Bytes>, StorageError>>;

    /// Everything stored, for rebuilding in-memory state at start.
    fn recover(&self) -> Result<Recovered, StorageError>;

    /// Like [`Engine::recover`], but hands each stream to `each` as it is read, in id order,
    /// and returns the rest with `streams` empty. A server with millions of streams rebuilds
    /// them without first holding all of them in a vector as well.
    fn recover_each(
        &self,
        each: &mut dyn FnMut(RecoveredStream),
    ) -> Result<Recovered, StorageError> {
        let mut recovered = self.recover()?;
        std::mem::take(&mut recovered.streams)
            .into_iter()
            .for_each(each);
        Ok(recovered)
    }

    /// Whether there is room for new data: `Err(Full)` while free disk space is below the
    /// reserve. Checked before an append is sequenced, so a refused append changes nothing.
    fn room(&self) -> Result<(), StorageError> {
        Ok(())
    }
}

pub type SharedEngine = Arc<dyn Engine>;

/// A read's byte budget: a record is read only if it fits in what is left (its body and headers,
/// [`Record::held_len`]), except the first, which is always read, however large, so every read
/// makes progress.
pub(crate) struct ByteBudget {
    max: usize,
    used: usize,
    records: usize,
}

impl ByteBudget {
    pub(crate) fn new(max: usize) -> Self {
        ByteBudget {
            max,
            used: 0,
            records: 0,
        }
    }

    /// Whether `record` is read, spending on it if so.
    pub(crate) fn take(&mut self, record: &Record) -> bool {
        self.take_len(record.held_len())
    }

    /// Whether a record holding `len` bytes is read, spending on it if so.
    pub(crate) fn take_len(&mut self, len: usize) -> bool {
        let used = self.used.saturating_add(len);
        if self.records > 0 && used > self.max {
            return false;
        }
        self.used = used;
        self.records += 1;
        true
    }
}

#[cfg(test)]
mod contract {
    //! The tests every engine must pass.

    use super::*;
    use crate::model::Offset;
    use crate::model::record::lay_out;
    use crate::model::stream::MetaExtra;
    use bytes::Bytes;

    fn meta(name: &str, tail: Offset) -> StreamMeta {
        StreamMeta {
            ttl_secs: Some(30),
            tail,
            last_timestamp_ms: 7,
            created_ms: 1,
            extra: Some(Box::new(MetaExtra {
                last_stream_seq: Some("a".into()),
                ..MetaExtra::default()
            })),
            ..StreamMeta::new(name, "text/plain")
        }
    }

    fn bodies(texts: &[&str]) -> Vec<Bytes> {
        texts
            .iter()
            .map(|t| Bytes::copy_from_slice(t.as_bytes()))
            .collect()
    }

    pub async fn committed_records_read_back_in_order(engine: &dyn Engine) {
        let records = lay_out(Offset::START, 7, bodies(&["ab", "cde", "f"]));
        let tail = records.last().unwrap().next_offset();
        engine
            .commit(vec![
                Change::PutStream(1, Box::new(meta("s", tail))),
                Change::PutRecords(1, records.clone(), None),
            ])
            .await
            .unwrap();
        assert_eq!(engine.read(1, 0, 3, usize::MAX).await.unwrap(), records);
        assert_eq!(
            engine.read(1, 1, 2, usize::MAX).await.unwrap(),
            records[1..2]
        );
        // Each counts 8 bytes beside its body: 10, 11 and 9.
        assert_eq!(engine.read(1, 0, 3, 1).await.unwrap(), records[..1]);
        assert_eq!(engine.read(1, 0, 3, 21).await.unwrap(), records[..2]);
        assert_eq!(
            engine.read(1, 0, 3, 20).await.unwrap(),
            records[..1],
            "a record that would take the read past its budget waits for the next read"
        );
        assert!(engine.read(2, 0, 3, usize::MAX).await.unwrap().is_empty());
        let recovered = engine.recover().unwrap();
        assert_eq!(
            recovered.streams[0].stored_end,
            records.last().map(StoredEnd::of),
            "the tail can be found after the last record"
        );
    }

    pub async fn recovery_returns_metadata_producers_and_next_id(engine: &dyn Engine) {
        let producer = ProducerState {
            epoch: 2,
            last_seq: 9,
            records: (3, 4),
            earlier: Vec::new(),
        };
        engine
            .commit(vec![
                Change::PutStream(4, Box::new(meta("a", Offset::START))),
                Change::PutStream(9, Box::new(meta("b", Offset::START))),
                Change::PutProducer(4, "p1".into(), producer.clone()),
            ])
            .await
            .unwrap();
        let recovered = engine.recover().unwrap();
        assert_eq!(recovered.next_id, 10);
        let a = recovered.streams.iter().find(|s| s.id == 4).unwrap();
        assert_eq!(a.stored_end, None);
        assert_eq!(a.meta, meta("a", Offset::START));
        assert_eq!(a.producers, vec![("p1".to_string(), producer)]);
    }

    pub async fn recovering_one_stream_at_a_time_gives_the_same_in_id_order(engine: &dyn Engine) {
        engine
            .commit(vec![
                Change::PutStream(12, Box::new(meta("c", Offset::START))),
                Change::PutStream(2, Box::new(meta("a", Offset::START))),
                Change::PutStream(7, Box::new(meta("b", Offset::START))),
                Change::PutRecords(7, lay_out(Offset::START, 1, bodies(&["x"])), None),
            ])
            .await
            .unwrap();
        let mut handed = Vec::new();
        let rest = engine.recover_each(&mut |s| handed.push(s)).unwrap();
        assert!(rest.streams.is_empty());
        assert_eq!(rest.next_id, 13);
        assert_eq!(handed.iter().map(|s| s.id).collect::<Vec<_>>(), [2, 7, 12]);
        let collected = engine.recover().unwrap().streams;
        assert_eq!(handed.len(), collected.len());
        for (one, other) in handed.iter().zip(&collected) {
            assert_eq!(
                (one.id, &one.meta, &one.stored_end),
                (other.id, &other.meta, &other.stored_end)
            );
        }
    }

    pub async fn removing_a_stream_removes_everything_but_keeps_ids_unused(engine: &dyn Engine) {
        let records = lay_out(Offset::START, 1, bodies(&["x"]));
        engine
            .commit(vec![
                Change::PutStream(3, Box::new(meta("gone", Offset::new(1, 1)))),
                Change::PutRecords(3, records, None),
                Change::PutProducer(
                    3,
                    "p".into(),
                    ProducerState {
                        epoch: 0,
                        last_seq: 0,
                        records: (0, 1),
                        earlier: Vec::new(),
                    },
                ),
            ])
            .await
            .unwrap();
        engine.commit(vec![Change::RemoveStream(3)]).await.unwrap();
        assert!(engine.read(3, 0, 10, usize::MAX).await.unwrap().is_empty());
        let recovered = engine.recover().unwrap();
        assert!(recovered.streams.is_empty());
        assert_eq!(recovered.next_id, 4);
    }

    pub async fn records_written_and_removed_in_one_batch_leave_nothing(engine: &dyn Engine) {
        let records = lay_out(Offset::START, 1, bodies(&["x", "y"]));
        engine
            .commit(vec![
                Change::PutStream(5, Box::new(meta("brief", Offset::new(2, 2)))),
                Change::PutRecords(5, records, None),
                Change::RemoveStream(5),
            ])
            .await
            .unwrap();
        assert!(engine.read(5, 0, 10, usize::MAX).await.unwrap().is_empty());
        assert!(engine.recover().unwrap().streams.is_empty());
    }

    pub async fn record_headers_and_unit_flags_survive(engine: &dyn Engine) {
        let mut records = lay_out(Offset::START, 42, bodies(&["", "body"]));
        records[1].headers = vec![
            (Bytes::from("k"), Bytes::from("v")),
            (Bytes::new(), Bytes::from("x")),
        ];
        engine
            .commit(vec![
                Change::PutStream(6, Box::new(meta("h", Offset::new(2, 4)))),
                Change::PutRecords(6, records.clone(), None),
            ])
            .await
            .unwrap();
        assert_eq!(engine.read(6, 0, 2, usize::MAX).await.unwrap(), records);
    }

    pub async fn a_read_budget_counts_header_bytes_too(engine: &dyn Engine) {
        let mut records = lay_out(Offset::START, 42, bodies(&["", "", ""]));
        for record in &mut records {
            record.headers = vec![(Bytes::from("h"), Bytes::from(vec![b'v'; 999]))];
        }
        engine
            .commit(vec![
                Change::PutStream(8, Box::new(meta("b", Offset::new(3, 0)))),
                Change::PutRecords(8, records.clone(), None),
            ])
            .await
            .unwrap();
        assert_eq!(engine.read(8, 0, 3, usize::MAX).await.unwrap(), records);
        // Each is 1,010 bytes: 8 for the record, 2 for its header, 1,000 of header bytes.
        assert_eq!(engine.read(8, 0, 3, 2_020).await.unwrap(), records[..2]);
        assert_eq!(
            engine.read(8, 0, 3, 2_019).await.unwrap(),
            records[..1],
            "records of empty bodies and large headers are not free to read"
        );
    }

    pub async fn a_read_of_empty_records_is_bounded_by_its_budget(engine: &dyn Engine) {
        let records = lay_out(Offset::START, 42, vec![Bytes::new(); 10_000]);
        engine
            .commit(vec![
                Change::PutStream(9, Box::new(meta("e", Offset::new(10_000, 0)))),
                Change::PutRecords(9, records.clone(), None),
            ])
            .await
            .unwrap();
        assert_eq!(
            engine.read(9, 0, 10_000, usize::MAX).await.unwrap(),
            records
        );
        assert_eq!(
            engine.read(9, 0, 10_000, 800).await.unwrap(),
            records[..100],
            "8 bytes each"
        );
    }

    pub async fn trimmed_records_are_never_read_and_later_ones_stay(engine: &dyn Engine) {
        let records = lay_out(Offset::START, 1, bodies(&["a"; 10]));
        engine
            .commit(vec![
                Change::PutStream(7, Box::new(meta("t", Offset::new(10, 10)))),
                Change::PutRecords(7, records.clone(), None),
                Change::PutStream(8, Box::new(meta("u", Offset::new(10, 10)))),
                Change::PutRecords(8, records.clone(), None),
            ])
            .await
            .unwrap();
        engine
            .commit(vec![Change::TrimRecords(7, 6)])
            .await
            .unwrap();
        let read = |from, until| engine.read(7, from, until, usize::MAX);
        assert_eq!(
            read(0, 10).await.unwrap(),
            records[6..],
            "from the trim point on"
        );
        assert!(read(0, 6).await.unwrap().is_empty());
        assert_eq!(read(0, 10).await.unwrap().len(), 4);
        assert_eq!(
            engine.read(8, 0, 10, usize::MAX).await.unwrap(),
            records,
            "another stream is untouched"
        );
        // A trim never moves back.
        engine
            .commit(vec![Change::TrimRecords(7, 2)])
            .await
            .unwrap();
        assert_eq!(read(0, 10).await.unwrap(), records[6..]);
        // Trimmed to the tail, then appended to.
        engine
            .commit(vec![Change::TrimRecords(7, 10)])
            .await
            .unwrap();
        assert!(read(0, 10).await.unwrap().is_empty());
        let recovered = engine.recover().unwrap();
        let stream = recovered.streams.iter().find(|s| s.id == 7).unwrap();
        assert_eq!(stream.stored_end, None, "no retained record is left");
        let more = lay_out(Offset::new(10, 10), 2, bodies(&["b", "c"]));
        engine
            .commit(vec![Change::PutRecords(7, more.clone(), None)])
            .await
            .unwrap();
        assert_eq!(read(0, 20).await.unwrap(), more);
        let recovered = engine.recover().unwrap();
        let stream = recovered.streams.iter().find(|s| s.id == 7).unwrap();
        assert_eq!(stream.stored_end, more.last().map(StoredEnd::of));
    }

    pub async fn a_stream_trimmed_then_removed_leaves_nothing(engine: &dyn Engine) {
        let records = lay_out(Offset::START, 1, bodies(&["a"; 5]));
        engine
            .commit(vec![
                Change::PutStream(9, Box::new(meta("r", Offset::new(5, 5)))),
                Change::PutRecords(9, records, None),
            ])
            .await
            .unwrap();
        engine
            .commit(vec![Change::TrimRecords(9, 3)])
            .await
            .unwrap();
        engine.commit(vec![Change::RemoveStream(9)]).await.unwrap();
        assert!(engine.read(9, 0, 10, usize::MAX).await.unwrap().is_empty());
        assert!(engine.recover().unwrap().streams.is_empty());
    }

    macro_rules! engine_contract {
        ($module:ident, $make:expr) => {
            mod $module {
                use super::*;

                #[tokio::test]
                async fn committed_records_read_back_in_order() {
                    let (engine, _dir) = $make;
                    super::committed_records_read_back_in_order(&engine).await;
                }

                #[tokio::test]
                async fn recovery_returns_metadata_producers_and_next_id() {
                    let (engine, _dir) = $make;
                    super::recovery_returns_metadata_producers_and_next_id(&engine).await;
                }

                #[tokio::test]
                async fn recovering_one_stream_at_a_time_gives_the_same_in_id_order() {
                    let (engine, _dir) = $make;
                    super::recovering_one_stream_at_a_time_gives_the_same_in_id_order(&engine)
                        .await;
                }

                #[tokio::test]
                async fn removing_a_stream_removes_everything_but_keeps_ids_unused() {
                    let (engine, _dir) = $make;
                    super::removing_a_stream_removes_everything_but_keeps_ids_unused(&engine).await;
                }

                #[tokio::test]
                async fn records_written_and_removed_in_one_batch_leave_nothing() {
                    let (engine, _dir) = $make;
                    super::records_written_and_removed_in_one_batch_leave_nothing(&engine).await;
                }

                #[tokio::test]
                async fn record_headers_and_unit_flags_survive() {
                    let (engine, _dir) = $make;
                    super::record_headers_and_unit_flags_survive(&engine).await;
                }

                #[tokio::test]
                async fn a_read_budget_counts_header_bytes_too() {
                    let (engine, _dir) = $make;
                    super::a_read_budget_counts_header_bytes_too(&engine).await;
                }

                #[tokio::test]
                async fn a_read_of_empty_records_is_bounded_by_its_budget() {
                    let (engine, _dir) = $make;
                    super::a_read_of_empty_records_is_bounded_by_its_budget(&engine).await;
                }

                #[tokio::test]
                async fn trimmed_records_are_never_read_and_later_ones_stay() {
                    let (engine, _dir) = $make;
                    super::trimmed_records_are_never_read_and_later_ones_stay(&engine).await;
                }

                #[tokio::test]
                async fn a_stream_trimmed_then_removed_leaves_nothing() {
                    let (engine, _dir) = $make;
                    super::a_stream_trimmed_then_removed_leaves_nothing(&engine).await;
                }
            }
        };
    }

    engine_contract!(memory_engine, (MemoryEngine::new(), ()));
    engine_contract!(fjall_engine, {
        let dir = tempfile::tempdir().unwrap();
        (
            FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap(),
            dir,
        )
    });

    #[tokio::test]
    async fn fjall_engine_recovers_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let records = lay_out(Offset::START, 3, bodies(&["persist", "me"]));
        {
            let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
            engine
                .commit(vec![
                    Change::PutStream(1, Box::new(meta("p", Offset::new(2, 9)))),
                    Change::PutRecords(1, records.clone(), None),
                ])
                .await
                .unwrap();
        }
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        let recovered = engine.recover().unwrap();
        assert_eq!(
            recovered.streams[0].stored_end,
            records.last().map(StoredEnd::of)
        );
        assert_eq!(
            engine.recover().unwrap().streams[0].meta.tail,
            Offset::new(2, 9)
        );
        assert_eq!(engine.read(1, 0, 2, usize::MAX).await.unwrap(), records);
    }

    #[tokio::test]
    async fn fjall_engine_keeps_a_trim_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let records = lay_out(Offset::START, 3, bodies(&["a", "b", "c", "d"]));
        {
            let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
            engine
                .commit(vec![
                    Change::PutStream(1, Box::new(meta("p", Offset::new(4, 4)))),
                    Change::PutRecords(1, records.clone(), None),
                ])
                .await
                .unwrap();
            engine
                .commit(vec![Change::TrimRecords(1, 3)])
                .await
                .unwrap();
        }
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        assert_eq!(
            engine.read(1, 0, 4, usize::MAX).await.unwrap(),
            records[3..]
        );
        let recovered = engine.recover().unwrap();
        assert_eq!(
            recovered.streams[0].stored_end,
            records.last().map(StoredEnd::of)
        );
    }
}
