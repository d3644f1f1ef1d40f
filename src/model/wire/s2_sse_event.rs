//! The events of an S2 read session over Server-Sent Events: `batch` events carrying a read
//! batch's JSON and the session's running totals as their `id`, `ping` heartbeats with the
//! tail, an `error` event when the session fails, and `data: [DONE]` at a normal end.

use bytes::Bytes;
use serde_json::{Value, json};

use super::s2_json;
use crate::model::ledger::s2::S2Position;
use crate::model::s2::EventId;

/// The last event of a session that ended normally.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// A `batch` event around a read batch's JSON (see [`s2_json::read_batch`]).
pub fn batch(id: EventId, json: &[u8]) -> Vec<u8> {
    let mut event = Vec::with_capacity(json.len() + 40);
    event.extend_from_slice(format!("event: batch\nid: {id}\ndata: ").as_bytes());
    event.extend_from_slice(json);
    event.extend_from_slice(b"\n\n");
    event
}

/// A `ping`: the time it is sent and the tail as it stands.
pub fn ping(now_ms: i64, tail: S2Position) -> Bytes {
    let data =
        json!({ "timestamp": u64::try_from(now_ms).unwrap_or(0), "tail": s2_json::position(tail) });
    Bytes::from(format!("event: ping\ndata: {data}\n\n"))
}

/// An `error` event carrying the JSON error body a unary call would get.
pub fn error(body: &Value) -> Bytes {
    Bytes::from(format!("event: error\ndata: {body}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_is_its_fields_then_a_blank_line() {
        let id = EventId {
            last_seq: 4,
            count: 5,
            bytes: 60,
        };
        assert_eq!(
            batch(id, br#"{"records":[]}"#),
            b"event: batch\nid: 4,5,60\ndata: {\"records\":[]}\n\n"
        );
        let tail = S2Position {
            seq_num: 9,
            timestamp: 10,
        };
        assert_eq!(
            ping(1_700, tail),
            "event: ping\ndata: {\"timestamp\":1700,\"tail\":{\"seq_num\":9,\"timestamp\":10}}\n\n"
        );
        assert_eq!(
            error(&json!({"code": "x"})),
            "event: error\ndata: {\"code\":\"x\"}\n\n"
        );
        assert_eq!(DONE, b"data: [DONE]\n\n");
    }
}
