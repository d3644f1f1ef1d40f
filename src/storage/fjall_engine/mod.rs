//! The embedded on-disk engine, on fjall, with group commit.
//!
//! Every batch goes through one writer thread (`writer`): it gathers what has queued, writes it
//! all, syncs the journal once, and only then acknowledges each batch in the group. Under load,
//! many concurrent appends share one fsync. Trims are logically instant and physically lazy
//! (`trims`); writes are refused before the disk fills (`space`). This file holds the engine
//! itself: opening, reading and recovery.

mod body_files;
#[cfg(all(test, target_os = "linux"))]
pub(crate) use body_files::mapped as mapped_body_files;
mod space;
mod submission;
mod time_index;
mod trims;
mod writer;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use bytes::Bytes;
use fjall::{Database, Keyspace, KeyspaceCreateOptions};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::codec::{self, Stored, decode_stored};
use super::staged;
use super::{
    ByteBudget, Change, Engine, Recovered, RecoveredStream, Staged, StorageError, StoredEnd,
    StreamId, TimeBounds,
};
use crate::model::Record;
use crate::model::record::held_len_of;

use body_files::{BodyFiles, STAGE_BYTES, SnapshotFile};
use space::FreeSpace;
use submission::Submission;
use time_index::TimeIndexer;
use trims::Trims;
use writer::Writer;

/// Whether an acknowledged batch is synced to stable storage first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// fsync before acknowledging: an acknowledged write survives power loss.
    Fsync,
    /// Acknowledge once written to the OS: survives a process crash, not a power loss.
    None,
}

#[derive(Clone)]
struct Keyspaces {
    db: Database,
    streams: Keyspace,
    records: Keyspace,
    producers: Keyspace,
    snapshots: Keyspace,
    buckets: Keyspace,
    tokens: Keyspace,
    system: Keyspace,
    /// Per trimmed stream, [`codec::encode_trim`]: where its trim stands and how far the
    /// records below it are deleted.
    trims: Keyspace,
    /// Which staged files hold records' bodies, and which hold snapshots (see `body_files`).
    record_files: Keyspace,
    snapshot_files: Keyspace,
    /// The timestamp index (see `time_index`).
    times: Keyspace,
}

impl Keyspaces {
    fn open(dir: &Path) -> Result<Keyspaces, StorageError> {
        std::fs::create_dir_all(dir).map_err(io)?;
        let db = Database::builder(dir).open().map_err(io)?;
        let open = |name: &str| {
            db.keyspace(name, KeyspaceCreateOptions::default)
                .map_err(io)
        };
        Ok(Keyspaces {
            streams: db
                .keyspace("streams", || {
                    KeyspaceCreateOptions::default().max_memtable_size(STREAMS_MEMTABLE_BYTES)
                })
                .map_err(io)?,
            records: db
                .keyspace("records", || {
                    KeyspaceCreateOptions::default()
                        .max_memtable_size(RECORDS_MEMTABLE_BYTES)
                        .with_kv_separation(Some(records_apart()))
                })
                .map_err(io)?,
            producers: db
                .keyspace("producers", || {
                    KeyspaceCreateOptions::default().max_memtable_size(PRODUCERS_MEMTABLE_BYTES)
                })
                .map_err(io)?,
            snapshots: open("snapshots")?,
            buckets: open("buckets")?,
            tokens: open("tokens")?,
            system: open("system")?,
            // Created on first open by this version; data written before has no trims pending.
            trims: open("trims")?,
            record_files: open("record_files")?,
            snapshot_files: open("snapshot_files")?,
            // Created on first open by this version; streams written before have no entries.
            times: open("times")?,
            db,
        })
    }
}

pub struct FjallEngine {
    keyspaces: Keyspaces,
    queue: mpsc::Sender<Submission>,
    failed: Arc<AtomicBool>,
    stats: Arc<CommitStats>,
    space: Arc<FreeSpace>,
    trims: Arc<Trims>,
    files: Arc<BodyFiles>,
}

impl Drop for FjallEngine {
    fn drop(&mut self) {
        // The purger holds a sender of the writer's queue; once it stops, the writer does too.
        self.trims.close();
    }
}

/// Counters of the group commit: how many batches were written in how many synced groups.
#[derive(Debug, Default)]
pub struct CommitStats {
    pub batches: AtomicU64,
    pub groups: AtomicU64,
    /// The most stored values (a record, or a run of them) one group deleted for trims: the
    /// deletions trimming added to the latency of every append sharing that group.
    pub most_values_purged: AtomicU64,
}

const NEXT_ID_KEY: &[u8] = b"next_id";

/// The stream-metadata keyspace's memtable size (fjall's default is 64 MiB). Every stream's
/// metadata is already in memory in the service, nothing reads this keyspace but recovery, and
/// it is written only on creates and metadata changes: a big memtable would only hold a second
/// in-memory copy of up to some 300k streams' metadata (about 110 MiB with the skiplist). fjall
/// fixes a keyspace's options when it creates it, so this applies to new data directories.
const STREAMS_MEMTABLE_BYTES: u64 = 16 << 20;

/// The records keyspace's memtable size. Every appended byte passes through it; the service
/// serves recent records from its own tail cache, so a large memtable only adds resident memory
/// (about twice its size with the skiplist) and a deeper skiplist to insert into. At 64 MiB a
/// 6-second run at 500 writers ended at 210–260 MiB resident, at 16 MiB 140–170 MiB, with the
/// append rate level. New data directories only, as above.
const RECORDS_MEMTABLE_BYTES: u64 = 16 << 20;

/// Record values of a kilobyte or more (runs of an append-batch, large records) are written to
/// blob files once, at flush, and compaction moves only their keys: an append-only log gains
/// nothing from rewriting its bodies level after level. That rewriting, with the copies it makes,
/// was the most of the writer-side cost of 512-frame append-batches, which went from about 350
/// to 800-900 batches/s with it gone (and runs). Uncompressed, as fjall leaves its first levels:
/// a catch-up read then costs no decompression. New data directories only, as above.
fn records_apart() -> fjall::KvSeparationOptions {
    fjall::KvSeparationOptions::default().compression(fjall::CompressionType::None)
}

