//! Header values: `Stream-TTL`, `Stream-Expires-At`, `Stream-Fork-Sub-Offset`, the producer
//! triple, `Stream-Closed`, `Content-Type` and S2's `s2-encryption-key`.
//!
//! Input: up to three header values, one per line (`Producer-Id`, `Producer-Epoch` and
//! `Producer-Seq` when taken together); a missing line, or a line that is just DEL (0x7f), is an
//! absent header.
//! Properties: canonical decimals render back verbatim and every parser built on them agrees;
//! a parsed timestamp re-renders to a timestamp that parses to the same instant; a producer claim
//! carries exactly the numbers sent; media types are normalised idempotently; a parsed key
//! seals and opens, and never opens what it did not seal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runnel::model::cipher::RecordKey;
use runnel::model::content_type;
use runnel::model::headers::{
    MAX_PRODUCER_NUMBER, format_timestamp, is_closed_flag, parse_canonical_u64, parse_expires_at,
    parse_producer, parse_sub_offset, parse_ttl,
};

fn check_value(value: &str) {
    // Canonical decimals: exactly the strings u64's Display produces.
    let canonical = parse_canonical_u64(value);
    if let Some(n) = canonical {
        assert_eq!(n.to_string(), value);
    } else if let Ok(n) = value.parse::<u64>() {
        assert_ne!(
            n.to_string(),
            value,
            "{value:?} is canonical but was refused"
        );
    }
    assert_eq!(parse_ttl(value).ok(), canonical);
    assert_eq!(parse_sub_offset(value).ok(), canonical);

    // Timestamps: what the server renders parses back to the same millisecond.
    if let Ok(ms) = parse_expires_at(value) {
        let rendered = format_timestamp(ms);
        if !rendered.is_empty() {
            assert_eq!(
                parse_expires_at(&rendered),
                Ok(ms),
                "{value:?} -> {rendered:?}"
            );
            assert_eq!(format_timestamp(ms), rendered);
        }
    }

    assert_eq!(
        is_closed_flag(Some(value)),
        value.trim().eq_ignore_ascii_case("true")
    );

    // Content types.
    let media = content_type::media_type(value);
    assert_eq!(
        content_type::media_type(&media),
        media,
        "media_type is not idempotent"
    );
    assert!(content_type::same_media_type(value, &media));
    assert_eq!(content_type::is_json(value), media == "application/json");
    assert_eq!(
        content_type::is_well_formed(value),
        content_type::is_well_formed(&media)
    );
    if content_type::is_well_formed(value) {
        assert_eq!(media.matches('/').count(), 1);
        assert!(!media.contains(char::is_whitespace));
    }
    let _ = content_type::sse_needs_base64(value);

    // Record keys.
    if let Ok(key) = RecordKey::from_base64(value) {
        let fingerprint = key.fingerprint();
        assert_eq!(fingerprint.len(), 64);
        let sealed = key.seal(value.as_bytes());
        assert_eq!(key.open(&sealed).as_deref(), Ok(value.as_bytes()));
        assert!(
            key.open(value.as_bytes()).is_err(),
            "opened bytes it never sealed"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n').map(|l| (l != "\u{7f}").then_some(l));
    let (id, epoch, seq) = (
        lines.next().flatten(),
        lines.next().flatten(),
        lines.next().flatten(),
    );
    for value in [id, epoch, seq].into_iter().flatten() {
        check_value(value);
    }

    match parse_producer(id, epoch, seq) {
        Ok(None) => assert!(id.is_none() && epoch.is_none() && seq.is_none()),
        Ok(Some(claim)) => {
            let (id, epoch, seq) = (id.unwrap(), epoch.unwrap(), seq.unwrap());
            assert_eq!(claim.id, id);
            assert!(!id.is_empty());
            for (number, text) in [(claim.epoch, epoch), (claim.seq, seq)] {
                assert!(number <= MAX_PRODUCER_NUMBER);
                assert!(text.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
                assert_eq!(text.parse::<u64>(), Ok(number));
            }
        }
        Err(_) => {}
    }
});
