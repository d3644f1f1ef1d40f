//! Content types: how a stream's declared type is compared and which read encodings it implies.

/// The type a stream gets when its creator names none.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

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
    fn malformed_content_types_are_detected() {
        assert!(is_well_formed("text/plain; charset=utf-8"));
        assert!(is_well_formed("application/vnd.api+json"));
        assert!(!is_well_formed("text"));
        assert!(!is_well_formed("/plain"));
        assert!(!is_well_formed(""));
    }
}
