//! Reads and tail watches: chunk sizes and budgets, reads that meet a trim, and how a tail watch
//! wakes (moved, idle, ended by its deadline or by shutdown).

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::Wake;
use crate::model::{Offset, ReadFrom, Record};
use crate::service::tests::{Wrapping, create_text, one_text_stream, text};
use crate::service::{
    CreateRequest, ForkRequest, ServiceConfig, Stream, StreamError, StreamService,
};
use crate::storage::{Engine, MemoryEngine, SharedEngine, StorageError, StreamId};

#[tokio::test]
async fn a_wait_without_appends_times_out_at_the_same_tail() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create(create_text("quiet")).await.unwrap();
    let stream = service.find("quiet", false).await.unwrap();
    let seen = service
        .wait_beyond(&stream, Offset::START, Duration::from_millis(20))
        .await;
    assert_eq!(seen.tail, Offset::START);
}

#[tokio::test]
async fn a_catch_up_read_carries_a_larger_chunk_than_a_live_read() {
    let config = ServiceConfig {
        // Each record of 50 bytes counts 58.
        max_read_bytes: 2 * 58,
        catch_up_read_bytes: 8 * 58,
        ..ServiceConfig::default()
    };
    let service = StreamService::open(Arc::new(MemoryEngine::new()), config).unwrap();
    service.create(create_text("s")).await.unwrap();
    for _ in 0..10 {
        service.append("s", text(&"x".repeat(50))).await.unwrap();
    }
    let stream = service.find("s", false).await.unwrap();

    let live = service.read_at(&stream, Offset::START, None).await.unwrap();
    let history = service
        .read_history_at(&stream, Offset::START, None)
        .await
        .unwrap();
    assert_eq!(live.records.len(), 2, "a live read stops at 116 bytes");
    assert_eq!(history.records.len(), 8, "a catch-up read at 464");
    assert!(!history.up_to_date);
}

#[tokio::test]
async fn a_read_through_a_fork_keeps_to_its_byte_budget_across_the_fork_point() {
    let config = ServiceConfig {
        max_read_bytes: 100,
        ..ServiceConfig::default()
    };
    let service = StreamService::open(Arc::new(MemoryEngine::new()), config).unwrap();
    service.create(create_text("src")).await.unwrap();
    service.append("src", text(&"s".repeat(60))).await.unwrap();
    let fork = CreateRequest {
        fork: Some(ForkRequest {
            source: "src".into(),
            offset: None,
            sub_offset: 0,
        }),
        ..create_text("fork")
    };
    service.create(fork).await.unwrap();
    service.append("fork", text(&"f".repeat(60))).await.unwrap();
    let fork = service.find("fork", false).await.unwrap();
    let chunk = service.read_at(&fork, Offset::START, None).await.unwrap();
    assert_eq!(
        chunk.records.len(),
        1,
        "the fork's own first record would take the read to 120 of 100 bytes"
    );
}

#[tokio::test]
async fn a_read_allowed_less_than_usual_for_memory_says_so() {
    let (service, stream) = one_text_stream().await;
    service.append("s", text("a")).await.unwrap();
    let usual = service
        .read_history_at(&stream, Offset::START, None)
        .await
        .unwrap();
    assert!(!usual.cut_for_memory);

    let config = ServiceConfig {
        read_memory_bytes: 64 << 10,
        ..ServiceConfig::default()
    };
    let service = StreamService::open(Arc::new(MemoryEngine::new()), config).unwrap();
    service.create(create_text("s")).await.unwrap();
    let stream = service.find("s", false).await.unwrap();
    service.append("s", text("a")).await.unwrap();
    let cut = service
        .read_history_at(&stream, Offset::START, None)
        .await
        .unwrap();
    assert!(
        cut.cut_for_memory,
        "a catch-up read may take 4 MiB, and 64 KiB is all there is"
    );
}

/// A memory engine that trims a stream's records below `trimmed_below` from under a service
/// that does not know yet, as the fjall engine's reads see a trim a moment before retention is
/// published. The first read after `trim_after_read` is cut short after that many records (a
/// body file it needed went with the trim) and the trim takes effect right after it.
#[derive(Default)]
struct TrimmingEngine {
    inner: MemoryEngine,
    trimmed_below: std::sync::Mutex<u64>,
    trim_after_read: std::sync::Mutex<Option<(usize, u64)>>,
}

