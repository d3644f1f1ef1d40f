//! The replication pumps and the SSE binding, over a service in memory.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::super::live::tests::app_over;
use super::*;
use crate::model::streamld::{self, Message, StreamDeleted};
use crate::service::sessions::replica_feed::{Cursor, Outbox, READ_BATCH, pump, stream_pump};
use crate::storage::StorageError;

fn outbox_of(queue: mpsc::Sender<(CancellationToken, Message)>) -> Outbox {
    Outbox {
        queue,
        subscription: CancellationToken::new(),
        failed: CancellationToken::new(),
    }
}

/// A memory engine whose reads fail with `failure` once it is set.
struct FailingReads {
    inner: crate::storage::MemoryEngine,
    failure: std::sync::Mutex<Option<StorageError>>,
}

impl crate::storage::Engine for FailingReads {
    fn commit(
        &self,
        changes: Vec<crate::storage::Change>,
    ) -> futures::future::BoxFuture<'static, Result<(), crate::storage::StorageError>> {
        self.inner.commit(changes)
    }

    fn read(
        &self,
        id: crate::storage::StreamId,
        from: u64,
        until: u64,
        max_bytes: usize,
    ) -> futures::future::BoxFuture<
        'static,
        Result<Vec<crate::model::Record>, crate::storage::StorageError>,
    > {
        if let Some(failure) = self.failure.lock().unwrap().clone() {
            return Box::pin(futures::future::ready(Err(failure)));
        }
        self.inner.read(id, from, until, max_bytes)
    }

    fn read_snapshot(
        &self,
        id: crate::storage::StreamId,
    ) -> futures::future::BoxFuture<'static, Result<Option<Bytes>, crate::storage::StorageError>>
    {
        self.inner.read_snapshot(id)
    }

    fn recover(&self) -> Result<crate::storage::Recovered, crate::storage::StorageError> {
        self.inner.recover()
    }
}

/// Follows stream `s`, whose one record cannot be read (`failure`), as a replication session
/// would: whether the pump asks for the session to end, once the pump has stopped.
async fn session_ended_by(failure: StorageError) -> bool {
    use crate::service::{AppendRequest, CreateRequest, ServiceConfig, StreamService};

    let engine = Arc::new(FailingReads {
        inner: crate::storage::MemoryEngine::new(),
        failure: std::sync::Mutex::new(None),
    });
    let writer = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    let create = CreateRequest {
        name: "s".into(),
        content_type: Some("text/plain".into()),
        ..Default::default()
    };
    writer.create(create).await.unwrap();
    let append = AppendRequest {
        content_type: Some("text/plain"),
        body: Bytes::from_static(b"on disk"),
        ..Default::default()
    };
    writer.append("s", append).await.unwrap();
    // Opened again, with nothing in its caches: its records are read from the engine.
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    *engine.failure.lock().unwrap() = Some(failure);

    let (queue, _sent) = mpsc::channel(16);
    let outbox = outbox_of(queue);
    let failed = outbox.failed.clone();
    let cursor = Cursor {
        after: 0,
        last_timestamp: None,
    };
    let pumping = stream_pump(service, outbox, "http://up".into(), "s".into(), cursor);
    let stopped = tokio::time::timeout(Duration::from_secs(5), pumping).await;
    assert!(stopped.is_ok(), "the pump stops");
    failed.is_cancelled()
}

#[tokio::test]
async fn a_stream_that_cannot_be_read_for_an_io_error_ends_its_replication_session() {
    let failure = StorageError::Io("a test's disk".into());
    assert!(session_ended_by(failure).await, "the replica joins again");
}

#[tokio::test]
async fn a_stream_whose_data_is_corrupt_stops_alone_and_the_session_goes_on() {
    let failure = StorageError::Corrupt("a test's record".into());
    assert!(
        !session_ended_by(failure).await,
        "the other streams of the session go on"
    );
}

#[tokio::test]
async fn a_close_made_while_a_stream_state_waits_for_room_goes_out_after_it() {
    use crate::service::AppendRequest;

    let (service, stream) = crate::service::one_text_stream().await;
    let feeding = service.clone();
    // A session's queue with no room: the pump's first state waits.
    let (queue, mut sent) = mpsc::channel(1);
    let outbox = outbox_of(queue);
    let filler = || {
        Message::Deleted(StreamDeleted {
            stream: "filler".into(),
        })
    };
    assert!(outbox.send(filler()).await.is_ok());
    let pumping = tokio::spawn(async move {
        let cursor = Cursor {
            after: 0,
            last_timestamp: None,
        };
        pump(&feeding, &outbox, "http://up/s", &stream, cursor).await
    });
    // The pump runs until its state finds no room (one runtime thread: it runs now).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let close = AppendRequest {
        content_type: Some("text/plain"),
        close: true,
        ..Default::default()
    };
    service.append("s", close).await.unwrap();

    let mut closed_told = false;
    while !closed_told {
        let next = tokio::time::timeout(Duration::from_secs(5), sent.recv()).await;
        let (_, message) = next
            .expect("the close goes out after the state")
            .expect("a message");
        closed_told = matches!(message, Message::State(state) if state.closed);
    }
    pumping.abort();
}

#[tokio::test]
async fn records_trimmed_under_a_replication_pump_are_a_gap_signal_to_its_replica() {
    let (service, stream) =
        crate::service::StreamService::with_text_stream_of(&["r"; READ_BATCH as usize * 2]).await;
    let trimmed = stream.clone();
    let feeding = service.clone();
    // Room for one message: the pump sends its state, reads its first batch and waits for
    // room for the batch's first frame.
    let (queue, mut sent) = mpsc::channel(1);
    let outbox = outbox_of(queue);
    let cursor = Cursor {
        after: 0,
        last_timestamp: None,
    };
    let pumping =
        tokio::spawn(async move { pump(&feeding, &outbox, "http://up/s", &stream, cursor).await });
    assert!(matches!(sent.recv().await, Some((_, Message::State(_)))));
    service.trim_for_test(&trimmed, READ_BATCH * 3 / 2).await;
    let mut last = None;
    while let Some((_, message)) = sent.recv().await {
        last = Some(message);
    }
    assert!(pumping.await.unwrap().is_ok());
    let Some(Message::Gap(signal)) = last else {
        panic!("expected a gap signal last, got {last:?}");
    };
    let first = streamld::sequence_of(READ_BATCH * 3 / 2);
    assert_eq!(signal.oldest_available, Some(first));
}

#[tokio::test]
async fn records_trimmed_under_a_streamld_sse_reader_end_its_response() {
    let (service, stream) =
        crate::service::StreamService::with_text_stream_of(&["a", "b", "c"]).await;
    let app = app_over(service.clone());
    let response = sse(&app, "s", "http://up", 0).await.unwrap();
    // The body is read once the response goes out: the trim passes its reader first.
    service.trim_for_test(&stream, 2).await;
    let body = axum::body::to_bytes(response.into_body(), usize::MAX);
    let body = tokio::time::timeout(Duration::from_secs(5), body).await;
    assert!(body.expect("it ends").unwrap().is_empty());
}
