//! Live reads over Server-Sent Events: a `data` event per chunk, each followed at once by a
//! `control` event with the offset to resume from.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::time::Instant;

use super::AppState;
use super::ds_view::{Read, canonical_body, next_cursor, shows_nothing, visible};
use crate::model::Offset;
use crate::model::content_type::sse_needs_base64;
use crate::model::records::{self, ReadView, RecordView};
use crate::model::sse::write_data_event;
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
    let (keepalive, deadline) = live_timing(app);
    // Readers of the canonical view at one place render the same bytes but for their cursor,
    // so they share one rendering (see `LiveFrame`).
    let shares = read.view == ReadView::Canonical;
    let options = FollowOptions {
        ends: Ends::At(deadline),
        frames: shares.then_some(FrameView::DurableStreams),
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
                    let (first, rest) = for_this_reader(&read, frame, fresh);
                    yield Ok::<Bytes, std::io::Error>(first);
                    if let Some(rest) = rest {
                        yield Ok(rest);
                    }
                }
                Event::Records(mut chunk) => {
                    let (events, records_len) = chunk_events(&read, &chunk, envelope, base64, fresh);
                    let events = Bytes::from(events);
                    if let Some(records_len) = records_len.filter(|_| shares && chunk.up_to_date) {
                        let frame = LiveFrame {
                            view: FrameView::DurableStreams,
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
                    yield Ok(Bytes::from(control_event(&read, reached(durable.closed), fresh)));
                }
                Event::CaughtUp(_) | Event::Changed(_) => {}
                Event::Idle => yield Ok(Bytes::from(control_event(&read, reached(false), fresh))),
                Event::Closed => {
                    if !told_closed {
                        yield Ok(Bytes::from(control_event(&read, reached(true), fresh)));
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

/// A chunk's events: for the envelope, a data event and its control event per record; otherwise
/// one data event for the whole chunk (a JSON array on JSON streams, keeping the base protocol's
/// representation even on record-aware reads, §6.9) and its control event. With the second, also
/// where the data event ends: the part other readers can share.
fn chunk_events(
    read: &Read,
    chunk: &ReadChunk,
    envelope: bool,
    base64: bool,
    cursor: u64,
) -> (Vec<u8>, Option<usize>) {
    let mut events = Vec::new();
    if shows_nothing(&chunk.records) {
        write_control_event(&mut events, read, Reached::from(chunk), cursor);
        return (events, None);
    }
    if envelope {
        let shown: Vec<_> = visible(&chunk.records).collect();
        for (i, record) in shown.iter().enumerate() {
            let last = i + 1 == shown.len();
            let step = Reached {
                next: record.next_offset(),
                up_to_date: last && chunk.up_to_date,
                closed: last && chunk.closed,
            };
            let envelope = records::envelope(record.seq, &record.body);
            write_data_event(&mut events, &envelope, false);
            write_control_event(&mut events, read, step, cursor);
        }
        return (events, None);
    }
    let body = canonical_body(read.stream.json, &chunk.records).into_bytes();
    events.reserve(body.len() + 160);
    write_data_event(&mut events, &body, base64);
    let records_len = events.len();
    write_control_event(&mut events, read, Reached::from(chunk), cursor);
    (events, Some(records_len))
}

/// Where a control event leaves its reader.
#[derive(Clone, Copy)]
struct Reached {
    next: Offset,
    up_to_date: bool,
    closed: bool,
}

impl From<&ReadChunk> for Reached {
    fn from(chunk: &ReadChunk) -> Self {
        Reached {
            next: chunk.next,
            up_to_date: chunk.up_to_date,
            closed: chunk.closed,
        }
    }
}

/// Shared frames of records this long or longer go out as they are, with this reader's control
/// event after them; shorter ones are copied into one buffer with it (one chunk to write).
const SEND_SHARED_AS_IS_FROM: usize = 16 * 1024;

/// A frame another reader rendered, as this reader sends it: whole when it was rendered for this
/// reader's cursor, otherwise its records with this reader's own control event.
fn for_this_reader(read: &Read, frame: LiveFrame, cursor: u64) -> (Bytes, Option<Bytes>) {
    if frame.tag == cursor {
        return (frame.bytes, None);
    }
    // A shared frame is handed out only while it ends at the durable tail.
    let reached = Reached {
        next: frame.next,
        up_to_date: true,
        closed: frame.closed,
    };
    let records = frame.bytes.slice(..frame.records_len);
    if records.len() >= SEND_SHARED_AS_IS_FROM {
        return (
            records,
            Some(Bytes::from(control_event(read, reached, cursor))),
        );
    }
    let mut joined = Vec::with_capacity(records.len() + 160);
    joined.extend_from_slice(&records);
    write_control_event(&mut joined, read, reached, cursor);
    (Bytes::from(joined), None)
}

fn control_event(read: &Read, reached: Reached, cursor: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    write_control_event(&mut out, read, reached, cursor);
    out
}

/// The control event after a chunk, rendered by hand: every subscriber gets one per event, and
/// building a JSON map for it showed in fan-out profiles. Every value is a number, a boolean or an
/// offset token, none of which needs escaping.
fn write_control_event(out: &mut Vec<u8>, read: &Read, reached: Reached, cursor: u64) {
    use std::io::Write as _;
    out.extend_from_slice(b"event: control\ndata:{\"streamNextOffset\":\"");
    if reached.next.is_representable() {
        out.extend_from_slice(reached.next.token().as_str().as_bytes());
    } else {
        let _ = write!(out, "{}", reached.next);
    }
    out.push(b'"');
    if let ReadView::Records(_) = read.view {
        let first = read.stream.durable().first.seq;
        let _ = write!(
            out,
            ",\"streamFirstRecord\":{first},\"streamNextRecord\":{}",
            reached.next.seq
        );
    }
    if reached.closed {
        out.extend_from_slice(b",\"streamClosed\":true");
    } else {
        let _ = write!(out, ",\"streamCursor\":\"{cursor}\"");
    }
    if reached.up_to_date {
        out.extend_from_slice(b",\"upToDate\":true");
    }
    out.extend_from_slice(b"}\n\n");
}

#[cfg(test)]
pub(super) mod tests;