/// The producers keyspace's memtable size. Each idempotent append rewrites its producer's state,
/// so the memtable fills with superseded versions of a few keys; flushing drops them.
const PRODUCERS_MEMTABLE_BYTES: u64 = 4 << 20;

fn io(e: impl std::fmt::Display) -> StorageError {
    StorageError::Io(e.to_string())
}

impl FjallEngine {
    /// Opens (or creates) the store in `dir`. Writes are refused while the file system has
    /// less than `reserve` bytes free (0: never).
    pub fn open(dir: &Path, sync: SyncMode, reserve: u64) -> Result<Self, StorageError> {
        let keyspaces = Keyspaces::open(dir)?;
        let trims = Arc::new(Trims::load(&keyspaces.trims)?);
        let files = Arc::new(BodyFiles::open(
            dir,
            &keyspaces.record_files,
            &keyspaces.snapshot_files,
            reserve,
            (sync == SyncMode::None).then(|| keyspaces.db.clone()),
        )?);
        let (queue, incoming) = mpsc::channel();
        let failed = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(CommitStats::default());
        let writer = Writer {
            keyspaces: keyspaces.clone(),
            sync,
            failed: failed.clone(),
            stats: stats.clone(),
            trims: trims.clone(),
            files: files.clone(),
            times: TimeIndexer::default(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        };
        std::thread::Builder::new()
            .name("runnel-writer".into())
            .spawn(move || writer.run(incoming))
            .map_err(io)?;
        let (purger, purges) = (trims.clone(), queue.clone());
        std::thread::Builder::new()
            .name("runnel-purger".into())
            .spawn(move || purger.purge(purges))
            .map_err(io)?;
        Ok(FjallEngine {
            keyspaces,
            queue,
            failed,
            stats,
            space: FreeSpace::watch(dir, reserve),
            trims,
            files,
        })
    }

    /// How many streams have trimmed records not yet deleted.
    pub fn pending_trims(&self) -> usize {
        self.trims.lock().pending.len()
    }

    pub fn stats(&self) -> &CommitStats {
        &self.stats
    }

    fn read_sync(
        records: &Keyspace,
        files: &BodyFiles,
        trims: &Trims,
        id: StreamId,
        from: u64,
        until: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, StorageError> {
        let mut out = Vec::new();
        let mut budget = ByteBudget::new(max_bytes);
        if until <= from {
            return Ok(out);
        }
        // Runs are keyed by their last seq, so the first one at or after `from` holds it.
        let runs = codec::record_key(id, from)..=codec::record_key(id, u64::MAX);
        for guard in records.range(runs) {
            let (key, value) = guard.into_inner().map_err(io)?;
            // The records keep the engine's buffer alive instead of copying it: catch-up reads
            // spent a tenth of their time in that copy.
            let last = codec::record_seq(&key)?;
            let complete = match decode_stored(last, Bytes::from_owner(value))? {
                Stored::Held(run) => {
                    let mut wanted = run.into_iter().skip_while(|r| r.seq < from);
                    wanted.all(|record| {
                        let taken = record.seq < until && budget.take(&record);
                        if taken {
                            out.push(record);
                        }
                        taken
                    })
                }
                Stored::Filed(run) => {
                    let file = run.file;
                    match Self::read_filed(files, run, from, until, &mut budget, &mut out)? {
                        Some(complete) => complete,
                        // Gone with a trim or a removal since this read began: what was read so
                        // far is the answer. Gone while its records are still there to read:
                        // lost, and said so rather than passed off as trimmed.
                        None if last >= trims.floor(id)
                            && records.contains_key(key).map_err(io)? =>
                        {
                            return Err(StorageError::Corrupt(format!(
                                "staged body file {file:016x} of stream {id} is missing"
                            )));
                        }
                        None => false,
                    }
                }
            };
            // Do not load the next run only to find it starts at or past `until`.
            if !complete || last.saturating_add(1) >= until {
                break;
            }
        }
        Ok(out)
    }

    /// Adds to `out` the records of `run` in `from..until` that fit the budget, their bodies
    /// read from the staged file in one read. Returns whether the read may go on to the next
    /// run (not when the budget or `until` stopped it), or `None` when the file is gone.
    fn read_filed(
        files: &BodyFiles,
        run: codec::FiledRun,
        from: u64,
        until: u64,
        budget: &mut ByteBudget,
        out: &mut Vec<Record>,
    ) -> Result<Option<bool>, StorageError> {
        let wanted = run.records.into_iter().skip_while(|f| f.record.seq < from);
        let mut taken = Vec::new();
        let mut complete = true;
        for filed in wanted {
            let held = held_len_of(&filed.record.headers, filed.len as usize);
            if filed.record.seq >= until || !budget.take_len(held) {
                complete = false;
                break;
            }
            taken.push(filed);
        }
        // Empty bodies lie nowhere in particular: they do not widen the read.
        let bodies = || taken.iter().filter(|f| f.len > 0);
        let start = bodies().map(|f| f.place).min().unwrap_or(0);
        let end = bodies().map(|f| f.place + f.len).max().unwrap_or(start);
        if end == start {
            out.extend(taken.into_iter().map(|f| f.record));
            return Ok(Some(complete));
        }
        let Some(span) = files.read(run.file, start, end - start)? else {
            return Ok(None);
        };
        for filed in taken {
            if filed.len == 0 {
                out.push(filed.record);
                continue;
            }
            let at = (filed.place - start) as usize;
            let body = span.slice(at..at + filed.len as usize);
            out.push(Record {
                body,
                ..filed.record
            });
        }
        Ok(Some(complete))
    }
}

impl Engine for FjallEngine {
    fn commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        let (done, result) = oneshot::channel();
        let submission = Submission {
            changes,
            done,
            purge: None,
        };
        if self.failed.load(Ordering::Acquire) || self.queue.send(submission).is_err() {
            return futures::future::ready(Err(StorageError::Failed)).boxed();
        }
        async move { result.await.unwrap_or(Err(StorageError::Failed)) }.boxed()
    }

    fn stages(&self, bytes: usize) -> bool {
        bytes >= STAGE_BYTES
    }

    fn stage(&self, bodies: Vec<Bytes>) -> BoxFuture<'static, Result<Staged, StorageError>> {
        if self.failed.load(Ordering::Acquire) {
            return futures::future::ready(Err(StorageError::Failed)).boxed();
        }
        let files = self.files.clone();
        async move {
            tokio::task::spawn_blocking(move || files.stage(bodies))
                .await
                .map_err(io)?
        }
        .boxed()
    }

