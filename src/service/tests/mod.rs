//! Service rules that need no HTTP: durability visibility, live wake-ups, recovery of forks.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::Semaphore;

use super::snapshots::RetentionMove;
use super::*;
use crate::model::ReadFrom;
use crate::model::records::ReadView;
use crate::storage::{Engine, MemoryEngine, Recovered};

/// A test engine that changes one thing about the engine it wraps and passes the rest through:
/// it implements the hook it changes, and `Engine` comes from the impl below.
trait Wrapping: Send + Sync + 'static {
    fn inner(&self) -> &dyn Engine;

    fn on_commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        self.inner().commit(changes)
    }

    fn on_stage(&self, bodies: Vec<Bytes>) -> BoxFuture<'static, Result<Staged, StorageError>> {
        self.inner().stage(bodies)
    }

    fn on_read(
        &self,
        id: StreamId,
        from: u64,
        until: u64,
        max: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StorageError>> {
        self.inner().read(id, from, until, max)
    }

    fn on_recover(&self) -> Result<Recovered, StorageError> {
        self.inner().recover()
    }
}

impl<W: Wrapping> Engine for W {
    fn commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        self.on_commit(changes)
    }

    fn stages(&self, bytes: usize) -> bool {
        self.inner().stages(bytes)
    }

    fn stage(&self, bodies: Vec<Bytes>) -> BoxFuture<'static, Result<Staged, StorageError>> {
        self.on_stage(bodies)
    }

    fn read(
        &self,
        id: StreamId,
        from: u64,
        until: u64,
        max: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StorageError>> {
        self.on_read(id, from, until, max)
    }

    fn read_snapshot(
        &self,
        id: StreamId,
    ) -> BoxFuture<'static, Result<Option<Bytes>, StorageError>> {
        self.inner().read_snapshot(id)
    }

    // `recover_each` stays the default, which goes through `recover`: a wrapper's recovery is
    // the one the service sees.
    fn recover(&self) -> Result<Recovered, StorageError> {
        self.on_recover()
    }

    fn room(&self) -> Result<(), StorageError> {
        self.inner().room()
    }
}

/// A memory engine whose commits complete only when the test lets them.
struct GatedEngine {
    inner: Arc<MemoryEngine>,
    gate: Arc<Semaphore>,
    /// Commits take effect only when the gate lets them through: until then the store holds
    /// what it held before, as a storage engine's does while its writer is behind. Otherwise
    /// they take effect at once and only their completion waits.
    held: bool,
}

impl GatedEngine {
    fn new(gate: Arc<Semaphore>) -> GatedEngine {
        GatedEngine {
            inner: Arc::new(MemoryEngine::new()),
            gate,
            held: false,
        }
    }

    fn held(gate: Arc<Semaphore>) -> GatedEngine {
        GatedEngine {
            held: true,
            ..GatedEngine::new(gate)
        }
    }
}

impl Wrapping for GatedEngine {
    fn inner(&self) -> &dyn Engine {
        self.inner.as_ref()
    }

    fn on_commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        let gate = self.gate.clone();
        // A memory engine's commit takes effect when called; a held one is called only later.
        let commit = if self.held {
            let inner = self.inner.clone();
            async move { inner.commit(changes).await }.boxed()
        } else {
            self.inner.commit(changes)
        };
        async move {
            gate.acquire()
                .await
                .map_err(|_| StorageError::Failed)?
                .forget();
            commit.await
        }
        .boxed()
    }
}

fn text(body: &str) -> AppendRequest<'static> {
    AppendRequest {
        content_type: Some("text/plain"),
        body: Bytes::copy_from_slice(body.as_bytes()),
        ..Default::default()
    }
}

fn create_text(name: &str) -> CreateRequest {
    CreateRequest {
        name: name.into(),
        content_type: Some("text/plain".into()),
        ..Default::default()
    }
}

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
async fn a_create_whose_requester_went_away_still_readies_the_stream_once_durable() {
    let gate = Arc::new(Semaphore::new(0));
    let engine = Arc::new(GatedEngine::new(gate.clone()));
    let service = StreamService::open(engine, ServiceConfig::default()).unwrap();

    // Polled once, so it is submitted, then dropped, as a server drops the handler of a client
    // that disconnected.
    assert!(service.create(create_text("s")).now_or_never().is_none());
    assert_eq!(service.counts().0, 1, "it was submitted");

    gate.add_permits(1);
    let found = tokio::time::timeout(Duration::from_secs(10), service.find("s", false)).await;
    assert!(
        found.expect("later requests do not wait forever").is_ok(),
        "the stream is there"
    );
}

#[tokio::test]
async fn a_deletion_whose_requester_went_away_still_tells_readers_once_durable() {
    let gate = Arc::new(Semaphore::new(1)); // lets the create through
    let engine = Arc::new(GatedEngine::new(gate.clone()));
    let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let stream = service.find("s", false).await.unwrap();

    assert!(service.delete("s").now_or_never().is_none());
    assert!(stream.lock().removed, "it was submitted");

    gate.add_permits(1);
    let mut durable = stream.subscribe();
    let told = tokio::time::timeout(Duration::from_secs(10), durable.wait_for(|d| d.removed));
    assert!(told.await.is_ok(), "readers learn the stream is gone");
}

#[tokio::test]
async fn attributes_whose_requester_went_away_are_still_published_once_durable() {
    let gate = Arc::new(Semaphore::new(1)); // lets the create through
    let engine = Arc::new(GatedEngine::new(gate.clone()));
    let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let attrs = crate::model::attrs::parse(br#"{"title":"set"}"#).unwrap();

    assert!(
        service
            .set_attrs("s", attrs.clone())
            .now_or_never()
            .is_none()
    );

    gate.add_permits(1);
    let read = tokio::time::timeout(Duration::from_secs(10), service.attrs("s")).await;
    let read = read.expect("reads of the stream's metadata do not wait forever");
    assert_eq!(read.unwrap(), attrs);
}

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
async fn recovery_restores_forks_soft_deletes_and_producers() {
    let engine: SharedEngine = Arc::new(MemoryEngine::new());
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("src")).await.unwrap();
    service.create(create_text("plain")).await.unwrap();
    let claim = crate::model::producer::ProducerClaim {
        id: "p".into(),
        epoch: 3,
        seq: 0,
    };
    service
        .append(
            "plain",
            AppendRequest {
                producer: Some(claim.clone()),
                ..text("once")
            },
        )
        .await
        .unwrap();
    let ack = service.append("src", text("hello")).await.unwrap();
    let fork = CreateRequest {
        fork: Some(ForkRequest {
            source: "src".into(),
            offset: Some(ack.tail),
            sub_offset: 0,
        }),
        ..create_text("fork")
    };
    service.create(fork).await.unwrap();
    service.delete("src").await.unwrap();
    assert!(matches!(
        service.find("src", false).await,
        Err(StreamError::Gone)
    ));

    let reopened = StreamService::open(engine, ServiceConfig::default()).unwrap();
    assert!(
        matches!(reopened.find("src", false).await, Err(StreamError::Gone)),
        "still soft-deleted"
    );
    let fork = reopened.find("fork", false).await.unwrap();
    let chunk = reopened
        .read_at(
            &fork,
            reopened.resolve(&fork, ReadFrom::Start).await.unwrap(),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        chunk.records[0].body, "hello",
        "the fork still reads its source's history"
    );
    let retry = reopened
        .append(
            "plain",
            AppendRequest {
                producer: Some(claim),
                ..text("again")
            },
        )
        .await
        .unwrap();
    assert!(
        retry.duplicate,
        "producer state survives: the retry is recognised"
    );
    assert_eq!(
        retry.records,
        Some((0, 1)),
        "and acknowledged with the original record range"
    );

    reopened.delete("fork").await.unwrap();
    assert!(
        matches!(
            reopened.find("src", false).await,
            Err(StreamError::NotFound)
        ),
        "the last fork's delete cascades"
    );
}

