//! Durable Streams live reads over Server-Sent Events: one follow of the stream, each of its
//! events rendered as `model::wire::ds_sse_event` spells them.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::time::Instant;

use super::AppState;
use super::ds_view::{Read, next_cursor};
use crate::model::content_type::sse_needs_base64;
use crate::model::records::{self, ReadView, RecordView};
use crate::model::wire::ds_sse_event::{self, Reached, Spelling, Standing};
use crate::service::{Chunks, Ends, Event, Follow, FollowOptions, FrameView, LiveFrame, ReadChunk};

/// How often an idle connection gets a control event, so proxies and clients see it is alive.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// How long a live SSE body may stay quiet before it gets a keep-alive, and when it ends
/// (`--sse-max-duration-secs`); the client then reconnects from its last event.
pub(super) fn live_timing(app: &AppState) -> (Duration, Instant) {
    let keepalive = KEEPALIVE.min(app.config.long_poll_timeout.max(Duration::from_millis(100)));
    (keepalive, Instant::now() + app.config.sse_max_duration)
}

pub fn respond(app: &AppState, read: Read) -> Response {
    let base64 = read.view == ReadView::Canonical && sse_needs_base64(&read.stream.content_type);
    let envelope = read.view == ReadView::Records(RecordView::Envelope);
    let json = read.stream.json;
    let spelling = Spelling {
        json,
        envelope,
        base64,
    };
    let (keepalive, deadline) = live_timing(app);
    // Readers of the canonical view at one place render the same bytes but for their cursor,
    // so they share one rendering (see `LiveFrame`).
    let shares = read.view == ReadView::Canonical;
    let options = FollowOptions {
        ends: Ends::At(deadline),
        frames: shares.then_some(FrameView::Canonical),
        ..FollowOptions::live(keepalive)
    };
    let source = Chunks::from(read.start, None);
    let mut follow = Follow::new(&app.service, read.stream.clone(), source, options);

    let events = async_stream::stream! {
        // Each event's cursor answers the cursor the request carried (feeding an event's own
        // cursor back in would add jitter at every event, days ahead within a connection), and
        // never goes back within the connection.
        let mut cursor = 0;
        // What the last event sent told the reader: that it is up to date, that the stream
        // is closed.
        let mut told_up_to_date = false;
        let mut told_closed = false;
        loop {
            let at = follow.source().at();
            let event = follow.next().await;
            let fresh = next_cursor(read.client_cursor).max(cursor);
            cursor = fresh;
            let reached = |closed| Reached { next: at, up_to_date: true, closed };
            match event {
                Event::Shared(frame) => {
                    told_closed = frame.closed;
                    told_up_to_date = true;
                    // A shared frame is handed out only while it ends at the durable tail.
                    let reached = Reached { next: frame.next, up_to_date: true, closed: frame.closed };
                    let (first, rest) = ds_sse_event::for_this_reader(
                        frame.bytes, frame.records_len, frame.tag, reached, standing(&read, fresh),
                    );
                    yield Ok::<Bytes, std::io::Error>(first);
                    if let Some(rest) = rest {
                        yield Ok(rest);
                    }
                }
                Event::Records(mut chunk) => {
                    let (events, records_len) = ds_sse_event::chunk(
                        &chunk.records, reached_by(&chunk), spelling, standing(&read, fresh),
                    );
                    let events = Bytes::from(events);
                    if let Some(records_len) = records_len.filter(|_| shares && chunk.up_to_date) {
                        let frame = LiveFrame {
                            view: FrameView::Canonical,
                            start: chunk.start,
                            next: chunk.next,
                            closed: chunk.closed,
                            bytes: events.clone(),
                            records_len,
                            tag: fresh,
                        };
                        follow.share(frame, &mut chunk.lease);
                    }
                    (told_up_to_date, told_closed) = (chunk.up_to_date, chunk.closed);
                    yield Ok(events);
                }
                // A reader that starts at the tail hears so at once.
                Event::CaughtUp(durable) if !told_up_to_date => {
                    told_closed = durable.closed;
                    yield Ok(Bytes::from(ds_sse_event::control(reached(durable.closed), standing(&read, fresh))));
                }
                Event::CaughtUp(_) | Event::Changed(_) => {}
                Event::Idle => yield Ok(Bytes::from(ds_sse_event::control(reached(false), standing(&read, fresh)))),
                Event::Closed => {
                    if !told_closed {
                        yield Ok(Bytes::from(ds_sse_event::control(reached(true), standing(&read, fresh))));
                    }
                    return;
                }
                Event::Failed(e) => {
                    tracing::warn!(stream = %read.stream.name, error = %e, "SSE read failed");
                    return;
                }
                // The client's reconnect from its last offset is answered as a new read: 410
                // below the retained records, 404 or 410 for a deleted stream.
                Event::Gap { .. } | Event::Deleted(_) | Event::Ended(_) => return,
            }
        }
    };

    let mut response = event_stream(Body::from_stream(events));
    let headers = response.headers_mut();
    if base64 {
        headers.insert(
            "stream-sse-data-encoding",
            HeaderValue::from_static("base64"),
        );
    }
    if envelope {
        headers.insert(
            "stream-data-content-type",
            HeaderValue::from_static(records::ENVELOPE_EVENT),
        );
    }
    if json {
        headers.insert(
            "stream-extensions",
            HeaderValue::from_static(records::EXTENSION_TOKEN),
        );
    }
    response
}

/// A 200 whose body is a live stream of server-sent events.
pub(super) fn event_stream(body: Body) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// What `read`'s control events say beside where it got to, as the stream stands now.
fn standing(read: &Read, cursor: u64) -> Standing {
    let first_record = match read.view {
        ReadView::Records(_) => Some(read.stream.durable().first.seq),
        ReadView::Canonical => None,
    };
    Standing {
        cursor,
        first_record,
    }
}

fn reached_by(chunk: &ReadChunk) -> Reached {
    Reached {
        next: chunk.next,
        up_to_date: chunk.up_to_date,
        closed: chunk.closed,
    }
}

#[cfg(test)]
pub(super) mod tests;
