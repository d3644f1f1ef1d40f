//! The body of a Durable Streams read, in the read's view: the records' bytes back to back (or,
//! on a JSON stream, one array of them), NDJSON values, or NDJSON envelopes. Readers of this face
//! never see S2 command records.

use super::gather::{Gather, Gathered};
use crate::model::Record;
use crate::model::records::{self, ReadView, RecordView};

/// The body of `records` in `view`, on a stream that is JSON (`json_mode`) or not.
pub fn render(view: ReadView, json_mode: bool, records: &[Record]) -> Gathered {
    match view {
        ReadView::Canonical => canonical(json_mode, records),
        ReadView::Records(RecordView::Values) => {
            let mut body = Gather::default();
            for record in visible(records) {
                body.push(&record.body);
                body.push_slice(b"\n");
            }
            body.finish()
        }
        ReadView::Records(RecordView::Envelope) => {
            let mut body = Gather::default();
            for record in visible(records) {
                body.push_slice(&records::envelope(record.seq, &record.body));
                body.push_slice(b"\n");
            }
            body.finish()
        }
    }
}

/// The base protocol's body of a read: the records' bytes, or for JSON one array of them.
pub fn canonical(json_mode: bool, records: &[Record]) -> Gathered {
    let lengths = visible(records).map(|r| r.body.len());
    let mut body = Gather::sized_for(lengths, if json_mode { records.len() + 2 } else { 0 });
    if json_mode {
        body.push_slice(b"[");
        for (i, record) in visible(records).enumerate() {
            if i > 0 {
                body.push_slice(b",");
            }
            body.push(&record.body);
        }
        body.push_slice(b"]");
    } else {
        for record in visible(records) {
            body.push(&record.body);
        }
    }
    body.finish()
}

/// The records Durable Streams readers see: all but S2 command records.
pub fn visible(records: &[Record]) -> impl Iterator<Item = &Record> {
    records.iter().filter(|r| !r.command)
}

/// Whether Durable Streams readers see nothing of `records` (none, or only command records): an
/// answer with no data, at the offset past them.
pub fn shows_nothing(records: &[Record]) -> bool {
    visible(records).next().is_none()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn record(seq: u64, body: &'static [u8], command: bool) -> Record {
        Record {
            seq,
            pos: 0,
            timestamp_ms: 0,
            arrival_ms: 0,
            starts_unit: true,
            headers: Vec::new(),
            body: Bytes::from_static(body),
            command,
        }
    }

    #[test]
    fn a_json_read_is_one_array_of_the_visible_messages() {
        let records = [
            record(0, b"1", false),
            record(1, b"", true),
            record(2, b"{\"a\":2}", false),
        ];
        assert_eq!(canonical(true, &records).into_bytes(), "[1,{\"a\":2}]");
        assert_eq!(canonical(true, &[]).into_bytes(), "[]");
    }

    #[test]
    fn a_byte_read_is_the_visible_bodies_back_to_back() {
        let records = [
            record(0, b"ab", false),
            record(1, b"fence", true),
            record(2, b"c", false),
        ];
        assert_eq!(canonical(false, &records).into_bytes(), "abc");
        assert!(canonical(false, &[]).into_bytes().is_empty());
    }

    #[test]
    fn a_record_read_is_one_line_per_visible_record() {
        let records = [
            record(3, b"1", false),
            record(4, b"", true),
            record(5, b"2", false),
        ];
        let values = render(ReadView::Records(RecordView::Values), true, &records);
        assert_eq!(values.into_bytes(), "1\n2\n");
        let envelopes = render(ReadView::Records(RecordView::Envelope), true, &records);
        let expected = [
            records::envelope(3, b"1"),
            b"\n".to_vec(),
            records::envelope(5, b"2"),
            b"\n".to_vec(),
        ]
        .concat();
        assert_eq!(envelopes.into_bytes(), expected);
    }
}
