//! The writer thread: group commit. It takes whatever has queued since its last sync (waiting a
//! little when concurrent writers are still arriving), writes it all, syncs the journal once, and
//! only then acknowledges each batch in the group.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

use fjall::PersistMode;

use super::body_files::{self, BodyFiles, SnapshotFile};
use super::submission::Submission;
use super::time_index::{self, TimeIndexer};
use super::trims::{PURGE_CHUNK, Trim, Trims};
use super::{CommitStats, Keyspaces, NEXT_ID_KEY, SyncMode, io};
use crate::model::Record;
use crate::storage::codec;
use crate::storage::{Change, Staged, StorageError, StreamId};

/// The most batches one sync may cover; bounds the latency of the first batch in a group.
const MAX_GROUP: usize = 4096;

/// Takes what is already queued, up to the group limit.
fn take_queued(incoming: &mpsc::Receiver<Submission>, group: &mut Vec<Submission>) {
    while group.len() < MAX_GROUP {
        match incoming.try_recv() {
            Ok(more) => group.push(more),
            Err(_) => break,
        }
    }
}

/// How long a group waits for more submissions once recent groups showed concurrency.
///
/// Committing only what is already queued forms tiny groups when the HTTP workers and the writer
/// share a busy core: the workers cannot queue more while the writer runs, so at 500 concurrent
/// writers each fsync covered about 5 appends, and the fsyncs themselves ate the core. Waiting in
/// short steps while submissions keep arriving lets a group grow to what the load offers.
///
/// A group smaller than a quarter of the recent peak waits, and a quiet step does not end the
/// wait until it reaches that quarter. Writers acknowledged by a large group come back, but only
/// once the HTTP workers have sent all those acknowledgements: committing the first stragglers at
/// once cost a run of one-append fsyncs after every large group (groups of 21 on average at 500
/// writers, 41 with the wait). The peak decays by an eighth per group rather than being the last
/// group only: one small group must not turn waiting off, or the stragglers after it commit one
/// by one (a third of all groups held a single append at 100 writers).
///
/// A group already as large as expected commits at once: its writers gathered while the last
/// group was being synced. A wait that did not grow the group by half backs off (the load has
/// fewer writers than the peak suggests): the next 1, 2, 4 … 64 groups commit at once, and a
/// fruitful wait resets that.
#[derive(Default)]
struct Linger {
    /// The largest recent group, decaying by an eighth per group.
    peak: usize,
    /// Groups still to commit without waiting.
    skip: u32,
    /// The skip after the next fruitless wait.
    backoff: u32,
}

/// One wait; a step that brings no submission ends the gathering once the group is as large as
/// expected.
const LINGER_STEP: std::time::Duration = std::time::Duration::from_micros(100);
/// The longest a group gathers, which bounds the latency the wait adds.
const LINGER_MAX: std::time::Duration = std::time::Duration::from_millis(2);
/// The most groups a fruitless wait makes commit at once.
const LINGER_MAX_BACKOFF: u32 = 64;

impl Linger {
    fn gather(&mut self, incoming: &mpsc::Receiver<Submission>, group: &mut Vec<Submission>) {
        let expected = self.expected();
        if group.len() >= expected {
            return;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return;
        }
        let before = group.len();
        let started = std::time::Instant::now();
        while group.len() < MAX_GROUP && started.elapsed() < LINGER_MAX {
            std::thread::sleep(LINGER_STEP);
            let had = group.len();
            take_queued(incoming, group);
            if group.len() == had && group.len() >= expected {
                break;
            }
        }
        self.judge(before, group.len());
    }

    /// Backs off after a wait that did not grow the group by half.
    fn judge(&mut self, before: usize, after: usize) {
        if (after - before) * 2 >= before {
            self.backoff = 0;
        } else {
            self.backoff = (self.backoff * 2).clamp(1, LINGER_MAX_BACKOFF);
            self.skip = self.backoff;
        }
    }

    /// The group size worth waiting for: a quarter of the recent peak. Below 2 (a peak under 8
    /// writers) no group waits.
    fn expected(&self) -> usize {
        (self.peak / 4).min(MAX_GROUP)
    }

    fn committed(&mut self, group: usize) {
        self.peak = group.max(self.peak - self.peak.div_ceil(8));
    }
}

