//! Stream names. Every stream has one key, the decoded URL path that addresses it:
//! `/v1/stream/{path}` on the base surface, `/{bucket_id}/{stream_id}` on the bucketed one.
//! The two never collide because bucket ids are at least four characters long.

/// Path prefix of the base-protocol surface.
pub const BASE_PREFIX: &str = "/v1/stream/";

/// The bucket-local stream id reserved for the listing endpoint.
pub const RESERVED_STREAM_ID: &str = "streams";

/// Bucket ids that name the server's own routes (`GET /metrics`, say), so no bucket can have them.
pub const RESERVED_BUCKET_IDS: [&str; 3] = ["healthz", "metrics", "readyz"];

/// The most bytes a stream id, and the combined `bucket/stream` key, may have.
pub const MAX_STREAM_KEY_BYTES: usize = 122;

/// The most bytes a base-protocol stream path (after `/v1/stream/`, decoded) may have.
pub const MAX_BASE_PATH_BYTES: usize = 1024;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("bucket id must match ^[a-z0-9_-]{{4,64}}$")]
    BadBucket,
    #[error(
        "stream id must be 1 to 122 bytes with no '/', NUL or '..', and bucket/stream at most 122 bytes"
    )]
    BadStreamId,
    #[error("an S2 stream name is 1 to 512 bytes with no NUL, and not '.' or '..'")]
    BadS2Name,
    #[error("the stream id 'streams' is reserved for the bucket listing")]
    Reserved,
    #[error("the bucket ids healthz, metrics and readyz are reserved for the server's own routes")]
    ReservedBucket,
    #[error("a base-protocol stream path must be 1 to 1024 bytes, free of control characters")]
    BadPath,
    #[error(
        "a base-protocol stream path has no empty, '.' or '..' segment: clients that normalise \
         URLs could never reach such a stream"
    )]
    BadPathSegment,
    #[error("the path has a '%' not followed by two hex digits, or is not UTF-8 once decoded")]
    BadEncoding,
    #[error("not a stream path: expected /v1/stream/<path> or /<bucket>/<stream>")]
    NotAStream,
}

pub fn validate_bucket_id(bucket: &str) -> Result<(), NameError> {
    let ok = (4..=64).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(NameError::BadBucket)
    }
}

/// Checks the id of a bucket to be created: a valid one, and not one of the reserved ids.
pub fn validate_new_bucket_id(bucket: &str) -> Result<(), NameError> {
    validate_bucket_id(bucket)?;
    if RESERVED_BUCKET_IDS.contains(&bucket) {
        return Err(NameError::ReservedBucket);
    }
    Ok(())
}

/// The key of a stream in a bucket, after checking both identifiers.
pub fn bucket_stream_key(bucket: &str, stream: &str) -> Result<String, NameError> {
    validate_bucket_id(bucket)?;
    if stream == RESERVED_STREAM_ID {
        return Err(NameError::Reserved);
    }
    let bad = stream.is_empty()
        || stream.len() > MAX_STREAM_KEY_BYTES
        || bucket.len() + 1 + stream.len() > MAX_STREAM_KEY_BYTES
        || stream.contains(['/', '\0'])
        || stream == "."
        || stream.contains("..");
    if bad {
        return Err(NameError::BadStreamId);
    }
    Ok(format!("/{bucket}/{stream}"))
}

/// The most bytes an S2 stream name may have.
pub const MAX_S2_STREAM_NAME_BYTES: usize = 512;

/// The key of any stream a bucket can hold, whichever face named it: S2's naming rule, the
/// widest of the faces (it allows `/`). A name that is also a valid bucket stream id is the same
/// stream on the bucketed Durable Streams surface; other names are reachable through S2 and
/// replication only.
pub fn stream_key_in(basin: &str, stream: &str) -> Result<String, NameError> {
    validate_bucket_id(basin)?;
    let bad = stream.is_empty()
        || stream.len() > MAX_S2_STREAM_NAME_BYTES
        || stream.contains('\0')
        || stream == "."
        || stream == "..";
    if bad {
        return Err(NameError::BadS2Name);
    }
    Ok(format!("/{basin}/{stream}"))
}

/// The key of a base-protocol stream.
pub fn base_stream_key(path: &str) -> Result<String, NameError> {
    if path.is_empty() || path.len() > MAX_BASE_PATH_BYTES || path.chars().any(char::is_control) {
        return Err(NameError::BadPath);
    }
    if path
        .split('/')
        .any(|segment| matches!(segment, "" | "." | ".."))
    {
        return Err(NameError::BadPathSegment);
    }
    Ok(format!("{BASE_PREFIX}{path}"))
}

