//! An engine that keeps everything in memory: for tests and `--memory`. Nothing survives a restart.

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::Bytes;
use futures::future::{self, BoxFuture};

use super::{
    ByteBudget, Change, Engine, Recovered, RecoveredStream, StorageError, StoredEnd, StreamId,
};
use crate::model::Record;
use crate::model::access::TokenRecord;
use crate::model::producer::ProducerState;
use crate::model::stream::{BucketMeta, StreamMeta};

#[derive(Default)]
pub struct MemoryEngine {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    streams: BTreeMap<StreamId, StreamMeta>,
    records: BTreeMap<(StreamId, u64), Record>,
    producers: BTreeMap<(StreamId, String), ProducerState>,
    snapshots: BTreeMap<StreamId, Bytes>,
    buckets: BTreeMap<String, BucketMeta>,
    tokens: BTreeMap<String, TokenRecord>,
    next_id: StreamId,
}

impl MemoryEngine {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain maps behind, still consistent per change.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Engine for MemoryEngine {
    fn commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        let mut state = self.lock();
        for change in changes {
            match change {
                Change::PutStream(id, meta) => {
                    state.next_id = state.next_id.max(id + 1);
                    state.streams.insert(id, *meta);
                }
                Change::PutRecords(id, records, _) => {
                    for record in records {
                        state.records.insert((id, record.seq), record);
                    }
                }
                Change::PutProducer(id, producer, value) => {
                    state.producers.insert((id, producer), value);
                }
                Change::RemoveStream(id) => {
                    state.streams.remove(&id);
                    state.records.retain(|(stream, _), _| *stream != id);
                    state.producers.retain(|(stream, _), _| *stream != id);
                    state.snapshots.remove(&id);
                }
                Change::TrimRecords(id, before) => {
                    // Only this stream's trimmed records, not a pass over every stream's.
                    let trimmed: Vec<_> = state
                        .records
                        .range((id, 0)..(id, before))
                        .map(|(key, _)| *key)
                        .collect();
                    for key in trimmed {
                        state.records.remove(&key);
                    }
                }
                Change::PutSnapshot(id, blob, _) => {
                    state.snapshots.insert(id, blob);
                }
                Change::RemoveSnapshot(id) => {
                    state.snapshots.remove(&id);
                }
                Change::PutBucket(name, meta) => {
                    state.buckets.insert(name, meta);
                }
                Change::RemoveBucket(name) => {
                    state.buckets.remove(&name);
                }
                Change::PutToken(token) => {
                    state.tokens.insert(token.id.clone(), token);
                }
                Change::RemoveToken(id) => {
                    state.tokens.remove(&id);
                }
            }
        }
        Box::pin(future::ready(Ok(())))
    }

    fn read(
        &self,
        id: StreamId,
        from: u64,
        until: u64,
        max_bytes: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StorageError>> {
        let state = self.lock();
        let mut records = Vec::new();
        let mut budget = ByteBudget::new(max_bytes);
        for (_, record) in state.records.range((id, from)..(id, until.max(from))) {
            if !budget.take(record) {
                break;
            }
            records.push(record.clone());
        }
        Box::pin(future::ready(Ok(records)))
    }

    fn read_snapshot(
        &self,
        id: StreamId,
    ) -> BoxFuture<'static, Result<Option<Bytes>, StorageError>> {
        let blob = self.lock().snapshots.get(&id).cloned();
        Box::pin(future::ready(Ok(blob)))
    }

    fn recover(&self) -> Result<Recovered, StorageError> {
        let state = self.lock();
        let streams = state
            .streams
            .iter()
            .map(|(&id, meta)| RecoveredStream {
                id,
                meta: meta.clone(),
                producers: state
                    .producers
                    .range((id, String::new())..)
                    .take_while(|((stream, _), _)| *stream == id)
                    .map(|((_, name), value)| (name.clone(), value.clone()))
                    .collect(),
                stored_end: state
                    .records
                    .range((id, 0)..=(id, u64::MAX))
                    .next_back()
                    .map(|(_, r)| StoredEnd::of(r)),
                // Trims delete at once here: what is below the first record held is gone.
                trimmed_before: state
                    .records
                    .range((id, 0)..=(id, u64::MAX))
                    .next()
                    .map_or(u64::MAX, |(&(_, seq), _)| seq),
            })
            .collect();
        let buckets = state
            .buckets
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(Recovered {
            streams,
            buckets,
            tokens: state.tokens.values().cloned().collect(),
            next_id: state.next_id,
        })
    }
}