    fn read(
        &self,
        id: StreamId,
        from: u64,
        until: u64,
        max_bytes: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StorageError>> {
        let (records, files) = (self.keyspaces.records.clone(), self.files.clone());
        let trims = self.trims.clone();
        // Trimmed records may still be stored until the purger reaches them; never show them.
        let from = from.max(self.trims.floor(id));
        async move {
            tokio::task::spawn_blocking(move || {
                Self::read_sync(&records, &files, &trims, id, from, until, max_bytes)
            })
            .await
            .map_err(io)?
        }
        .boxed()
    }

    fn time_bounds(
        &self,
        id: StreamId,
        timestamp_ms: u64,
    ) -> BoxFuture<'static, Result<TimeBounds, StorageError>> {
        let times = self.keyspaces.times.clone();
        async move {
            tokio::task::spawn_blocking(move || time_index::bounds(&times, id, timestamp_ms))
                .await
                .map_err(io)?
        }
        .boxed()
    }

    fn read_snapshot(
        &self,
        id: StreamId,
    ) -> BoxFuture<'static, Result<Option<Bytes>, StorageError>> {
        let ks = self.keyspaces.clone();
        let files = self.files.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let key = codec::stream_key(id);
                // A newer snapshot may replace the file between the lookup and the read: then
                // look again. The same file still referred to but gone is lost.
                let mut tried = None;
                loop {
                    let Some(value) = ks.snapshot_files.get(key).map_err(io)? else {
                        let blob = ks.snapshots.get(key).map_err(io)?;
                        return Ok(blob.map(Bytes::from_owner));
                    };
                    let file = SnapshotFile::decode(&value)?;
                    if tried == Some(file.number) {
                        let name = staged::file_name(file.number);
                        return Err(StorageError::Corrupt(format!(
                            "the snapshot of stream {id} is in staged file {name}, which is missing"
                        )));
                    }
                    if let Some(blob) = files.read(file.number, 0, file.len)? {
                        return Ok(Some(blob));
                    }
                    tried = Some(file.number);
                }
            })
            .await
            .map_err(io)?
        }
        .boxed()
    }

    /// No room once a write failed: the writer takes no more, and a request refused here waits
    /// for nothing.
    fn room(&self) -> Result<(), StorageError> {
        if self.failed.load(Ordering::Acquire) {
            return Err(StorageError::Failed);
        }
        if self.space.has_room.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(StorageError::Full {
                reserve: self.space.reserve,
            })
        }
    }

    fn recover(&self) -> Result<Recovered, StorageError> {
        let mut streams = Vec::new();
        let recovered = self.recover_each(&mut |stream| streams.push(stream))?;
        Ok(Recovered {
            streams,
            ..recovered
        })
    }

    fn recover_each(
        &self,
        each: &mut dyn FnMut(RecoveredStream),
    ) -> Result<Recovered, StorageError> {
        let ks = &self.keyspaces;
        let mut buckets = Vec::new();
        for guard in ks.buckets.iter() {
            let (key, value) = guard.into_inner().map_err(io)?;
            let name = String::from_utf8(key.to_vec())
                .map_err(|_| StorageError::Corrupt("bucket name is not UTF-8".into()))?;
            let meta = serde_json::from_slice(&value)
                .map_err(|e| StorageError::Corrupt(format!("metadata of bucket {name}: {e}")))?;
            buckets.push((name, meta));
        }
        let mut tokens = Vec::new();
        for guard in ks.tokens.iter() {
            let (key, value) = guard.into_inner().map_err(io)?;
            let token = serde_json::from_slice(&value).map_err(|e| {
                StorageError::Corrupt(format!(
                    "access token {}: {e}",
                    String::from_utf8_lossy(&key)
                ))
            })?;
            tokens.push(token);
        }
        let mut next_stream_id = 0;
        for guard in ks.streams.iter() {
            let (key, value) = guard.into_inner().map_err(io)?;
            let (id, _) = codec::split_key(&key)?;
            let meta = serde_json::from_slice(&value)
                .map_err(|e| StorageError::Corrupt(format!("metadata of stream {id}: {e}")))?;
            let mut producers = Vec::new();
            for guard in ks.producers.prefix(codec::stream_key(id)) {
                let (key, value) = guard.into_inner().map_err(io)?;
                let (_, name) = codec::split_key(&key)?;
                let name = String::from_utf8(name.to_vec())
                    .map_err(|_| StorageError::Corrupt(format!("producer id in stream {id}")))?;
                let state = codec::decode_producer(&value).map_err(|e| {
                    StorageError::Corrupt(format!("producer {name} of stream {id}: {e}"))
                })?;
                producers.push((name, state));
            }
            // The last retained record: trimmed ones may linger until they are purged.
            let trimmed_before = self.trims.floor(id);
            let retained = codec::record_key(id, trimmed_before)..=codec::record_key(id, u64::MAX);
            let stored_end = match ks.records.range(retained).next_back() {
                Some(guard) => {
                    let (key, value) = guard.into_inner().map_err(io)?;
                    let seq = codec::record_seq(&key)?;
                    // Not copied: the record only tells the service its stream's tail, and goes.
                    decode_stored(seq, Bytes::from_owner(value))?
                        .end()
                        .map(|(next, timestamp_ms)| StoredEnd { next, timestamp_ms })
                }
                None => None,
            };
            next_stream_id = next_stream_id.max(id.saturating_add(1));
            each(RecoveredStream {
                id,
                meta,
                producers,
                stored_end,
                trimmed_before,
            });
        }
        let next_id = match ks.system.get(NEXT_ID_KEY).map_err(io)? {
            Some(v) => u64::from_be_bytes(
                v.as_ref()
                    .try_into()
                    .map_err(|_| StorageError::Corrupt("next_id".into()))?,
            ),
            None => 0,
        }
        .max(next_stream_id);
        Ok(Recovered {
            streams: Vec::new(),
            buckets,
            tokens,
            next_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::trims::PURGE_CHUNK;
    use super::*;

    use crate::model::Offset;
    use crate::model::record::lay_out;

    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_batches_share_one_sync() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        let commits: Vec<_> = (0..200u64)
            .map(|i| {
                let records = lay_out(Offset::new(i, i), 0, vec![Bytes::from_static(b"x")]);
                engine.commit(vec![Change::PutRecords(1, records, None)])
            })
            .collect();
        for commit in commits {
            commit.await.unwrap();
        }
        let batches = engine.stats().batches.load(Ordering::Relaxed);
        let groups = engine.stats().groups.load(Ordering::Relaxed);
        assert_eq!(batches, 200);
        assert!(groups < 20, "200 queued batches took {groups} syncs");
    }

    /// Stream `id` with `count` one-byte records, committed in batches.
    async fn fill(engine: &FjallEngine, id: StreamId, count: u64) {
        use crate::model::stream::StreamMeta;
        let meta = StreamMeta::new("s", "application/octet-stream");
        engine
            .commit(vec![Change::PutStream(id, Box::new(meta))])
            .await
            .unwrap();
        let mut at = Offset::START;
        while at.seq < count {
            let n = (count - at.seq).min(10_000) as usize;
            let records = lay_out(at, 0, vec![Bytes::from_static(b"x"); n]);
            at = records.last().unwrap().next_offset();
            engine.commit(one_key_each(id, records)).await.unwrap();
        }
    }

    /// Each record as a change of its own, so each is stored under a key of its own: the purge
    /// tests count deletions in keys.
    fn one_key_each(id: StreamId, records: Vec<Record>) -> Vec<Change> {
        let each = records
            .into_iter()
            .map(|r| Change::PutRecords(id, vec![r], None));
        each.collect()
    }

    /// How many records of stream `id` with `from <= seq < until` are physically stored.
    fn stored(ks: &Keyspaces, id: StreamId, from: u64, until: u64) -> usize {
        let runs = ks
            .records
            .range(codec::record_key(id, from)..=codec::record_key(id, u64::MAX));
        let mut count = 0;
        for guard in runs {
            let (key, value) = guard.into_inner().unwrap();
            let run = decode_stored(codec::record_seq(&key).unwrap(), Bytes::from_owner(value));
            let seqs: Vec<u64> = match run.unwrap() {
                Stored::Held(records) => records.iter().map(|r| r.seq).collect(),
                Stored::Filed(run) => run.records.iter().map(|f| f.record.seq).collect(),
            };
            count += seqs
                .iter()
                .filter(|seq| (from..until).contains(*seq))
                .count();
        }
        count
    }

    fn stored_below(engine: &FjallEngine, id: StreamId, before: u64) -> usize {
        stored(&engine.keyspaces, id, 0, before)
    }

    /// Waits until the records below `before` are physically gone.
    async fn wait_purged(engine: &FjallEngine, id: StreamId, before: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while engine.pending_trims() > 0 || stored_below(engine, id, before) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "trimmed records still stored after 60 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_large_trim_deletes_in_bounded_chunks_while_other_streams_append() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FjallEngine::open(dir.path(), SyncMode::None, 0).unwrap();
        fill(&engine, 1, 60_000).await;
        fill(&engine, 2, 0).await;
        let trim = engine.commit(vec![Change::TrimRecords(1, 50_000)]);
        // Appends to another stream, queued behind the trim and during its deletion.
        let mut worst = std::time::Duration::ZERO;
        let mut at = Offset::START;
        while at.seq < 20 || engine.pending_trims() > 0 {
            let records = lay_out(at, 0, vec![Bytes::from_static(b"y")]);
            at = records[0].next_offset();
            let started = std::time::Instant::now();
            engine
                .commit(vec![Change::PutRecords(2, records, None)])
                .await
                .unwrap();
            worst = worst.max(started.elapsed());
        }
        trim.await.unwrap();
        wait_purged(&engine, 1, 50_000).await;
        let kept = engine.read(1, 0, 60_000, usize::MAX).await.unwrap();
        assert_eq!(kept.len(), 10_000);
        assert_eq!(
            kept[0].seq, 50_000,
            "records at and after the trim point stay"
        );
        assert_eq!(
            engine.read(2, 0, at.seq, usize::MAX).await.unwrap().len() as u64,
            at.seq
        );
        let most = engine.stats().most_values_purged.load(Ordering::Relaxed);
        assert!(
            most <= PURGE_CHUNK as u64,
            "one group deleted {most} stored values; every append in it waited for that"
        );
        // Structural bound above; this wall-clock one is generous (debug build, shared CPU).
        assert!(
            worst < std::time::Duration::from_secs(2),
            "an append on another stream waited {worst:?}"
        );
    }

    /// A writer with no threads around it, to write groups one at a time.
    fn bare_writer(dir: &Path) -> Writer {
        let keyspaces = Keyspaces::open(dir).unwrap();
        let trims = Arc::new(Trims::load(&keyspaces.trims).unwrap());
        let ks = &keyspaces;
        let files = BodyFiles::open(dir, &ks.record_files, &ks.snapshot_files, 0, None).unwrap();
        Writer {
            keyspaces,
            sync: SyncMode::None,
            failed: Arc::default(),
            stats: Arc::default(),
            trims,
            files: Arc::new(files),
            times: TimeIndexer::default(),
            runtime: None,
        }
    }

    fn batch(changes: Vec<Change>) -> Submission {
        Submission {
            changes,
            done: oneshot::channel().0,
            purge: None,
        }
    }

    fn purge(id: StreamId) -> Submission {
        Submission {
            changes: Vec::new(),
            done: oneshot::channel().0,
            purge: Some(id),
        }
    }

    fn write(writer: &Writer, group: Vec<Submission>) {
        writer.write_group(&group, &mut 0, &mut 0).unwrap();
    }

    /// Stream `id` with one-byte records `0..count`, as one submission.
    fn filled(id: StreamId, count: u64) -> Submission {
        use crate::model::stream::StreamMeta;
        let records = lay_out(
            Offset::START,
            0,
            vec![Bytes::from_static(b"x"); count as usize],
        );
        let meta = Box::new(StreamMeta::new("s", "text/plain"));
        let mut changes = vec![Change::PutStream(id, meta)];
        changes.extend(one_key_each(id, records));
        batch(changes)
    }

    fn stored_trim(writer: &Writer, id: StreamId) -> Option<(u64, u64)> {
        let value = writer.keyspaces.trims.get(codec::stream_key(id)).unwrap()?;
        Some(codec::decode_trim(&value).unwrap())
    }

    #[test]
    fn submissions_a_failed_group_had_already_committed_succeed_and_the_rest_fail() {
        let dir = tempfile::tempdir().unwrap();
        let writer = bare_writer(dir.path());
        write(&writer, vec![filled(1, 3), filled(2, 1), filled(3, 1)]);
        // A corrupt file reference of stream 1: its removal fails after the commit it needs first.
        let corrupt = codec::record_key(1, 2);
        writer
            .keyspaces
            .record_files
            .insert(corrupt, b"bad")
            .unwrap();
        let append = |seq| {
            let records = lay_out(Offset::new(seq, seq), 0, vec![Bytes::from_static(b"y")]);
            vec![Change::PutRecords(2, records, None)]
        };
        let (queue, incoming) = std::sync::mpsc::channel();
        let mut answers = Vec::new();
        let remove = |id| vec![Change::RemoveStream(id)];
        // Two removals split the group twice; the second fails after its split.
        for changes in [append(1), remove(3), append(2), remove(1), append(3)] {
            let (done, answer) = oneshot::channel();
            let purge = None;
            queue
                .send(Submission {
                    changes,
                    done,
                    purge,
                })
                .unwrap();
            answers.push(answer);
        }
        drop(queue);
        // All five are queued, so they form one group; the loop ends with the queue.
        let keyspaces = writer.keyspaces.clone();
        writer.run(incoming);
        let succeeded: Vec<bool> = answers
            .into_iter()
            .map(|a| a.blocking_recv().unwrap().is_ok())
            .collect();
        assert_eq!(succeeded, [true, true, true, false, false]);
        assert_eq!(stored(&keyspaces, 2, 0, u64::MAX), 3);
        assert_eq!(stored(&keyspaces, 3, 0, u64::MAX), 0);
    }

    #[test]
    fn a_trim_deletes_nothing_and_each_purge_a_bounded_chunk_from_where_the_last_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let writer = bare_writer(dir.path());
        let chunk = PURGE_CHUNK as u64;
        let (before, count) = (2 * chunk + 100, 3 * chunk);
        write(&writer, vec![filled(1, count)]);
        write(&writer, vec![batch(vec![Change::TrimRecords(1, before)])]);
        assert_eq!(stored(&writer.keyspaces, 1, 0, count), count as usize);
        assert_eq!(stored_trim(&writer, 1), Some((before, 0)));
        for purged in [chunk, 2 * chunk, before] {
            write(&writer, vec![purge(1)]);
            assert_eq!(stored_trim(&writer, 1), Some((before, purged)));
            assert_eq!(
                stored(&writer.keyspaces, 1, 0, before),
                (before - purged) as usize
            );
        }
        let most = writer.stats.most_values_purged.load(Ordering::Relaxed);
        assert_eq!(most, chunk, "no group deleted more than one chunk");
        write(&writer, vec![purge(1)]);
        assert_eq!(stored_trim(&writer, 1), Some((before, before)), "done");
        assert_eq!(
            stored(&writer.keyspaces, 1, before, u64::MAX),
            (count - before) as usize,
            "records at and after the trim point stay"
        );
    }

    #[test]
    fn a_purge_finds_records_written_in_its_own_group_before_the_trim() {
        let dir = tempfile::tempdir().unwrap();
        let writer = bare_writer(dir.path());
        write(
            &writer,
            vec![
                filled(1, 10),
                batch(vec![Change::TrimRecords(1, 8)]),
                purge(1),
            ],
        );
        assert_eq!(stored(&writer.keyspaces, 1, 0, 8), 0);
        assert_eq!(stored(&writer.keyspaces, 1, 8, 10), 2);
        assert_eq!(stored_trim(&writer, 1), Some((8, 8)));
    }

    #[test]
    fn trimming_again_while_purging_moves_the_target_up_never_down() {
        let dir = tempfile::tempdir().unwrap();
        let writer = bare_writer(dir.path());
        let chunk = PURGE_CHUNK as u64;
        write(&writer, vec![filled(1, 4 * chunk)]);
        write(
            &writer,
            vec![batch(vec![Change::TrimRecords(1, chunk + 10)])],
        );
        write(&writer, vec![purge(1)]);
        write(
            &writer,
            vec![
                batch(vec![Change::TrimRecords(1, 3 * chunk)]),
                batch(vec![Change::TrimRecords(1, 5)]),
            ],
        );
        assert_eq!(stored_trim(&writer, 1), Some((3 * chunk, chunk)));
        while writer.trims.get(1).is_some_and(|t| t.pending()) {
            write(&writer, vec![purge(1)]);
        }
        assert_eq!(stored(&writer.keyspaces, 1, 0, 3 * chunk), 0);
        assert_eq!(
            stored(&writer.keyspaces, 1, 3 * chunk, u64::MAX),
            chunk as usize
        );
        assert_eq!(stored_trim(&writer, 1), Some((3 * chunk, 3 * chunk)));
    }

    #[test]
    fn a_stream_removed_during_its_purge_leaves_no_records_and_no_trim_state() {
        let dir = tempfile::tempdir().unwrap();
        let writer = bare_writer(dir.path());
        let chunk = PURGE_CHUNK as u64;
        write(&writer, vec![filled(1, 3 * chunk), filled(2, 10)]);
        write(
            &writer,
            vec![batch(vec![Change::TrimRecords(1, 2 * chunk)])],
        );
        write(&writer, vec![purge(1)]);
        write(
            &writer,
            vec![batch(vec![Change::RemoveStream(1)]), purge(1)],
        );
        while writer.trims.get(1).is_some() {
            write(&writer, vec![purge(1)]);
        }
        assert_eq!(stored(&writer.keyspaces, 1, 0, u64::MAX), 0);
        assert_eq!(stored_trim(&writer, 1), None);
        assert_eq!(writer.trims.get(1), None);
        // A trim that arrives after the removal leaves nothing behind either.
        write(&writer, vec![batch(vec![Change::TrimRecords(1, 10)])]);
        write(&writer, vec![purge(1)]);
        assert_eq!(stored_trim(&writer, 1), None);
        assert_eq!(writer.trims.get(1), None);
        assert_eq!(
            stored(&writer.keyspaces, 2, 0, u64::MAX),
            10,
            "others untouched"
        );
    }

    #[tokio::test]
    async fn an_interrupted_purge_resumes_at_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            // Stopped after one chunk, as a crash would leave it.
            let writer = bare_writer(dir.path());
            write(&writer, vec![filled(1, 10_000)]);
            write(&writer, vec![batch(vec![Change::TrimRecords(1, 8_000)])]);
            write(&writer, vec![purge(1)]);
            assert_eq!(stored_trim(&writer, 1), Some((8_000, PURGE_CHUNK as u64)));
        }
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        let first = engine.read(1, 0, 10, usize::MAX).await.unwrap();
        assert!(
            first.is_empty(),
            "trimmed records stay hidden while they are purged"
        );
        let recovered = engine.recover().unwrap();
        assert_eq!(recovered.streams[0].stored_end.unwrap().next.seq, 10_000);
        wait_purged(&engine, 1, 8_000).await;
        let kept = engine.read(1, 0, 10_000, usize::MAX).await.unwrap();
        assert_eq!(kept.len(), 2_000);
        assert_eq!(kept[0].seq, 8_000);
    }

    #[test]
    fn removing_a_long_stream_deletes_nothing_at_once_and_each_purge_a_bounded_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let writer = bare_writer(dir.path());
        let chunk = PURGE_CHUNK as u64;
        let count = 3 * chunk + 5;
        write(&writer, vec![filled(1, count), filled(2, 10)]);
        write(&writer, vec![batch(vec![Change::RemoveStream(1)])]);
        assert_eq!(
            stored(&writer.keyspaces, 1, 0, u64::MAX),
            count as usize,
            "the removal's own group deletes no records"
        );
        assert_eq!(writer.trims.floor(1), u64::MAX, "but no read sees them");
        let mut purges = 0;
        while writer.trims.get(1).is_some() {
            let before = stored(&writer.keyspaces, 1, 0, u64::MAX);
            write(&writer, vec![purge(1)]);
            let after = stored(&writer.keyspaces, 1, 0, u64::MAX);
            assert!(
                before - after <= PURGE_CHUNK,
                "one purge deleted {}",
                before - after
            );
            purges += 1;
        }
        assert_eq!(purges, 4);
        assert_eq!(stored(&writer.keyspaces, 1, 0, u64::MAX), 0);
        assert_eq!(stored_trim(&writer, 1), None, "no state is left behind");
        assert_eq!(
            stored(&writer.keyspaces, 2, 0, u64::MAX),
            10,
            "others untouched"
        );
    }

    #[tokio::test]
    async fn a_removal_interrupted_before_its_records_are_deleted_finishes_at_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            // Stopped right after the removal, as a crash would leave it.
            let writer = bare_writer(dir.path());
            write(&writer, vec![filled(1, 10_000), filled(2, 3)]);
            write(&writer, vec![batch(vec![Change::RemoveStream(1)])]);
        }
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        assert!(engine.read(1, 0, 10, usize::MAX).await.unwrap().is_empty());
        let recovered = engine.recover().unwrap();
        assert_eq!(recovered.streams.len(), 1, "only stream 2 is recovered");
        wait_purged(&engine, 1, u64::MAX).await;
        assert!(
            engine
                .keyspaces
                .trims
                .get(codec::stream_key(1))
                .unwrap()
                .is_none()
        );
        assert_eq!(engine.read(2, 0, 10, usize::MAX).await.unwrap().len(), 3);
    }

    #[test]
    fn removing_a_short_stream_deletes_its_records_in_its_own_group_and_keeps_no_state() {
        let dir = tempfile::tempdir().unwrap();
        let writer = bare_writer(dir.path());
        let chunk = PURGE_CHUNK as u64;
        write(&writer, vec![filled(1, chunk), filled(2, 10)]);
        write(&writer, vec![batch(vec![Change::RemoveStream(1)])]);
        assert_eq!(stored(&writer.keyspaces, 1, 0, u64::MAX), 0);
        assert_eq!(stored_trim(&writer, 1), None);
        assert_eq!(writer.trims.get(1), None, "nothing is left for the purger");
        assert_eq!(
            stored(&writer.keyspaces, 2, 0, u64::MAX),
            10,
            "others untouched"
        );
    }

    #[tokio::test]
    async fn a_batch_is_stored_in_runs_and_reads_back_from_any_seq() {
        use crate::model::stream::StreamMeta;
        let dir = tempfile::tempdir().unwrap();
        let engine = FjallEngine::open(dir.path(), SyncMode::None, 0).unwrap();
        // 1 KiB bodies: some sixty records to a run.
        let bodies = (0..500u32).map(|i| Bytes::from(vec![i as u8; 1024]));
        let records = lay_out(Offset::START, 0, bodies.collect());
        let meta = Box::new(StreamMeta::new("s", "application/octet-stream"));
        let changes = vec![
            Change::PutStream(1, meta),
            Change::PutRecords(1, records.clone(), None),
        ];
        engine.commit(changes).await.unwrap();
        let keys = engine
            .keyspaces
            .records
            .prefix(codec::stream_key(1))
            .count();
        assert!((5..=20).contains(&keys), "500 records under {keys} keys");
        for (from, until) in [
            (0, 500),
            (1, 2),
            (63, 130),
            (250, 251),
            (499, 500),
            (100, 99),
        ] {
            let read = engine.read(1, from, until, usize::MAX).await.unwrap();
            assert_eq!(read, records[from as usize..until.max(from) as usize]);
        }
        let budgeted = engine.read(1, 10, 500, 3 * (1024 + 8)).await.unwrap();
        assert_eq!(budgeted, records[10..13], "the budget stops mid-run");
        drop(engine);
        let engine = FjallEngine::open(dir.path(), SyncMode::None, 0).unwrap();
        let recovered = engine.recover().unwrap();
        let end = recovered.streams[0].stored_end;
        assert_eq!(end, Some(crate::storage::StoredEnd::of(&records[499])));
        engine
            .commit(vec![Change::TrimRecords(1, 250)])
            .await
            .unwrap();
        wait_purged(&engine, 1, 150).await; // below the run that holds 250
        let kept = engine.read(1, 0, 500, usize::MAX).await.unwrap();
        assert_eq!(kept, records[250..], "a trim mid-run keeps the rest whole");
    }

    #[test]
    fn a_trim_inside_a_run_hides_its_head_and_the_trim_that_passes_it_deletes_it() {
        use crate::model::stream::StreamMeta;
        let dir = tempfile::tempdir().unwrap();
        let writer = bare_writer(dir.path());
        let records = lay_out(Offset::START, 0, vec![Bytes::from_static(b"x"); 6]);
        write(
            &writer,
            vec![batch(vec![
                Change::PutStream(1, Box::new(StreamMeta::new("s", "text/plain"))),
                Change::PutRecords(1, records[..3].to_vec(), None),
                Change::PutRecords(1, records[3..].to_vec(), None),
            ])],
        );
        write(&writer, vec![batch(vec![Change::TrimRecords(1, 4)])]);
        write(&writer, vec![purge(1)]);
        assert_eq!(stored(&writer.keyspaces, 1, 0, 3), 0, "the run below goes");
        assert_eq!(
            stored(&writer.keyspaces, 1, 3, 6),
            3,
            "the run across stays"
        );
        let floor = writer.trims.floor(1);
        let visible = FjallEngine::read_sync(
            &writer.keyspaces.records,
            &writer.files,
            &writer.trims,
            1,
            floor,
            6,
            usize::MAX,
        );
        assert_eq!(
            visible.unwrap(),
            records[4..],
            "but shows none below the trim"
        );
        write(&writer, vec![batch(vec![Change::TrimRecords(1, 6)])]);
        write(&writer, vec![purge(1)]);
        assert_eq!(stored(&writer.keyspaces, 1, 0, u64::MAX), 0);
        assert_eq!(stored_trim(&writer, 1), Some((6, 6)));
    }

    /// The staged body files in the engine's directory.
    fn body_files(dir: &Path) -> usize {
        std::fs::read_dir(dir.join("bodies")).unwrap().count()
    }

    async fn until(what: &str, condition: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !condition() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    fn large(fill: u8) -> Bytes {
        Bytes::from(vec![fill; STAGE_BYTES + 1])
    }

    async fn staged(engine: &FjallEngine, bodies: &[Bytes]) -> Staged {
        let bytes = bodies.iter().map(Bytes::len).sum();
        assert!(engine.stages(bytes));
        engine.stage(bodies.to_vec()).await.unwrap()
    }

    /// Creates stream 1 with `records`, their `bodies` staged.
    async fn stream_of_staged(engine: &FjallEngine, bodies: &[Bytes], records: &[Record]) {
        let staged = staged(engine, bodies).await;
        let meta = crate::model::stream::StreamMeta::new("s", "text/plain");
        engine
            .commit(vec![
                Change::PutStream(1, Box::new(meta)),
                Change::PutRecords(1, records.to_vec(), Some(staged)),
            ])
            .await
            .unwrap();
    }

    /// The largest stored record value of stream `id`.
    fn largest_value(engine: &FjallEngine, id: StreamId) -> usize {
        let stream = codec::record_key(id, 0)..=codec::record_key(id, u64::MAX);
        let records = engine.keyspaces.records.range(stream);
        records
            .map(|g| g.into_inner().unwrap().1.len())
            .max()
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn staged_bodies_are_stored_by_reference_and_read_back_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let bodies = vec![large(1), Bytes::from_static(b"small"), large(2)];
        let records = lay_out(Offset::START, 3, bodies.clone());
        {
            let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
            stream_of_staged(&engine, &bodies, &records).await;
            assert!(
                largest_value(&engine, 1) < 1024,
                "the commit stores where the bodies lie, not the bodies"
            );
            assert_eq!(engine.read(1, 0, 3, usize::MAX).await.unwrap(), records);
        }
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        assert_eq!(body_files(dir.path()), 1);
        assert_eq!(engine.read(1, 0, 3, usize::MAX).await.unwrap(), records);
        assert_eq!(
            engine.read(1, 1, 3, 10).await.unwrap(),
            records[1..2],
            "a read from the middle stops at its budget"
        );
        assert_eq!(
            engine.recover().unwrap().streams[0].stored_end,
            Some(crate::storage::StoredEnd::of(&records[2]))
        );
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_read_of_most_of_a_staged_file_maps_it_and_a_read_of_a_small_part_copies() {
        let dir = tempfile::tempdir().unwrap();
        let bodies = vec![large(1), large(2), large(3), large(4)];
        let records = lay_out(Offset::START, 4, bodies.clone());
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        stream_of_staged(&engine, &bodies, &records).await;
        // A mapping keeps the whole file on disk while a reader holds it, even once deleted.
        let part = engine.read(1, 1, 2, usize::MAX).await.unwrap();
        assert_eq!(part, records[1..2]);
        assert_eq!(body_files::mapped(dir.path()), 0, "a quarter of the file");
        let most = engine.read(1, 1, 4, usize::MAX).await.unwrap();
        assert_eq!(most, records[1..4]);
        assert_eq!(body_files::mapped(dir.path()), 1, "three quarters of it");
        drop(most);
        assert_eq!(body_files::mapped(dir.path()), 0);
    }

    #[tokio::test]
    async fn a_staged_file_no_commit_refers_to_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        {
            let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
            let refused = staged(&engine, &[large(1)]).await;
            assert_eq!(body_files(dir.path()), 1);
            drop(refused);
            assert_eq!(
                body_files(dir.path()),
                0,
                "a refused request's file goes at once"
            );
            // As if the server died after its commit went to the writer, before it was durable.
            staged(&engine, &[large(2)]).await.hand_over();
            assert_eq!(body_files(dir.path()), 1);
            // Bodies the records do not share (equal copies) are stored in the commit.
            let body = large(3);
            let file = staged(&engine, std::slice::from_ref(&body)).await;
            let copy = Bytes::copy_from_slice(&body);
            let records = lay_out(Offset::START, 3, vec![copy]);
            engine
                .commit(vec![Change::PutRecords(1, records.clone(), Some(file))])
                .await
                .unwrap();
            assert!(largest_value(&engine, 1) > STAGE_BYTES);
            until("the unused file is deleted", || body_files(dir.path()) == 1).await;
            assert_eq!(engine.read(1, 0, 1, usize::MAX).await.unwrap(), records);
        }
        let _engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        assert_eq!(
            body_files(dir.path()),
            0,
            "the file never committed goes at open"
        );
    }

    #[tokio::test]
    async fn trimming_past_a_staged_append_or_removing_its_stream_deletes_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        for id in [1, 2] {
            let first = vec![large(1), large(2)];
            let records = lay_out(Offset::START, 3, first.clone());
            let file = staged(&engine, &first).await;
            let second = vec![large(3)];
            let more = lay_out(records[1].next_offset(), 3, second.clone());
            let other = staged(&engine, &second).await;
            engine
                .commit(vec![
                    Change::PutRecords(id, records, Some(file)),
                    Change::PutRecords(id, more, Some(other)),
                ])
                .await
                .unwrap();
        }
        assert_eq!(body_files(dir.path()), 4);
        engine
            .commit(vec![Change::TrimRecords(1, 1)])
            .await
            .unwrap();
        until("the trim is purged", || engine.pending_trims() == 0).await;
        assert_eq!(
            body_files(dir.path()),
            4,
            "a trim inside an append keeps its file"
        );
        engine
            .commit(vec![Change::TrimRecords(1, 2)])
            .await
            .unwrap();
        until("the trimmed append's file is deleted", || {
            body_files(dir.path()) == 3
        })
        .await;
        let kept = engine.read(1, 0, 3, usize::MAX).await.unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].body, large(3));
        engine.commit(vec![Change::RemoveStream(2)]).await.unwrap();
        until("the removed stream's files are deleted", || {
            body_files(dir.path()) == 1
        })
        .await;
    }

    #[tokio::test]
    async fn a_staged_snapshot_replaced_or_removed_deletes_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        let put = |blob: &Bytes, staged: Option<Staged>| {
            engine.commit(vec![Change::PutSnapshot(5, blob.clone(), staged)])
        };
        let first = large(1);
        put(
            &first,
            Some(staged(&engine, std::slice::from_ref(&first)).await),
        )
        .await
        .unwrap();
        assert_eq!(engine.read_snapshot(5).await.unwrap(), Some(first));
        let second = large(2);
        let file = staged(&engine, std::slice::from_ref(&second)).await;
        put(&second, Some(file)).await.unwrap();
        until("the replaced snapshot's file is deleted", || {
            body_files(dir.path()) == 1
        })
        .await;
        assert_eq!(engine.read_snapshot(5).await.unwrap(), Some(second));
        let small = Bytes::from_static(b"{}");
        put(&small, None).await.unwrap();
        until("a file replaced by a held snapshot is deleted", || {
            body_files(dir.path()) == 0
        })
        .await;
        assert_eq!(engine.read_snapshot(5).await.unwrap(), Some(small));
        let third = large(3);
        let file = staged(&engine, std::slice::from_ref(&third)).await;
        put(&third, Some(file)).await.unwrap();
        drop(engine);
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        assert_eq!(engine.read_snapshot(5).await.unwrap(), Some(third));
        engine
            .commit(vec![Change::RemoveSnapshot(5)])
            .await
            .unwrap();
        until("a removed snapshot's file is deleted", || {
            body_files(dir.path()) == 0
        })
        .await;
        assert_eq!(engine.read_snapshot(5).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_body_file_lost_under_its_records_or_snapshot_is_an_error_not_a_gap() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        let first = vec![large(1)];
        let records = lay_out(Offset::START, 3, first.clone());
        let held = lay_out(records[0].next_offset(), 3, vec![Bytes::from_static(b"x")]);
        let second = vec![large(2)];
        let last = lay_out(held[0].next_offset(), 3, second.clone());
        let (one, two) = (
            staged(&engine, &first).await,
            staged(&engine, &second).await,
        );
        let gone = dir
            .path()
            .join("bodies")
            .join(staged::file_name(two.number()));
        engine
            .commit(vec![
                Change::PutRecords(1, records.clone(), Some(one)),
                Change::PutRecords(1, held.clone(), None),
                Change::PutRecords(1, last, Some(two)),
            ])
            .await
            .unwrap();
        std::fs::remove_file(gone).unwrap();
        assert!(
            matches!(
                engine.read(1, 0, 3, usize::MAX).await,
                Err(StorageError::Corrupt(_))
            ),
            "records whose file is lost are an error, not passed off as trimmed"
        );

        let blob = large(3);
        let file = staged(&engine, std::slice::from_ref(&blob)).await;
        let lost = dir
            .path()
            .join("bodies")
            .join(staged::file_name(file.number()));
        engine
            .commit(vec![Change::PutSnapshot(2, blob, Some(file))])
            .await
            .unwrap();
        std::fs::remove_file(lost).unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), engine.read_snapshot(2));
        assert!(
            matches!(answer.await, Ok(Err(StorageError::Corrupt(_)))),
            "a snapshot whose file is lost is an error, at once"
        );
    }
}