#[tokio::test]
async fn restart_removes_soft_deleted_streams_no_fork_reads_any_more() {
    use crate::model::stream::{ForkOrigin, MetaExtra, StreamMeta};
    let meta = |name: &str, soft_deleted: bool, fork: Option<ForkOrigin>| StreamMeta {
        soft_deleted,
        extra: Some(Box::new(MetaExtra {
            fork,
            ..MetaExtra::default()
        })),
        ..StreamMeta::new(name, "text/plain")
    };
    let origin = |source_id, source_name: &str| ForkOrigin {
        source_id,
        source_name: source_name.into(),
        offset: Offset::START,
        sub_offset: 0,
    };
    // A cascade interrupted by a crash: root <- middle (both soft-deleted); the last fork is gone.
    // Beside it, a soft-deleted source that a live fork still reads.
    let engine: SharedEngine = Arc::new(MemoryEngine::new());
    engine
        .commit(vec![
            Change::PutStream(1, Box::new(meta("root", true, None))),
            Change::PutStream(2, Box::new(meta("middle", true, Some(origin(1, "root"))))),
            Change::PutStream(3, Box::new(meta("kept", true, None))),
            Change::PutStream(4, Box::new(meta("reader", false, Some(origin(3, "kept"))))),
        ])
        .await
        .unwrap();
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    for gone in ["root", "middle"] {
        assert!(
            matches!(service.find(gone, false).await, Err(StreamError::NotFound)),
            "{gone}"
        );
    }
    assert!(matches!(
        service.find("kept", false).await,
        Err(StreamError::Gone)
    ));
    assert!(service.find("reader", false).await.is_ok());
    let stored: Vec<StreamId> = engine
        .recover()
        .unwrap()
        .streams
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(
        stored.len(),
        2,
        "only kept and reader remain stored: {stored:?}"
    );
}

/// Recovers what its inner engine holds, streams in reverse id order.
struct Reversed(MemoryEngine);

impl Wrapping for Reversed {
    fn inner(&self) -> &dyn Engine {
        &self.0
    }

    fn on_recover(&self) -> Result<Recovered, StorageError> {
        let mut recovered = self.0.recover()?;
        recovered.streams.reverse();
        Ok(recovered)
    }
}

#[tokio::test]
async fn recovery_builds_forks_after_their_sources_in_whatever_order_they_come() {
    let engine: SharedEngine = Arc::new(Reversed(MemoryEngine::new()));
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("src")).await.unwrap();
    service.append("src", text("hello")).await.unwrap();
    let fork_of = |source: &str, name: &str| CreateRequest {
        fork: Some(ForkRequest {
            source: source.into(),
            offset: None,
            sub_offset: 0,
        }),
        ..create_text(name)
    };
    service.create(fork_of("src", "fork")).await.unwrap();
    service.create(fork_of("fork", "grandchild")).await.unwrap();
    drop(service);

    let reopened = StreamService::open(engine, ServiceConfig::default()).unwrap();
    let grandchild = reopened.find("grandchild", false).await.unwrap();
    let start = reopened
        .resolve(&grandchild, ReadFrom::Start)
        .await
        .unwrap();
    let chunk = reopened.read_at(&grandchild, start, None).await.unwrap();
    assert_eq!(chunk.records[0].body, "hello", "read through two sources");
    reopened.delete("src").await.unwrap();
    assert!(
        matches!(reopened.find("src", false).await, Err(StreamError::Gone)),
        "the source knows its fork: deleting it is soft"
    );
    assert_eq!(reopened.counts().0, 3);
}

#[tokio::test]
async fn s2_retention_ages_count_from_arrival_not_from_client_timestamps() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create_bucket("aging", None, None).await.unwrap();
    let config = serde_json::json!({
        "retention_policy": {"age": 3600},
        "timestamping": {"mode": "client-require", "uncapped": true}
    });
    service
        .create_s2_stream("aging", "s", Some(config), None)
        .await
        .unwrap();
    let stream = service.find("/aging/s", false).await.unwrap();
    // Timestamps from 1970, as a client counting from its own start would send.
    let records = (0..3)
        .map(|i| S2Record {
            timestamp: Some(1_000 + i),
            headers: Vec::new(),
            body: Bytes::from_static(b"old-looking"),
        })
        .collect();
    let append = S2Append {
        records,
        match_seq_num: None,
        fencing_token: None,
    }
    .check()
    .unwrap();
    service.s2_append(&stream, append, None).await.unwrap();
    service.enforce_s2_configs().await;
    assert_eq!(
        stream.durable().first.seq,
        0,
        "records that arrived just now are an hour from expiry"
    );
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
        .create_s2_stream("aging", "s", Some(config), None)
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
    service.s2_append(&stream, append, None).await.unwrap();
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
async fn a_trim_hides_its_records_at_once_and_after_a_restart() {
    use crate::storage::{FjallEngine, SyncMode};
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        StreamService::open(Arc::new(engine), ServiceConfig::default()).unwrap()
    };
    let check = |service: Arc<StreamService>, restarted: bool| async move {
        let stream = service.find("t", false).await.unwrap();
        let first = service.resolve(&stream, ReadFrom::Start).await.unwrap();
        assert_eq!(first.seq, 6);
        let chunk = service.read_at(&stream, first, None).await.unwrap();
        assert_eq!(chunk.records[0].body, "r6");
        assert_eq!(chunk.records.len(), 4);
        assert!(matches!(
            service
                .resolve(&stream, ReadFrom::At(Offset::new(1, 2)))
                .await,
            Err(StreamError::Retained { .. })
        ));
        // A reader still positioned before the trim point is told where the stream now starts,
        // whether the hot tail cache still holds the trimmed records (before the restart) or not.
        let stale = service.read_at(&stream, Offset::START, None).await;
        assert!(
            matches!(stale, Err(StreamError::Retained { first: at }) if at == first),
            "restarted: {restarted}, {stale:?}"
        );
    };
    {
        let service = open();
        service.create(create_text("t")).await.unwrap();
        for i in 0..10 {
            service.append("t", text(&format!("r{i}"))).await.unwrap();
        }
        let stream = service.find("t", false).await.unwrap();
        service.trim(&stream, 6).await.unwrap();
        check(service, false).await;
    }
    check(open(), true).await;
}

#[tokio::test]
async fn a_trim_racing_a_delete_does_not_bring_the_stream_back() {
    let engine: SharedEngine = Arc::new(MemoryEngine::new());
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("t")).await.unwrap();
    service.append("t", text("a")).await.unwrap();
    service.append("t", text("b")).await.unwrap();
    // A trim (a retention sweep, say) that found the stream just before it was deleted.
    let stream = service.find("t", false).await.unwrap();
    service.delete("t").await.unwrap();
    let trimmed = service
        .move_retention(&stream, Offset::new(1, 1), RetentionMove::Trim(1))
        .await;
    assert!(matches!(trimmed, Err(StreamError::NotFound)));
    assert!(
        engine.recover().unwrap().streams.is_empty(),
        "the deleted stream stays deleted"
    );
}

#[tokio::test]
async fn retention_that_checked_a_snapshot_deleted_since_does_not_move() {
    let engine: SharedEngine = Arc::new(MemoryEngine::new());
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("t")).await.unwrap();
    service.append("t", text("a")).await.unwrap();
    let at = service.append("t", text("b")).await.unwrap().tail;
    let snapshot = |service: Arc<StreamService>| async move {
        let blob = Bytes::from_static(b"ab");
        let at = Position::Offset(at);
        service
            .publish_snapshot("t", at, "text/plain".into(), blob, None)
            .await
    };
    snapshot(service.clone()).await.unwrap();
    // `set_retention` found the snapshot at `at`; before it moved retention there, the snapshot
    // was deleted (retention was still at the start, so the delete was allowed).
    let stream = service.find("t", false).await.unwrap();
    service.delete_snapshot("t", at).await.unwrap();
    let moved = service
        .move_retention(&stream, at, RetentionMove::KeepSnapshot)
        .await;
    assert!(matches!(moved, Err(StreamError::Conflict(_))), "{moved:?}");
    let bootstrap = service.bootstrap("t").await.unwrap();
    assert_eq!(bootstrap.start, Offset::START, "no record was dropped");
    // With the snapshot back, the same move goes through.
    snapshot(service.clone()).await.unwrap();
    service
        .move_retention(&stream, at, RetentionMove::KeepSnapshot)
        .await
        .unwrap();
    assert_eq!(service.bootstrap("t").await.unwrap().start, at);
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

