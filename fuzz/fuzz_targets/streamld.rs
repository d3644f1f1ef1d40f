//! StreamLD replication messages: `streamld::Message::parse` (what a mirror and the WebSocket
//! endpoint read), `Message::to_json`, and the record envelope (`envelope`, `frame`,
//! `record_of`).
//!
//! Input: a message text; also used as the body of a record that is replicated, as a stream's
//! attributes in a state message, and (one per line) as stream names in a bucket subscription's
//! cursors.
//! Properties: a message that parses, sent again, parses to the same message; a record in a
//! frame comes back from the wire exactly as the upstream stored it (JSON records are stored
//! canonical, so under a JSON content type only canonical bodies are tried); so do a stream's
//! attributes and the stream names of cursors.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use runnel::model::Record;
use runnel::model::attrs;
use runnel::model::json::canonical_value;
use runnel::model::streamld::{
    Message, StreamState, SubscriptionRequest, envelope, frame, record_of, sequence_of,
};

const CONTENT_TYPES: [&str; 3] = ["application/json", "text/plain", "application/octet-stream"];

/// Sends `record` as a replication frame and reads it back as a mirror does.
fn replicate(record: &Record, content_type: &str) {
    let canonical = canonical_value(&record.body).is_ok_and(|c| c == record.body);
    if content_type == "application/json" && !record.command && !canonical {
        return;
    }
    let event = envelope("http://upstream/bucket/stream", content_type, record);
    assert_eq!(event.sequence, sequence_of(record.seq));
    assert_eq!(
        record_of(&event).as_ref(),
        Some(record),
        "envelope under {content_type}"
    );

    let text = Message::Frame(Box::new(frame(
        "http://upstream/bucket/stream",
        content_type,
        record,
        7,
    )))
    .to_json();
    let Ok(Message::Frame(received)) = Message::parse(&text) else {
        panic!("a frame Runnel sent does not parse as a frame: {text}");
    };
    assert_eq!(
        record_of(&received.event).as_ref(),
        Some(record),
        "the record changed on the wire under {content_type}: {text}"
    );
}

fuzz_target!(|data: &[u8]| {
    // The input as a record body, replicated.
    let record = Record {
        seq: 3,
        pos: 17,
        timestamp_ms: 1_700_000_000_000,
        // Replicated records carry their timestamp as their arrival.
        arrival_ms: 1_700_000_000_000,
        starts_unit: true,
        headers: vec![(Bytes::from_static(b"k"), Bytes::from_static(&[0, 255]))],
        body: Bytes::copy_from_slice(data),
        command: false,
    };
    for content_type in CONTENT_TYPES {
        replicate(&record, content_type);
    }

    // The input as a stream's attributes.
    if let Ok(Some(attrs)) = attrs::parse(data) {
        let state = Message::State(Box::new(StreamState {
            stream: "http://upstream/bucket/stream".into(),
            content_type: "application/json".into(),
            closed: false,
            attrs: Some(attrs),
            ttl_secs: None,
            expires_at_ms: None,
            retained_from: "0000000000000000_0000000000000000".into(),
            first_sequence: 1,
            tail: "0000000000000000_0000000000000000".into(),
            next_sequence: 1,
            snapshot: None,
            created_ms: 0,
            cipher: None,
            key_fingerprint: None,
        }));
        let text = state.to_json();
        assert_eq!(
            Message::parse(&text).as_ref(),
            Ok(&state),
            "attributes changed on the wire: {text}"
        );
    }

    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };

    // The input as the stream names of a bucket subscription's cursors.
    let cursors = text
        .split('\n')
        .zip(1..)
        .map(|(s, n)| (s.to_string(), n))
        .collect();
    let request = Message::Subscribe(SubscriptionRequest {
        stream: "http://upstream/bucket".into(),
        cursors: Some(cursors),
        ..Default::default()
    });
    let sent = request.to_json();
    assert_eq!(
        Message::parse(&sent).as_ref(),
        Ok(&request),
        "cursors changed on the wire: {sent}"
    );

    // The input as a message.
    let Ok(message) = Message::parse(text) else {
        return;
    };
    let sent = message.to_json();
    assert_eq!(
        Message::parse(&sent).as_ref(),
        Ok(&message),
        "a parsed message, sent again, must parse the same: {sent}"
    );
    if let Message::Frame(received) = &message
        && let Some(record) = record_of(&received.event)
    {
        assert_eq!(received.event.sequence, sequence_of(record.seq));
        for content_type in CONTENT_TYPES {
            replicate(&record, content_type);
        }
    }
});
