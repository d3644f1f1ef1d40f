//! Streams coming and going: creates and deletes finished after their requester left, removals
//! checked again under the stream's lock, and changes to a stream deleted since it was found.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::Semaphore;

use super::{GatedEngine, create_text, plain_records, text};
use crate::model::Offset;
use crate::service::snapshots::RetentionMove;
use crate::service::stream::State;
use crate::service::{Removal, ServiceConfig, StreamError, StreamService};
use crate::storage::{MemoryEngine, SharedEngine};

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
async fn a_change_to_a_stream_deleted_since_it_was_found_does_not_bring_it_back() {
    let engine: SharedEngine = Arc::new(MemoryEngine::new());
    let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
    service.create(create_text("doomed")).await.unwrap();
    service.append("doomed", text("record")).await.unwrap();
    // Found by a request that a deletion then overtakes before it takes the stream's lock.
    let found = service.find("doomed", false).await.unwrap();
    service.delete("doomed").await.unwrap();

    assert!(matches!(
        service.append_records(&found, plain_records(1), None).await,
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