/// A service in memory holding one empty `text/plain` stream, `s`: where many tests start.
pub(crate) async fn one_text_stream() -> (Arc<StreamService>, Arc<Stream>) {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let stream = service.find("s", false).await.unwrap();
    (service, stream)
}

/// What a live reader of the Durable Streams view rendered for the records from `start` to the
/// tail, to share.
async fn frame_from(
    service: &StreamService,
    stream: &Arc<Stream>,
    start: Offset,
) -> (LiveFrame, ReadLease) {
    frame_of(FrameView::DurableStreams, service, stream, start).await
}

async fn frame_of(
    view: FrameView,
    service: &StreamService,
    stream: &Arc<Stream>,
    start: Offset,
) -> (LiveFrame, ReadLease) {
    let chunk = service.read_at(stream, start, None).await.unwrap();
    assert!(chunk.up_to_date);
    let frame = LiveFrame {
        view,
        start,
        next: chunk.next,
        closed: chunk.closed,
        bytes: Bytes::from_static(b"rendered"),
        records_len: 4,
        tag: 7,
    };
    (frame, chunk.lease)
}

const DS: FrameView = FrameView::DurableStreams;

#[tokio::test]
async fn a_shared_frame_serves_readers_at_its_start_only_while_it_reaches_the_tail() {
    let (service, stream) = one_text_stream().await;
    let _readers = [0, 1].map(|_| service.watch_tail(&stream, Duration::from_secs(60), None));
    service.append("s", text("a")).await.unwrap();
    let (frame, mut lease) = frame_from(&service, &stream, Offset::START).await;
    let next = frame.next;
    stream.share_frame(frame, &mut lease);
    let shared = stream.shared_frame(&DS, 0).expect("shared");
    assert_eq!(
        (shared.next, shared.tag, &shared.bytes[..]),
        (next, 7, &b"rendered"[..])
    );
    assert!(
        stream.shared_frame(&DS, next.seq).is_none(),
        "a reader elsewhere reads for itself"
    );

    service.append("s", text("b")).await.unwrap();
    assert!(
        stream.shared_frame(&DS, 0).is_none(),
        "once the tail moves, the frame would leave out a record"
    );
    let (frame, mut lease) = frame_from(&service, &stream, Offset::START).await;
    stream.share_frame(frame, &mut lease);
    let close = AppendRequest {
        close: true,
        ..Default::default()
    };
    service.append("s", close).await.unwrap();
    assert!(
        stream.shared_frame(&DS, 0).is_none(),
        "once the stream closes, the frame would not say so"
    );
}

#[tokio::test]
async fn a_shared_frame_serves_only_readers_rendering_the_same_view() {
    let (service, stream) = one_text_stream().await;
    let _readers = [0, 1].map(|_| service.watch_tail(&stream, Duration::from_secs(60), None));
    service.append("s", text("a")).await.unwrap();
    let here = FrameView::StreamLd("http://here".into());
    let (frame, mut lease) = frame_of(here.clone(), &service, &stream, Offset::START).await;
    stream.share_frame(frame, &mut lease);
    assert!(stream.shared_frame(&here, 0).is_some());
    assert!(
        stream.shared_frame(&DS, 0).is_none(),
        "Durable Streams readers render otherwise"
    );
    let there = FrameView::StreamLd("http://there".into());
    assert!(
        stream.shared_frame(&there, 0).is_none(),
        "its events name the stream under another origin"
    );
    let (frame, mut lease) = frame_from(&service, &stream, Offset::START).await;
    stream.share_frame(frame, &mut lease);
    assert!(
        stream.shared_frame(&here, 0).is_some() && stream.shared_frame(&DS, 0).is_some(),
        "each view keeps its own frame"
    );
}

/// Leaves a body for the records a catch-up read of `stream` from `start` returns now, as a
/// face would after rendering them.
async fn share_read(
    service: &StreamService,
    stream: &Arc<Stream>,
    start: Offset,
) -> Arc<SharedBody> {
    let chunk = service.read_history_at(stream, start, None).await.unwrap();
    let range = BodyRange {
        start: chunk.start,
        next: chunk.next,
        short_of_tail: !chunk.up_to_date,
        first_shown: start.seq,
    };
    let pieces = chunk.records.iter().map(|r| r.body.clone()).collect();
    let body = Arc::new(SharedBody::new(range, pieces, chunk.lease));
    service.share_body(stream, ReadView::Canonical, body.clone());
    body
}

const CANONICAL: ReadView = ReadView::Canonical;

#[tokio::test]
async fn a_shared_body_that_reached_the_tail_is_taken_only_until_the_tail_moves() {
    let (service, stream) = one_text_stream().await;
    service.append("s", text("a")).await.unwrap();
    share_read(&service, &stream, Offset::START).await;
    let shared = service
        .shared_body(&stream, Offset::START, CANONICAL)
        .expect("the body is current");
    assert!(shared.up_to_date && !shared.closed);
    assert_eq!(&shared.body.pieces()[..], [Bytes::from_static(b"a")]);
    let elsewhere = shared.body.range.next;
    assert!(service.shared_body(&stream, elsewhere, CANONICAL).is_none());
    let records = ReadView::Records(crate::model::records::RecordView::Values);
    assert!(
        service
            .shared_body(&stream, Offset::START, records)
            .is_none(),
        "a body rendered in one view is not another's"
    );

    service.append("s", text("b")).await.unwrap();
    assert!(
        service
            .shared_body(&stream, Offset::START, CANONICAL)
            .is_none(),
        "once the tail moves, the body would leave out a record"
    );
    assert_eq!(service.shared_body_bytes(), 0, "a stale body is let go");
}

