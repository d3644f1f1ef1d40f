//! Trims: logically instant, purged in the background in bounded chunks.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Condvar, Mutex, MutexGuard, mpsc};

use fjall::Keyspace;
use tokio::sync::oneshot;

use super::io;
use super::submission::Submission;
use crate::storage::codec;
use crate::storage::{StorageError, StreamId};

/// The most stored values (a record, or a run of them) one group deletes. Deleting a key costs
/// about a microsecond or two in the writer, so a chunk adds a few milliseconds at most to the
/// appends sharing its group.
pub(super) const PURGE_CHUNK: usize = 2048;

/// Where each trimmed stream's trim stands, shared by the writer, readers and the purger.
///
/// A trim (`Change::TrimRecords`) only raises the stream's trim point, in memory and in the
/// `trims` keyspace, in the same batch as the rest of its commit: logically instant. Reads never
/// return records below the trim point, so the trim is complete for readers once committed, and
/// after a restart too (the point is stored). The records themselves are deleted afterwards by
/// the purger, [`PURGE_CHUNK`] keys at a time, from where the previous deletion stopped
/// (`purged`, stored beside the trim point) rather than from seq 0, so a long stream trimmed
/// again and again never rescans the tombstones of its earlier trims. Removing a stream trims
/// all of its records the same way; the state is dropped once the last chunk is deleted.
///
/// The writer raises the point in memory while it writes the group, just before the sync: a
/// read racing that commit may already miss the records, as it would have when they were deleted
/// in the commit itself (readers resolved after the trim is published never ask for them).
/// If the write fails, the engine refuses every write until a restart reloads the stored point.
///
/// Why a purger thread that submits chunks through the writer's queue, rather than deleting on
/// its own or inside the writer loop: every change to the trim state then goes through the one
/// writer, in queue order, so a purge can never race a new trim, a stream removal or a restart
/// (it reads the state the writer left, after every change queued before it). The purger sends
/// one chunk and waits for it before the next, so at most one chunk rides in any group, and
/// appends queued meanwhile commit in the same group: each waits for one chunk at most, never
/// for the whole trim. The group-commit loop itself stays as it was.
pub(super) struct Trims {
    pub(super) state: Mutex<TrimTable>,
    /// Signalled when there is new work or the engine closes.
    pub(super) wake: Condvar,
}

#[derive(Default)]
pub(super) struct TrimTable {
    /// Every trimmed stream's trim (a few dozen bytes each; read on every read of the stream).
    pub(super) streams: HashMap<StreamId, Trim>,
    /// The streams whose trimmed records are not all deleted yet, for the purger.
    pub(super) pending: BTreeSet<StreamId>,
    /// The engine is gone: the purger stops.
    pub(super) closed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Trim {
    /// Records with `seq < before` are trimmed: never read again.
    pub(super) before: u64,
    /// Stored values (records and runs, keyed by their last seq) with a key below `purged` are
    /// deleted too. Never above `before`; a run that reaches `before` stays whole, its records
    /// below `before` hidden like any trimmed ones until a later trim passes its end.
    pub(super) purged: u64,
}

impl Trim {
    pub(super) fn pending(&self) -> bool {
        self.purged < self.before
    }

    pub(super) fn encode(&self) -> [u8; 17] {
        codec::encode_trim(self.before, self.purged)
    }
}

impl TrimTable {
    /// Sets (or with `None` drops) stream `id`'s trim, keeping `pending` in step.
    fn put(&mut self, id: StreamId, trim: Option<Trim>) -> Option<Trim> {
        let old = match trim {
            Some(trim) => self.streams.insert(id, trim),
            None => self.streams.remove(&id),
        };
        if trim.is_some_and(|t| t.pending()) {
            self.pending.insert(id);
        } else {
            self.pending.remove(&id);
        }
        metrics::gauge!("runnel_trim_pending_streams").set(self.pending.len() as f64);
        old
    }
}

impl Trims {
    /// The trim states stored in `keyspace`: deletions a restart interrupted resume from them.
    pub(super) fn load(keyspace: &Keyspace) -> Result<Trims, StorageError> {
        let mut table = TrimTable::default();
        for guard in keyspace.iter() {
            let (key, value) = guard.into_inner().map_err(io)?;
            let (id, _) = codec::split_key(&key)?;
            let (before, purged) = codec::decode_trim(&value)?;
            let purged = purged.min(before);
            table.put(id, Some(Trim { before, purged }));
        }
        Ok(Trims {
            state: Mutex::new(table),
            wake: Condvar::new(),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, TrimTable> {
        // Every critical section leaves the table consistent: a poisoned one is still usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The first seq of stream `id` that reads may return.
    pub(super) fn floor(&self, id: StreamId) -> u64 {
        self.lock().streams.get(&id).map_or(0, |t| t.before)
    }

    pub(super) fn get(&self, id: StreamId) -> Option<Trim> {
        self.lock().streams.get(&id).copied()
    }

    /// Moves stream `id`'s trim point up to `before` (never down). Returns the new state if it
    /// moved, and wakes the purger.
    pub(super) fn raise(&self, id: StreamId, before: u64) -> Option<Trim> {
        let mut table = self.lock();
        let trim = table.streams.get(&id).copied().unwrap_or(Trim {
            before: 0,
            purged: 0,
        });
        if before <= trim.before {
            return None;
        }
        let trim = Trim { before, ..trim };
        table.put(id, Some(trim));
        drop(table);
        self.wake.notify_all();
        Some(trim)
    }

    pub(super) fn set(&self, id: StreamId, trim: Trim) {
        self.lock().put(id, Some(trim));
    }

    pub(super) fn forget(&self, id: StreamId) -> Option<Trim> {
        self.lock().put(id, None)
    }

    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_all();
    }

    /// The purger: while any stream has trimmed records left, asks the writer to delete the
    /// next chunk of one of them and waits for it. Runs until the engine closes or fails; an
    /// interrupted deletion resumes at the next start.
    pub(super) fn purge(&self, queue: mpsc::Sender<Submission>) {
        let mut last = None;
        loop {
            let id = {
                let mut table = self.lock();
                loop {
                    if table.closed {
                        return;
                    }
                    // Round robin, so a stream trimmed over and over delays no other stream's.
                    let after = last.map_or(0, |id: StreamId| id.saturating_add(1));
                    let next = table.pending.range(after..).next();
                    if let Some(&id) = next.or_else(|| table.pending.first()) {
                        last = Some(id);
                        break id;
                    }
                    table = self
                        .wake
                        .wait(table)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            };
            let (done, result) = oneshot::channel();
            let submission = Submission {
                changes: Vec::new(),
                done,
                purge: Some(id),
            };
            if queue.send(submission).is_err() {
                return;
            }
            match result.blocking_recv() {
                Ok(Ok(())) => {}
                // The writer refuses writes from now on; the work resumes at the next start.
                Ok(Err(_)) | Err(_) => return,
            }
        }
    }
}
