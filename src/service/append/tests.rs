//! Appends and closes: visible and acknowledged only once durable, timestamps at the server's
//! clock, refusals and retries that wait for what they depend on, and staging of large bodies.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::Semaphore;

use super::AppendRequest;
use crate::model::Offset;
use crate::service::tests::{FailingCommits, GatedEngine, Wrapping, create_text, text};
use crate::service::{S2Append, S2Record, ServiceConfig, StreamError, StreamService, now_ms};
use crate::storage::{Engine, MemoryEngine, Staged, StorageError};

#[tokio::test]
async fn readers_see_an_append_only_once_it_is_durable() {
    let gate = Arc::new(Semaphore::new(1)); // lets the create through
    let engine = Arc::new(GatedEngine::new(gate.clone()));
    let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();

    let writer = {
        let service = service.clone();
        tokio::spawn(async move { service.append("s", text("pending")).await })
    };
    let stream = service.find("s", false).await.unwrap();
    // Wait until the append is sequenced (the writer-side tail moved), then read.
    while stream.lock().meta.tail == Offset::START {
        tokio::task::yield_now().await;
    }
    let chunk = service.read_at(&stream, Offset::START, None).await.unwrap();
    assert!(
        chunk.records.is_empty(),
        "an append not yet durable is invisible"
    );
    assert!(!writer.is_finished(), "and not yet acknowledged");

    let waiter = {
        let service = service.clone();
        let stream = stream.clone();
        tokio::spawn(async move {
            service
                .wait_beyond(&stream, Offset::START, Duration::from_secs(10))
                .await
        })
    };
    gate.add_permits(1);
    let ack = writer.await.unwrap().unwrap();
    let seen = waiter.await.unwrap();
    assert_eq!(
        seen.tail, ack.tail,
        "a waiting reader wakes at the durable tail"
    );
    let chunk = service.read_at(&stream, Offset::START, None).await.unwrap();
    assert_eq!(chunk.records[0].body, "pending");
}

#[tokio::test]
async fn an_append_whose_requester_went_away_still_becomes_visible_once_durable() {
    let gate = Arc::new(Semaphore::new(1)); // lets the create through
    let engine = Arc::new(GatedEngine::new(gate.clone()));
    let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let stream = service.find("s", false).await.unwrap();

    // Poll the append once, so it is sequenced and submitted, then drop it, as a server drops
    // the handler of a client that disconnected.
    assert!(service.append("s", text("orphan")).now_or_never().is_none());
    assert_ne!(stream.lock().meta.tail, Offset::START, "it was sequenced");

    gate.add_permits(1);
    let seen = service
        .wait_beyond(&stream, Offset::START, Duration::from_secs(10))
        .await;
    assert_ne!(seen.tail, Offset::START, "readers see the durable append");
    let chunk = service.read_at(&stream, Offset::START, None).await.unwrap();
    assert_eq!(chunk.records[0].body, "orphan");
}

#[tokio::test]
async fn a_base_protocol_append_after_a_future_timestamp_still_arrives_at_the_server_clock() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create_bucket("aging", None, None).await.unwrap();
    let config = serde_json::json!({
        "retention_policy": {"age": 3600},
        "timestamping": {"uncapped": true}
    });
    service
        .create_in_bucket("aging", "s", Some(config), None)
        .await
        .unwrap();
    let stream = service.find("/aging/s", false).await.unwrap();
    let future_ms = now_ms() + 10 * 365 * 86_400_000;
    let append = S2Append {
        records: vec![S2Record {
            timestamp: Some(future_ms as u64),
            headers: Vec::new(),
            body: Bytes::from_static(b"from the future"),
        }],
        match_seq_num: None,
        fencing_token: None,
    }
    .check()
    .unwrap();
    service.append_records(&stream, append, None).await.unwrap();
    let plain = AppendRequest {
        content_type: Some("application/octet-stream"),
        body: Bytes::from_static(b"plain"),
        ..Default::default()
    };
    service.append("/aging/s", plain).await.unwrap();

    let chunk = service.read_at(&stream, Offset::START, None).await.unwrap();
    let plain = &chunk.records[1];
    assert!(
        plain.timestamp_ms >= future_ms,
        "timestamps never go back along a stream"
    );
    // Retention ages count from arrival: a record stamped ten years ahead must not make every
    // later record outlive its age.
    assert!(plain.arrival_ms <= now_ms());
}

