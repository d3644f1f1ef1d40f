//! How a Durable Streams read shows its records over HTTP: the resolved read, its body (in the
//! read's view, see `model::wire::ds_body`), and the headers that say where an answer ends.
//! Catch-up reads, long-polls and SSE all render through it.

use std::sync::Arc;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::error::{set, set_number, set_tail};
use super::gather::Pieces;
use crate::model::records::{self, ReadView, RecordView};
use crate::model::wire::ds_body::{self, visible};
use crate::model::{Offset, Record, cursor};
use crate::service::{ReadChunk, SharedRead, Stream};

/// Catch-up chunks that end before the tail never change, so shared caches may keep them.
pub(super) const CACHE_HISTORIC: &str = "public, max-age=60, stale-while-revalidate=300";

/// `Stream-Extensions` on responses about a JSON stream (seed 000 §6).
pub(super) fn advertise_records(response: &mut Response) {
    set(response, "stream-extensions", records::EXTENSION_TOKEN);
}

/// `Stream-Record-First` / `Stream-Record-Next`: the retained records of a JSON stream. With
/// them the extension's token: a client must not rely on record headers without it.
pub(super) fn set_record_bounds(response: &mut Response, first: u64, next: u64) {
    advertise_records(response);
    set_number(response, "stream-record-first", first);
    set_number(response, "stream-record-next", next);
}

/// `Stream-Record-Start` / `Stream-Record-Next` of an operation that created records, with the
/// extension's token.
pub(super) fn set_record_range(response: &mut Response, (start, next): (u64, u64)) {
    advertise_records(response);
    set_number(response, "stream-record-start", start);
    set_number(response, "stream-record-next", next);
}

/// A resolved read: the stream, where it starts, and how the records are shown.
pub(super) struct Read {
    pub stream: Arc<Stream>,
    pub start: Offset,
    pub view: ReadView,
    pub max_records: Option<u64>,
    pub client_cursor: Option<u64>,
}

/// Where a read's answer starts and ends, and how it stands against the stream.
pub(super) struct ChunkHead {
    pub start: Offset,
    pub next: Offset,
    pub up_to_date: bool,
    pub closed: bool,
    /// The first record the body shows: command records written through S2 before JSON
    /// streams refused them are left out.
    pub first_shown: u64,
}

impl ChunkHead {
    pub(super) fn of(chunk: &ReadChunk) -> ChunkHead {
        ChunkHead {
            start: chunk.start,
            next: chunk.next,
            up_to_date: chunk.up_to_date,
            closed: chunk.closed,
            // Nothing shown (only command records, or none): an empty range where it ends.
            first_shown: visible(&chunk.records)
                .next()
                .map_or(chunk.next.seq, |r| r.seq),
        }
    }

    pub(super) fn of_shared(shared: &SharedRead) -> ChunkHead {
        let range = shared.body.range;
        ChunkHead {
            start: range.start,
            next: range.next,
            up_to_date: shared.up_to_date,
            closed: shared.closed,
            first_shown: range.first_shown,
        }
    }
}

/// The entity tag of a read's answer: the stream, the range, whether it closed, and the view.
pub(super) fn etag_of(read: &Read, head: &ChunkHead) -> String {
    let view_tag = match read.view {
        ReadView::Canonical => "",
        ReadView::Records(RecordView::Values) => ":ndjson",
        ReadView::Records(RecordView::Envelope) => ":envelope",
    };
    format!(
        "\"{}:{}:{}{}{}\"",
        read.stream.id,
        head.start,
        head.next,
        if head.closed { ":c" } else { "" },
        view_tag
    )
}

/// A 200 carrying a rendered body of records.
pub(super) fn ok_with(content_type: &str, body: Pieces) -> Response {
    let mut response = (StatusCode::OK, Body::new(body)).into_response();
    set(&mut response, "content-type", content_type);
    response
}

/// The headers that say where a chunk ends, for the read's view.
pub(super) fn describe_chunk(response: &mut Response, read: &Read, head: &ChunkHead) {
    set_tail(response, head.next, head.closed);
    if head.up_to_date {
        set(response, "stream-up-to-date", "true");
    }
    if read.stream.json {
        advertise_records(response);
    }
    if let ReadView::Records(_) = read.view {
        set(
            response,
            "stream-record-first",
            &read.stream.durable().first.seq.to_string(),
        );
        set_record_range(response, (head.first_shown, head.next.seq));
    }
}

/// The content type of a read's body.
pub(super) fn content_type(read: &Read) -> &str {
    match read.view {
        ReadView::Canonical => &read.stream.content_type,
        ReadView::Records(RecordView::Values) => records::NDJSON,
        ReadView::Records(RecordView::Envelope) => records::ENVELOPE_NDJSON,
    }
}

/// The content type and body of records in a read's view.
pub(super) fn render<'a>(read: &'a Read, records: &[Record]) -> (&'a str, Pieces) {
    let body = ds_body::render(read.view, read.stream.json, records);
    (content_type(read), body.into())
}

pub(super) fn next_cursor(client: Option<u64>) -> u64 {
    cursor::next_cursor(
        crate::service::now_ms(),
        client,
        rand::random_range(1..=180),
    )
}
