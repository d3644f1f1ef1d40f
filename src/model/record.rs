//! Records: the unit every face reads and writes.

use bytes::Bytes;

use super::offset::Offset;

/// One message of a stream: a POST body on a byte stream, one JSON value on a JSON stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Ordinal within the stream, from 0, never reused.
    pub seq: u64,
    /// Byte position of the first body byte in the stream's canonical byte sequence.
    pub pos: u64,
    /// Milliseconds since the Unix epoch, never decreasing within a stream: the arrival time,
    /// or the S2 client's timestamp where the stream's timestamping mode takes it.
    pub timestamp_ms: i64,
    /// When the server sequenced the record (milliseconds since the Unix epoch). S2 retention
    /// ages count from it, whatever timestamp the client chose.
    pub arrival_ms: i64,
    /// Whether this record begins an append unit (one POST, one PUT body). Fork sub-offsets and
    /// producer acknowledgements are defined per unit.
    pub starts_unit: bool,
    /// Name/value pairs that S2 clients attach; Durable Streams reads never show them.
    pub headers: Vec<(Bytes, Bytes)>,
    pub body: Bytes,
    /// An S2 command record (fence, trim): it takes a sequence number but no bytes of the
    /// canonical byte stream, so Durable Streams reads never show it.
    pub command: bool,
}

impl Record {
    /// The offset just after this record.
    pub fn next_offset(&self) -> Offset {
        Offset::new(self.seq + 1, self.pos + self.byte_len())
    }

    /// How many bytes of the canonical byte stream this record holds.
    pub fn byte_len(&self) -> u64 {
        if self.command {
            0
        } else {
            self.body.len() as u64
        }
    }

    /// The bytes Durable Streams readers see.
    pub fn visible_body(&self) -> &[u8] {
        if self.command { &[] } else { &self.body }
    }

    /// The offset at this record's first byte.
    pub fn offset(&self) -> Offset {
        Offset::new(self.seq, self.pos)
    }

    /// The bytes a read counts this record as holding, against its budget and the read memory
    /// (see [`held_len_of`]).
    pub fn held_len(&self) -> usize {
        held_len_of(&self.headers, self.body.len())
    }
}

/// The bytes a read counts a record of `headers` and a body of `body_len` bytes as holding: its
/// S2 metered size (8 bytes for the record, 2 per header, and the bytes of the headers and the
/// body). Not the body alone: an S2 record may carry a megabyte of headers and no body, and a
/// budget of bodies would let one read load a thousand of them, or any number of empty records.
/// Not more than the metered size either, so that an S2 read's budget still reaches its metered
/// limit. (A record's place in memory weighs more than its 8 bytes: the hot cache counts it.)
pub fn held_len_of(headers: &[(Bytes, Bytes)], body_len: usize) -> usize {
    crate::model::s2::metered_size_of(headers, body_len) as usize
}

/// Lays out the bodies of one append unit after `tail`, stamped with `timestamp_ms`, which is
/// also taken for their arrival.
pub fn lay_out(tail: Offset, timestamp_ms: i64, bodies: Vec<Bytes>) -> Vec<Record> {
    lay_out_arrived(tail, timestamp_ms, timestamp_ms, bodies)
}

/// [`lay_out`], for records that arrived at `arrival_ms` (the server's clock) but carry
/// `timestamp_ms`, which never goes below the stream's last timestamp and so may be ahead of
/// the clock. Retention ages count from arrival.
pub fn lay_out_arrived(
    tail: Offset,
    timestamp_ms: i64,
    arrival_ms: i64,
    bodies: Vec<Bytes>,
) -> Vec<Record> {
    let mut at = tail;
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| {
            let record = Record {
                seq: at.seq,
                pos: at.pos,
                timestamp_ms,
                arrival_ms,
                starts_unit: i == 0,
                headers: Vec::new(),
                body,
                command: false,
            };
            at = record.next_offset();
            record
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_is_laid_out_contiguously_after_the_tail() {
        let records = lay_out(
            Offset::new(3, 10),
            5,
            vec![Bytes::from("ab"), Bytes::from("cde")],
        );
        assert_eq!(records[0].offset(), Offset::new(3, 10));
        assert_eq!(records[1].offset(), Offset::new(4, 12));
        assert_eq!(records[1].next_offset(), Offset::new(5, 15));
        assert!(records[0].starts_unit && !records[1].starts_unit);
    }
}