#[tokio::test]
async fn a_shared_body_is_not_taken_once_retention_passes_its_start() {
    let (service, stream) = one_text_stream().await;
    for body in ["a", "b"] {
        service.append("s", text(body)).await.unwrap();
    }
    share_read(&service, &stream, Offset::START).await;
    assert!(
        service
            .shared_body(&stream, Offset::START, CANONICAL)
            .is_some()
    );
    service
        .move_retention(&stream, Offset::new(1, 1), RetentionMove::Trim(1))
        .await
        .unwrap();
    assert!(
        service
            .shared_body(&stream, Offset::START, CANONICAL)
            .is_none(),
        "a fresh read from there is refused as retained"
    );
    assert_eq!(service.shared_body_bytes(), 0, "and never will be again");
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

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_shared_body_moves_into_a_file_once_a_second_reader_comes() {
    use crate::storage::file_bytes::is_file_backed;
    let (service, stream) = one_text_stream().await;
    let record = "x".repeat(20_000);
    service.append("s", text(&record)).await.unwrap();
    let body = share_read(&service, &stream, Offset::START).await;
    assert!(
        !is_file_backed(&body.pieces()[0]),
        "the reader that rendered it sends it as it is"
    );
    let shared = service
        .shared_body(&stream, Offset::START, CANONICAL)
        .unwrap();
    let pieces = shared.body.pieces_for_another_reader();
    assert!(
        is_file_backed(&pieces[0]),
        "the next ones send it from a file"
    );
    assert_eq!(pieces.concat(), record.as_bytes());
    assert_eq!(
        shared.body.pieces_for_another_reader()[0].as_ptr(),
        pieces[0].as_ptr(),
        "moved once"
    );
}

#[tokio::test]
async fn a_shared_body_that_stopped_short_of_the_tail_stays_as_the_stream_grows() {
    let config = ServiceConfig {
        catch_up_read_bytes: 100,
        ..ServiceConfig::default()
    };
    let service = StreamService::open(Arc::new(MemoryEngine::new()), config).unwrap();
    service.create(create_text("s")).await.unwrap();
    let stream = service.find("s", false).await.unwrap();
    for _ in 0..3 {
        service.append("s", text(&"x".repeat(60))).await.unwrap();
    }
    share_read(&service, &stream, Offset::START).await;
    service.append("s", text("more")).await.unwrap();
    let shared = service
        .shared_body(&stream, Offset::START, CANONICAL)
        .expect("a full body shows the same records however the stream grows");
    assert!(!shared.up_to_date && shared.body.range.short_of_tail);
    assert_eq!(
        shared.body.range.next.seq, 1,
        "100 bytes hold one record of 60"
    );
}

#[tokio::test]
async fn a_shared_body_says_the_stream_closed_once_it_is() {
    let (service, stream) = one_text_stream().await;
    service.append("s", text("a")).await.unwrap();
    share_read(&service, &stream, Offset::START).await;
    let tail = stream.durable().tail;
    let close = AppendRequest {
        close: true,
        ..Default::default()
    };
    service.append("s", close).await.unwrap();
    assert_eq!(stream.durable().tail, tail, "closing adds no record");
    let shared = service
        .shared_body(&stream, Offset::START, CANONICAL)
        .expect("the records are the same");
    assert!(shared.up_to_date && shared.closed);
}

#[tokio::test]
async fn a_frame_is_shared_only_while_more_than_one_live_reader_waits() {
    let (service, stream) = one_text_stream().await;
    service.append("s", text("a")).await.unwrap();
    let first = service.watch_tail(&stream, Duration::from_secs(60), None);
    let (frame, mut lease) = frame_from(&service, &stream, Offset::START).await;
    stream.share_frame(frame, &mut lease);
    assert!(
        stream.shared_frame(&DS, 0).is_none(),
        "a lone reader keeps nothing"
    );
    assert_eq!(
        lease.bytes(),
        9,
        "and the read keeps its lease (8 bytes a record)"
    );

    let second = service.watch_tail(&stream, Duration::from_secs(60), None);
    let (frame, mut lease) = frame_from(&service, &stream, Offset::START).await;
    stream.share_frame(frame, &mut lease);
    assert_eq!(lease.bytes(), 0, "the shared frame holds the lease now");
    assert!(stream.shared_frame(&DS, 0).is_some());
    drop(first);
    let held = service.read_memory_held();
    drop(second);
    assert!(
        service.read_memory_held() < held,
        "the last reader to leave drops the frame and the read memory it held"
    );
}

#[tokio::test]
async fn a_shared_frame_is_not_given_to_a_reader_below_a_retention_move() {
    let (service, stream) = one_text_stream().await;
    service.append("s", text("a")).await.unwrap();
    let at = service.append("s", text("b")).await.unwrap().tail;
    let _readers = [0, 1].map(|_| service.watch_tail(&stream, Duration::from_secs(60), None));
    let (frame, mut lease) = frame_from(&service, &stream, Offset::START).await;
    stream.share_frame(frame, &mut lease);
    assert!(stream.shared_frame(&DS, 0).is_some());
    let blob = Bytes::from_static(b"ab");
    let snapshot_at = Position::Offset(at);
    service
        .publish_snapshot("s", snapshot_at, "text/plain".into(), blob, None)
        .await
        .unwrap();
    service
        .move_retention(&stream, at, RetentionMove::KeepSnapshot)
        .await
        .unwrap();
    assert!(
        stream.shared_frame(&DS, 0).is_none(),
        "a reader there is told its records are gone, as a read of its own would be"
    );
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
async fn a_listing_page_goes_on_past_streams_it_does_not_show() {
    let (service, _) = one_text_stream().await;
    service.create_bucket("pages", None, None).await.unwrap();
    for name in ["a", "b", "c", "d"] {
        service
            .create(create_text(&format!("/pages/{name}")))
            .await
            .unwrap();
    }
    // Deleted while a fork reads through it: kept, but not listed.
    let fork = CreateRequest {
        fork: Some(ForkRequest {
            source: "/pages/b".into(),
            offset: None,
            sub_offset: 0,
        }),
        ..create_text("s-fork")
    };
    service.create(fork).await.unwrap();
    service.delete("/pages/b").await.unwrap();
    let page = |after: Option<&'static str>| {
        let listing = service
            .list_streams("pages", "", after, 1, |_| true)
            .unwrap();
        let ids: Vec<String> = listing.streams.into_iter().map(|s| s.stream_id).collect();
        (ids, listing.has_more)
    };
    assert_eq!(page(None), (vec!["a".to_string()], true));
    assert_eq!(page(Some("a")), (vec!["c".to_string()], true));
    assert_eq!(page(Some("c")), (vec!["d".to_string()], false));
}

/// A memory engine whose commits wait for the test's gate and, once `fail` is set, fail as a
/// storage whose write failed does.
struct FailingCommits {
    inner: MemoryEngine,
    gate: Arc<Semaphore>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl Wrapping for FailingCommits {
    fn inner(&self) -> &dyn Engine {
        &self.inner
    }

    fn on_commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        let failing = self.fail.load(std::sync::atomic::Ordering::SeqCst);
        let commit = (!failing).then(|| self.inner.commit(changes));
        let gate = self.gate.clone();
        async move {
            gate.acquire()
                .await
                .map_err(|_| StorageError::Failed)?
                .forget();
            match commit {
                Some(commit) => commit.await,
                None => Err(StorageError::Io("the disk went away".into())),
            }
        }
        .boxed()
    }
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
async fn a_metadata_change_whose_write_fails_is_shown_to_no_reader() {
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let engine = FailingCommits {
        inner: MemoryEngine::new(),
        gate: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
        fail: fail.clone(),
    };
    let service = StreamService::open(Arc::new(engine), ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let attrs = |n: i64| serde_json::json!({ "n": n }).as_object().cloned();
    service.set_attrs("s", attrs(1)).await.unwrap();
    assert_eq!(service.attrs("s").await.unwrap(), attrs(1));
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(service.append("s", text("lost")).await.is_err());
    assert_eq!(
        service.attrs("s").await.unwrap(),
        attrs(1),
        "a failed append leaves the metadata as it was, and shown"
    );
    let refused = service.set_attrs("s", attrs(2)).await;
    assert!(
        matches!(refused, Err(StreamError::Storage(_))),
        "{refused:?}"
    );
    let read = service.attrs("s").await;
    assert!(
        matches!(read, Err(StreamError::Storage(_))),
        "a change that may not be on disk is not shown as the stream's: {read:?}"
    );
    let stream = service.find("s", false).await.unwrap();
    assert!(
        matches!(
            service.replicated_state(&stream),
            Err(StreamError::Storage(_))
        ),
        "nor sent to mirrors"
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

fn mirrored_state(retained_from: Offset, tail: Offset, snapshot: bool) -> ReplicatedState {
    ReplicatedState {
        content_type: "text/plain".into(),
        closed: false,
        attrs: None,
        ttl_secs: None,
        expires_at_ms: None,
        retained_from,
        tail,
        snapshot: snapshot.then(|| crate::model::stream::SnapshotInfo {
            offset: retained_from,
            content_type: "application/json".into(),
            digest: "digest".into(),
        }),
        created_ms: 0,
        cipher: None,
        key_fingerprint: None,
    }
}

#[tokio::test]
async fn a_mirror_rebuild_keeps_the_old_stream_readable_until_the_new_one_is_durable() {
    let gate = Arc::new(Semaphore::new(2)); // the mirror's creation and its first records
    let engine = Arc::new(GatedEngine::new(gate.clone()));
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    let upstream = "http://upstream:1";
    let first = mirrored_state(Offset::START, Offset::START, false);
    let old = service
        .mirror_stream("m", upstream, &first, None)
        .await
        .unwrap();
    let records =
        crate::model::record::lay_out(Offset::START, 1, vec![Bytes::from("ab"), Bytes::from("cd")]);
    let old_tail = records[1].next_offset();
    service.mirror_records(&old, records).await.unwrap();

    // The upstream trimmed past the mirror: it starts over at the retained start, snapshot first.
    let retained = Offset::new(7, 40);
    let rebuilt = mirrored_state(retained, retained, true);
    let rebuild = {
        let service = service.clone();
        let rebuilt = rebuilt.clone();
        tokio::spawn(async move {
            service
                .mirror_rebuild("m", upstream, &rebuilt, Some(Bytes::from("{}")))
                .await
        })
    };
    // Its commit is written but not yet durable.
    let stored_ids = || {
        let recovered = engine.inner.recover().unwrap();
        recovered.streams.iter().map(|s| s.id).collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while stored_ids().contains(&old.id) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "rebuild never committed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let found = service.find("m", false).await.unwrap();
    assert!(
        Arc::ptr_eq(&found, &old),
        "the old stream is still the one found"
    );
    let chunk = service.read_at(&found, Offset::START, None).await.unwrap();
    assert_eq!(
        (chunk.records.len(), found.durable().tail),
        (2, old_tail),
        "and still whole"
    );

    gate.add_permits(1);
    let new = rebuild.await.unwrap().unwrap();
    assert!(
        old.durable().removed,
        "readers of the old stream are told it is gone"
    );
    let found = service.find("m", false).await.unwrap();
    assert!(Arc::ptr_eq(&found, &new));
    let durable = new.durable();
    assert_eq!((durable.first, durable.tail), (retained, retained));
    assert!(service.has_snapshot(&new, rebuilt.snapshot.as_ref().unwrap()));
    assert_eq!(
        engine.inner.read_snapshot(new.id).await.unwrap().as_deref(),
        Some(&b"{}"[..])
    );
    assert_eq!(stored_ids(), vec![new.id], "one stream stored, the new one");
}

#[tokio::test]
async fn a_new_mirror_is_made_in_one_commit_at_the_upstreams_retained_start_with_its_snapshot() {
    let gate = Arc::new(Semaphore::new(1)); // one commit, no more
    let engine = Arc::new(GatedEngine::new(gate.clone()));
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    let retained = Offset::new(7, 40);
    let state = mirrored_state(retained, Offset::new(9, 50), true);
    let made = tokio::time::timeout(
        Duration::from_secs(5),
        service.mirror_stream("m", "http://upstream:1", &state, Some(Bytes::from("{}"))),
    )
    .await
    .expect("made in one commit")
    .unwrap();
    let durable = made.durable();
    assert_eq!((durable.first, durable.tail), (retained, retained));
    assert!(!durable.closed, "closed only once every record is here");
    assert!(service.has_snapshot(&made, state.snapshot.as_ref().unwrap()));
    assert_eq!(
        engine
            .inner
            .read_snapshot(made.id)
            .await
            .unwrap()
            .as_deref(),
        Some(&b"{}"[..])
    );
    let resolved = service.resolve(&made, ReadFrom::At(Offset::START)).await;
    assert!(
        matches!(resolved, Err(StreamError::Retained { first }) if first == retained),
        "offsets before the upstream's retained start are gone here too"
    );
}

#[tokio::test]
async fn a_stream_with_delete_on_empty_goes_once_it_has_been_empty_for_its_min_age() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create_bucket("empties", None, None).await.unwrap();
    let config = serde_json::json!({"delete_on_empty": {"min_age_secs": 1}});
    for name in ["emptied", "unwritten", "written"] {
        service
            .create_s2_stream("empties", name, Some(config.clone()), None)
            .await
            .unwrap();
    }
    let one = || {
        S2Append {
            records: vec![S2Record {
                timestamp: None,
                headers: Vec::new(),
                body: Bytes::from_static(b"r"),
            }],
            match_seq_num: None,
            fencing_token: None,
        }
        .check()
        .unwrap()
    };
    let emptied = service.find("/empties/emptied", false).await.unwrap();
    let written = service.find("/empties/written", false).await.unwrap();
    service.s2_append(&written, one(), None).await.unwrap();
    service.s2_append(&emptied, one(), None).await.unwrap();
    service.trim(&emptied, 1).await.unwrap();
    let present = |name: &'static str| {
        let service = service.clone();
        async move {
            service
                .find(&format!("/empties/{name}"), false)
                .await
                .is_ok()
        }
    };

    service.enforce_s2_configs().await;
    assert!(present("emptied").await, "found empty just now");
    assert!(present("unwritten").await, "created just now");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Written to and emptied again meanwhile: the wait starts over.
    service.s2_append(&emptied, one(), None).await.unwrap();
    service.trim(&emptied, 2).await.unwrap();
    service.enforce_s2_configs().await;
    assert!(present("emptied").await, "an append starts the wait over");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    service.enforce_s2_configs().await;
    assert!(!present("emptied").await, "empty for its min_age: deleted");
    assert!(
        !present("unwritten").await,
        "never written, created over its min_age ago: deleted"
    );
    assert!(present("written").await, "holds a record");
}

#[tokio::test]
async fn a_removal_whose_reason_no_longer_holds_under_the_stream_lock_removes_nothing() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let stream = service.find("s", false).await.unwrap();
    let seen = stream.lock().meta.tail.seq;
    // Appended after a background pass looked, before it removes.
    service.append("s", text("late")).await.unwrap();
    let unchanged = |state: &State| state.meta.tail.seq == seen;
    assert!(
        service
            .remove_if(&stream, unchanged)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        service.find("s", false).await.is_ok(),
        "kept, with its append"
    );
    let now = stream.lock().meta.tail.seq;
    let removed = service
        .remove_if(&stream, |state| state.meta.tail.seq == now)
        .await
        .unwrap();
    assert!(matches!(removed, Some(Removal::Hard)));
    assert!(service.find("s", false).await.is_err());
}

#[tokio::test]
async fn a_bucket_watch_that_fell_behind_is_given_the_whole_bucket_then_arrivals_again() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create_bucket("watched", None, None).await.unwrap();
    service.create_bucket("other", None, None).await.unwrap();
    let mut watch = service.streams_appearing_in("watched");
    service
        .create_s2_stream("other", "elsewhere", None, None)
        .await
        .unwrap();
    service
        .create_s2_stream("watched", "first", None, None)
        .await
        .unwrap();
    let appeared = watch.next(&service).await.unwrap();
    let names: Vec<&str> = appeared.iter().map(|a| &*a.name).collect();
    assert_eq!(
        names,
        ["/watched/first"],
        "streams of other buckets are skipped"
    );

    // More arrivals than the watch keeps while nobody reads it: it lagged.
    let missed = replication::APPEARED_BACKLOG + 5;
    for i in 0..missed {
        service
            .create_s2_stream("watched", &format!("s{i}"), None, None)
            .await
            .unwrap();
    }
    service
        .create_s2_stream("other", "elsewhere-too", None, None)
        .await
        .unwrap();
    let appeared = watch.next(&service).await.unwrap();
    assert_eq!(appeared.len(), missed + 1, "every stream the bucket holds");
    assert!(appeared.iter().all(|a| a.name.starts_with("/watched/")));

    service
        .create_s2_stream("watched", "after", None, None)
        .await
        .unwrap();
    let next = watch.next(&service).await.unwrap();
    let names: Vec<&str> = next.iter().map(|a| &*a.name).collect();
    assert_eq!(
        names,
        ["/watched/after"],
        "one arrival at a time again, none of the missed ones twice"
    );
}

#[tokio::test]
async fn a_change_to_a_stream_deleted_since_it_was_found_does_not_bring_it_back() {
    let engine: SharedEngine = Arc::new(MemoryEngine::new());
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("doomed")).await.unwrap();
    service.append("doomed", text("record")).await.unwrap();
    // Found by a request that a deletion then overtakes before it takes the stream's lock.
    let found = service.find("doomed", false).await.unwrap();
    service.delete("doomed").await.unwrap();

    assert!(matches!(
        service.s2_append(&found, plain_records(1), None).await,
        Err(StreamError::NotFound)
    ));
    assert!(matches!(
        service
            .move_retention(&found, Offset::new(1, 6), RetentionMove::Trim(6))
            .await,
        Err(StreamError::NotFound)
    ));
    let reopened = StreamService::open(engine, ServiceConfig::default()).unwrap();
    assert!(
        matches!(
            reopened.find("doomed", false).await,
            Err(StreamError::NotFound)
        ),
        "deleted for good, after a restart too"
    );
}

#[tokio::test]
async fn a_fork_chain_stops_at_its_bound_and_deleting_it_whole_cascades_to_the_root() {
    let engine: SharedEngine = Arc::new(MemoryEngine::new());
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("c0")).await.unwrap();
    service.append("c0", text("root")).await.unwrap();
    let fork_of = |n: usize| CreateRequest {
        fork: Some(ForkRequest {
            source: format!("c{}", n - 1),
            offset: None,
            sub_offset: 0,
        }),
        ..create_text(&format!("c{n}"))
    };
    for n in 1..fork::MAX_FORK_CHAIN {
        service.create(fork_of(n)).await.unwrap();
    }
    let refused = service.create(fork_of(fork::MAX_FORK_CHAIN)).await;
    assert!(
        matches!(&refused, Err(StreamError::BadRequest(m)) if m.contains("fork chain")),
        "{refused:?}"
    );
    assert!(matches!(
        service
            .find(&format!("c{}", fork::MAX_FORK_CHAIN), false)
            .await,
        Err(StreamError::NotFound)
    ));

    // Every stream but the last is kept by its fork: soft deletes, then one cascade.
    for n in 0..fork::MAX_FORK_CHAIN {
        service.delete(&format!("c{n}")).await.unwrap();
    }
    assert_eq!(service.counts().0, 0, "the whole chain is gone");
    let reopened = StreamService::open(engine, ServiceConfig::default()).unwrap();
    assert_eq!(reopened.counts().0, 0, "after a restart too");
}

