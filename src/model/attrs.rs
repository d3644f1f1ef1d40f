//! Stream attributes (seed 000 §5): a small JSON object of application metadata beside a stream.
//!
//! Only `title` (a string) and `metadata` (an object) are kept; other top-level fields are
//! accepted and dropped. `{}` means no attributes.

use serde_json::{Map, Value};

/// The largest encoded attribute object accepted.
pub const MAX_ATTRS_BYTES: usize = 16 * 1024;

/// How deep an attribute document may nest. Attributes travel inside other JSON (a mirror's
/// `StreamState` message), and parsers commonly stop at 128 levels: a document near that would
/// stop every mirror of its stream.
pub const MAX_ATTRS_DEPTH: usize = 64;

/// Normalised attributes: `None` when there are none.
pub type Attrs = Option<Map<String, Value>>;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttrsError {
    #[error("stream attributes exceed {MAX_ATTRS_BYTES} bytes")]
    TooLarge,
    #[error("stream attributes nest arrays and objects at most {MAX_ATTRS_DEPTH} deep")]
    TooDeep,
    #[error("stream attributes must be a JSON object: {0}")]
    NotAnObject(String),
    #[error("stream attribute 'title' must be a string")]
    BadTitle,
    #[error("stream attribute 'metadata' must be a JSON object")]
    BadMetadata,
}

/// Parses and normalises an attribute document.
pub fn parse(encoded: &[u8]) -> Result<Attrs, AttrsError> {
    if encoded.len() > MAX_ATTRS_BYTES {
        return Err(AttrsError::TooLarge);
    }
    if super::json::nests_deeper_than(encoded, MAX_ATTRS_DEPTH) {
        return Err(AttrsError::TooDeep);
    }
    let value: Value =
        serde_json::from_slice(encoded).map_err(|e| AttrsError::NotAnObject(e.to_string()))?;
    let Value::Object(mut given) = value else {
        return Err(AttrsError::NotAnObject("got another JSON type".into()));
    };
    let mut kept = Map::new();
    match given.remove("title") {
        None | Some(Value::Null) => {}
        Some(title @ Value::String(_)) => {
            kept.insert("title".into(), title);
        }
        Some(_) => return Err(AttrsError::BadTitle),
    }
    match given.remove("metadata") {
        None | Some(Value::Null) => {}
        Some(metadata @ Value::Object(_)) => {
            kept.insert("metadata".into(), metadata);
        }
        Some(_) => return Err(AttrsError::BadMetadata),
    }
    Ok((!kept.is_empty()).then_some(kept))
}

/// The attribute document as clients read it: `{}` when there are none.
pub fn render(attrs: &Attrs) -> String {
    match attrs {
        Some(map) => Value::Object(map.clone()).to_string(),
        None => "{}".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unknown_top_level_fields_are_dropped_and_empty_means_none() {
        let attrs = parse(br#"{"title":"t","extra":1,"metadata":{"a":{"b":2}}}"#).unwrap();
        assert_eq!(render(&attrs), r#"{"title":"t","metadata":{"a":{"b":2}}}"#);
        assert_eq!(parse(b"{}").unwrap(), None);
        assert_eq!(parse(br#"{"other":true}"#).unwrap(), None);
    }

    #[test]
    fn malformed_documents_are_rejected() {
        assert!(matches!(parse(b"[1]"), Err(AttrsError::NotAnObject(_))));
        assert!(matches!(parse(b"{"), Err(AttrsError::NotAnObject(_))));
        assert_eq!(parse(br#"{"title":3}"#), Err(AttrsError::BadTitle));
        assert_eq!(parse(br#"{"metadata":"x"}"#), Err(AttrsError::BadMetadata));
        let big = format!(r#"{{"title":"{}"}}"#, "x".repeat(MAX_ATTRS_BYTES));
        assert_eq!(parse(big.as_bytes()), Err(AttrsError::TooLarge));
    }

    #[test]
    fn documents_nest_at_most_64_deep_so_that_messages_carrying_them_stay_parseable() {
        // The document is one level; each `{"a":…}` (the first is `metadata`'s object) one more.
        let nested = |depth: usize| {
            let inner = depth - 1;
            format!(
                r#"{{"metadata":{}1{}}}"#,
                r#"{"a":"#.repeat(inner),
                "}".repeat(inner)
            )
        };
        assert!(parse(nested(MAX_ATTRS_DEPTH).as_bytes()).unwrap().is_some());
        assert_eq!(
            parse(nested(MAX_ATTRS_DEPTH + 1).as_bytes()),
            Err(AttrsError::TooDeep)
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = parse(&body);
        }
    }
}