pub(super) struct Writer {
    pub(super) keyspaces: Keyspaces,
    pub(super) sync: SyncMode,
    pub(super) failed: Arc<AtomicBool>,
    pub(super) stats: Arc<CommitStats>,
    pub(super) trims: Arc<Trims>,
    pub(super) files: Arc<BodyFiles>,
    pub(super) times: TimeIndexer,
    /// The runtime the appends wait in, when the engine was opened inside one: see `acknowledge`.
    pub(super) runtime: Option<tokio::runtime::Handle>,
}

/// What one group does to the staged body files.
#[derive(Default)]
struct GroupFiles {
    /// Files whose last reference this group deletes, or that nothing in it referred to.
    unreferenced: Vec<u64>,
    /// Staged files this group refers to.
    referred: HashSet<u64>,
    /// Each stream's snapshot file as this group leaves it so far (the keyspace shows only what
    /// is committed).
    snapshots: HashMap<StreamId, Option<u64>>,
}

impl Writer {
    pub(super) fn run(self, incoming: mpsc::Receiver<Submission>) {
        let mut next_id = self.stored_next_id();
        let mut linger = Linger::default();
        while let Ok(first) = incoming.recv() {
            let mut group = vec![first];
            take_queued(&incoming, &mut group);
            linger.gather(&incoming, &mut group);
            let mut written = 0;
            let outcome = if self.failed.load(Ordering::Acquire) {
                Err(StorageError::Failed)
            } else {
                self.write_group(&group, &mut next_id, &mut written)
            };
            let (result, unreferenced) = match outcome {
                Ok(unreferenced) => (Ok(()), unreferenced),
                Err(e) => {
                    // What a split commit wrote before the failure is acknowledged once it is
                    // synced, rather than failed while it may be on disk.
                    if written > 0
                        && let Err(error) = self.keyspaces.db.persist(self.persist_mode())
                    {
                        tracing::error!(%error, "syncing the part of a failed group already written failed");
                        written = 0;
                    }
                    (Err(e), Vec::new())
                }
            };
            linger.committed(group.len());
            // The purger's chunk rides in a group as a submission of its own: not an append.
            let appends = group.iter().filter(|s| s.purge.is_none()).count();
            self.stats.groups.fetch_add(1, Ordering::Relaxed);
            metrics::histogram!("runnel_commit_group_appends").record(appends as f64);
            if result.is_err() {
                metrics::counter!("runnel_commit_failures_total").increment(1);
            }
            self.stats
                .batches
                .fetch_add(appends as u64, Ordering::Relaxed);
            if let Err(e) = &result {
                tracing::error!(error = %e, acknowledged = written, "storage write failed; refusing further writes");
                self.failed.store(true, Ordering::Release);
            }
            self.acknowledge(group, result, written);
            self.files.delete(unreferenced);
        }
    }

    /// Tells every submission of a group how it ended: `result`, except that when the group
    /// failed, its first `written` submissions were committed and synced, and succeeded (a
    /// purge's own deletions come after every submission's changes, so it never counts).
    ///
    /// A task woken from this thread goes to the runtime's shared queue, which a worker busy with
    /// its own tasks looks at only every so often (about every 200 µs in tokio 1.x), taking one
    /// task each time: a group's acknowledgements trickled out while requests kept arriving. Sent
    /// from one task inside the runtime, they are woken onto a worker's own queue together. The
    /// purger waits on a thread of its own, so it is told from here.
    fn acknowledge(
        &self,
        group: Vec<Submission>,
        result: Result<(), StorageError>,
        written: usize,
    ) {
        let result_of = |index: usize, submission: &Submission| {
            if index < written && submission.purge.is_none() {
                Ok(())
            } else {
                result.clone()
            }
        };
        let Some(runtime) = &self.runtime else {
            for (index, submission) in group.into_iter().enumerate() {
                let result = result_of(index, &submission);
                let _ = submission.done.send(result);
            }
            return;
        };
        let mut tasks = Vec::with_capacity(group.len());
        for (index, submission) in group.into_iter().enumerate() {
            let result = result_of(index, &submission);
            match submission.purge {
                Some(_) => drop(submission.done.send(result)),
                None => tasks.push((submission.done, result)),
            }
        }
        if !tasks.is_empty() {
            drop(runtime.spawn(async move {
                for (done, result) in tasks {
                    let _ = done.send(result);
                }
            }));
        }
    }