/// Every record of `stream` a reader gets from its start, following `next` until up to date.
async fn read_whole(service: &StreamService, stream: &Arc<Stream>) -> Vec<String> {
    let mut at = service.resolve(stream, ReadFrom::Start).await.unwrap();
    let mut bodies = Vec::new();
    loop {
        let chunk = service.read_at(stream, at, None).await.unwrap();
        bodies.extend(
            chunk
                .records
                .iter()
                .map(|r| String::from_utf8_lossy(&r.body).into_owned()),
        );
        at = chunk.next;
        if chunk.up_to_date {
            return bodies;
        }
    }
}

/// A source of 10 records trimmed to 8 while a fork held them back, then the fork's removal
/// committed and the service stopped before it deleted them (a crash). Returns the source's id.
async fn crash_after_a_fork_holding_records_back_went(engine: SharedEngine) -> StreamId {
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("src")).await.unwrap();
    for i in 0..10 {
        service
            .append("src", text(&format!("s{i};")))
            .await
            .unwrap();
    }
    let fork = CreateRequest {
        fork: Some(ForkRequest {
            source: "src".into(),
            offset: None,
            sub_offset: 0,
        }),
        ..create_text("fork")
    };
    service.create(fork).await.unwrap();
    let src = service.find("src", false).await.unwrap();
    service.trim(&src, 8).await.unwrap();
    let fork = service.find("fork", false).await.unwrap();
    engine
        .commit(vec![Change::RemoveStream(fork.id)])
        .await
        .unwrap();
    assert_eq!(
        engine.read(src.id, 0, 8, usize::MAX).await.unwrap().len(),
        8,
        "held back"
    );
    src.id
}

