//! The events of a Durable Streams read over Server-Sent Events: a `data` event per chunk (per
//! record in the envelope view), each followed at once by a `control` event saying where its
//! reader stands: the offset to resume from, its cursor, whether it is up to date, whether the
//! stream is closed.

use std::io::Write as _;

use bytes::Bytes;

use super::ds_body::{canonical, shows_nothing, visible};
use crate::model::records;
use crate::model::sse::write_data_event;
use crate::model::{Offset, Record};

/// Where a control event leaves its reader.
#[derive(Clone, Copy, Debug)]
pub struct Reached {
    pub next: Offset,
    pub up_to_date: bool,
    pub closed: bool,
}

/// What a reader's control events say beside where it got to.
#[derive(Clone, Copy, Debug)]
pub struct Standing {
    /// The cursor the event hands the reader.
    pub cursor: u64,
    /// On a record-aware read, the stream's first retained record.
    pub first_record: Option<u64>,
}

/// How a reader's chunks are spelled.
#[derive(Clone, Copy, Debug)]
pub struct Spelling {
    /// The stream is JSON: a chunk's data is one array.
    pub json: bool,
    /// One data event per record, its envelope.
    pub envelope: bool,
    /// Data is base64 (a binary stream's canonical view).
    pub base64: bool,
}

/// A chunk's events: for the envelope, a data event and its control event per record; otherwise
/// one data event for the whole chunk (a JSON array on JSON streams, keeping the base protocol's
/// representation even on record-aware reads, §6.9) and its control event. With the second, also
/// where the data event ends: the part other readers can share.
pub fn chunk(
    records: &[Record],
    reached: Reached,
    spelling: Spelling,
    standing: Standing,
) -> (Vec<u8>, Option<usize>) {
    let mut events = Vec::new();
    if shows_nothing(records) {
        write_control(&mut events, reached, standing);
        return (events, None);
    }
    if spelling.envelope {
        let shown: Vec<_> = visible(records).collect();
        for (i, record) in shown.iter().enumerate() {
            let last = i + 1 == shown.len();
            let step = Reached {
                next: record.next_offset(),
                up_to_date: last && reached.up_to_date,
                closed: last && reached.closed,
            };
            let envelope = records::envelope(record.seq, &record.body);
            write_data_event(&mut events, &envelope, false);
            write_control(&mut events, step, standing);
        }
        return (events, None);
    }
    let body = canonical(spelling.json, records).into_bytes();
    events.reserve(body.len() + 160);
    write_data_event(&mut events, &body, spelling.base64);
    let records_len = events.len();
    write_control(&mut events, reached, standing);
    (events, Some(records_len))
}

/// Shared frames of records this long or longer go out as they are, with this reader's control
/// event after them; shorter ones are copied into one buffer with it (one chunk to write).
const SEND_SHARED_AS_IS_FROM: usize = 16 * 1024;

/// A frame another reader rendered (a data event of `records_len` bytes, then that reader's
/// control event), as this reader sends it: whole when it was rendered for this reader's cursor
/// (`rendered_for`), otherwise its data event with this reader's own control event.
pub fn for_this_reader(
    frame: Bytes,
    records_len: usize,
    rendered_for: u64,
    reached: Reached,
    standing: Standing,
) -> (Bytes, Option<Bytes>) {
    if rendered_for == standing.cursor {
        return (frame, None);
    }
    let records = frame.slice(..records_len);
    if records.len() >= SEND_SHARED_AS_IS_FROM {
        return (records, Some(Bytes::from(control(reached, standing))));
    }
    let mut joined = Vec::with_capacity(records.len() + 160);
    joined.extend_from_slice(&records);
    write_control(&mut joined, reached, standing);
    (Bytes::from(joined), None)
}

/// A control event on its own.
pub fn control(reached: Reached, standing: Standing) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    write_control(&mut out, reached, standing);
    out
}

/// The control event after a chunk, rendered by hand: every subscriber gets one per event, and
/// building a JSON map for it showed in fan-out profiles. Every value is a number, a boolean or an
/// offset token, none of which needs escaping.
fn write_control(out: &mut Vec<u8>, reached: Reached, standing: Standing) {
    out.extend_from_slice(b"event: control\ndata:{\"streamNextOffset\":\"");
    if reached.next.is_representable() {
        out.extend_from_slice(reached.next.token().as_str().as_bytes());
    } else {
        let _ = write!(out, "{}", reached.next);
    }
    out.push(b'"');
    if let Some(first) = standing.first_record {
        let _ = write!(
            out,
            ",\"streamFirstRecord\":{first},\"streamNextRecord\":{}",
            reached.next.seq
        );
    }
    if reached.closed {
        out.extend_from_slice(b",\"streamClosed\":true");
    } else {
        let _ = write!(out, ",\"streamCursor\":\"{}\"", standing.cursor);
    }
    if reached.up_to_date {
        out.extend_from_slice(b",\"upToDate\":true");
    }
    out.extend_from_slice(b"}\n\n");
}

#[cfg(test)]
mod tests;
