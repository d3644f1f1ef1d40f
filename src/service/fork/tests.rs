//! Forks: the bound on a fork chain, a fork's history across its source's trims, sub-offsets
//! into an append unit, and the copy a fork keeps of its prefix.

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;

use super::ForkRequest;
use crate::model::ledger::fork::MAX_FORK_CHAIN;
use crate::model::{Offset, ReadFrom, Record};
use crate::service::tests::{Wrapping, create_text, read_whole, text};
use crate::service::{
    AppendRequest, CreateRequest, S2Append, S2Record, ServiceConfig, StreamError, StreamService,
};
use crate::storage::{Engine, MemoryEngine, SharedEngine, StorageError, StreamId};

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
    for n in 1..MAX_FORK_CHAIN {
        service.create(fork_of(n)).await.unwrap();
    }
    let refused = service.create(fork_of(MAX_FORK_CHAIN)).await;
    assert!(
        matches!(&refused, Err(StreamError::BadRequest(m)) if m.contains("fork chain")),
        "{refused:?}"
    );
    assert!(matches!(
        service.find(&format!("c{}", MAX_FORK_CHAIN), false).await,
        Err(StreamError::NotFound)
    ));

    // Every stream but the last is kept by its fork: soft deletes, then one cascade.
    for n in 0..MAX_FORK_CHAIN {
        service.delete(&format!("c{n}")).await.unwrap();
    }
    assert_eq!(service.counts().0, 0, "the whole chain is gone");
    let reopened = StreamService::open(engine, ServiceConfig::default()).unwrap();
    assert_eq!(reopened.counts().0, 0, "after a restart too");
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
    service.append_records(&source, unit, None).await.unwrap();
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