/// Waits (at most 5 s) until the engine holds none of stream `id`'s records below `before`.
async fn until_deleted(engine: &SharedEngine, id: StreamId, before: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !engine
        .read(id, 0, before, usize::MAX)
        .await
        .unwrap()
        .is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "records below {before} still held 5 s after the restart"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn records_a_fork_held_back_are_deleted_at_restart_if_it_went_before_their_deletion() {
    let engine: SharedEngine = Arc::new(MemoryEngine::new());
    let src = crash_after_a_fork_holding_records_back_went(engine.clone()).await;
    let reopened = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    let stream = reopened.find("src", false).await.unwrap();
    assert_eq!(read_whole(&reopened, &stream).await, ["s8;", "s9;"]);
    until_deleted(&engine, src, 8).await;

    // The same on disk, across a real reopen of the engine.
    use crate::storage::{FjallEngine, SyncMode};
    let dir = tempfile::tempdir().unwrap();
    let open =
        || -> SharedEngine { Arc::new(FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap()) };
    let src = crash_after_a_fork_holding_records_back_went(open()).await;
    let engine = open();
    let reopened = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    let stream = reopened.find("src", false).await.unwrap();
    assert_eq!(read_whole(&reopened, &stream).await, ["s8;", "s9;"]);
    until_deleted(&engine, src, 8).await;
}

#[tokio::test]
async fn a_fork_keeps_its_history_when_its_source_trims_past_the_fork_point() {
    let engine: SharedEngine = Arc::new(MemoryEngine::new());
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("src")).await.unwrap();
    let mut fork_at = Offset::START;
    for i in 0..10 {
        let ack = service
            .append("src", text(&format!("s{i};")))
            .await
            .unwrap();
        if i == 4 {
            fork_at = ack.tail;
        }
    }
    let fork = CreateRequest {
        fork: Some(ForkRequest {
            source: "src".into(),
            offset: Some(fork_at),
            sub_offset: 0,
        }),
        ..create_text("fork")
    };
    service.create(fork).await.unwrap();
    for i in 0..3 {
        service
            .append("fork", text(&format!("f{i};")))
            .await
            .unwrap();
    }
    let src = service.find("src", false).await.unwrap();
    service.trim(&src, 8).await.unwrap();

    let expected = ["s0;", "s1;", "s2;", "s3;", "s4;", "f0;", "f1;", "f2;"];
    for service in [
        service.clone(),
        StreamService::open(engine.clone(), ServiceConfig::default()).unwrap(),
    ] {
        let src = service.find("src", false).await.unwrap();
        let fork = service.find("fork", false).await.unwrap();
        assert_eq!(read_whole(&service, &fork).await, expected);
        assert_eq!(read_whole(&service, &src).await, ["s8;", "s9;"]);
        assert!(matches!(
            service.read_at(&src, Offset::START, None).await,
            Err(StreamError::Retained { first }) if first.seq == 8
        ));
    }

    // Once the fork is gone, nothing holds the trimmed records any more.
    assert_eq!(
        engine.read(src.id, 0, 8, usize::MAX).await.unwrap().len(),
        8
    );
    service.delete("fork").await.unwrap();
    assert!(
        engine
            .read(src.id, 0, 8, usize::MAX)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(read_whole(&service, &src).await, ["s8;", "s9;"]);
}

#[tokio::test]
async fn a_fork_cannot_start_in_trimmed_history_and_starts_where_its_source_does() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create(create_text("src")).await.unwrap();
    let mut offsets = Vec::new();
    for i in 0..6 {
        offsets.push(
            service
                .append("src", text(&format!("s{i};")))
                .await
                .unwrap()
                .tail,
        );
    }
    let src = service.find("src", false).await.unwrap();
    service.trim(&src, 3).await.unwrap();
    let fork_at = |name: &str, at: Offset| CreateRequest {
        fork: Some(ForkRequest {
            source: "src".into(),
            offset: Some(at),
            sub_offset: 0,
        }),
        ..create_text(name)
    };
    let refused = service.create(fork_at("early", offsets[0])).await;
    assert!(
        matches!(refused, Err(StreamError::Retained { first }) if first == offsets[2]),
        "{refused:?}"
    );
    service.create(fork_at("late", offsets[4])).await.unwrap();
    let late = service.find("late", false).await.unwrap();
    assert_eq!(
        service.resolve(&late, ReadFrom::Start).await.unwrap(),
        offsets[2],
        "the fork's history starts where its source's does"
    );
    assert_eq!(read_whole(&service, &late).await, ["s3;", "s4;"]);
}

