//! Recovery at start: forks, soft deletes and producers come back as they were, and what a crash
//! left half done (a cascade of deletes, records a fork held back) is finished.

use std::sync::Arc;
use std::time::Duration;

use super::{Wrapping, create_text, read_whole, text};
use crate::model::{Offset, ReadFrom};
use crate::service::{
    AppendRequest, CreateRequest, ForkRequest, ServiceConfig, StreamError, StreamService,
};
use crate::storage::{
    Change, Engine, MemoryEngine, Recovered, SharedEngine, StorageError, StreamId,
};

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