impl Wrapping for TrimmingEngine {
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
        let cut = self.trim_after_read.lock().unwrap().take();
        let trimmed_below = {
            let mut below = self.trimmed_below.lock().unwrap();
            let now = *below;
            if let Some((_, trim_to)) = cut {
                *below = trim_to;
            }
            now
        };
        let read = self.inner.read(id, from.max(trimmed_below), until, max);
        async move {
            let mut records = read.await?;
            if let Some((kept, _)) = cut {
                records.truncate(kept);
            }
            Ok(records)
        }
        .boxed()
    }
}

/// Seven records `r0` … `r6` in stream "t", read back by a service that has just started (so
/// reads go to the engine, not the tail cache). Returns the offsets after each record.
async fn seven_records_after_a_restart(
    engine: &Arc<TrimmingEngine>,
) -> (Arc<StreamService>, Arc<Stream>, Vec<Offset>) {
    let shared: SharedEngine = engine.clone();
    let service = StreamService::open(shared.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("t")).await.unwrap();
    let mut ends = Vec::new();
    for i in 0..7 {
        ends.push(
            service
                .append("t", text(&format!("r{i}")))
                .await
                .unwrap()
                .tail,
        );
    }
    drop(service);
    let service = StreamService::open(shared, ServiceConfig::default()).unwrap();
    let stream = service.find("t", false).await.unwrap();
    (service, stream, ends)
}

#[tokio::test]
async fn a_read_never_joins_records_across_a_trim_that_happened_while_it_read() {
    let engine = Arc::new(TrimmingEngine::default());
    let (service, stream, ends) = seven_records_after_a_restart(&engine).await;
    // The first engine read ends after r1; then r2 … r4 are trimmed.
    *engine.trim_after_read.lock().unwrap() = Some((2, 5));
    let chunk = service.read_at(&stream, Offset::START, None).await.unwrap();
    let bodies: Vec<&[u8]> = chunk.records.iter().map(|r| &r.body[..]).collect();
    assert_eq!(bodies, [b"r0", b"r1"], "contiguous, ending before the gap");
    assert_eq!(chunk.next, ends[1]);
    // The reader's next read is told where the stream now starts.
    let next = service.read_at(&stream, chunk.next, None).await;
    assert!(
        matches!(next, Err(StreamError::Retained { first }) if first == ends[4]),
        "{next:?}"
    );
}

#[tokio::test]
async fn an_offset_that_retention_is_passing_is_gone_not_invalid() {
    let engine = Arc::new(TrimmingEngine::default());
    let (service, stream, ends) = seven_records_after_a_restart(&engine).await;
    // The engine no longer has r0 … r2; retention is not yet published.
    *engine.trimmed_below.lock().unwrap() = 3;
    let resolved = service.resolve(&stream, ReadFrom::At(ends[0])).await;
    assert!(
        matches!(resolved, Err(StreamError::Retained { first }) if first == ends[2]),
        "{resolved:?}"
    );
    let at_start = service
        .resolve(&stream, ReadFrom::At(ends[2]))
        .await
        .unwrap();
    assert_eq!(at_start, ends[2], "the first record still there resolves");
}

// These use real time: paused time needs tokio's `test-util`, and a dev-only tokio feature would
// make every build compile tokio and its dependents twice. Bounds are lower bounds (timers never
// fire early) or generous.

#[tokio::test]
async fn a_tail_watch_wakes_idle_once_nothing_was_sent_for_the_idle_period() {
    let (service, stream) = one_text_stream().await;
    let idle = Duration::from_millis(50);
    let started = tokio::time::Instant::now();
    let mut watch = service.watch_tail(&stream, idle, None);
    assert!(matches!(watch.next(Offset::START).await, Wake::Idle));
    assert!(started.elapsed() >= idle);

    tokio::time::sleep(Duration::from_millis(30)).await;
    watch.sent();
    let sent = tokio::time::Instant::now();
    assert!(matches!(watch.next(Offset::START).await, Wake::Idle));
    assert!(
        sent.elapsed() >= idle,
        "the idle period counts from the last send, not from the last wake"
    );
}

