//! What a StreamLD subscription names (seed 003): its `stream` IRI read as a bucketed stream or
//! a bucket of this server.

use crate::model::names;
use crate::model::streamld;

/// What a replica subscribes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// A bucketed stream, by its key.
    Stream(String),
    /// A bucket: every stream in it, including those created later.
    Bucket(String),
}

impl Target {
    /// A replication session's name for a subscription to it.
    pub fn name(&self) -> String {
        match self {
            Target::Stream(key) => key.clone(),
            Target::Bucket(bucket) => format!("bucket:{bucket}"),
        }
    }
}

/// What a subscription's `stream` IRI names on this server: a bucketed stream or a bucket.
pub fn of_iri(iri: &str) -> Option<Target> {
    let path = streamld::iri_path(iri)?;
    let mut segments = path.trim_start_matches('/').splitn(2, '/');
    match (segments.next(), segments.next()) {
        (Some(bucket), None | Some("")) => names::validate_bucket_id(bucket)
            .ok()
            .map(|()| Target::Bucket(bucket.to_string())),
        (Some(bucket), Some(stream)) => names::stream_key_in(bucket, stream)
            .ok()
            .map(Target::Stream),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_targets_are_buckets_or_bucketed_streams() {
        assert_eq!(
            of_iri("http://up:1/docs"),
            Some(Target::Bucket("docs".into()))
        );
        assert_eq!(
            of_iri("http://up:1/docs/"),
            Some(Target::Bucket("docs".into()))
        );
        assert_eq!(
            of_iri("http://up:1/docs/a%20b"),
            Some(Target::Stream("/docs/a b".into()))
        );
        assert!(of_iri("http://up:1/v1/stream/x").is_none());
        assert!(of_iri("http://up:1/").is_none());
    }
}
