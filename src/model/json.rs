//! JSON mode: turning a request body into normalised messages (records).
//!
//! A top-level array is flattened exactly one level; any other value is one message. Each message
//! is stored in compact canonical form, so a record is always one line of JSON.

use bytes::Bytes;
use serde_json::Value;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("body is not valid JSON: {0}")]
    Invalid(String),
    #[error("an empty JSON array appends nothing")]
    EmptyArray,
}

/// Whether an empty top-level array is acceptable: it is on create, not on append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmptyArray {
    Allowed,
    Rejected,
}

/// Splits a JSON body into its messages, each serialised compactly.
pub fn messages(body: &[u8], empty: EmptyArray) -> Result<Vec<Bytes>, JsonError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| JsonError::Invalid(e.to_string()))?;
    let values = match value {
        Value::Array(items) => {
            if items.is_empty() && empty == EmptyArray::Rejected {
                return Err(JsonError::EmptyArray);
            }
            items
        }
        single => vec![single],
    };
    Ok(values.iter().map(canonical).collect())
}

/// One JSON value (never flattened), serialised compactly.
pub fn canonical_value(body: &[u8]) -> Result<Bytes, JsonError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| JsonError::Invalid(e.to_string()))?;
    Ok(canonical(&value))
}

fn canonical(value: &Value) -> Bytes {
    // Serialising a `Value` cannot fail: its keys are strings and it holds no foreign types.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn texts(body: &str) -> Vec<String> {
        messages(body.as_bytes(), EmptyArray::Rejected)
            .unwrap()
            .iter()
            .map(|m| String::from_utf8(m.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn a_non_array_value_is_one_message() {
        assert_eq!(texts(r#"{"e": 1}"#), [r#"{"e":1}"#]);
        assert_eq!(texts("42"), ["42"]);
        assert_eq!(texts(r#""s""#), [r#""s""#]);
    }

    #[test]
    fn a_top_level_array_is_flattened_exactly_one_level() {
        assert_eq!(texts(r#"[{"a":1},{"b":2}]"#), [r#"{"a":1}"#, r#"{"b":2}"#]);
        assert_eq!(texts("[[1,2],[3,4]]"), ["[1,2]", "[3,4]"]);
        assert_eq!(texts("[[[1,2,3]]]"), ["[[1,2,3]]"]);
    }

    #[test]
    fn key_order_and_number_text_survive_normalisation() {
        assert_eq!(
            texts(r#"{"z":1,"a":1.50,"n":12345678901234567890}"#),
            [r#"{"z":1,"a":1.50,"n":12345678901234567890}"#]
        );
    }

    #[test]
    fn empty_array_is_rejected_on_append_and_allowed_on_create() {
        assert_eq!(
            messages(b"[]", EmptyArray::Rejected),
            Err(JsonError::EmptyArray)
        );
        assert_eq!(messages(b" [ ] ", EmptyArray::Allowed), Ok(vec![]));
    }

    #[test]
    fn invalid_json_is_rejected() {
        for bad in ["", "{", "[1,]", "{\"a\":}", "nul", "1 2"] {
            assert!(matches!(
                messages(bad.as_bytes(), EmptyArray::Rejected),
                Err(JsonError::Invalid(_))
            ));
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = messages(&body, EmptyArray::Rejected);
        }

        #[test]
        fn normalised_messages_are_single_line_json(s in "[\\[\\]{}\",:0-9a-z \\n\\t]{0,64}") {
            if let Ok(msgs) = messages(s.as_bytes(), EmptyArray::Allowed) {
                for m in msgs {
                    prop_assert!(!m.contains(&b'\n'));
                    prop_assert!(serde_json::from_slice::<Value>(&m).is_ok());
                }
            }
        }
    }
}