    /// How far a commit goes: see [`SyncMode`].
    fn persist_mode(&self) -> PersistMode {
        match self.sync {
            SyncMode::Fsync => PersistMode::SyncAll,
            // Out of the journal's buffer and into the OS at every commit: a crash of Runnel loses
            // nothing acknowledged, a crash of the machine may.
            SyncMode::None => PersistMode::Buffer,
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

    /// Writes every submission of the group, then syncs once. Returns the staged body files
    /// nothing refers to once the group is committed, to be deleted.
    ///
    /// A stream removal, or a purge after a trim in the same group, needs what came before it
    /// committed first (range scans see only committed data), and so splits the group's commit.
    /// `written` is how many of the first submissions such a split has committed whole, should
    /// the group then fail other than in the journal. A submission whose removal is not its first
    /// change may be left half written by such a failure (none is built so: a mirror's rebuild
    /// puts its removal first).
    pub(super) fn write_group(
        &self,
        group: &[Submission],
        next_id: &mut u64,
        written: &mut usize,
    ) -> Result<Vec<u64>, StorageError> {
        let ks = &self.keyspaces;
        let mut batch = ks.db.batch();
        // Streams whose trim state goes once this batch is committed (see `purge_chunk`).
        let mut finished = Vec::new();
        let mut files = GroupFiles::default();
        let staged = group
            .iter()
            .flat_map(|s| &s.changes)
            .filter_map(|change| match change {
                Change::PutRecords(_, _, staged) | Change::PutSnapshot(_, _, staged) => {
                    staged.as_ref()
                }
                _ => None,
            });
        // Whatever happens from here, the engine decides these files' fate.
        for staged in staged.clone() {
            staged.hand_over();
        }
        let changes = group
            .iter()
            .enumerate()
            .flat_map(|(index, s)| s.changes.iter().map(move |change| (index, change)));
        for (index, change) in changes {
            match change {
                Change::PutStream(id, meta) => {
                    let value = serde_json::to_vec(meta).map_err(io)?;
                    batch.insert(&ks.streams, codec::stream_key(*id), value);
                    if *id >= *next_id {
                        *next_id = id + 1;
                        batch.insert(&ks.system, NEXT_ID_KEY, next_id.to_be_bytes());
                    }
                }
                Change::PutRecords(id, records, staged) => {
                    self.put_records(&mut batch, *id, records, staged.as_ref(), &mut files);
                }
                Change::PutProducer(id, name, state) => {
                    let value = codec::encode_producer(state);
                    batch.insert(&ks.producers, codec::producer_key(*id, name), value);
                }
                Change::RemoveStream(id) => {
                    // Range scans see only committed data, so commit what came before first:
                    // records and producer states written earlier in this group are then found.
                    std::mem::replace(&mut batch, ks.db.batch())
                        .commit()
                        .map_err(io)?;
                    *written = index;
                    batch.remove(&ks.streams, codec::stream_key(*id));
                    self.remove_snapshot(&mut batch, *id, &mut files)?;
                    for guard in ks.producers.prefix(codec::stream_key(*id)) {
                        batch.remove(&ks.producers, guard.key().map_err(io)?);
                    }
                    // Its records may linger until purged, but no read sees them any more.
                    for guard in ks.record_files.prefix(codec::stream_key(*id)) {
                        let (key, number) = guard.into_inner().map_err(io)?;
                        batch.remove(&ks.record_files, key);
                        files.unreferenced.push(body_files::decode_number(&number)?);
                    }
                    self.remove_records(*id, &mut batch, &mut finished)?;
                }
                Change::TrimRecords(id, before) => {
                    // Only the trim point is written here: reads stop showing the records below
                    // it at once, and the purger deletes them in chunks in later groups.
                    if let Some(trim) = self.trims.raise(*id, *before) {
                        batch.insert(&ks.trims, codec::stream_key(*id), trim.encode());
                    }
                }
                Change::PutSnapshot(id, blob, staged) => {
                    self.remove_snapshot(&mut batch, *id, &mut files)?;
                    let key = codec::stream_key(*id);
                    match staged.as_ref().filter(|s| s.holds_only(blob)) {
                        Some(staged) => {
                            let number = staged.number();
                            let len = blob.len() as u64;
                            let file = SnapshotFile { number, len };
                            batch.insert(&ks.snapshot_files, key, file.encode());
                            files.referred.insert(number);
                            files.snapshots.insert(*id, Some(number));
                        }
                        None => batch.insert(&ks.snapshots, key, blob.as_ref()),
                    }
                }
                Change::RemoveSnapshot(id) => {
                    self.remove_snapshot(&mut batch, *id, &mut files)?;
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
        let mut purged = 0;
        for id in group.iter().filter_map(|s| s.purge) {
            purged +=
                self.purge_chunk(id, group, &mut batch, &mut finished, &mut files, written)?;
        }
        self.stats
            .most_values_purged
            .fetch_max(purged, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let committed = batch
            .durability(Some(self.persist_mode()))
            .commit()
            .map_err(io);
        metrics::histogram!("runnel_commit_seconds").record(started.elapsed().as_secs_f64());
        if committed.is_err() {
            // The journal itself failed (a write or a sync): what an earlier split wrote is not
            // known to be on disk, whatever a sync after it says (Linux may report a second
            // fsync clean after dropping the pages the first failed on).
            *written = 0;
        }
        committed?;
        // Only now: until the deletions are committed, the floor is what hides the records.
        for id in finished {
            self.trims.forget(id);
        }
        let unused = staged
            .map(Staged::number)
            .filter(|n| !files.referred.contains(n));
        files.unreferenced.extend(unused);
        Ok(files.unreferenced)
    }

    /// Stores `records`; those whose bodies are among the staged ones, as references into the
    /// staged file, the rest with their bodies.
    fn put_records(
        &self,
        batch: &mut fjall::OwnedWriteBatch,
        id: StreamId,
        records: &[Record],
        staged: Option<&Staged>,
        files: &mut GroupFiles,
    ) {
        let ks = &self.keyspaces;
        if let Some(first) = records.first() {
            self.times.note(batch, &ks.times, id, first);
        }
        let Some(staged) = staged else {
            for run in codec::runs(records) {
                batch.insert(&ks.records, run.key(id), run.encode());
            }
            return;
        };
        let places: Vec<Option<u64>> = records.iter().map(|r| staged.place_of(&r.body)).collect();
        let mut last_filed = None;
        let mut at = 0;
        // Records in stretches that are all filed or all held.
        for stretch in places.chunk_by(|a, b| a.is_some() == b.is_some()) {
            let held = &records[at..at + stretch.len()];
            at += stretch.len();
            if stretch[0].is_none() {
                for run in codec::runs(held) {
                    batch.insert(&ks.records, run.key(id), run.encode());
                }
                continue;
            }
            let places: Vec<u64> = stretch.iter().flatten().copied().collect();
            let mut run_at = 0;
            for run in codec::filed_runs(held) {
                let count = run.records().len();
                let value = run.encode_filed(staged.number(), &places[run_at..run_at + count]);
                batch.insert(&ks.records, run.key(id), value);
                last_filed = Some(run.key(id));
                run_at += count;
            }
        }
        if let Some(key) = last_filed {
            let number = staged.number();
            batch.insert(&ks.record_files, key, body_files::encode_number(number));
            files.referred.insert(number);
        }
    }

    /// Removes stream `id`'s snapshot, and the reference to its file if it had one.
    fn remove_snapshot(
        &self,
        batch: &mut fjall::OwnedWriteBatch,
        id: StreamId,
        files: &mut GroupFiles,
    ) -> Result<(), StorageError> {
        let ks = &self.keyspaces;
        let key = codec::stream_key(id);
        let file = match files.snapshots.get(&id) {
            Some(file) => *file,
            None => match ks.snapshot_files.get(key).map_err(io)? {
                Some(value) => Some(SnapshotFile::decode(&value)?.number),
                None => None,
            },
        };
        batch.remove(&ks.snapshots, key);
        if let Some(number) = file {
            batch.remove(&ks.snapshot_files, key);
            files.unreferenced.push(number);
        }
        files.snapshots.insert(id, None);
        Ok(())
    }

    /// Deletes the records of removed stream `id`: at once when they fit in one purge chunk;
    /// otherwise they go as trimmed ones do, all trimmed in this commit (no read sees them from
    /// now on, nor after a restart) and deleted afterwards by the purger in bounded chunks, so
    /// a long stream's removal holds up no append sharing its group. Ids are never reused, and
    /// the trim state goes once the records are gone.
    fn remove_records(
        &self,
        id: StreamId,
        batch: &mut fjall::OwnedWriteBatch,
        finished: &mut Vec<StreamId>,
    ) -> Result<(), StorageError> {
        let ks = &self.keyspaces;
        // Records below the purged point are gone already: skip their tombstones.
        let purged = self.trims.get(id).map_or(0, |t| t.purged);
        let stored = codec::record_key(id, purged)..=codec::record_key(id, u64::MAX);
        let mut few = Vec::new();
        for guard in ks.records.range(stored).take(PURGE_CHUNK + 1) {
            few.push(guard.key().map_err(io)?);
        }
        let key = codec::stream_key(id);
        if few.len() <= PURGE_CHUNK {
            for record in few {
                batch.remove(&ks.records, record);
            }
            time_index::purge_below(batch, &ks.times, id, u64::MAX, PURGE_CHUNK)?;
            batch.remove(&ks.trims, key);
            // Kept at its full height in memory until the deletions are committed.
            let gone = Trim {
                before: u64::MAX,
                purged: u64::MAX,
            };
            self.trims.set(id, gone);
            finished.push(id);
        } else if let Some(trim) = self.trims.raise(id, u64::MAX) {
            batch.insert(&ks.trims, key, trim.encode());
        }
        Ok(())
    }

    /// Adds to `batch` the deletion of the next [`PURGE_CHUNK`] stored values (records, or runs
    /// of them) below stream `id`'s trim point, from where the last chunk stopped, and the trim
    /// state that records the progress. Returns how many values it deletes. When that finishes a stream that is gone, its id goes to
    /// `finished`: its state is to be forgotten once the batch is committed.
    fn purge_chunk(
        &self,
        id: StreamId,
        group: &[Submission],
        batch: &mut fjall::OwnedWriteBatch,
        finished: &mut Vec<StreamId>,
        files: &mut GroupFiles,
        written: &mut usize,
    ) -> Result<u64, StorageError> {
        let ks = &self.keyspaces;
        // Nothing left to delete: the state was dropped when the last chunk went.
        let Some(trim) = self.trims.get(id).filter(Trim::pending) else {
            return Ok(0);
        };
        // Range scans see only committed data. Records below the trim point can be in this
        // group only if a trim in this group moved the point past them (every record below an
        // earlier trim point was queued before that trim). Then commit the group so far, so the
        // scan finds them; every submission is still written whole.
        let uncommitted = group.iter().flat_map(|s| &s.changes).any(|change| {
            matches!(change, Change::PutRecords(of, records, _)
                if *of == id && records.first().is_some_and(|r| r.seq < trim.before))
        });
        if uncommitted {
            std::mem::replace(batch, ks.db.batch())
                .commit()
                .map_err(io)?;
            *written = group.len();
        }
        let mut next = trim.before;
        let mut deleted = 0;
        let trimmed = codec::record_key(id, trim.purged)..codec::record_key(id, trim.before);
        for guard in ks.records.range(trimmed) {
            let key = guard.key().map_err(io)?;
            if deleted == PURGE_CHUNK {
                next = codec::record_seq(&key)?;
                break;
            }
            batch.remove(&ks.records, key);
            deleted += 1;
        }
        time_index::purge_below(batch, &ks.times, id, next, PURGE_CHUNK)?;
        // The files whose last run goes in this chunk.
        let gone = codec::record_key(id, trim.purged)..codec::record_key(id, next);
        for guard in ks.record_files.range(gone) {
            let (key, number) = guard.into_inner().map_err(io)?;
            batch.remove(&ks.record_files, key);
            files.unreferenced.push(body_files::decode_number(&number)?);
        }
        let trim = Trim {
            purged: next,
            ..trim
        };
        let key = codec::stream_key(id);
        let removed_here = group
            .iter()
            .flat_map(|s| &s.changes)
            .any(|change| matches!(change, Change::RemoveStream(of) if *of == id));
        if !trim.pending() && (removed_here || !ks.streams.contains_key(key).map_err(io)?) {
            // The last chunk of a removed stream (or of a trim that came after its removal):
            // keep no state for a stream that is gone, or it would stay forever. In memory it
            // stays at its full height until the deletions are committed.
            self.trims.set(id, trim);
            finished.push(id);
            batch.remove(&ks.trims, key);
        } else {
            self.trims.set(id, trim);
            batch.insert(&ks.trims, key, trim.encode());
        }
        metrics::counter!("runnel_trim_deleted_values_total").increment(deleted as u64);
        Ok(deleted as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group_of(size: usize) -> Vec<Submission> {
        (0..size)
            .map(|_| Submission {
                changes: Vec::new(),
                done: tokio::sync::oneshot::channel().0,
                purge: None,
            })
            .collect()
    }

    /// How large a group of `size` is once `linger` has gathered for it from a queue where five
    /// more submissions already wait: what it took shows whether it waited, however slowly the
    /// test thread runs.
    fn gathered(linger: &mut Linger, size: usize) -> usize {
        let (queue, incoming) = mpsc::channel();
        for submission in group_of(5) {
            queue.send(submission).unwrap();
        }
        let mut group = group_of(size);
        linger.gather(&incoming, &mut group);
        group.len()
    }

    #[test]
    fn fruitless_waits_for_a_group_back_off_and_a_fruitful_one_resets() {
        let (_queue, incoming) = mpsc::channel::<Submission>();
        let mut linger = Linger::default();
        linger.committed(400);
        // Nothing else arrives: the wait was wasted, so the next group commits at once.
        linger.gather(&incoming, &mut group_of(1));
        assert_eq!((linger.skip, linger.backoff), (1, 1));
        linger.gather(&incoming, &mut group_of(1));
        assert_eq!(linger.skip, 0);
        // Each further wasted wait doubles the groups that skip waiting, up to a bound.
        for expected in [2, 4, 8, 16, 32, 64, 64] {
            linger.gather(&incoming, &mut group_of(1));
            assert_eq!(linger.backoff, expected);
            while linger.skip > 0 {
                linger.gather(&incoming, &mut group_of(1));
            }
        }
        // A wait that grows the group by half or more turns waiting back on.
        linger.judge(10, 15);
        assert_eq!((linger.skip, linger.backoff), (0, 0));
    }

    #[test]
    fn a_group_already_as_large_as_expected_commits_without_waiting() {
        let mut linger = Linger::default();
        linger.committed(8);
        // A wait would have taken the submissions queued meanwhile.
        assert_eq!(gathered(&mut linger, 2), 2);
        assert_eq!((linger.skip, linger.backoff), (0, 0));
    }

    #[test]
    fn small_groups_after_a_large_one_still_wait_for_the_stragglers() {
        let mut linger = Linger::default();
        linger.committed(100);
        linger.committed(1);
        linger.committed(1);
        assert_eq!(gathered(&mut linger, 1), 6);
    }

    #[test]
    fn the_expectation_decays_until_a_lone_writer_stops_waiting() {
        let mut linger = Linger::default();
        linger.committed(100);
        let groups = (1..)
            .take_while(|_| {
                linger.committed(1);
                linger.expected() > 1
            })
            .count();
        assert!((2..40).contains(&groups), "{groups} groups");
    }

    #[test]
    fn a_wait_outlasts_quiet_steps_until_a_quarter_of_the_recent_peak_arrives() {
        let (queue, incoming) = mpsc::channel::<Submission>();
        let mut linger = Linger::default();
        linger.committed(40);
        let late = std::thread::spawn(move || {
            std::thread::sleep(LINGER_STEP * 4);
            for submission in group_of(10) {
                queue.send(submission).unwrap();
            }
        });
        let mut group = group_of(1);
        let started = std::time::Instant::now();
        linger.gather(&incoming, &mut group);
        let waited = started.elapsed();
        late.join().unwrap();
        assert!(waited >= LINGER_STEP * 4, "quiet steps ended the wait");
        // On a loaded machine the stragglers may come after the bound; otherwise they joined.
        assert!(
            group.len() == 11 || waited >= LINGER_MAX,
            "{} in the group",
            group.len()
        );
    }

    #[test]
    fn a_wait_that_never_reaches_its_expectation_ends_at_the_bound_and_backs_off() {
        let (_queue, incoming) = mpsc::channel::<Submission>();
        let mut linger = Linger::default();
        linger.committed(40);
        let started = std::time::Instant::now();
        linger.gather(&incoming, &mut group_of(1));
        assert!(started.elapsed() >= LINGER_MAX);
        assert_eq!((linger.skip, linger.backoff), (1, 1));
    }

    #[test]
    fn a_lone_writer_never_waits() {
        let mut linger = Linger::default();
        linger.committed(1);
        assert_eq!(gathered(&mut linger, 1), 1);
        assert_eq!((linger.skip, linger.backoff), (0, 0));
    }
}