#[tokio::test]
async fn only_accepted_reads_and_appends_renew_a_ttl() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    let with_ttl = |name: &str| CreateRequest {
        ttl_secs: Some(1),
        ..create_text(name)
    };
    service.create(with_ttl("rejected")).await.unwrap();
    service.create(with_ttl("accepted")).await.unwrap();
    service.create(with_ttl("snapshot-refused")).await.unwrap();
    let publish = |blob: &'static [u8]| {
        service.publish_snapshot(
            "snapshot-refused",
            Position::Offset(Offset::START),
            "text/plain".into(),
            Bytes::from_static(blob),
            None,
        )
    };
    publish(b"first").await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let wrong_type = AppendRequest {
        content_type: Some("application/json"),
        ..text("{}")
    };
    assert!(matches!(
        service.append("rejected", wrong_type).await,
        Err(StreamError::ContentTypeMismatch)
    ));
    assert!(matches!(
        publish(b"another").await,
        Err(StreamError::Conflict(_))
    ));
    service.append("accepted", text("kept")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        matches!(
            service.find("rejected", false).await,
            Err(StreamError::NotFound)
        ),
        "a refused append does not keep the stream alive"
    );
    assert!(
        matches!(
            service.find("snapshot-refused", false).await,
            Err(StreamError::NotFound)
        ),
        "nor does a refused snapshot"
    );
    service.find("accepted", false).await.unwrap();
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
async fn readers_see_a_new_snapshot_only_once_it_is_durable_and_only_with_its_own_blob() {
    let gate = Arc::new(Semaphore::new(3)); // the create, one append, the first snapshot
    let engine = Arc::new(GatedEngine::held(gate.clone()));
    let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let tail = service.append("s", text("one")).await.unwrap().tail;
    let publish = |at: Offset, blob: &'static [u8]| {
        let service = service.clone();
        async move {
            service
                .publish_snapshot(
                    "s",
                    Position::Offset(at),
                    "text/plain".into(),
                    Bytes::from_static(blob),
                    None,
                )
                .await
        }
    };
    publish(Offset::START, b"old").await.unwrap();

    // The second snapshot is submitted; its commit (blob and description) is held.
    let stream = service.find("s", false).await.unwrap();
    let submitted = stream.lock().meta_submitted;
    let second = tokio::spawn(publish(tail, b"new"));
    while stream.lock().meta_submitted == submitted {
        tokio::task::yield_now().await;
    }
    let bootstrap = {
        let service = service.clone();
        tokio::spawn(async move { service.bootstrap("s").await })
    };
    let head = {
        let service = service.clone();
        tokio::spawn(async move { service.head("s").await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !bootstrap.is_finished() && !head.is_finished(),
        "readers wait for the snapshot they would describe"
    );

    gate.add_permits(1);
    second.await.unwrap().unwrap();
    let Bootstrap { snapshot, .. } = bootstrap.await.unwrap().unwrap();
    let (info, blob) = snapshot.unwrap();
    assert_eq!((info.offset, blob.as_ref()), (tail, b"new".as_ref()));
    let (_, info) = head.await.unwrap().unwrap();
    assert_eq!(info.snapshot.unwrap().offset, tail);
}

/// An S2 batch of `n` plain records.
fn plain_records(n: usize) -> CheckedAppend {
    S2Append {
        records: (0..n)
            .map(|_| S2Record {
                timestamp: None,
                headers: Vec::new(),
                body: Bytes::from_static(b"r"),
            })
            .collect(),
        match_seq_num: None,
        fencing_token: None,
    }
    .check()
    .unwrap()
}

#[test]
fn a_trim_command_stored_before_a_crash_takes_effect_after_it() {
    let engine = Arc::new(MemoryEngine::new());
    // The first life ends (its runtime dropped, with the task that would apply the trim) once
    // the trim command's record is committed.
    let first_life = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    first_life.block_on(async {
        let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
        service.create_bucket("basin", None, None).await.unwrap();
        service
            .create_s2_stream("basin", "s", None, None)
            .await
            .unwrap();
        let stream = service.find("/basin/s", false).await.unwrap();
        service
            .s2_append(&stream, plain_records(4), None)
            .await
            .unwrap();
        let trim = S2Append {
            records: vec![S2Record {
                timestamp: None,
                headers: vec![(Bytes::new(), Bytes::from_static(b"trim"))],
                body: Bytes::copy_from_slice(&3u64.to_be_bytes()),
            }],
            match_seq_num: None,
            fencing_token: None,
        }
        .check()
        .unwrap();
        let _unawaited = service.s2_sequence(&stream, trim, None).await.unwrap();
    });
    drop(first_life);

    let second_life = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second_life.block_on(async {
        let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
        let stream = service.find("/basin/s", false).await.unwrap();
        assert_eq!(stream.durable().tail.seq, 5, "the trim record is durable");
        service.settle_pending_trims().await;
        assert_eq!(stream.durable().first.seq, 3, "and so is its effect");
        assert_eq!(stream.lock().meta.extra().pending_trim, None);
    });
}

#[tokio::test]
async fn a_basin_delete_cut_short_is_finished_at_the_next_start_and_takes_no_new_streams() {
    let engine = Arc::new(MemoryEngine::new());
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create_bucket("doomed", None, None).await.unwrap();
    for name in ["a", "b", "c"] {
        service
            .create_s2_stream("doomed", name, None, None)
            .await
            .unwrap();
    }
    // What a crash leaves after the delete's first step: the mark, and every stream still there.
    let meta = BucketMeta {
        created_ms: service.bucket_info("doomed").unwrap().created_ms,
        s2_config: None,
        s2_creation: None,
        deleting: true,
    };
    engine
        .commit(vec![Change::PutBucket("doomed".into(), meta)])
        .await
        .unwrap();
    drop(service);

    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    assert!(matches!(
        service.create(create_text("/doomed/new")).await,
        Err(StreamError::BucketDeleting)
    ));
    service.finish_basin_deletes().await;
    assert!(matches!(
        service.bucket_info("doomed"),
        Err(StreamError::BucketNotFound)
    ));
    let reopened = StreamService::open(engine, ServiceConfig::default()).unwrap();
    assert!(reopened.bucket_info("doomed").is_err());
    assert!(reopened.find("/doomed/a", false).await.is_err());
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

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_fork_keeps_a_copy_of_its_prefix_not_the_file_it_was_read_from() {
    use crate::storage::{FjallEngine, SyncMode, mapped_body_files};
    let dir = tempfile::tempdir().unwrap();
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    let service = StreamService::open(Arc::new(engine), ServiceConfig::default()).unwrap();
    service.create(create_text("src")).await.unwrap();
    let large = AppendRequest {
        body: Bytes::from(vec![b'x'; 4 << 20]),
        ..text("")
    };
    service.append("src", large).await.unwrap();
    // Out of the source's tail cache: the fork reads the record from its staged file.
    service.append("src", text("later")).await.unwrap();
    let fork = CreateRequest {
        fork: Some(ForkRequest {
            source: "src".into(),
            offset: Some(Offset::START),
            sub_offset: 10,
        }),
        ..create_text("fork")
    };
    service.create(fork).await.unwrap();
    let forked = service.find("fork", false).await.unwrap();
    let chunk = service.read_at(&forked, Offset::START, None).await.unwrap();
    assert_eq!(&chunk.records[0].body[..], b"xxxxxxxxxx");
    drop(chunk);
    assert_eq!(
        mapped_body_files(dir.path()),
        0,
        "the fork's tail cache holds its 10 bytes, not the 4 MiB file"
    );
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

/// Counts the record bytes the engine it wraps reads.
#[derive(Default)]
struct CountingReads {
    inner: MemoryEngine,
    bytes: Arc<std::sync::atomic::AtomicUsize>,
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
        let read = self.inner.read(id, from, until, max);
        let bytes = self.bytes.clone();
        async move {
            let records = read.await?;
            let len: usize = records.iter().map(|r| r.body.len()).sum();
            bytes.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
            Ok(records)
        }
        .boxed()
    }
}

fn sub_offset_fork(name: &str, source: &str, sub_offset: u64) -> CreateRequest {
    CreateRequest {
        fork: Some(ForkRequest {
            source: source.into(),
            offset: Some(Offset::START),
            sub_offset,
        }),
        ..create_text(name)
    }
}

#[tokio::test]
async fn a_sub_offset_far_past_its_unit_reads_no_further_than_the_unit() {
    let engine = Arc::new(CountingReads::default());
    let read = engine.bytes.clone();
    let service = StreamService::open(engine, ServiceConfig::default()).unwrap();
    service.create(create_text("src")).await.unwrap();
    service.append("src", text("abc")).await.unwrap();
    let megabyte = "m".repeat(1 << 20);
    for _ in 0..8 {
        service.append("src", text(&megabyte)).await.unwrap();
    }
    read.store(0, std::sync::atomic::Ordering::Relaxed);

    let refused = service
        .create(sub_offset_fork("fork", "src", 1 << 40))
        .await;
    assert!(
        matches!(&refused, Err(StreamError::BadRequest(reason)) if reason.contains("past the next append unit")),
        "{refused:?}"
    );
    let read = read.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        read < (1 << 20) + 1024,
        "{read} bytes read for a unit of 3 bytes and the 1 MiB record after it, of 8 MiB"
    );
}

#[tokio::test]
async fn a_sub_offset_inside_a_later_record_of_a_unit_forks_that_far() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create(create_text("src")).await.unwrap();
    let source = service.find("src", false).await.unwrap();
    let unit = S2Append {
        records: [b"0123456789", b"abcdefghij", b"ABCDEFGHIJ"]
            .iter()
            .map(|body| S2Record {
                timestamp: None,
                headers: Vec::new(),
                body: Bytes::from_static(*body),
            })
            .collect(),
        match_seq_num: None,
        fencing_token: None,
    }
    .check()
    .unwrap();
    service.s2_append(&source, unit, None).await.unwrap();
    service.append("src", text("next unit")).await.unwrap();

    service
        .create(sub_offset_fork("fork", "src", 25))
        .await
        .unwrap();
    let fork = service.find("fork", false).await.unwrap();
    let chunk = service.read_at(&fork, Offset::START, None).await.unwrap();
    let bodies: Vec<&[u8]> = chunk.records.iter().map(|r| &r.body[..]).collect();
    assert_eq!(bodies, [&b"0123456789"[..], b"abcdefghij", b"ABCDE"]);

    let past = service.create(sub_offset_fork("too-far", "src", 31)).await;
    assert!(matches!(past, Err(StreamError::BadRequest(_))), "{past:?}");
}

