//! The StreamLD SSE binding at `/{bucket}/{stream}/streamld`: one event per record, its `id`
//! the record's cursor. It renders one follow of the stream (see `docs/live-reads.md`).

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::super::AppState;
use super::super::sse::{event_stream, live_timing};
use crate::model::streamld::{self, GapSignal, Message};
use crate::service::sessions::replica_feed::READ_BATCH;
use crate::service::{
    Chunks, Ends, Event, Follow, FollowOptions, FrameView, LiveFrame, StreamError,
};

/// The SSE binding's answer to a cursor it cannot serve: 409 with a `GapSignal` naming the first
/// record it holds.
fn gap_response(first: u64) -> Response {
    let gap = Message::Gap(GapSignal {
        oldest_available: Some(streamld::sequence_of(first)),
        ..Default::default()
    });
    (
        StatusCode::CONFLICT,
        [(header::CONTENT_TYPE, "application/ld+json")],
        gap.to_json(),
    )
        .into_response()
}

/// The SSE binding: one event per record, `id` = its cursor; `Last-Event-ID` (or `?after=`)
/// resumes; a cursor that cannot be served answers 409 with a `GapSignal`.
pub async fn sse(
    app: &AppState,
    key: &str,
    origin: &str,
    after: u64,
) -> Result<Response, StreamError> {
    let stream = app.service.find(key, false).await?;
    if stream.encrypted {
        return Err(StreamError::Encrypted);
    }
    let url = streamld::stream_iri(origin, key);
    let durable = stream.durable();
    if after < durable.first.seq || after > durable.tail.seq {
        return Ok(gap_response(durable.first.seq));
    }
    if durable.closed && after == durable.tail.seq {
        // Nothing will ever follow: 204 tells an EventSource to stop reconnecting.
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let start = match app
        .service
        .record_offset(&stream, after, durable.tail)
        .await
    {
        Ok(at) => at,
        Err(StreamError::RecordRetained { first, .. }) => return Ok(gap_response(first)),
        Err(e) => return Err(e),
    };
    let (keepalive, deadline) = live_timing(app);
    // Readers at one place render the same events: they share one rendering (see `LiveFrame`).
    let view = FrameView::UnderOrigin(origin.into());
    let options = FollowOptions {
        ends: Ends::At(deadline),
        frames: Some(view.clone()),
        ..FollowOptions::live(keepalive)
    };
    let source = Chunks::from(start, Some(READ_BATCH));
    let mut follow = Follow::new(&app.service, stream, source, options);
    let events = async_stream::stream! {
        loop {
            match follow.next().await {
                Event::Shared(frame) => yield Ok::<Bytes, std::io::Error>(frame.bytes),
                Event::Records(mut chunk) => {
                    let stream = follow.stream();
                    let mut out = Vec::new();
                    for record in &chunk.records {
                        let event = streamld::envelope(&url, &stream.content_type, record);
                        streamld::write_sse_event(&mut out, &event);
                    }
                    let events = Bytes::from(out);
                    if chunk.up_to_date {
                        let frame = LiveFrame {
                            view: view.clone(),
                            start: chunk.start,
                            next: chunk.next,
                            closed: chunk.closed,
                            bytes: events.clone(),
                            records_len: events.len(),
                            tag: 0,
                        };
                        follow.share(frame, &mut chunk.lease);
                    }
                    yield Ok(events);
                }
                // A comment line: EventSource ignores it, proxies see the connection alive.
                Event::Idle => yield Ok(Bytes::from_static(b": keep-alive\n\n")),
                Event::CaughtUp(_) | Event::Changed(_) => {}
                // Records trimmed under the reader end the stream rather than being skipped:
                // the client's reconnect (Last-Event-ID) is then answered with the GapSignal.
                Event::Gap { .. }
                | Event::Closed
                | Event::Deleted(_)
                | Event::Ended(_)
                | Event::Failed(_) => return,
            }
        }
    };
    Ok(event_stream(Body::from_stream(events)))
}
