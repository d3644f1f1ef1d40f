//! Content types: how a stream's declared type is compared and which read encodings it implies.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};

/// The type a stream gets when its creator names none.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// How many distinct content types [`intern`] shares, and the longest one it shares. Beyond
/// these a content type gets its own copy: a client naming endless distinct types cannot grow
/// the shared set without bound.
const MAX_INTERNED: usize = 1024;
const MAX_INTERNED_LEN: usize = 256;

static INTERNED: LazyLock<Mutex<HashSet<Arc<str>>>> = LazyLock::new(Default::default);

/// The content type as one shared allocation. Nearly every stream has one of a handful of
/// types, and a server holds every stream's type in memory, so streams share the text instead
/// of each keeping a copy.
pub fn intern(content_type: &str) -> Arc<str> {
    if content_type.len() > MAX_INTERNED_LEN {
        return Arc::from(content_type);
    }
    // The set is only ever added to, so a poisoned lock still holds valid entries.
    let mut interned = INTERNED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(shared) = interned.get(content_type) {
        return shared.clone();
    }
    let shared: Arc<str> = Arc::from(content_type);
    if interned.len() < MAX_INTERNED {
        interned.insert(shared.clone());
    }
    shared
}

/// The media type without parameters, lowercased: `Text/Plain; charset=utf-8` → `text/plain`.
/// Two content types are the same for the protocol when their media types are equal.
pub fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The media type as written (parameters cut, whitespace trimmed, case kept), without allocating:
/// the comparisons below run on every append.
fn bare_media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or_default().trim()
}

pub fn same_media_type(a: &str, b: &str) -> bool {
    bare_media_type(a).eq_ignore_ascii_case(bare_media_type(b))
}

/// JSON mode (message boundaries, array flattening, array reads) applies to `application/json`.
pub fn is_json(content_type: &str) -> bool {
    bare_media_type(content_type).eq_ignore_ascii_case("application/json")
}

/// SSE carries text for `text/*` and JSON streams; everything else travels base64-encoded.
pub fn sse_needs_base64(content_type: &str) -> bool {
    let media = media_type(content_type);
    !(media.starts_with("text/") || media == "application/json")
}

/// Whether a client-supplied content type has the `type/subtype` shape worth storing.
/// Anything else falls back to the default, as the reference server does.
pub fn is_well_formed(content_type: &str) -> bool {
    let media = media_type(content_type);
    let mut parts = media.splitn(2, '/');
    let (Some(kind), Some(sub)) = (parts.next(), parts.next()) else {
        return false;
    };
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    token(kind) && token(sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_compare_case_and_parameter_insensitively() {
        assert!(same_media_type("APPLICATION/JSON", "application/json"));
        assert!(same_media_type("text/plain; charset=utf-8", "TEXT/PLAIN"));
        assert!(!same_media_type("text/plain", "text/html"));
    }

    #[test]
    fn json_mode_applies_with_parameters() {
        assert!(is_json("application/json; charset=utf-8"));
        assert!(!is_json("application/jsonl"));
    }

    #[test]
    fn only_text_and_json_travel_as_sse_text() {
        assert!(!sse_needs_base64("text/plain"));
        assert!(!sse_needs_base64("application/json"));
        assert!(sse_needs_base64("application/octet-stream"));
        assert!(sse_needs_base64("application/x-protobuf"));
        assert!(sse_needs_base64("image/png"));
    }

    #[test]
    fn interned_content_types_share_one_allocation() {
        let a = intern("text/plain; charset=utf-8");
        let b = intern("text/plain; charset=utf-8");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(
            &*intern("TEXT/plain"),
            "TEXT/plain",
            "kept exactly as given"
        );
        let long = "x".repeat(MAX_INTERNED_LEN + 1);
        assert!(!Arc::ptr_eq(&intern(&long), &intern(&long)));
    }

    #[test]
    fn malformed_content_types_are_detected() {
        assert!(is_well_formed("text/plain; charset=utf-8"));
        assert!(is_well_formed("application/vnd.api+json"));
        assert!(!is_well_formed("text"));
        assert!(!is_well_formed("/plain"));
        assert!(!is_well_formed(""));
    }
}
