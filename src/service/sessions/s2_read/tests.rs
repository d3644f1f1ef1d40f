use bytes::Bytes;
use futures::StreamExt as _;

use super::*;

/// A session over a stream holding one record, and the service it reads.
pub(crate) async fn session_over_one_record() -> (Arc<StreamService>, Arc<Stream>, Session) {
    let (service, stream) = crate::service::one_text_stream().await;
    let append = crate::service::AppendRequest {
        content_type: Some("text/plain"),
        body: Bytes::from_static(b"a record"),
        ..Default::default()
    };
    service.append("s", append).await.unwrap();
    let session = Session {
        start: 0,
        limits: ReadLimits::default(),
        may_follow: false,
        idle: None,
        resume: None,
        key: None,
    };
    (service, stream, session)
}

#[tokio::test]
async fn a_session_whose_client_took_long_over_a_batch_is_not_idle_and_goes_on() {
    let (service, stream, session) = session_over_one_record().await;
    let session = Session {
        may_follow: true,
        idle: Some(Duration::from_millis(50)),
        ..session
    };
    let events = events(service.clone(), stream, session);
    futures::pin_mut!(events);
    assert!(matches!(
        events.next().await,
        Some(SessionEvent::Batch { .. })
    ));
    // The client takes longer than the idle bound over the batch, and a record comes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let append = crate::service::AppendRequest {
        content_type: Some("text/plain"),
        body: Bytes::from_static(b"another"),
        ..Default::default()
    };
    service.append("s", append).await.unwrap();
    assert!(matches!(
        events.next().await,
        Some(SessionEvent::Heartbeat(_))
    ));
    assert!(
        matches!(events.next().await, Some(SessionEvent::Batch { .. })),
        "the record goes out; the session is not ended as idle"
    );
}

/// A session that follows the stream from its start, without limits.
fn following_from_the_start() -> Session {
    Session {
        start: 0,
        limits: ReadLimits::default(),
        may_follow: true,
        idle: None,
        resume: None,
        key: None,
    }
}

#[tokio::test]
async fn a_session_waiting_at_the_tail_ends_without_end_when_the_server_shuts_down() {
    let (service, stream) = crate::service::one_text_stream().await;
    let session = following_from_the_start();
    let events = events(service.clone(), stream, session);
    futures::pin_mut!(events);
    assert!(
        matches!(events.next().await, Some(SessionEvent::Heartbeat(_))),
        "caught up"
    );
    service.begin_shutdown();
    let last = tokio::time::timeout(Duration::from_secs(5), events.next()).await;
    assert!(
        last.expect("it ends").is_none(),
        "no End: the client resumes elsewhere"
    );
}

#[tokio::test]
async fn a_session_whose_records_are_trimmed_from_under_it_goes_on_from_the_first_retained() {
    let (service, stream) =
        crate::service::StreamService::with_text_stream_of(&["a", "b", "c"]).await;
    let session = following_from_the_start();
    let events = events(service.clone(), stream.clone(), session);
    service.trim_for_test(&stream, 2).await;
    futures::pin_mut!(events);
    match events.next().await {
        Some(SessionEvent::Batch { batch, .. }) => assert_eq!(batch.records[0].seq, 2),
        _ => panic!("expected the retained records"),
    }
}

#[tokio::test]
async fn a_waiting_read_whose_records_are_trimmed_from_under_it_gets_the_first_retained() {
    let (service, stream) = StreamService::with_text_stream_of(&["a", "b", "c"]).await;
    let source = S2Reads::from(0, ReadLimits::default(), None);
    service.trim_for_test(&stream, 2).await;
    let batch = wait_for_records(&service, stream, source, Duration::from_secs(5)).await;
    let Ok(batch) = batch else {
        panic!("expected the retained records");
    };
    assert_eq!(batch.records[0].seq, 2);
}
