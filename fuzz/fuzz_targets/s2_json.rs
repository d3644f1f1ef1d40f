//! S2 JSON: `s2::parse_append_json` (an `AppendInput` body in the `raw` and `base64` formats),
//! `s2::command_of`, `s2::metered_size`, `Format::named` and `EventId::parse`.
//!
//! Input: a request body; also read as an `s2-format` header value and an SSE `Last-Event-ID`.
//! Properties: an append that parses, written back as JSON in the same format, parses to the
//! same records; raw text survives byte for byte; command records are recognised exactly by
//! their one empty-named header and carry what their body says; metering adds up; event ids
//! render back to themselves.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use runnel::model::s2::{
    Command, EventId, Format, MAX_FENCING_TOKEN, RecordError, S2Append, command_of, metered_size,
    parse_append_json,
};
use serde_json::{Value, json};

/// The append as JSON again, its bytes encoded in `format`.
fn to_json(append: &S2Append, format: Format) -> Vec<u8> {
    let records: Vec<Value> = append
        .records
        .iter()
        .map(|r| {
            let headers: Vec<Value> = r
                .headers
                .iter()
                .map(|(n, v)| json!([format.encode(n), format.encode(v)]))
                .collect();
            json!({ "timestamp": r.timestamp, "headers": headers, "body": format.encode(&r.body) })
        })
        .collect();
    serde_json::to_vec(&json!({
        "records": records,
        "match_seq_num": append.match_seq_num,
        "fencing_token": append.fencing_token,
    }))
    .unwrap()
}

type Shape = (Option<u64>, Vec<(Bytes, Bytes)>, Bytes);

fn shape(append: &S2Append) -> (Vec<Shape>, Option<u64>, Option<String>) {
    let records = append
        .records
        .iter()
        .map(|r| (r.timestamp, r.headers.clone(), r.body.clone()))
        .collect();
    (records, append.match_seq_num, append.fencing_token.clone())
}

fn check_command(headers: &[(Bytes, Bytes)], body: &[u8]) {
    let empty_names = headers.iter().filter(|(n, _)| n.is_empty()).count();
    match command_of(headers, body) {
        Ok(None) => assert_eq!(empty_names, 0),
        Ok(Some(command)) => {
            assert_eq!(headers.len(), 1);
            assert!(headers[0].0.is_empty());
            match command {
                Command::Fence(token) => {
                    assert_eq!(headers[0].1.as_ref(), b"fence");
                    assert_eq!(token.as_bytes(), body);
                    assert!(token.len() <= MAX_FENCING_TOKEN);
                }
                Command::Trim(point) => {
                    assert_eq!(headers[0].1.as_ref(), b"trim");
                    assert_eq!(body, point.to_be_bytes());
                }
            }
        }
        Err(RecordError::EmptyHeaderName) => assert!(empty_names >= 1 && headers.len() > 1),
        Err(_) => assert!(empty_names == 1 && headers.len() == 1),
    }
    let header_bytes: u64 = headers
        .iter()
        .map(|(n, v)| 2 + n.len() as u64 + v.len() as u64)
        .sum();
    assert_eq!(
        metered_size(headers, body),
        8 + header_bytes + body.len() as u64
    );
}

fuzz_target!(|data: &[u8]| {
    for format in [Format::Raw, Format::Base64] {
        let Ok(append) = parse_append_json(data, format) else {
            continue;
        };
        let again = parse_append_json(&to_json(&append, format), format)
            .expect("an append written back as JSON must parse");
        assert_eq!(shape(&again), shape(&append));
        for record in &append.records {
            check_command(&record.headers, &record.body);
            if format == Format::Raw {
                for bytes in record.headers.iter().flat_map(|(n, v)| [n, v]) {
                    assert!(std::str::from_utf8(bytes).is_ok());
                }
                assert_eq!(
                    Format::Raw.encode(&record.body).as_bytes(),
                    record.body.as_ref()
                );
            }
        }
    }

    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(format) = Format::named(Some(text)) {
            let trimmed = text.trim();
            let binsafe = matches!(trimmed, "base64" | "json-binsafe");
            assert_eq!(format == Format::Base64, binsafe);
        }
        if let Some(id) = EventId::parse(text) {
            assert_eq!(EventId::parse(&id.to_string()), Some(id));
        }
    }
    // Base64 round trip of the raw bytes.
    let encoded = Format::Base64.encode(data);
    assert_eq!(Format::Base64.decode(&encoded).as_deref(), Ok(data));
});