#[tokio::test]
async fn replicated_records_that_do_not_follow_one_another_are_refused_whole() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    let state = mirrored_state(Offset::START, Offset::START, false);
    let mirror = service
        .mirror_stream("m", "http://upstream:1", &state, None)
        .await
        .unwrap();
    let laid = |bodies: &[&'static str]| {
        let bodies = bodies.iter().map(|b| Bytes::from_static(b.as_bytes()));
        crate::model::record::lay_out(Offset::START, 1, bodies.collect())
    };
    let mut repeated = laid(&["ab", "cd"]);
    repeated[1] = repeated[0].clone();
    let mut skipping = laid(&["ab", "cd", "ef"]);
    skipping.remove(1);
    for broken in [repeated, skipping] {
        assert!(matches!(
            service.mirror_records(&mirror, broken).await,
            Err(StreamError::Conflict(_))
        ));
        assert_eq!(mirror.durable().tail, Offset::START, "nothing applied");
    }
    service
        .mirror_records(&mirror, laid(&["ab", "cd"]))
        .await
        .unwrap();
    assert_eq!(mirror.durable().tail, Offset::new(2, 4));
}

#[tokio::test]
async fn s2_reads_count_against_the_read_memory_and_get_less_of_it_when_others_hold_it() {
    let config = ServiceConfig {
        read_memory_bytes: 2 * read_memory::MIN_LEASE,
        ..ServiceConfig::default()
    };
    let service = StreamService::open(Arc::new(MemoryEngine::new()), config).unwrap();
    service.create(create_text("s")).await.unwrap();
    // Each record counts 8 bytes beside its body: 32 KiB.
    let body = "x".repeat(read_memory::MIN_LEASE / 2 - 8);
    for _ in 0..10 {
        service.append("s", text(&body)).await.unwrap();
    }
    let stream = service.find("s", false).await.unwrap();
    let read = |service: Arc<StreamService>, stream: Arc<Stream>| async move {
        service
            .s2_read(&stream, 0, s2::S2Limits::default(), 1000, 1 << 20)
            .await
            .unwrap()
    };

    let alone = read(service.clone(), stream.clone()).await;
    assert_eq!(alone.records.len(), 4, "the whole read memory, 128 KiB");
    assert_eq!(
        service.read_memory.held(),
        4 * (body.len() + 8),
        "held while the batch is"
    );
    drop(alone);
    assert_eq!(service.read_memory.held(), 0, "given back with it");

    let others = service.read_memory.lease(2 * read_memory::MIN_LEASE);
    let squeezed = read(service.clone(), stream.clone()).await;
    assert_eq!(squeezed.records.len(), 2, "the least any read gets, 64 KiB");
    drop(others);
}

#[tokio::test]
async fn the_expiry_sweep_removes_expired_streams_past_a_batch_of_them_and_only_them() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    let expiring = WALKED_AT_ONCE + 300;
    for n in 0..expiring {
        let request = CreateRequest {
            ttl_secs: Some(1),
            ..create_text(&format!("ttl-{n:05}"))
        };
        service.create(request).await.unwrap();
    }
    for n in 0..20 {
        service
            .create(create_text(&format!("kept-{n}")))
            .await
            .unwrap();
    }
    assert_eq!(service.lock_registry().expiring.len(), expiring);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    service.sweep_expired().await;
    assert_eq!(
        service.counts().0,
        20,
        "only the streams without a TTL are left"
    );
    assert!(service.lock_registry().expiring.is_empty());
}

#[tokio::test]
async fn a_bucket_count_walks_every_stream_of_its_bucket_and_no_other() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    for bucket in ["buck", "buck-2"] {
        service.create_bucket(bucket, None, None).await.unwrap();
    }
    let in_b = 2 * WALKED_AT_ONCE + 5;
    for n in 0..in_b {
        service
            .create(create_text(&format!("/buck/s{n:05}")))
            .await
            .unwrap();
    }
    service.create(create_text("/buck-2/other")).await.unwrap();
    assert_eq!(service.bucket_stream_count("buck", |_| true).unwrap(), in_b);
    assert_eq!(
        service
            .bucket_stream_count("buck", |id| id.ends_with('7'))
            .unwrap(),
        (0..in_b).filter(|n| n % 10 == 7).count()
    );
    assert_eq!(service.bucket_stream_count("buck-2", |_| true).unwrap(), 1);
}
