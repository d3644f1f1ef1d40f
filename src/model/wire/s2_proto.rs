//! S2's protobuf messages of the records API (`s2.v1`, from the `s2-api` crate), mapped to and
//! from the model's types: an `AppendInput` into an append, an ack and a read batch into their
//! messages. How messages are framed in a session is [`super::s2s_frame`].

use s2_api::v1::stream::proto;
use s2_api::v1::stream::s2s::CompressedData;

use crate::model::Record;
use crate::model::ledger::s2::{S2Ack, S2Position};
use crate::model::s2::{self, BatchError, S2Append, S2Record};

/// The largest protobuf `AppendInput` a valid batch makes: protobuf spells a header out in at
/// most twice its metered bytes, a record's own fields in at most 19 bytes against its 8
/// metered ones, and a batch holds at most 1 MiB metered in 1000 records. A larger body is
/// refused before it is decoded.
const MAX_APPEND_INPUT_BYTES: usize = 3 << 20;

/// Why an `AppendInput` is refused before its records are checked.
#[derive(Debug, thiserror::Error)]
pub enum AppendInputError {
    /// It decodes, or would, to no valid batch: too large, or too many records.
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// A unary body that is not a protobuf `AppendInput`.
    #[error("invalid protobuf: {0}")]
    Malformed(#[from] prost::DecodeError),
    /// A session frame that does not hold an `AppendInput`.
    #[error("invalid AppendInput frame: {0}")]
    BadFrame(std::io::Error),
}

/// A unary protobuf `AppendInput`, refused as [`S2Append::check`] would refuse it when it is
/// larger than any valid batch or holds too many records, before it is decoded: decoded, an
/// empty record weighs 72 bytes against its 2 on the wire.
pub fn decode_append(bytes: &[u8]) -> Result<S2Append, AppendInputError> {
    if bytes.len() > MAX_APPEND_INPUT_BYTES {
        return Err(BatchError::TooLarge.into());
    }
    check_record_count(prost::Message::decode(bytes)?)?;
    Ok(append_of(prost::Message::decode(bytes)?))
}

/// The `AppendInput` of an append session's frame, its records counted first, as a unary
/// body's are: a frame of 2 MiB holds a million empty records.
pub fn append_of_frame(data: CompressedData) -> Result<S2Append, AppendInputError> {
    let count = data
        .clone()
        .try_into_proto()
        .map_err(AppendInputError::BadFrame)?;
    check_record_count(count)?;
    data.try_into_proto::<proto::AppendInput>()
        .map(append_of)
        .map_err(AppendInputError::BadFrame)
}

/// An `AppendInput` read only for how many records it holds: each decodes to nothing, so
/// counting them allocates nothing.
#[derive(Clone, PartialEq, prost::Message)]
struct RecordCount {
    #[prost(message, repeated, tag = "1")]
    records: Vec<()>,
}

fn check_record_count(count: RecordCount) -> Result<(), BatchError> {
    if count.records.len() > s2::MAX_BATCH_RECORDS {
        return Err(BatchError::RecordCount);
    }
    Ok(())
}

/// The records of an `AppendInput`, as the service takes them.
fn append_of(input: proto::AppendInput) -> S2Append {
    S2Append {
        records: input
            .records
            .into_iter()
            .map(|r| S2Record {
                timestamp: r.timestamp,
                headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(),
                body: r.body,
            })
            .collect(),
        match_seq_num: input.match_seq_num,
        fencing_token: input.fencing_token,
    }
}

fn position(p: S2Position) -> proto::StreamPosition {
    proto::StreamPosition {
        seq_num: p.seq_num,
        timestamp: p.timestamp,
    }
}

pub fn ack_message(ack: &S2Ack) -> proto::AppendAck {
    proto::AppendAck {
        start: Some(position(ack.start)),
        end: Some(position(ack.end)),
        tail: Some(position(ack.tail)),
    }
}

/// Records as a `ReadBatch`, with the tail when the batch tells it.
pub fn read_batch(records: &[Record], tail: Option<S2Position>) -> proto::ReadBatch {
    let records = records
        .iter()
        .map(|r| proto::SequencedRecord {
            seq_num: r.seq,
            timestamp: u64::try_from(r.timestamp_ms).unwrap_or(0),
            headers: r
                .headers
                .iter()
                .map(|(name, value)| proto::Header {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            body: r.body.clone(),
        })
        .collect();
    proto::ReadBatch {
        records,
        tail: tail.map(position),
    }
}

/// A batch of no records, telling the tail: a read session's heartbeat.
pub fn heartbeat(tail: S2Position) -> proto::ReadBatch {
    read_batch(&[], Some(tail))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use prost::Message as _;

    use super::*;

    fn input(records: usize) -> proto::AppendInput {
        proto::AppendInput {
            records: (0..records)
                .map(|i| proto::AppendRecord {
                    timestamp: Some(i as u64),
                    headers: vec![proto::Header {
                        name: Bytes::from_static(b"h"),
                        value: Bytes::from_static(b"v"),
                    }],
                    body: Bytes::from(format!("record {i}")),
                })
                .collect(),
            match_seq_num: Some(4),
            fencing_token: Some("fence".into()),
        }
    }

    #[test]
    fn an_append_input_decodes_to_its_records_in_order() {
        let append = decode_append(&input(3).encode_to_vec()).unwrap();
        assert_eq!(append.records.len(), 3);
        assert_eq!(append.records[2].body, "record 2");
        assert_eq!(append.records[1].timestamp, Some(1));
        assert_eq!(append.records[0].headers, vec![("h".into(), "v".into())]);
        assert_eq!(append.match_seq_num, Some(4));
        assert_eq!(append.fencing_token.as_deref(), Some("fence"));
    }

    #[test]
    fn an_append_input_of_too_many_records_is_refused_before_it_is_decoded() {
        let bytes = input(s2::MAX_BATCH_RECORDS + 1).encode_to_vec();
        assert!(matches!(
            decode_append(&bytes),
            Err(AppendInputError::Batch(BatchError::RecordCount))
        ));
        let huge = vec![0u8; MAX_APPEND_INPUT_BYTES + 1];
        assert!(matches!(
            decode_append(&huge),
            Err(AppendInputError::Batch(BatchError::TooLarge))
        ));
    }

    #[test]
    fn bytes_that_are_not_an_append_input_are_malformed() {
        let refused = decode_append(b"\xff\xff\xff").unwrap_err();
        assert!(matches!(refused, AppendInputError::Malformed(_)));
        assert!(refused.to_string().starts_with("invalid protobuf: "));
    }
}
