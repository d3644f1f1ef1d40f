//! JSON normalisation: `json::messages` (a JSON-mode append body) and `json::canonical_value`.
//!
//! Input: a request body.
//! Properties: the canonical form is idempotent, one line, UTF-8 and the same JSON value; a
//! top-level array of N values gives N messages that render back as the canonical array; any
//! other value is one message; an empty array is refused exactly when appending; the two
//! functions accept the same bodies, but for arrays of more messages than one append carries,
//! and for arrays nested past one message's depth limit, whose elements are within it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runnel::model::json::{
    EmptyArray, JsonError, MAX_MESSAGE_DEPTH, canonical_value, messages, nests_deeper_than,
};
use serde_json::Value;

/// The messages laid out as one JSON array, as a JSON-mode read returns them.
fn as_array(messages: &[bytes::Bytes]) -> Vec<u8> {
    let mut out = b"[".to_vec();
    for (i, message) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(message);
    }
    out.push(b']');
    out
}

fn assert_canonical(bytes: &[u8]) {
    assert_eq!(
        canonical_value(bytes).as_deref(),
        Ok(bytes),
        "canonical form is not idempotent"
    );
    assert!(!bytes.contains(&b'\n'), "a record must be one line");
    assert!(std::str::from_utf8(bytes).is_ok());
}

fuzz_target!(|body: &[u8]| {
    let canonical = canonical_value(body);
    let allowed = messages(body, EmptyArray::Allowed);
    let rejected = messages(body, EmptyArray::Rejected);

    let canonical = match canonical {
        Ok(canonical) => canonical,
        Err(JsonError::TooDeep) => {
            // Too deep for one message; an array is flattened, and its elements may be within
            // the limit. Whatever is taken is.
            for result in [&allowed, &rejected] {
                match result {
                    Ok(taken) => {
                        for message in taken {
                            assert!(!nests_deeper_than(message, MAX_MESSAGE_DEPTH));
                            assert_canonical(message);
                        }
                    }
                    Err(e) => assert!(
                        matches!(
                            e,
                            JsonError::TooDeep
                                | JsonError::Invalid(_)
                                | JsonError::TooMany
                                | JsonError::TooManyValues
                                | JsonError::EmptyArray
                        ),
                        "{e:?}"
                    ),
                }
            }
            return;
        }
        Err(_) => {
            let refused = |r: &Result<_, JsonError>| {
                matches!(r, Err(JsonError::Invalid(_) | JsonError::TooManyValues))
            };
            assert!(refused(&allowed) && refused(&rejected));
            return;
        }
    };
    assert_canonical(&canonical);
    let original: Value = serde_json::from_slice(body).unwrap();
    let normalised: Value = serde_json::from_slice(&canonical).unwrap();
    assert_eq!(original, normalised, "normalisation changed the value");

    if allowed == Err(JsonError::TooMany) {
        // More messages than one append may carry: refused whatever the empty-array rule.
        assert_eq!(rejected, Err(JsonError::TooMany));
        return;
    }
    let allowed = allowed.expect("canonical_value accepted the body but messages refused it");
    match &normalised {
        Value::Array(items) => {
            assert_eq!(allowed.len(), items.len());
            assert_eq!(as_array(&allowed), canonical.as_ref());
            for (message, item) in allowed.iter().zip(items) {
                assert_canonical(message);
                assert_eq!(&serde_json::from_slice::<Value>(message).unwrap(), item);
            }
            if items.is_empty() {
                assert_eq!(rejected, Err(JsonError::EmptyArray));
            } else {
                assert_eq!(rejected, Ok(allowed));
            }
        }
        _ => {
            assert_eq!(allowed, vec![canonical.clone()]);
            assert_eq!(rejected, Ok(allowed));
        }
    }
});
