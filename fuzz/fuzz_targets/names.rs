//! Stream names: `names::stream_key_of_path` (a decoded stream path, as in
//! `Stream-Forked-From`), `bucket_stream_key`, `stream_key_in`, `base_stream_key`,
//! `validate_bucket_id` and `bucket_of`.
//!
//! Input: a path; also split at the first newline into a bucket and a stream id.
//! Properties: a stream's key is its path; the bucket of a bucketed key is the bucket that named
//! it; a key a name check accepts is itself an accepted path; a name valid on the bucketed
//! Durable Streams surface is also a valid S2 name for the same stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runnel::model::names::{
    BASE_PREFIX, MAX_STREAM_KEY_BYTES, base_stream_key, bucket_of, bucket_stream_key,
    stream_key_in, stream_key_of_path, validate_bucket_id,
};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };

    if let Ok(key) = stream_key_of_path(text) {
        assert_eq!(key, text, "a stream's key is its path");
        match text.strip_prefix(BASE_PREFIX) {
            Some(rest) => {
                assert_eq!(bucket_of(&key), None);
                assert_eq!(base_stream_key(rest).as_deref(), Ok(text));
            }
            None => {
                let bucket = bucket_of(&key).expect("a bucketed key has a bucket");
                assert!(validate_bucket_id(bucket).is_ok());
                assert!(key.len() <= MAX_STREAM_KEY_BYTES + 1);
            }
        }
    }

    let (bucket, stream) = text.split_once('\n').unwrap_or((text, ""));
    if let Ok(key) = bucket_stream_key(bucket, stream) {
        assert_eq!(key, format!("/{bucket}/{stream}"));
        assert_eq!(bucket_of(&key), Some(bucket));
        assert_eq!(stream_key_of_path(&key).as_deref(), Ok(key.as_str()));
        assert_eq!(
            stream_key_in(bucket, stream).as_deref(),
            Ok(key.as_str()),
            "a bucket stream id must also be a valid S2 name for the same stream"
        );
    }
    if let Ok(key) = stream_key_in(bucket, stream) {
        assert_eq!(key, format!("/{bucket}/{stream}"));
        assert_eq!(bucket_of(&key), Some(bucket));
    }
    if validate_bucket_id(bucket).is_ok() {
        assert!((4..=64).contains(&bucket.len()));
        assert!(!bucket.contains('/'));
    }
    if let Ok(key) = base_stream_key(text) {
        assert_eq!(key, format!("{BASE_PREFIX}{text}"));
        assert_eq!(stream_key_of_path(&key).as_deref(), Ok(key.as_str()));
    }
});
