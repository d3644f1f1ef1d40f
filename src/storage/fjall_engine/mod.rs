//! The embedded on-disk engine, on fjall, with group commit.
//!
//! Every batch goes through one writer thread (`writer`): it gathers what has queued, writes it
//! all, syncs the journal once, and only then acknowledges each batch in the group. Under load,
//! many concurrent appends share one fsync. Trims are logically instant and physically lazy
//! (`trims`); writes are refused before the disk fills (`space`). This file holds the engine
//! itself: opening, reading and recovery.

mod backup;
mod body_files;
mod lock_holder;
#[cfg(all(test, target_os = "linux"))]
pub(crate) use body_files::mapped as mapped_body_files;
mod space;
mod submission;
mod time_index;
mod trims;
mod verify;
mod writer;

pub use backup::{BackupError, BackupSummary, check as check_backup, restore};
pub use verify::VerifySummary;

use std::path::{Path, PathBuf};
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
    /// Every keyspace with the name it is opened by, in a fixed order.
    fn named(&self) -> [(&'static str, &Keyspace); 11] {
        [
            ("streams", &self.streams),
            ("records", &self.records),
            ("producers", &self.producers),
            ("snapshots", &self.snapshots),
            ("buckets", &self.buckets),
            ("tokens", &self.tokens),
            ("system", &self.system),
            ("trims", &self.trims),
            ("record_files", &self.record_files),
            ("snapshot_files", &self.snapshot_files),
            ("times", &self.times),
        ]
    }

    fn open(dir: &Path) -> Result<Keyspaces, StorageError> {
        std::fs::create_dir_all(dir).map_err(io)?;
        let db = Database::builder(dir).open().map_err(|e| match e {
            fjall::Error::Locked => StorageError::Locked {
                holder: lock_holder::lock_holder(dir),
            },
            other => io(other),
        })?;
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

/// A data directory opened by a tool while no server has it: for a backup or a check, without
/// the writer, the purger or the clean-up of files at open, so that nothing is changed.
pub struct DataDir {
    keyspaces: Keyspaces,
    bodies: PathBuf,
}

impl DataDir {
    /// Opens the data directory `dir`, which must exist and hold a Runnel store (a missing
    /// one is not created).
    pub fn open(dir: &Path) -> Result<DataDir, StorageError> {
        let bodies = dir.join(body_files::DIRECTORY);
        if !bodies.is_dir() {
            let why = format!("{} holds no Runnel data directory", dir.display());
            return Err(StorageError::Io(why));
        }
        Ok(DataDir {
            keyspaces: Keyspaces::open(dir)?,
            bodies,
        })
    }

    /// As [`FjallEngine::backup`].
    pub fn backup(&self, out: &mut dyn std::io::Write) -> Result<BackupSummary, BackupError> {
        backup::write(&self.keyspaces, &self.bodies, None, out)
    }

    /// As [`FjallEngine::verify`].
    pub fn verify(&self, report: &mut dyn std::io::Write) -> std::io::Result<VerifySummary> {
        verify::check(&self.keyspaces, &self.bodies, report)
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

    /// Writes a backup of everything stored to `out`, consistent as of its start, while the
    /// engine goes on writing (see `backup`). Blocking.
    pub fn backup(&self, out: &mut dyn std::io::Write) -> Result<BackupSummary, BackupError> {
        let paused = self.files.pause_deletions();
        backup::write(&self.keyspaces, self.files.dir(), Some(paused), out)
    }

    /// Checks everything stored (see `verify`), a line per problem to `report`. Blocking.
    pub fn verify(&self, report: &mut dyn std::io::Write) -> std::io::Result<VerifySummary> {
        verify::check(&self.keyspaces, self.files.dir(), report)
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
mod tests;