#[tokio::test]
async fn a_tail_watch_wakes_when_the_tail_moves_and_ends_at_its_deadline() {
    let (service, stream) = one_text_stream().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    let mut watch = service.watch_tail(&stream, Duration::from_millis(50), Some(deadline));
    service.append("s", text("a")).await.unwrap();
    let Wake::Moved(seen) = watch.next(Offset::START).await else {
        panic!("the append moved the tail");
    };
    assert_eq!(seen.tail.seq, 1);
    let tail = stream.durable().tail;
    let mut idles = 0;
    loop {
        match watch.next(tail).await {
            Wake::Idle => idles += 1,
            Wake::Ended => break,
            Wake::Moved(seen) => panic!("nothing was appended: {seen:?}"),
        }
    }
    assert!(tokio::time::Instant::now() >= deadline);
    assert!(
        (1..=20).contains(&idles),
        "{idles} idle wakes in 1 s at 50 ms"
    );
}

#[tokio::test]
async fn a_tail_watch_past_its_deadline_ends_even_while_the_tail_keeps_moving() {
    let (service, stream) = one_text_stream().await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(20);
    let mut watch = service.watch_tail(&stream, Duration::from_secs(60), Some(deadline));
    tokio::time::sleep_until(deadline).await;
    // A writer faster than the reader: each time the reader waits, the tail has moved already.
    service.append("s", text("a")).await.unwrap();
    assert!(matches!(watch.next(Offset::START).await, Wake::Ended));
}

#[tokio::test]
async fn a_tail_watch_ends_when_the_server_shuts_down() {
    let (service, stream) = one_text_stream().await;
    let mut watch = service.watch_tail(&stream, Duration::from_secs(60), None);
    service.begin_shutdown();
    let woke = tokio::time::timeout(Duration::from_secs(10), watch.next(stream.durable().tail));
    assert!(matches!(woke.await, Ok(Wake::Ended)));
}

#[tokio::test]
async fn a_tail_watch_whose_tail_has_moved_still_ends_when_the_server_shuts_down() {
    let (service, stream) = one_text_stream().await;
    let mut watch = service.watch_tail(&stream, Duration::from_secs(60), None);
    service.append("s", text("a")).await.unwrap();
    service.begin_shutdown();
    // The tail is ahead of the reader, as it always is on a busy stream: shutdown still wins.
    for _ in 0..10 {
        assert!(matches!(watch.next(Offset::START).await, Wake::Ended));
    }
}

#[tokio::test]
async fn a_tail_watch_already_waiting_ends_when_the_server_shuts_down() {
    let (service, stream) = one_text_stream().await;
    let mut watch = service.watch_tail(&stream, Duration::from_secs(60), None);
    let tail = stream.durable().tail;
    let waiting = tokio::spawn(async move { watch.next(tail).await });
    // Let it start waiting (and stop looking at the shutdown signal on every poll).
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished());
    service.begin_shutdown();
    let woke = tokio::time::timeout(Duration::from_secs(10), waiting).await;
    assert!(matches!(woke, Ok(Ok(Wake::Ended))));
}

#[tokio::test]
async fn a_tail_watch_woken_by_appends_still_wakes_idle_after_them() {
    let (service, stream) = one_text_stream().await;
    let idle = Duration::from_millis(100);
    let mut watch = service.watch_tail(&stream, idle, None);
    for body in ["a", "b", "c"] {
        let at = stream.durable().tail;
        let appended = service.append("s", text(body));
        let (moved, _) = tokio::join!(watch.next(at), appended);
        assert!(matches!(moved, Wake::Moved(_)));
        watch.sent();
    }
    let sent = tokio::time::Instant::now();
    let woke = tokio::time::timeout(Duration::from_secs(10), watch.next(stream.durable().tail));
    assert!(matches!(woke.await, Ok(Wake::Idle)));
    assert!(sent.elapsed() >= idle, "idle counts from the last send");
}
