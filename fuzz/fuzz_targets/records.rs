//! JSON record coordinates: `records::parse_record_read` (the `record`, `tail_records`,
//! `max_records` and `record_view` read parameters and how they combine with `offset` and
//! `max_bytes`), and the envelope line.
//!
//! Input: a query string, decoded as the server decodes it (a repeated parameter is refused
//! before this parser runs, so such inputs are skipped).
//! Properties: a record-aware read has exactly one start, no `offset` and no `max_bytes`; every
//! number in it is the canonical decimal that was sent; a plain read sends none of the record
//! parameters; an envelope line is the JSON object it claims to be.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runnel::model::records::{ReadParams, RecordStart, RecordView, envelope, parse_record_read};
use serde_json::Value;

const NAMES: [&str; 6] = [
    "offset",
    "record",
    "tail_records",
    "max_records",
    "max_bytes",
    "record_view",
];

fuzz_target!(|data: &[u8]| {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(data)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let mut values: [Option<&str>; 6] = [None; 6];
    for (name, value) in &pairs {
        if let Some(i) = NAMES.iter().position(|n| n == name) {
            if values[i].is_some() {
                return;
            }
            values[i] = Some(value);
        }
    }
    let [
        offset,
        record,
        tail_records,
        max_records,
        max_bytes,
        record_view,
    ] = values;
    let params = ReadParams {
        offset,
        record,
        tail_records,
        max_records,
        max_bytes,
        record_view,
    };
    match parse_record_read(&params) {
        Ok(None) => {
            assert!(record.is_none() && tail_records.is_none());
            assert!(max_records.is_none() && record_view.is_none());
        }
        Ok(Some(read)) => {
            assert!(offset.is_none() && max_bytes.is_none());
            assert!(record.is_some() != tail_records.is_some());
            match read.start {
                RecordStart::At(n) => assert_eq!(record, Some(n.to_string().as_str())),
                RecordStart::Now => assert!(record == Some("now") || tail_records == Some("0")),
                RecordStart::Last(n) => {
                    assert!(n > 0);
                    assert_eq!(tail_records, Some(n.to_string().as_str()));
                }
            }
            match read.max_records {
                Some(n) => {
                    assert!(n > 0);
                    assert_eq!(max_records, Some(n.to_string().as_str()));
                }
                None => assert!(max_records.is_none()),
            }
            assert_eq!(
                read.view == RecordView::Envelope,
                record_view == Some("envelope")
            );
            assert!(record_view.is_none_or(|v| v == "envelope"));
        }
        Err(reason) => assert!(!reason.is_empty()),
    }

    // An envelope line around a canonical value is that JSON object.
    if let Ok(value) = runnel::model::json::canonical_value(data) {
        let n = data.len() as u64 * 7919;
        let line = envelope(n, &value);
        let parsed: Value = serde_json::from_slice(&line).expect("envelope line is JSON");
        assert_eq!(parsed["record"], Value::from(n));
        assert_eq!(
            parsed["value"],
            serde_json::from_slice::<Value>(&value).unwrap()
        );
        assert!(!line.contains(&b'\n'));
    }
});
