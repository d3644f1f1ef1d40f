//! S2 rules over Runnel streams: retention by arrival age, trims and trim commands, delete on
//! empty, basin deletes finished after a crash, and reads bounded by the read memory.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{ReadLimits, S2Append, S2Record};
use crate::model::stream::BucketMeta;
use crate::model::{Offset, ReadFrom};
use crate::service::read_memory;
use crate::service::tests::{create_text, plain_records, text};
use crate::service::{ServiceConfig, Stream, StreamError, StreamService};
use crate::storage::{Change, Engine, MemoryEngine};

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
        .create_in_bucket("aging", "s", Some(config), None)
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
    service.append_records(&stream, append, None).await.unwrap();
    service.enforce_s2_configs().await;
    assert_eq!(
        stream.durable().first.seq,
        0,
        "records that arrived just now are an hour from expiry"
    );
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
async fn a_stream_with_delete_on_empty_goes_once_it_has_been_empty_for_its_min_age() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create_bucket("empties", None, None).await.unwrap();
    let config = serde_json::json!({"delete_on_empty": {"min_age_secs": 1}});
    for name in ["emptied", "unwritten", "written"] {
        service
            .create_in_bucket("empties", name, Some(config.clone()), None)
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
    service.append_records(&written, one(), None).await.unwrap();
    service.append_records(&emptied, one(), None).await.unwrap();
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
    service.append_records(&emptied, one(), None).await.unwrap();
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
            .create_in_bucket("basin", "s", None, None)
            .await
            .unwrap();
        let stream = service.find("/basin/s", false).await.unwrap();
        service
            .append_records(&stream, plain_records(4), None)
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
        let _unawaited = service.sequence_records(&stream, trim, None).await.unwrap();
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
            .create_in_bucket("doomed", name, None, None)
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
            .read_records(&stream, 0, ReadLimits::default(), 1000, 1 << 20)
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
