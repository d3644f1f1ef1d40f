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
                    // Only this stream's keys, not a pass over every stream's under the lock.
                    let records: Vec<_> = state
                        .records
                        .range((id, 0)..=(id, u64::MAX))
                        .map(|(key, _)| *key)
                        .collect();
                    for key in records {
                        state.records.remove(&key);
                    }
                    let producers: Vec<_> = state
                        .producers
                        .range((id, String::new())..)
                        .take_while(|((stream, _), _)| *stream == id)
                        .map(|(key, _)| key.clone())
                        .collect();
                    for key in producers {
                        state.producers.remove(&key);
                    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Offset;
    use crate::model::record::lay_out;

    #[tokio::test]
    async fn removing_a_stream_removes_its_keys_and_no_other_streams() {
        let engine = MemoryEngine::new();
        for id in [1, 2, 3] {
            let records = lay_out(Offset::START, 0, vec![Bytes::from_static(b"x"); 3]);
            engine
                .commit(vec![
                    Change::PutStream(id, Box::new(StreamMeta::new("s", "text/plain"))),
                    Change::PutRecords(id, records, None),
                    Change::PutProducer(
                        id,
                        "p".into(),
                        ProducerState {
                            epoch: 0,
                            last_seq: 0,
                            records: (0, 3),
                            earlier: Vec::new(),
                        },
                    ),
                ])
                .await
                .unwrap();
        }
        engine.commit(vec![Change::RemoveStream(2)]).await.unwrap();
        let recovered = engine.recover().unwrap();
        let left: Vec<(StreamId, usize)> = recovered
            .streams
            .iter()
            .map(|s| (s.id, s.producers.len()))
            .collect();
        assert_eq!(left, [(1, 1), (3, 1)]);
        for (id, records) in [(1, 3), (2, 0), (3, 3)] {
            let read = engine.read(id, 0, u64::MAX, usize::MAX).await.unwrap();
            assert_eq!(read.len(), records, "stream {id}");
        }
    }
}
