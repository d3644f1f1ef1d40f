//! The embedded on-disk engine, on fjall, with group commit.
//!
//! Every batch goes through one writer thread. It takes whatever has queued since its last sync,
//! writes it all, syncs the journal once, and only then acknowledges each batch in the group.
//! Under load, many concurrent appends share one fsync.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use bytes::Bytes;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::codec::{self, decode_record, encode_record};
use super::{ByteBudget, Change, Engine, Recovered, RecoveredStream, StorageError, StreamId};
use crate::model::Record;

/// Whether an acknowledged batch is synced to stable storage first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// fsync before acknowledging: an acknowledged write survives power loss.
    Fsync,
    /// Acknowledge once written to the OS: survives a process crash, not a power loss.
    None,
}

/// The most batches one sync may cover; bounds the latency of the first batch in a group.
const MAX_GROUP: usize = 4096;

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
}

pub struct FjallEngine {
    keyspaces: Keyspaces,
    queue: mpsc::Sender<Submission>,
    failed: Arc<AtomicBool>,
    stats: Arc<CommitStats>,
    space: Arc<FreeSpace>,
}

/// How often free disk space is measured.
const SPACE_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// Free space on the data directory's file system, measured in the background, against the
/// reserve below which writes are refused. Refusing early keeps the engine from ever meeting a
/// full disk mid-write (which would poison it until a restart); deleting data or freeing space
/// elsewhere lets writes through again on the next measurement.
struct FreeSpace {
    reserve: u64,
    has_room: AtomicBool,
}

impl FreeSpace {
    fn watch(dir: &Path, reserve: u64) -> Arc<FreeSpace> {
        let space = Arc::new(FreeSpace {
            reserve,
            has_room: AtomicBool::new(true),
        });
        if reserve == 0 {
            return space;
        }
        space.measure(dir);
        let (weak, dir) = (Arc::downgrade(&space), dir.to_path_buf());
        let _ = std::thread::Builder::new()
            .name("runnel-free-space".into())
            .spawn(move || {
                while let Some(space) = weak.upgrade() {
                    space.measure(&dir);
                    drop(space);
                    std::thread::sleep(SPACE_CHECK_INTERVAL);
                }
            });
        space
    }

    fn measure(&self, dir: &Path) {
        let Ok(stats) = rustix::fs::statvfs(dir) else {
            return;
        };
        let free = stats.f_bavail.saturating_mul(stats.f_frsize);
        let had = self.has_room.swap(free >= self.reserve, Ordering::AcqRel);
        if had && free < self.reserve {
            tracing::error!(
                free,
                reserve = self.reserve,
                "disk nearly full; refusing writes until space returns"
            );
        } else if !had && free >= self.reserve {
            tracing::info!(free, "disk space is back; accepting writes again");
        }
    }
}

/// Counters of the group commit: how many batches were written in how many synced groups.
#[derive(Debug, Default)]
pub struct CommitStats {
    pub batches: AtomicU64,
    pub groups: AtomicU64,
}

struct Submission {
    changes: Vec<Change>,
    done: oneshot::Sender<Result<(), StorageError>>,
}

const NEXT_ID_KEY: &[u8] = b"next_id";

/// The stream-metadata keyspace's memtable size (fjall's default is 64 MiB). Every stream's
/// metadata is already in memory in the service, nothing reads this keyspace but recovery, and
/// it is written only on creates and metadata changes: a big memtable would only hold a second
/// in-memory copy of up to some 300k streams' metadata (about 110 MiB with the skiplist). fjall
/// fixes a keyspace's options when it creates it, so this applies to new data directories.
const STREAMS_MEMTABLE_BYTES: u64 = 16 << 20;

fn io(e: impl std::fmt::Display) -> StorageError {
    StorageError::Io(e.to_string())
}

