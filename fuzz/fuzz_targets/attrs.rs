//! Stream attributes: `attrs::parse` and `attrs::render`.
//!
//! Input: an attribute document.
//! Properties: only `title` (a string) and `metadata` (an object) are kept, never an empty map;
//! what is rendered parses back to the same attributes and renders the same again; oversized
//! documents are refused before parsing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runnel::model::attrs::{AttrsError, MAX_ATTRS_BYTES, parse, render};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let parsed = parse(data);
    if data.len() > MAX_ATTRS_BYTES {
        assert_eq!(parsed, Err(AttrsError::TooLarge));
        return;
    }
    let Ok(attrs) = parsed else {
        return;
    };
    if let Some(map) = &attrs {
        assert!(!map.is_empty());
        assert!(
            map.keys().all(|k| k == "title" || k == "metadata"),
            "{map:?}"
        );
        assert!(map.get("title").is_none_or(Value::is_string));
        assert!(map.get("metadata").is_none_or(Value::is_object));
    }
    let rendered = render(&attrs);
    assert!(serde_json::from_str::<Value>(&rendered).is_ok_and(|v| v.is_object()));
    if rendered.len() <= MAX_ATTRS_BYTES {
        assert_eq!(parse(rendered.as_bytes()), Ok(attrs.clone()), "{rendered}");
    }
    // Rendering is a normal form.
    if let Ok(again) = parse(rendered.as_bytes()) {
        assert_eq!(render(&again), rendered);
    }
});
