//! What an idle stream costs in the server's memory: heap bytes the stream service holds per
//! stream that was created and never written, right after creating it and after a restart.
//!
//! The storage engine here keeps nothing (so only the service's own memory is counted), and a
//! counting allocator measures the heap bytes live before and after. Bytes are as requested from
//! the allocator; malloc adds its own few bytes per allocation on top.
//!
//! This is a test binary of its own, not a module of `tests/it`: the counting allocator counts
//! every heap byte of the process, so a test running beside it in another thread would be
//! counted as the idle streams' cost.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use runnel::model::Record;
use runnel::model::stream::StreamMeta;
use runnel::service::{CreateRequest, ServiceConfig, StreamService};
use runnel::storage::{Change, Engine, Recovered, RecoveredStream, StorageError, StreamId};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Accepts every commit and keeps nothing; recovers the streams it was built with.
struct Forgetful {
    streams: std::sync::Mutex<Vec<RecoveredStream>>,
}

impl Engine for Forgetful {
    fn commit(&self, _: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        futures::future::ready(Ok(())).boxed()
    }

    fn read(
        &self,
        _: StreamId,
        _: u64,
        _: u64,
        _: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StorageError>> {
        futures::future::ready(Ok(Vec::new())).boxed()
    }

    fn read_snapshot(
        &self,
        _: StreamId,
    ) -> BoxFuture<'static, Result<Option<Bytes>, StorageError>> {
        futures::future::ready(Ok(None)).boxed()
    }

    fn recover(&self) -> Result<Recovered, StorageError> {
        let streams = std::mem::take(&mut *self.streams.lock().unwrap());
        let next_id = streams.len() as u64;
        Ok(Recovered {
            streams,
            buckets: vec![(
                "runnel-bench".into(),
                serde_json::from_str(r#"{"created_ms":1}"#).unwrap(),
            )],
            tokens: Vec::new(),
            next_id,
        })
    }
}

const STREAMS: usize = 20_000;

/// The budget per idle stream: a million of them should stay well under 1 GiB, with the
/// storage engine's memtables and the allocator's overhead on top.
const MAX_BYTES_PER_STREAM: isize = 560;

/// A name like the idle benchmark's: `/runnel-bench/{run}-i{n}`.
fn name(i: usize) -> String {
    format!("/runnel-bench/r5f3a9c2e-i{i}")
}

fn forgetful(streams: Vec<RecoveredStream>) -> Arc<Forgetful> {
    Arc::new(Forgetful {
        streams: std::sync::Mutex::new(streams),
    })
}

#[tokio::test(flavor = "current_thread")]
async fn idle_streams_cost_little_memory_after_creation_and_after_a_restart() {
    let service = StreamService::open(forgetful(Vec::new()), ServiceConfig::default()).unwrap();
    let before = live();
    for i in 0..STREAMS {
        service
            .create(CreateRequest {
                name: name(i),
                content_type: Some("application/octet-stream".into()),
                ..CreateRequest::default()
            })
            .await
            .unwrap();
    }
    let created = (live() - before) / STREAMS as isize;
    drop(service);

    // Counted from before the engine holds the recovered metadata: what open() keeps of it is
    // the service's, the rest it must free.
    let before = live();
    let recovered: Vec<RecoveredStream> = (0..STREAMS)
        .map(|i| RecoveredStream {
            id: i as u64,
            meta: StreamMeta {
                created_ms: 1_700_000_000_000,
                ..StreamMeta::new(&name(i), "application/octet-stream")
            },
            producers: Vec::new(),
            stored_end: None,
            trimmed_before: 0,
        })
        .collect();
    let engine = forgetful(recovered);
    let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
    let reopened = (live() - before) / STREAMS as isize;
    drop(service);

    println!("heap bytes per idle stream: {created} after creation, {reopened} after a restart");
    // About 460 of each today; it was about 1,390 when each stream kept its own copies of its
    // name, content type, full metadata and watch channel.
    assert!(
        created <= MAX_BYTES_PER_STREAM,
        "{created} bytes per created stream"
    );
    assert!(
        reopened <= MAX_BYTES_PER_STREAM,
        "{reopened} bytes per recovered stream"
    );
}