impl FjallEngine {
    /// Opens (or creates) the store in `dir`. Writes are refused while the file system has
    /// less than `reserve` bytes free (0: never).
    pub fn open(dir: &Path, sync: SyncMode, reserve: u64) -> Result<Self, StorageError> {
        std::fs::create_dir_all(dir).map_err(io)?;
        let db = Database::builder(dir).open().map_err(io)?;
        let open = |name: &str| {
            db.keyspace(name, KeyspaceCreateOptions::default)
                .map_err(io)
        };
        let keyspaces = Keyspaces {
            streams: db
                .keyspace("streams", || {
                    KeyspaceCreateOptions::default().max_memtable_size(STREAMS_MEMTABLE_BYTES)
                })
                .map_err(io)?,
            records: open("records")?,
            producers: open("producers")?,
            snapshots: open("snapshots")?,
            buckets: open("buckets")?,
            tokens: open("tokens")?,
            system: open("system")?,
            db,
        };
        let (queue, incoming) = mpsc::channel();
        let failed = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(CommitStats::default());
        let writer = Writer {
            keyspaces: keyspaces.clone(),
            sync,
            failed: failed.clone(),
            stats: stats.clone(),
        };
        std::thread::Builder::new()
            .name("runnel-writer".into())
            .spawn(move || writer.run(incoming))
            .map_err(io)?;
        Ok(FjallEngine {
            keyspaces,
            queue,
            failed,
            stats,
            space: FreeSpace::watch(dir, reserve),
        })
    }

    pub fn stats(&self) -> &CommitStats {
        &self.stats
    }

    fn read_sync(
        records: &Keyspace,
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
        for guard in records.range(codec::record_key(id, from)..codec::record_key(id, until)) {
            if !budget.has_room() {
                break;
            }
            let (key, value) = guard.into_inner().map_err(io)?;
            let (_, seq) = codec::split_key(&key)?;
            let seq = u64::from_be_bytes(
                seq.try_into()
                    .map_err(|_| StorageError::Corrupt("record key length".into()))?,
            );
            let record = decode_record(seq, Bytes::copy_from_slice(&value))?;
            budget.spend(&record);
            out.push(record);
        }
        Ok(out)
    }
}

