//! The follow primitive on its own: the events a follower hears for each thing that can happen
//! to its stream.

use bytes::Bytes;

use super::*;
use crate::service::{AppendRequest, CreateRequest, ForkRequest, ReadLimits, one_text_stream};

fn text(body: &'static str) -> AppendRequest<'static> {
    AppendRequest {
        content_type: Some("text/plain"),
        body: Bytes::from_static(body.as_bytes()),
        ..Default::default()
    }
}

impl StreamService {
    /// A service in memory whose one `text/plain` stream, `s`, holds `bodies`: for the tests of
    /// live readers.
    pub(crate) async fn with_text_stream_of(bodies: &[&'static str]) -> (Arc<Self>, Arc<Stream>) {
        let (service, stream) = one_text_stream().await;
        for body in bodies {
            service.append("s", text(body)).await.unwrap();
        }
        (service, stream)
    }

    /// Retains `stream`'s records from `seq` on (an S2 trim, which needs no snapshot), for the
    /// tests of readers a trim passes.
    pub(crate) async fn trim_for_test(&self, stream: &Arc<Stream>, seq: u64) {
        self.trim(stream, seq).await.unwrap();
    }
}

/// The follower's next event, which comes at once in every test here.
async fn next<S: Source>(follow: &mut Follow<S>) -> Event<S::Chunk> {
    let event = tokio::time::timeout(Duration::from_secs(5), follow.next()).await;
    event.expect("an event in time")
}

fn chunks_from_start(service: &Arc<StreamService>, stream: &Arc<Stream>) -> Follow<Chunks> {
    let source = Chunks::from(Offset::START, None);
    let options = FollowOptions::live(Duration::from_secs(60));
    Follow::new(service, stream.clone(), source, options)
}

#[tokio::test]
async fn a_follower_behind_a_retention_move_hears_of_the_gap_with_the_first_retained_offset() {
    let (service, stream) = StreamService::with_text_stream_of(&["a", "b", "c"]).await;
    let mut follow = chunks_from_start(&service, &stream);
    service.trim_for_test(&stream, 2).await;
    match next(&mut follow).await {
        Event::Gap { first } => assert_eq!(first.seq, 2),
        other => panic!("expected a gap, got {other:?}"),
    }
}

#[tokio::test]
async fn an_s2_follower_moves_on_to_the_first_retained_record_past_a_trim() {
    let (service, stream) = StreamService::with_text_stream_of(&["a", "b", "c"]).await;
    let source = S2Reads::from(0, ReadLimits::default(), None);
    let options = FollowOptions::live(Duration::from_secs(60));
    let mut follow = Follow::new(&service, stream.clone(), source, options);
    service.trim_for_test(&stream, 2).await;
    match next(&mut follow).await {
        Event::Records(batch) => assert_eq!(batch.records[0].seq, 2),
        other => panic!("expected the retained records, got {other:?}"),
    }
}

#[tokio::test]
async fn a_follower_hears_it_caught_up_once_then_records_as_they_come_then_idle() {
    let (service, stream) = StreamService::with_text_stream_of(&["a"]).await;
    let source = Chunks::from(Offset::START, None);
    let options = FollowOptions::live(Duration::from_millis(50));
    let mut follow = Follow::new(&service, stream.clone(), source, options);
    assert!(matches!(next(&mut follow).await, Event::Records(_)));
    assert!(matches!(next(&mut follow).await, Event::CaughtUp(_)));
    service.append("s", text("b")).await.unwrap();
    match next(&mut follow).await {
        Event::Records(chunk) => assert_eq!(chunk.records[0].body, "b"),
        other => panic!("expected the new record, got {other:?}"),
    }
    assert!(
        matches!(next(&mut follow).await, Event::Idle),
        "not caught up again"
    );
}

#[tokio::test]
async fn a_closed_stream_ends_a_follower_after_its_last_records() {
    let (service, stream) = StreamService::with_text_stream_of(&["a"]).await;
    let close = AppendRequest {
        close: true,
        ..text("last")
    };
    service.append("s", close).await.unwrap();
    let mut follow = chunks_from_start(&service, &stream);
    assert!(matches!(next(&mut follow).await, Event::Records(chunk) if chunk.closed));
    assert!(matches!(next(&mut follow).await, Event::CaughtUp(d) if d.closed));
    assert!(matches!(next(&mut follow).await, Event::Closed));
}

#[tokio::test]
async fn a_removed_stream_and_a_soft_deleted_one_are_told_apart() {
    let (service, stream) = StreamService::with_text_stream_of(&["a"]).await;
    let mut follow = chunks_from_start(&service, &stream);
    service.delete("s").await.unwrap();
    assert!(matches!(
        next(&mut follow).await,
        Event::Deleted(Deletion::Removed)
    ));

    let (service, stream) = StreamService::with_text_stream_of(&["a"]).await;
    let fork = CreateRequest {
        name: "fork".into(),
        fork: Some(ForkRequest {
            source: "s".into(),
            offset: None,
            sub_offset: 0,
        }),
        ..Default::default()
    };
    service.create(fork).await.unwrap();
    let mut follow = chunks_from_start(&service, &stream);
    service.delete("s").await.unwrap();
    assert!(matches!(
        next(&mut follow).await,
        Event::Deleted(Deletion::SoftDeleted)
    ));
}

#[tokio::test]
async fn a_replica_follower_is_told_of_closure_and_follows_on_until_the_stream_goes() {
    let (service, stream) = StreamService::with_text_stream_of(&["a"]).await;
    let source = Chunks::from(Offset::START, None);
    let mut follow = Follow::new(&service, stream.clone(), source, FollowOptions::replica());
    assert!(matches!(next(&mut follow).await, Event::Records(_)));
    assert!(matches!(next(&mut follow).await, Event::CaughtUp(_)));
    let close = AppendRequest {
        close: true,
        ..Default::default()
    };
    service.append("s", close).await.unwrap();
    assert!(matches!(next(&mut follow).await, Event::Changed(d) if d.closed));
    service.delete("s").await.unwrap();
    assert!(matches!(
        next(&mut follow).await,
        Event::Deleted(Deletion::Removed)
    ));
}

#[tokio::test]
async fn a_live_follower_keeps_its_stream_from_expiring_and_a_replica_follower_does_not() {
    let (service, stream) = one_text_stream().await;
    let live = chunks_from_start(&service, &stream);
    assert_eq!(stream.live_reader_count(), 1);
    drop(live);
    let source = Chunks::from(Offset::START, None);
    let _replica = Follow::new(&service, stream.clone(), source, FollowOptions::replica());
    assert_eq!(stream.live_reader_count(), 0);
}
