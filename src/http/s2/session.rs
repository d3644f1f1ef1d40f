//! Read sessions: what both streaming wires, SSE (`text/event-stream`) and S2S (`s2s/proto`),
//! send. A session is one follow of the stream (see `docs/live-reads.md`): batches up to the
//! tail, a heartbeat on catching up, then new records as they come, heartbeating while idle,
//! until a limit, the idle bound or an error ends it. Each wire only renders the events.

use futures::Stream as FuturesStream;

use super::*;
use crate::service::{End, Ends, Event, Follow, FollowOptions, S2Reads};

/// What a read session was asked for.
pub(super) struct Session {
    pub start: u64,
    pub limits: S2Limits,
    pub may_follow: bool,
    /// How long the session may go without a new record before it ends.
    pub idle: Option<Duration>,
    /// Where an SSE session resumes its counts (`Last-Event-ID`).
    pub resume: Option<EventId>,
    pub key: Option<RecordKey>,
}

/// One step of a read session.
pub(super) enum SessionEvent {
    /// Records, with the session's running totals after them.
    Batch { batch: S2Batch, id: EventId },
    /// Nothing new: the tail as it stands. Sent on catching up and while idle.
    Heartbeat(S2Position),
    /// The session is over: a limit was reached, the idle bound passed or the stream closed.
    End,
    /// The session failed; nothing follows.
    Failed(StreamError),
}

/// The events of a read session, ending with `End` or `Failed`, or with neither when the server
/// shuts down: `End` tells a client its read is over (SSE's `[DONE]`), which it is not.
pub(super) fn events(
    service: Arc<crate::service::StreamService>,
    stream: Arc<Stream>,
    session: Session,
) -> impl FuturesStream<Item = SessionEvent> + Send {
    let Session {
        start,
        limits,
        may_follow,
        idle,
        resume,
        key,
    } = session;
    let options = FollowOptions {
        ends: idle.map_or(Ends::Never, Ends::IdleFor),
        stops_at_tail: !may_follow,
        ..FollowOptions::live(PING_INTERVAL)
    };
    let source = S2Reads::from(start, limits, key);
    let mut follow = Follow::new(&service, stream, source, options);
    async_stream::stream! {
        // The totals start from the client's Last-Event-ID, which may be anything.
        let mut count = resume.map_or(0, |r| r.count);
        let mut bytes = resume.map_or(0, |r| r.bytes);
        loop {
            match follow.next().await {
                Event::Records(batch) => {
                    count = count.saturating_add(batch.records.len() as u64);
                    bytes = bytes.saturating_add(batch.metered);
                    let last_seq = batch.records.last().map_or(0, |r| r.seq);
                    let id = EventId { last_seq, count, bytes };
                    yield SessionEvent::Batch { batch, id };
                }
                Event::CaughtUp(_) | Event::Idle => {
                    yield SessionEvent::Heartbeat(service.tail_position(follow.stream()));
                }
                // Deleted, for good or while forks read through it: what a new read would
                // find, a stream not found.
                Event::Deleted(_) => {
                    yield SessionEvent::Failed(StreamError::NotFound);
                    return;
                }
                Event::Failed(e) => {
                    yield SessionEvent::Failed(e);
                    return;
                }
                Event::Ended(End::Shutdown) => return,
                // A limit, the idle bound or the tail of a session that does not follow; or
                // closed through Durable Streams: no record will ever follow.
                Event::Ended(_) | Event::Closed | Event::Gap { .. } => {
                    yield SessionEvent::End;
                    return;
                }
                Event::Shared(_) | Event::Changed(_) => {}
            }
        }
    }
}

/// A 200 response whose body is a live session, kept out of caches and proxy buffers.
pub(super) fn streaming_response(body: Body, content_type: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

#[cfg(test)]
pub(super) mod tests {
    use futures::StreamExt as _;

    use super::*;

    /// A session over a stream holding one record, and the service it reads.
    pub(in crate::http::s2) async fn session_over_one_record()
    -> (Arc<crate::service::StreamService>, Arc<Stream>, Session) {
        let (service, stream) = crate::service::one_text_stream().await;
        let append = crate::service::AppendRequest {
            content_type: Some("text/plain"),
            body: Bytes::from_static(b"a record"),
            ..Default::default()
        };
        service.append("s", append).await.unwrap();
        let session = Session {
            start: 0,
            limits: S2Limits::default(),
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
            limits: S2Limits::default(),
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
}