impl Engine for FjallEngine {
    fn commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        let (done, result) = oneshot::channel();
        if self.failed.load(Ordering::Acquire)
            || self.queue.send(Submission { changes, done }).is_err()
        {
            return futures::future::ready(Err(StorageError::Failed)).boxed();
        }
        async move { result.await.unwrap_or(Err(StorageError::Failed)) }.boxed()
    }

    fn read(
        &self,
        id: StreamId,
        from: u64,
        until: u64,
        max_bytes: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StorageError>> {
        let records = self.keyspaces.records.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                Self::read_sync(&records, id, from, until, max_bytes)
            })
            .await
            .map_err(io)?
        }
        .boxed()
    }

    fn read_snapshot(
        &self,
        id: StreamId,
    ) -> BoxFuture<'static, Result<Option<Bytes>, StorageError>> {
        let snapshots = self.keyspaces.snapshots.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let blob = snapshots.get(codec::stream_key(id)).map_err(io)?;
                Ok(blob.map(|b| Bytes::copy_from_slice(&b)))
            })
            .await
            .map_err(io)?
        }
        .boxed()
    }

    fn room(&self) -> Result<(), StorageError> {
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
                let state = serde_json::from_slice(&value).map_err(|e| {
                    StorageError::Corrupt(format!("producer {name} of stream {id}: {e}"))
                })?;
                producers.push((name, state));
            }
            let last_record = match ks.records.prefix(codec::stream_key(id)).next_back() {
                Some(guard) => {
                    let (key, value) = guard.into_inner().map_err(io)?;
                    let (_, seq) = codec::split_key(&key)?;
                    let seq = u64::from_be_bytes(
                        seq.try_into()
                            .map_err(|_| StorageError::Corrupt("record key length".into()))?,
                    );
                    Some(decode_record(seq, Bytes::copy_from_slice(&value))?)
                }
                None => None,
            };
            next_stream_id = next_stream_id.max(id.saturating_add(1));
            each(RecoveredStream {
                id,
                meta,
                producers,
                last_record,
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

struct Writer {
    keyspaces: Keyspaces,
    sync: SyncMode,
    failed: Arc<AtomicBool>,
    stats: Arc<CommitStats>,
}

impl Writer {
    fn run(self, incoming: mpsc::Receiver<Submission>) {
        let mut next_id = self.stored_next_id();
        while let Ok(first) = incoming.recv() {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match incoming.try_recv() {
                    Ok(more) => group.push(more),
                    Err(_) => break,
                }
            }
            let result = if self.failed.load(Ordering::Acquire) {
                Err(StorageError::Failed)
            } else {
                self.write_group(&group, &mut next_id)
            };
            self.stats.groups.fetch_add(1, Ordering::Relaxed);
            metrics::histogram!("runnel_commit_group_appends").record(group.len() as f64);
            if result.is_err() {
                metrics::counter!("runnel_commit_failures_total").increment(1);
            }
            self.stats
                .batches
                .fetch_add(group.len() as u64, Ordering::Relaxed);
            if let Err(e) = &result {
                tracing::error!(error = %e, "storage write failed; refusing further writes");
                self.failed.store(true, Ordering::Release);
            }
            for submission in group {
                let _ = submission.done.send(result.clone());
            }
        }
    }

    fn stored_next_id(&self) -> u64 {
        self.keyspaces
            .system
            .get(NEXT_ID_KEY)
            .ok()
            .flatten()
            .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(0)
    }

    /// Writes every submission of the group, then syncs once.
    fn write_group(&self, group: &[Submission], next_id: &mut u64) -> Result<(), StorageError> {
        let ks = &self.keyspaces;
        let mut batch = ks.db.batch();
        for change in group.iter().flat_map(|s| &s.changes) {
            match change {
                Change::PutStream(id, meta) => {
                    let value = serde_json::to_vec(meta).map_err(io)?;
                    batch.insert(&ks.streams, codec::stream_key(*id), value);
                    if *id >= *next_id {
                        *next_id = id + 1;
                        batch.insert(&ks.system, NEXT_ID_KEY, next_id.to_be_bytes());
                    }
                }
                Change::PutRecords(id, records) => {
                    for record in records {
                        batch.insert(
                            &ks.records,
                            codec::record_key(*id, record.seq),
                            encode_record(record),
                        );
                    }
                }
                Change::PutProducer(id, name, state) => {
                    let value = serde_json::to_vec(state).map_err(io)?;
                    batch.insert(&ks.producers, codec::producer_key(*id, name), value);
                }
                Change::RemoveStream(id) => {
                    // Range scans see only committed data, so commit what came before first:
                    // records added earlier in this group are then found and removed too.
                    std::mem::replace(&mut batch, ks.db.batch())
                        .commit()
                        .map_err(io)?;
                    batch.remove(&ks.streams, codec::stream_key(*id));
                    batch.remove(&ks.snapshots, codec::stream_key(*id));
                    for keyspace in [&ks.records, &ks.producers] {
                        for guard in keyspace.prefix(codec::stream_key(*id)) {
                            batch.remove(keyspace, guard.key().map_err(io)?);
                        }
                    }
                }
                Change::TrimRecords(id, before) => {
                    std::mem::replace(&mut batch, ks.db.batch())
                        .commit()
                        .map_err(io)?;
                    let range = codec::record_key(*id, 0)..codec::record_key(*id, *before);
                    for guard in ks.records.range(range) {
                        batch.remove(&ks.records, guard.key().map_err(io)?);
                    }
                }
                Change::PutSnapshot(id, blob) => {
                    batch.insert(&ks.snapshots, codec::stream_key(*id), blob.as_ref());
                }
                Change::RemoveSnapshot(id) => {
                    batch.remove(&ks.snapshots, codec::stream_key(*id));
                }
                Change::PutBucket(name, meta) => {
                    let value = serde_json::to_vec(meta).map_err(io)?;
                    batch.insert(&ks.buckets, name.as_bytes(), value);
                }
                Change::RemoveBucket(name) => {
                    batch.remove(&ks.buckets, name.as_bytes());
                }
                Change::PutToken(token) => {
                    let value = serde_json::to_vec(token).map_err(io)?;
                    batch.insert(&ks.tokens, token.id.as_bytes(), value);
                }
                Change::RemoveToken(id) => {
                    batch.remove(&ks.tokens, id.as_bytes());
                }
            }
        }
        let durability = match self.sync {
            SyncMode::Fsync => Some(PersistMode::SyncAll),
            SyncMode::None => None,
        };
        let started = std::time::Instant::now();
        let committed = batch.durability(durability).commit().map_err(io);
        metrics::histogram!("runnel_commit_seconds").record(started.elapsed().as_secs_f64());
        committed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Offset;
    use crate::model::record::lay_out;

    #[tokio::test]
    async fn concurrent_batches_share_one_sync() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        let commits: Vec<_> = (0..200u64)
            .map(|i| {
                let records = lay_out(Offset::new(i, i), 0, vec![Bytes::from_static(b"x")]);
                engine.commit(vec![Change::PutRecords(1, records)])
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
}
