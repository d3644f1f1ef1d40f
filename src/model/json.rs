//! JSON mode: turning a request body into normalised messages (records).
//!
//! A top-level array is flattened exactly one level; any other value is one message. Each message
//! is stored in compact canonical form, so a record is always one line of JSON.

use std::cell::Cell;
use std::fmt;

use bytes::Bytes;
use serde::Deserializer as _;
use serde::de::{self, SeqAccess, Visitor};
use serde_json::Value;

/// The most messages one body may hold. Each becomes a record, and a body of tiny values
/// (`[0,0,…]`) would otherwise cost hundreds of times its own size in memory.
pub const MAX_MESSAGES: usize = 100_000;

/// How deep one message may nest arrays and objects. Parsers commonly stop at 128 levels
/// (`serde_json` does, and refuses bodies deeper than that itself), and a read puts a message one
/// level further down: in the array of a canonical read, or the envelope view's object.
pub const MAX_MESSAGE_DEPTH: usize = 126;

/// The most JSON values (of any depth) one body may hold. Parsed, each costs about 80 bytes
/// however small its text, so a body of tiny values would cost many times its own size.
pub const MAX_VALUES: usize = 1_000_000;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("body is not valid JSON: {0}")]
    Invalid(String),
    #[error("an empty JSON array appends nothing")]
    EmptyArray,
    #[error("a body holds at most {MAX_MESSAGES} JSON messages; send more in several appends")]
    TooMany,
    #[error("a body holds at most {MAX_VALUES} JSON values in all")]
    TooManyValues,
    #[error("a JSON message nests arrays and objects at most {MAX_MESSAGE_DEPTH} deep")]
    TooDeep,
}

/// Refuses a body that could hold more than [`MAX_VALUES`] JSON values, before it is parsed.
pub fn check_value_count(body: &[u8]) -> Result<(), JsonError> {
    if more_values_than(body, MAX_VALUES) {
        Err(JsonError::TooManyValues)
    } else {
        Ok(())
    }
}

/// Refuses, before it is parsed, one message that could hold more than [`MAX_VALUES`] JSON
/// values or nests deeper than [`MAX_MESSAGE_DEPTH`]: one pass for both, since most JSON
/// appends are a single message.
fn check_message(body: &[u8]) -> Result<(), JsonError> {
    let mut shape = Shape::default();
    let over = any_outside_strings(body, |byte| {
        shape.take(byte);
        shape.depth > MAX_MESSAGE_DEPTH || shape.values > MAX_VALUES
    });
    match over {
        false => Ok(()),
        true if shape.depth > MAX_MESSAGE_DEPTH => Err(JsonError::TooDeep),
        true => Err(JsonError::TooManyValues),
    }
}

/// What JSON text has shown so far, read byte by byte outside its strings: how many values it
/// could hold (each separator or opening starts at most one), and how deep it nests now.
#[derive(Default)]
struct Shape {
    values: usize,
    depth: usize,
}

impl Shape {
    fn take(&mut self, byte: u8) {
        match byte {
            b'[' | b'{' => {
                self.values += 1;
                self.depth += 1;
            }
            b']' | b'}' => self.depth = self.depth.saturating_sub(1),
            b',' | b':' => self.values += 1,
            _ => {}
        }
    }
}

/// Whether `body` could hold more than `max` JSON values: counts the separators and openings
/// outside strings, each of which starts at most one value, without parsing.
pub fn more_values_than(body: &[u8], max: usize) -> bool {
    let mut shape = Shape::default();
    any_outside_strings(body, |byte| {
        shape.take(byte);
        shape.values > max
    })
}

/// Whether the JSON text `body` nests arrays and objects more than `max` deep, without parsing.
pub fn nests_deeper_than(body: &[u8], max: usize) -> bool {
    let mut shape = Shape::default();
    any_outside_strings(body, |byte| {
        shape.take(byte);
        shape.depth > max
    })
}

/// Hands `stop` each byte of JSON text outside its strings (and their quotes), until it answers
/// true; whether it did. A plain loop: every JSON append's body passes through it, and as an
/// iterator chain it took a third longer.
fn any_outside_strings(body: &[u8], mut stop: impl FnMut(u8) -> bool) -> bool {
    let (mut in_string, mut escaped) = (false, false);
    for &byte in body {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else if byte == b'"' {
            in_string = true;
        } else if stop(byte) {
            return true;
        }
    }
    false
}

/// Whether an empty top-level array is acceptable: it is on create, not on append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmptyArray {
    Allowed,
    Rejected,
}

/// Splits a JSON body into its messages, each serialised compactly.
pub fn messages(body: &[u8], empty: EmptyArray) -> Result<Vec<Bytes>, JsonError> {
    let invalid = |e: serde_json::Error| JsonError::Invalid(e.to_string());
    let is_array = body
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .is_some_and(|b| *b == b'[');
    if !is_array {
        return canonical_value(body).map(|single| vec![single]);
    }
    // The parser's own depth limit keeps each element within MAX_MESSAGE_DEPTH, one level
    // less deep than the array.
    check_value_count(body)?;
    // Each element is rendered as it is parsed, so the whole array is never held as values.
    let too_many = Cell::new(false);
    let mut parser = serde_json::Deserializer::from_slice(body);
    let messages = parser
        .deserialize_seq(Elements {
            too_many: &too_many,
        })
        .and_then(|messages| parser.end().map(|()| messages))
        .map_err(|e| {
            if too_many.get() {
                JsonError::TooMany
            } else {
                invalid(e)
            }
        })?;
    if messages.is_empty() && empty == EmptyArray::Rejected {
        return Err(JsonError::EmptyArray);
    }
    Ok(messages)
}

