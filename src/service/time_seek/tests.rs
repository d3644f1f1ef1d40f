//! Starting a read at a timestamp: the answer, and what it costs in storage reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::model::Record;
use crate::service::s2::RecordStart;
use crate::service::tests::Wrapping;
use crate::service::{S2Append, S2Record, ServiceConfig, StreamService};
use crate::storage::{Engine, FjallEngine, StorageError, StreamId, SyncMode};

/// A fjall engine that counts the record reads made through it.
struct CountingReads {
    inner: FjallEngine,
    reads: AtomicUsize,
}

impl Wrapping for CountingReads {
    fn inner(&self) -> &dyn Engine {
        &self.inner
    }

    fn on_read(
        &self,
        id: StreamId,
        from: u64,
        until: u64,
        max: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StorageError>> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read(id, from, until, max)
    }
}

const APPENDS: u64 = 400;
const PER_APPEND: u64 = 25;

/// Append `i` holds records `25 i .. 25 i + 25`, timestamped `1000 i + j`.
fn timestamp_of(seq: u64) -> u64 {
    1000 * (seq / PER_APPEND) + seq % PER_APPEND
}

#[tokio::test]
async fn a_read_at_a_timestamp_starts_after_one_index_lookup_and_one_read() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let engine = CountingReads {
            inner: FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap(),
            reads: AtomicUsize::new(0),
        };
        let engine = Arc::new(engine);
        let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
        (engine, service)
    };
    {
        let (_, service) = open();
        service.create_bucket("clock", None, None).await.unwrap();
        let config = serde_json::json!({
            "timestamping": {"mode": "client-require", "uncapped": true}
        });
        service
            .create_in_bucket("clock", "s", Some(config), None)
            .await
            .unwrap();
        let stream = service.find("/clock/s", false).await.unwrap();
        for i in 0..APPENDS {
            let records = (0..PER_APPEND)
                .map(|j| S2Record {
                    timestamp: Some(timestamp_of(i * PER_APPEND + j)),
                    headers: Vec::new(),
                    body: Bytes::from_static(b"tick"),
                })
                .collect();
            let append = S2Append {
                records,
                match_seq_num: None,
                fencing_token: None,
            };
            service
                .append_records(&stream, append.check().unwrap(), None)
                .await
                .unwrap();
        }
    }
    // After a restart the tail cache is empty: every record read goes to storage.
    let (engine, service) = open();
    let stream = service.find("/clock/s", false).await.unwrap();
    let tail = APPENDS * PER_APPEND;
    let cases = [
        (0, 0),
        (timestamp_of(5), 5),
        (timestamp_of(4_321), 4_321),
        // Between two appends: the next append's first record.
        (timestamp_of(4_324) + 1, 4_325),
        (timestamp_of(tail - 1), tail - 1),
    ];
    for (timestamp, expected) in cases {
        engine.reads.store(0, Ordering::Relaxed);
        let start = service
            .resolve_start(&stream, RecordStart::Timestamp(timestamp), false)
            .await
            .unwrap();
        assert_eq!(start, expected, "the first record at or after {timestamp}");
        let reads = engine.reads.load(Ordering::Relaxed);
        // A bisection of 10,000 records takes 14.
        assert!(reads <= 1, "{reads} storage reads to start at {timestamp}");
    }
}