#[tokio::test]
async fn a_retry_waiting_for_an_append_whose_write_fails_is_told_so_rather_than_waiting_forever() {
    let gate = Arc::new(Semaphore::new(1));
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let engine = FailingCommits {
        inner: MemoryEngine::new(),
        gate: gate.clone(),
        fail: fail.clone(),
    };
    let service = StreamService::open(Arc::new(engine), ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let stream = service.find("s", false).await.unwrap();
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let producer_append = || AppendRequest {
        producer: Some(crate::model::producer::ProducerClaim {
            id: "p".into(),
            epoch: 0,
            seq: 0,
        }),
        ..text("once")
    };
    let first = tokio::spawn({
        let service = service.clone();
        async move { service.append("s", producer_append()).await }
    });
    // Decided (the producer's state moved on), its write waiting at the gate.
    while stream.lock().meta.tail.seq == 0 {
        tokio::task::yield_now().await;
    }
    let retry = tokio::spawn({
        let service = service.clone();
        async move { service.append("s", producer_append()).await }
    });
    gate.add_permits(1);
    assert!(first.await.unwrap().is_err(), "the write failed");
    let retried = tokio::time::timeout(Duration::from_secs(10), retry).await;
    let retried = retried.expect("the retry is answered").unwrap();
    assert!(
        matches!(retried, Err(StreamError::Storage(_))),
        "{retried:?}"
    );
}

#[tokio::test]
async fn a_repeated_close_is_acknowledged_only_once_the_close_is_durable() {
    let gate = Arc::new(Semaphore::new(1)); // lets the create through
    let engine = Arc::new(GatedEngine::new(gate.clone()));
    let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let stream = service.find("s", false).await.unwrap();
    let close = || AppendRequest {
        close: true,
        ..Default::default()
    };

    // The close is sequenced and submitted, its commit held at the gate.
    let first = {
        let service = service.clone();
        tokio::spawn(async move { service.append("s", close()).await })
    };
    while !stream.lock().meta.closed {
        tokio::task::yield_now().await;
    }
    let retry = {
        let service = service.clone();
        tokio::spawn(async move { service.append("s", close()).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !retry.is_finished(),
        "the retry waits for the close it repeats"
    );
    gate.add_permits(1);
    assert!(first.await.unwrap().unwrap().closed);
    let ack = retry.await.unwrap().unwrap();
    assert!(ack.closed && ack.duplicate);
    assert!(stream.durable().closed);
}

#[tokio::test]
async fn a_refusal_reports_a_close_or_a_tail_only_once_it_is_durable() {
    let gate = Arc::new(Semaphore::new(2)); // lets the create and the first append through
    let engine = Arc::new(GatedEngine::new(gate.clone()));
    let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    service.append("s", text("first")).await.unwrap();

    // An append that closes the stream is sequenced but not yet durable.
    let mut closing = text("last");
    closing.close = true;
    let closing = {
        let service = service.clone();
        tokio::spawn(async move { service.append("s", closing).await })
    };
    let stream = service.find("s", false).await.unwrap();
    while !stream.lock().meta.closed {
        tokio::task::yield_now().await;
    }

    // A crash now would lose the close: the append it refuses must not be answered yet.
    let refused = {
        let service = service.clone();
        tokio::spawn(async move { service.append("s", text("late")).await })
    };
    let batch = {
        let service = service.clone();
        tokio::spawn(async move {
            service
                .append_batch("s", "text/plain", vec![Bytes::from_static(b"late")])
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!refused.is_finished(), "the refusal waits for the close");
    assert!(!batch.is_finished(), "so does a batch's");

    gate.add_permits(1);
    closing.await.unwrap().unwrap();
    assert!(matches!(
        refused.await.unwrap(),
        Err(StreamError::Closed { .. })
    ));
    let results = batch.await.unwrap().unwrap();
    assert!(matches!(results[0], Err(StreamError::Closed { .. })));
}

#[tokio::test]
async fn a_large_append_is_staged_unless_it_can_never_be_written() {
    use crate::model::producer::ProducerClaim;
    use crate::storage::{FjallEngine, SyncMode};
    let dir = tempfile::tempdir().unwrap();
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    let service = StreamService::open(Arc::new(engine), ServiceConfig::default()).unwrap();
    service.create(create_text("t")).await.unwrap();
    service.create(create_text("u")).await.unwrap();
    let large = Bytes::from(vec![b'x'; 2 << 20]);
    let append = |seq: Option<u64>, close: bool| AppendRequest {
        body: large.clone(),
        close,
        producer: seq.map(|seq| ProducerClaim {
            id: "p".into(),
            epoch: 0,
            seq,
        }),
        ..text("")
    };
    service.append("t", append(Some(0), false)).await.unwrap();
    // A producer retrying after a timeout: acknowledged without writing.
    let retry = service.append("t", append(Some(0), false)).await.unwrap();
    assert!(retry.duplicate);
    service.append("t", append(Some(1), true)).await.unwrap();
    let refused = service.append("t", append(None, false)).await;
    assert!(
        matches!(refused, Err(StreamError::Closed { .. })),
        "{refused:?}"
    );
    service.append("u", append(None, false)).await.unwrap();

    // A pipelining producer's next append, sent before the one ahead of it is decided, is
    // staged: it will most likely be written, after that one.
    let ahead = service.find("u", false).await.unwrap();
    let pipelined = AppendRequest {
        producer: Some(ProducerClaim {
            id: "q".into(),
            epoch: 0,
            seq: 1,
        }),
        ..append(None, false)
    };
    let staged = service
        .stage_append(&ahead, &pipelined, std::slice::from_ref(&large))
        .await
        .unwrap();
    assert!(staged.is_some());
    drop(staged);

    // Each body file is numbered when it is written: the retry and the refusal took none.
    let mut numbers: Vec<u64> = std::fs::read_dir(dir.path().join("bodies"))
        .unwrap()
        .map(|entry| {
            let name = entry.unwrap().file_name();
            u64::from_str_radix(name.to_str().unwrap(), 16).unwrap()
        })
        .collect();
    numbers.sort_unstable();
    let first = numbers[0];
    assert_eq!(
        numbers,
        [first, first + 1, first + 2],
        "the dropped file is gone"
    );
}

/// A fjall engine whose first staging of bodies finishes only when the test lets it, as a slow
/// disk's would.
struct SlowFirstStaging {
    inner: crate::storage::FjallEngine,
    first: Arc<Semaphore>,
    calls: std::sync::atomic::AtomicUsize,
}

impl Wrapping for SlowFirstStaging {
    fn inner(&self) -> &dyn Engine {
        &self.inner
    }

    fn on_stage(&self, bodies: Vec<Bytes>) -> BoxFuture<'static, Result<Staged, StorageError>> {
        let staging = self.inner.stage(bodies);
        if self.calls.fetch_add(1, Ordering::SeqCst) > 0 {
            return staging;
        }
        let first = self.first.clone();
        async move {
            let _released = first.acquire().await.map_err(|_| StorageError::Failed)?;
            staging.await
        }
        .boxed()
    }
}

#[tokio::test]
async fn a_pipelined_append_waits_for_an_earlier_one_still_staging_instead_of_refusing_a_gap() {
    use crate::model::producer::ProducerClaim;
    use crate::storage::{FjallEngine, SyncMode};
    let dir = tempfile::tempdir().unwrap();
    let first_staged = Arc::new(Semaphore::new(0));
    let engine = Arc::new(SlowFirstStaging {
        inner: FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap(),
        first: first_staged.clone(),
        calls: Default::default(),
    });
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let append = |seq: u64| {
        let request = AppendRequest {
            body: Bytes::from(vec![b'0' + seq as u8; 2 << 20]),
            producer: Some(ProducerClaim {
                id: "p".into(),
                epoch: 0,
                seq,
            }),
            ..text("")
        };
        let service = service.clone();
        tokio::spawn(async move { service.append("s", request).await })
    };
    let first = append(0);
    let staging = || engine.calls.load(Ordering::SeqCst) == 1;
    for _ in 0..5000 {
        if staging() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(staging(), "the first append is staging");
    let second = append(1);
    let stream = service.find("s", false).await.unwrap();
    let waiting = || {
        stream
            .lock()
            .arrivals
            .as_ref()
            .is_some_and(|a| a.waited_on())
    };
    for _ in 0..5000 {
        if waiting() || second.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        !second.is_finished(),
        "decided before the append that arrived first: {:?}",
        second.await
    );
    assert!(waiting());
    first_staged.add_permits(1);
    let (first, second) = (
        first.await.unwrap().unwrap(),
        second.await.unwrap().unwrap(),
    );
    assert_eq!(first.records, Some((0, 1)));
    assert_eq!(second.records, Some((1, 2)));
}