/// The elements of a top-level array, each in canonical form, at most [`MAX_MESSAGES`].
struct Elements<'a> {
    too_many: &'a Cell<bool>,
}

impl<'de> Visitor<'de> for Elements<'_> {
    type Value = Vec<Bytes>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Bytes>, A::Error> {
        let mut messages = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(value) = seq.next_element::<Value>()? {
            if messages.len() == MAX_MESSAGES {
                self.too_many.set(true);
                return Err(de::Error::custom("too many messages"));
            }
            messages.push(canonical(&value));
        }
        Ok(messages)
    }
}

/// One JSON value (never flattened), serialised compactly.
pub fn canonical_value(body: &[u8]) -> Result<Bytes, JsonError> {
    check_message(body)?;
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

    #[test]
    fn nesting_is_counted_outside_strings_only() {
        assert!(!nests_deeper_than(br#"[[1],{"a":[2]}]"#, 3));
        assert!(nests_deeper_than(b"[[[[1]]]]", 3));
        assert!(!nests_deeper_than(br#"["[[[[", "\"[[[[{{"]"#, 1));
        assert!(
            nests_deeper_than(br#"{"a\\":[[1]]}"#, 2),
            "an escaped backslash ends no string"
        );
    }

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

    #[test]
    fn a_body_holds_at_most_max_messages() {
        let body = |n: usize| format!("[{}]", vec!["0"; n].join(","));
        assert_eq!(
            messages(body(MAX_MESSAGES).as_bytes(), EmptyArray::Rejected)
                .unwrap()
                .len(),
            MAX_MESSAGES
        );
        assert_eq!(
            messages(body(MAX_MESSAGES + 1).as_bytes(), EmptyArray::Rejected),
            Err(JsonError::TooMany)
        );
    }

    #[test]
    fn a_message_nests_at_most_126_deep_so_that_reads_wrapping_it_stay_parseable() {
        let object = |depth: usize| format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
        let deepest = object(MAX_MESSAGE_DEPTH);
        let one = messages(deepest.as_bytes(), EmptyArray::Rejected).unwrap();
        // Read back in a canonical body's array: within what parsers take.
        let read = format!("[{}]", String::from_utf8(one[0].to_vec()).unwrap());
        assert!(serde_json::from_str::<Value>(&read).is_ok());
        let deeper = object(MAX_MESSAGE_DEPTH + 1);
        assert_eq!(
            messages(deeper.as_bytes(), EmptyArray::Rejected),
            Err(JsonError::TooDeep)
        );
        assert_eq!(canonical_value(deeper.as_bytes()), Err(JsonError::TooDeep));
        // A top-level array is flattened: its elements are a level less deep than it, and the
        // parser takes no body deeper than 127.
        let elements = format!("[{deepest},{deepest}]");
        assert_eq!(
            messages(elements.as_bytes(), EmptyArray::Rejected)
                .unwrap()
                .len(),
            2
        );
        let array = format!("[{}]", object(MAX_MESSAGE_DEPTH + 1));
        assert!(matches!(
            messages(array.as_bytes(), EmptyArray::Rejected),
            Err(JsonError::Invalid(_))
        ));
    }

    #[test]
    fn a_body_holds_at_most_max_values_at_any_depth() {
        let nested = format!("[[{}]]", vec!["0"; MAX_VALUES + 1].join(","));
        assert_eq!(
            messages(nested.as_bytes(), EmptyArray::Rejected),
            Err(JsonError::TooManyValues)
        );
        assert_eq!(
            canonical_value(nested.as_bytes()),
            Err(JsonError::TooManyValues)
        );
        let quoted = format!("[\"{}\"]", ",".repeat(MAX_VALUES + 1));
        assert_eq!(
            texts(&quoted).len(),
            1,
            "commas inside strings are not values"
        );
        assert_eq!(texts(r#"["a\",[", 1]"#), [r#""a\",[""#, "1"]);
    }

    #[test]
    fn anything_after_the_top_level_array_is_invalid() {
        for bad in ["[1] 2", "[1]]", "[1],", " [1] x"] {
            assert!(matches!(
                messages(bad.as_bytes(), EmptyArray::Rejected),
                Err(JsonError::Invalid(_))
            ));
        }
        assert_eq!(texts(" \n[1]\t "), ["1"]);
    }

    /// What flattening means: parse the whole body, then take the array's elements.
    fn flattened_whole(body: &[u8]) -> Option<Vec<Bytes>> {
        match serde_json::from_slice::<Value>(body).ok()? {
            Value::Array(items) => Some(items.iter().map(canonical).collect()),
            single => Some(vec![canonical(&single)]),
        }
    }

    proptest! {
        #[test]
        fn elements_parsed_one_by_one_agree_with_the_whole_value(
            s in "[\\[\\]{}\",:0-9a-z \\n\\t]{0,64}"
        ) {
            prop_assert_eq!(
                messages(s.as_bytes(), EmptyArray::Allowed).ok(),
                flattened_whole(s.as_bytes())
            );
        }

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
