//! S2's JSON records on the wire: stream positions, append acks and read batches, record bytes
//! spelled in the read's `s2-format`. Serialised straight from the model's types: no
//! intermediate `Value` tree on the paths every append and every read take.

use serde_json::Value;

use crate::model::Record;
use crate::model::ledger::s2::{S2Ack, S2Position};
use crate::model::s2::Format;

/// S2's `StreamPosition`.
#[derive(serde::Serialize)]
struct Position {
    seq_num: u64,
    timestamp: u64,
}

impl From<S2Position> for Position {
    fn from(p: S2Position) -> Self {
        Position {
            seq_num: p.seq_num,
            timestamp: p.timestamp,
        }
    }
}

/// S2's `AppendAck`. Building it as a `Value` allocated four maps per append.
#[derive(serde::Serialize)]
struct Ack {
    start: Position,
    end: Position,
    tail: Position,
}

/// A position as a JSON value, for the bodies that hold one among other fields.
pub fn position(position: S2Position) -> Value {
    serde_json::json!(Position::from(position))
}

/// An append's ack.
pub fn ack(ack: &S2Ack) -> String {
    let body = Ack {
        start: ack.start.into(),
        end: ack.end.into(),
        tail: ack.tail.into(),
    };
    serde_json::to_string(&body).expect("numbers always serialise")
}

/// Records as a `ReadBatch`, with the tail when the batch tells it. Text bodies are borrowed
/// rather than copied. (Building a `Value` tree cost S2 readers a third of their time.)
pub fn read_batch(records: &[Record], tail: Option<S2Position>, format: Format) -> Vec<u8> {
    let json = Batch {
        records: records
            .iter()
            .map(|record| JsonRecord {
                seq_num: record.seq,
                timestamp: u64::try_from(record.timestamp_ms).unwrap_or(0),
                headers: record
                    .headers
                    .iter()
                    .map(|(name, value)| [Encoded(name, format), Encoded(value, format)])
                    .collect(),
                body: (!record.body.is_empty()).then_some(Encoded(&record.body, format)),
            })
            .collect(),
        tail: tail.map(Position::from),
    };
    // Serialising these types into memory cannot fail: every key is a string.
    serde_json::to_vec(&json).unwrap_or_default()
}

#[derive(serde::Serialize)]
struct Batch<'a> {
    records: Vec<JsonRecord<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tail: Option<Position>,
}

#[derive(serde::Serialize)]
struct JsonRecord<'a> {
    seq_num: u64,
    timestamp: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    headers: Vec<[Encoded<'a>; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Encoded<'a>>,
}

/// Bytes as a JSON string in the read's format.
struct Encoded<'a>(&'a [u8], Format);

impl serde::Serialize for Encoded<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.1.encoded(self.0))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::json;

    use super::*;

    fn at(seq_num: u64, timestamp: u64) -> S2Position {
        S2Position { seq_num, timestamp }
    }

    #[test]
    fn an_append_ack_is_the_json_of_its_three_positions() {
        let ack = S2Ack {
            start: at(7, 1_700_000_000_000),
            end: at(9, 1_700_000_000_001),
            tail: at(u64::MAX, 0),
        };
        let parsed: Value = serde_json::from_str(&super::ack(&ack)).expect("ack is JSON");
        assert_eq!(
            parsed,
            json!({
                "start": {"seq_num": 7, "timestamp": 1_700_000_000_000u64},
                "end": {"seq_num": 9, "timestamp": 1_700_000_000_001u64},
                "tail": {"seq_num": u64::MAX, "timestamp": 0},
            })
        );
        assert_eq!(position(ack.start), parsed["start"]);
    }

    fn record(seq: u64, headers: Vec<(Bytes, Bytes)>, body: &'static str) -> Record {
        Record {
            seq,
            pos: 0,
            timestamp_ms: 1_000 + seq as i64,
            arrival_ms: 0,
            starts_unit: true,
            headers,
            body: Bytes::from_static(body.as_bytes()),
            command: false,
        }
    }

    #[test]
    fn a_read_batch_leaves_out_empty_headers_and_bodies_and_an_untold_tail() {
        let records = [
            record(
                0,
                vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
                "a",
            ),
            record(1, Vec::new(), ""),
        ];
        let untold: Value =
            serde_json::from_slice(&read_batch(&records, None, Format::Raw)).unwrap();
        assert_eq!(
            untold,
            json!({"records": [
                {"seq_num": 0, "timestamp": 1000, "headers": [["k", "v"]], "body": "a"},
                {"seq_num": 1, "timestamp": 1001},
            ]})
        );
        let told: Value =
            serde_json::from_slice(&read_batch(&records[..1], Some(at(2, 5)), Format::Base64))
                .unwrap();
        assert_eq!(
            told,
            json!({
                "records": [{"seq_num": 0, "timestamp": 1000, "headers": [["aw==", "dg=="]],
                             "body": "YQ=="}],
                "tail": {"seq_num": 2, "timestamp": 5},
            })
        );
    }
}
