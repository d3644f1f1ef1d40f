//! The mirror side of replication: making and rebuilding a mirror, applying the upstream's
//! records, and watching a bucket for streams that appear in it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;

use super::{APPEARED_BACKLOG, ReplicatedState};
use crate::model::{Offset, ReadFrom};
use crate::service::tests::GatedEngine;
use crate::service::{ServiceConfig, StreamError, StreamService};
use crate::storage::{Engine, MemoryEngine};

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
async fn a_bucket_watch_that_fell_behind_is_given_the_whole_bucket_then_arrivals_again() {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create_bucket("watched", None, None).await.unwrap();
    service.create_bucket("other", None, None).await.unwrap();
    let mut watch = service.streams_appearing_in("watched");
    service
        .create_in_bucket("other", "elsewhere", None, None)
        .await
        .unwrap();
    service
        .create_in_bucket("watched", "first", None, None)
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
    let missed = APPEARED_BACKLOG + 5;
    for i in 0..missed {
        service
            .create_in_bucket("watched", &format!("s{i}"), None, None)
            .await
            .unwrap();
    }
    service
        .create_in_bucket("other", "elsewhere-too", None, None)
        .await
        .unwrap();
    let appeared = watch.next(&service).await.unwrap();
    assert_eq!(appeared.len(), missed + 1, "every stream the bucket holds");
    assert!(appeared.iter().all(|a| a.name.starts_with("/watched/")));

    service
        .create_in_bucket("watched", "after", None, None)
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
