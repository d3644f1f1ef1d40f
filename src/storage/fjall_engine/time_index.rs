//! The timestamp index: where a read that starts at a timestamp begins, in one lookup.
//!
//! Timestamps never decrease along a stream, so a sparse index is enough: an entry names a
//! record by `(stream, timestamp, seq)` (its value is empty), and the writer adds one when a
//! stream's appends reach a later step of [`STEP_MS`] than it last indexed. Between two
//! neighbouring entries lie the records of at most one step's appends, however long the stream.
//! Entries go with the records they name (trims and removals purge them together). Data written
//! before the index existed has no entries: a lookup there finds no bounds, and the reader
//! searches as it did before.

use std::collections::HashMap;
use std::sync::Mutex;

use fjall::{Keyspace, OwnedWriteBatch};

use super::io;
use crate::model::Record;
use crate::storage::{StorageError, StreamId, TimeBounds};

/// The most time one stretch between neighbouring entries covers, in timestamp milliseconds.
/// Each entry is one key in the commit of an append; a stream appended to at 25,000 appends per
/// second gets one per 100 ms, not one per append.
pub const STEP_MS: u64 = 100;

/// Streams whose last indexed step the writer remembers. Past this many it forgets them all:
/// a stream it forgot gets an entry for its next append, which is harmless (an extra entry
/// only narrows a stretch).
const REMEMBERED: usize = 65_536;

/// The writer's side: which step each recently written stream was last indexed at.
#[derive(Default)]
pub(super) struct TimeIndexer {
    indexed_step: Mutex<HashMap<StreamId, u64>>,
}

impl TimeIndexer {
    /// Adds the entry of `first` (the first record of an append to stream `id`) to `batch`
    /// when the stream's last indexed step is earlier than `first`'s.
    pub(super) fn note(
        &self,
        batch: &mut OwnedWriteBatch,
        times: &Keyspace,
        id: StreamId,
        first: &Record,
    ) {
        let timestamp = timestamp_of(first);
        let step = timestamp / STEP_MS;
        let mut indexed = self
            .indexed_step
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if indexed.get(&id).is_some_and(|&last| last >= step) {
            return;
        }
        if indexed.len() >= REMEMBERED {
            indexed.clear();
        }
        indexed.insert(id, step);
        batch.insert(times, key(id, timestamp, first.seq), []);
    }
}

/// Adds to `batch` the deletion of stream `id`'s entries that name records below `seq` (they
/// were purged), at most `limit` of them; returns how many.
pub(super) fn purge_below(
    batch: &mut OwnedWriteBatch,
    times: &Keyspace,
    id: StreamId,
    seq: u64,
    limit: usize,
) -> Result<usize, StorageError> {
    let mut deleted = 0;
    for guard in times.prefix(id.to_be_bytes()).take(limit) {
        let key = guard.key().map_err(io)?;
        if seq_of(&key)? >= seq {
            break;
        }
        batch.remove(times, key);
        deleted += 1;
    }
    Ok(deleted)
}

/// Where stream `id`'s first record with a timestamp at or after `timestamp` lies, by the
/// entries on either side of it.
pub(super) fn bounds(
    times: &Keyspace,
    id: StreamId,
    timestamp: u64,
) -> Result<TimeBounds, StorageError> {
    let before = key(id, 0, 0)..key(id, timestamp, 0);
    let after = key(id, timestamp, 0)..=key(id, u64::MAX, u64::MAX);
    let earlier = match times.range(before).next_back() {
        Some(guard) => Some(seq_of(&guard.key().map_err(io)?)?),
        None => None,
    };
    let at_most = match times.range(after).next() {
        Some(guard) => Some(seq_of(&guard.key().map_err(io)?)?),
        None => None,
    };
    Ok(TimeBounds { earlier, at_most })
}

/// A record's timestamp as the index orders it (timestamps before 1970 count as 0).
fn timestamp_of(record: &Record) -> u64 {
    u64::try_from(record.timestamp_ms).unwrap_or(0)
}

fn key(id: StreamId, timestamp: u64, seq: u64) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..8].copy_from_slice(&id.to_be_bytes());
    key[8..16].copy_from_slice(&timestamp.to_be_bytes());
    key[16..].copy_from_slice(&seq.to_be_bytes());
    key
}

fn seq_of(key: &[u8]) -> Result<u64, StorageError> {
    let seq: [u8; 8] = key
        .get(16..24)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| StorageError::Corrupt(format!("time index key of {} bytes", key.len())))?;
    Ok(u64::from_be_bytes(seq))
}

#[cfg(test)]
mod tests;