/// Every `%` in `raw` starts an escape: two hex digits follow it.
pub fn escapes_are_whole(raw: &str) -> bool {
    let bytes = raw.as_bytes();
    bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    })
}

/// `raw` with every escape of an unreserved character (letters, digits, `-`, `.`, `_`, `~`)
/// decoded, as RFC 3986 §6.2.2.2 normalises them; `None` when there is none. Routing and
/// authorization then see one spelling of each segment: `r%65tention` is `retention` to both.
/// Escapes of other characters (`%2F`) keep their meaning and stay.
pub fn normalize_unreserved(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let unreserved_at = |i: usize| {
        let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
        let byte = u8::from_str_radix(hex, 16).ok()?;
        (byte.is_ascii_alphanumeric() || b"-._~".contains(&byte)).then_some(byte)
    };
    let first = (0..bytes.len()).find(|&i| bytes[i] == b'%' && unreserved_at(i).is_some())?;
    let mut out = Vec::with_capacity(bytes.len());
    out.extend_from_slice(&bytes[..first]);
    let mut i = first;
    while i < bytes.len() {
        match (bytes[i], unreserved_at(i)) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A URL path percent-decoded, refusing a `%` that does not start an escape (which a lenient
/// decoder would keep as it is, so `a%zz` and `a%25zz` would name one stream) and bytes that are
/// not UTF-8 once decoded.
pub fn decode_path(raw: &str) -> Result<std::borrow::Cow<'_, str>, NameError> {
    if !escapes_are_whole(raw) {
        return Err(NameError::BadEncoding);
    }
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| NameError::BadEncoding)
}

/// Checks a decoded path that names a stream (as in `Stream-Forked-From`) and returns its key.
pub fn stream_key_of_path(path: &str) -> Result<String, NameError> {
    if let Some(rest) = path.strip_prefix(BASE_PREFIX) {
        return base_stream_key(rest);
    }
    let mut segments = path
        .strip_prefix('/')
        .ok_or(NameError::NotAStream)?
        .splitn(2, '/');
    match (segments.next(), segments.next()) {
        (Some(bucket), Some(stream)) => bucket_stream_key(bucket, stream),
        _ => Err(NameError::NotAStream),
    }
}

/// What a stream key's URL path keeps percent-encoded: controls, space, `%`, the characters that
/// would end the path (`?`, `#`) and those a URL may not hold raw. Non-ASCII is always encoded;
/// `/` is not, so the key's segments stay segments.
const PATH_ESCAPES: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// The URL path of a stream key (keys are decoded paths): percent-decoding it gives the key back.
pub fn url_path(key: &str) -> String {
    percent_encoding::utf8_percent_encode(key, PATH_ESCAPES).to_string()
}

/// The bucket a stream key belongs to, if it is on the bucketed surface.
pub fn bucket_of(key: &str) -> Option<&str> {
    if key.starts_with(BASE_PREFIX) {
        return None;
    }
    key.strip_prefix('/')?.split('/').next()
}

/// The prefix every stream key of `bucket` starts with.
pub fn bucket_prefix(bucket: &str) -> String {
    format!("/{bucket}/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_base_path_with_an_empty_dot_or_dot_dot_segment_is_refused() {
        for path in ["a/../b", "..", ".", "a/.", "a//b", "a/", "/a", "./a"] {
            assert_eq!(
                base_stream_key(path),
                Err(NameError::BadPathSegment),
                "{path}"
            );
        }
        for path in ["a/b", "a..b/c", ".hidden/x", "a/b.c"] {
            assert!(base_stream_key(path).is_ok(), "{path}");
        }
    }

    #[test]
    fn a_keys_url_path_decodes_back_to_the_key_and_keeps_its_segments() {
        for (key, path) in [
            ("/docs/a b", "/docs/a%20b"),
            ("/docs/a%20b", "/docs/a%2520b"),
            ("/docs/users/42", "/docs/users/42"),
            ("/docs/q?x#y", "/docs/q%3Fx%23y"),
            ("/docs/caf\u{e9}", "/docs/caf%C3%A9"),
        ] {
            assert_eq!(url_path(key), path);
        }
    }

    proptest! {
        #[test]
        fn url_paths_decode_to_their_keys(key in "/[a-z]{4}/\\PC{1,20}") {
            let path = url_path(&key);
            prop_assert!(!path.contains([' ', '?', '#']));
            let decoded = percent_encoding::percent_decode_str(&path).decode_utf8().unwrap();
            prop_assert_eq!(decoded, key);
        }
    }

    #[test]
    fn s2_names_allow_slashes_and_dots_but_not_nul_or_dot_segments() {
        assert_eq!(
            stream_key_in("basin-1", "users/42/events").unwrap(),
            "/basin-1/users/42/events"
        );
        assert!(stream_key_in("basin-1", "a..b").is_ok());
        assert!(stream_key_in("basin-1", &"n".repeat(512)).is_ok());
        for bad in ["", ".", "..", "a\0b"] {
            assert_eq!(stream_key_in("basin-1", bad), Err(NameError::BadS2Name));
        }
        assert!(stream_key_in("basin-1", &"n".repeat(513)).is_err());
        assert!(
            bucket_stream_key("basin-1", "users/42").is_err(),
            "the bucketed surface keeps its narrower rule"
        );
        assert!(
            bucket_stream_key("basin-1", ".").is_err(),
            "every bucket stream id is also an S2 name"
        );
    }

    #[test]
    fn bucket_ids_are_four_to_sixty_four_lowercase_word_characters() {
        for ok in ["abcd", "a-b_c", "0123", &"x".repeat(64)] {
            assert_eq!(validate_bucket_id(ok), Ok(()), "{ok}");
        }
        for bad in [
            "abc",
            "ABCD",
            "ab.cd",
            "ab cd",
            "v1",
            &"x".repeat(65),
            "über",
        ] {
            assert_eq!(validate_bucket_id(bad), Err(NameError::BadBucket), "{bad}");
        }
    }

    #[test]
    fn stream_ids_respect_length_separator_and_reserved_rules() {
        assert_eq!(bucket_stream_key("game", "room 1").unwrap(), "/game/room 1");
        assert_eq!(
            bucket_stream_key("game", "streams"),
            Err(NameError::Reserved)
        );
        for bad in ["", "a/b", "a\0b", "..", "a..b"] {
            assert_eq!(
                bucket_stream_key("game", bad),
                Err(NameError::BadStreamId),
                "{bad:?}"
            );
        }
        assert!(bucket_stream_key("game", &"s".repeat(117)).is_ok());
        assert_eq!(
            bucket_stream_key("game", &"s".repeat(118)),
            Err(NameError::BadStreamId)
        );
    }

    #[test]
    fn paths_decode_only_with_whole_escapes_and_base_paths_are_bounded() {
        assert_eq!(decode_path("a%20b/c").unwrap(), "a b/c");
        assert_eq!(decode_path("a%25zz").unwrap(), "a%zz");
        for bad in ["a%zz", "a%", "a%2", "%g0", "%ff"] {
            assert_eq!(decode_path(bad), Err(NameError::BadEncoding), "{bad}");
        }
        assert!(base_stream_key(&"x".repeat(MAX_BASE_PATH_BYTES)).is_ok());
        assert_eq!(
            base_stream_key(&"x".repeat(MAX_BASE_PATH_BYTES + 1)),
            Err(NameError::BadPath)
        );
    }

    #[test]
    fn paths_resolve_to_keys_on_either_surface() {
        assert_eq!(
            stream_key_of_path("/v1/stream/a/b").unwrap(),
            "/v1/stream/a/b"
        );
        assert_eq!(stream_key_of_path("/game/room").unwrap(), "/game/room");
        assert_eq!(stream_key_of_path("/game"), Err(NameError::NotAStream));
        assert_eq!(stream_key_of_path("game/room"), Err(NameError::NotAStream));
        assert_eq!(bucket_of("/game/room"), Some("game"));
        assert_eq!(bucket_of("/v1/stream/game/room"), None);
    }

    #[test]
    fn escaped_unreserved_characters_are_normalised_and_others_kept() {
        assert_eq!(
            normalize_unreserved("/b/s/r%65tention").as_deref(),
            Some("/b/s/retention")
        );
        assert_eq!(
            normalize_unreserved("/b/a%2Fb%7e%41").as_deref(),
            Some("/b/a%2Fb~A")
        );
        assert_eq!(normalize_unreserved("/b/a%2Fb%20c"), None);
        assert_eq!(normalize_unreserved("/plain"), None);
    }

    proptest! {
        #[test]
        fn arbitrary_paths_never_panic(path in "\\PC*") {
            let _ = stream_key_of_path(&path);
        }

        #[test]
        fn normalising_keeps_what_a_path_decodes_to(path in "[a-z%0-9A-F/]{0,24}") {
            if let (Some(normal), Ok(before)) = (normalize_unreserved(&path), decode_path(&path)) {
                prop_assert_eq!(decode_path(&normal).unwrap(), before);
            }
        }
    }
}
