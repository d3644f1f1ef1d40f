//! Shared live frames: given only to readers of the same view at the frame's start, only while it
//! reaches the tail, and only while more than one live reader waits.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{FrameView, LiveFrame};
use crate::model::Offset;
use crate::service::snapshots::RetentionMove;
use crate::service::tests::{one_text_stream, text};
use crate::service::{AppendRequest, Position, ReadLease, Stream, StreamService};

/// What a live reader of the Durable Streams view rendered for the records from `start` to the
/// tail, to share.
async fn frame_from(
    service: &StreamService,
    stream: &Arc<Stream>,
    start: Offset,
) -> (LiveFrame, ReadLease) {
    frame_of(FrameView::Canonical, service, stream, start).await
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

const DS: FrameView = FrameView::Canonical;

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
    let here = FrameView::UnderOrigin("http://here".into());
    let (frame, mut lease) = frame_of(here.clone(), &service, &stream, Offset::START).await;
    stream.share_frame(frame, &mut lease);
    assert!(stream.shared_frame(&here, 0).is_some());
    assert!(
        stream.shared_frame(&DS, 0).is_none(),
        "Durable Streams readers render otherwise"
    );
    let there = FrameView::UnderOrigin("http://there".into());
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
