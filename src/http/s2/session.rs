//! Read sessions: the one loop behind both streaming wires, SSE (`text/event-stream`) and S2S
//! (`s2s/proto`). It reads batches up to the tail, signals catching up with a heartbeat, then
//! follows new records, heartbeating while idle, until a limit, the idle bound or an error ends
//! it. Each wire only renders the events.

use futures::{Stream as FuturesStream, StreamExt as _};

use super::*;
use crate::service::Wake;
use crate::storage::StorageError;

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
    async_stream::stream! {
        let mut next = start;
        let mut count = resume.map_or(0, |r| r.count);
        let mut bytes = resume.map_or(0, |r| r.bytes);
        let mut remaining = limits;
        let mut caught_up = false;
        let mut idle_deadline = idle.map(|d| Instant::now() + d);
        let mut tail = service.watch_tail(&stream, PING_INTERVAL, idle_deadline);
        loop {
            let read = service.s2_read(&stream, next, remaining, s2::UNARY_MAX_RECORDS, s2::UNARY_MAX_BYTES).await;
            let batch = match read.and_then(|mut batch| {
                service.s2_open(&stream, key.as_ref(), &mut batch.records).map(|()| batch)
            }) {
                Ok(batch) => batch,
                Err(e) => {
                    yield SessionEvent::Failed(e);
                    return;
                }
            };
            let (limit_reached, at_tail) = (batch.limit_reached, batch.at_tail);
            if batch.records.is_empty() && !at_tail && !limit_reached {
                // Reading again from the same place would return nothing again, forever.
                let missing = format!("no records readable at {next}, below the tail");
                yield SessionEvent::Failed(StorageError::Corrupt(missing).into());
                return;
            }
            // Even with no records: a trim may have moved the start past where this session was.
            next = next.max(batch.next_seq);
            if let Some(last) = batch.records.last() {
                // The totals start from the client's Last-Event-ID, which may be anything.
                count = count.saturating_add(batch.records.len() as u64);
                bytes = bytes.saturating_add(batch.metered);
                remaining.count = remaining.count.map(|c| c.saturating_sub(batch.records.len() as u64));
                remaining.bytes = remaining.bytes.map(|b| b.saturating_sub(batch.metered));
                let id = EventId { last_seq: last.seq, count, bytes };
                yield SessionEvent::Batch { batch, id };
                // Idle from when the client took the batch: a client slow to take one is not
                // idle, and its session is not ended with records waiting.
                idle_deadline = idle.map(|d| Instant::now() + d);
            }
            if limit_reached || (at_tail && !may_follow) {
                yield SessionEvent::End;
                return;
            }
            if !at_tail {
                continue;
            }
            if !caught_up {
                caught_up = true;
                yield SessionEvent::Heartbeat(service.tail_position(&stream));
            }
            // Caught up: wait for new records, heartbeating while idle, until the idle bound.
            tail.sent();
            tail.extend_deadline(idle_deadline);
            loop {
                match tail.next(Offset::new(next, 0)).await {
                    Wake::Moved(seen) if seen.removed => {
                        yield SessionEvent::Failed(StreamError::NotFound);
                        return;
                    }
                    Wake::Moved(seen) if seen.tail.seq > next => break,
                    Wake::Ended if service.is_stopping() => return,
                    // Closed through Durable Streams: no record will ever follow.
                    Wake::Moved(_) | Wake::Ended => {
                        yield SessionEvent::End;
                        return;
                    }
                    Wake::Idle => yield SessionEvent::Heartbeat(service.tail_position(&stream)),
                }
            }
        }
    }
}

/// A read session over SSE: `batch` events, `ping` heartbeats, `data: [DONE]` at a normal end,
/// an `error` event (and no `[DONE]`) when it fails.
pub(super) fn sse(
    app: &AppState,
    stream: Arc<Stream>,
    session: Session,
    format: Format,
) -> Response {
    let rendered = events(app.service.clone(), stream, session)
        .map(move |event| Ok::<Bytes, std::io::Error>(sse_event(event, format)));
    streaming_response(Body::from_stream(rendered), "text/event-stream")
}

/// One session event as SSE.
fn sse_event(event: SessionEvent, format: Format) -> Bytes {
    match event {
        SessionEvent::Batch { mut batch, id } => {
            let json = batch_json(&batch, format);
            let mut event = Vec::with_capacity(json.len() + 40);
            event.extend_from_slice(format!("event: batch\nid: {id}\ndata: ").as_bytes());
            event.extend_from_slice(&json);
            event.extend_from_slice(b"\n\n");
            // The read's memory stays counted until the event is sent.
            std::mem::take(&mut batch.lease).with_bytes(event)
        }
        SessionEvent::Heartbeat(tail) => ping(tail),
        SessionEvent::End => Bytes::from_static(b"data: [DONE]\n\n"),
        SessionEvent::Failed(error) => error_event(error),
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

fn ping(tail: S2Position) -> Bytes {
    let data =
        json!({ "timestamp": u64::try_from(now_ms()).unwrap_or(0), "tail": position_json(tail) });
    Bytes::from(format!("event: ping\ndata: {data}\n\n"))
}

fn error_event(error: StreamError) -> Bytes {
    let S2Error { body, .. } = S2Error::from(error);
    Bytes::from(format!("event: error\ndata: {body}\n\n"))
}

#[cfg(test)]
pub(super) mod tests {
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

    #[tokio::test]
    async fn an_sse_batch_holds_its_read_memory_until_it_is_sent() {
        let (service, stream, session) = session_over_one_record().await;
        let events = events(service.clone(), stream, session);
        futures::pin_mut!(events);
        let batch = events.next().await.expect("a batch");
        assert!(matches!(batch, SessionEvent::Batch { .. }));
        let rendered = sse_event(batch, Format::Raw);
        assert!(
            service.read_memory_held() > 0,
            "held while it waits to be sent"
        );
        drop(rendered);
        assert_eq!(service.read_memory_held(), 0, "given back once sent");
    }

    #[tokio::test]
    async fn a_session_waiting_at_the_tail_ends_without_end_when_the_server_shuts_down() {
        let (service, stream) = crate::service::one_text_stream().await;
        let session = Session {
            start: 0,
            limits: S2Limits::default(),
            may_follow: true,
            idle: None,
            resume: None,
            key: None,
        };
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
}
