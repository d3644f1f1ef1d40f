//! Stream metadata and the rules over it that need no I/O: configuration matching for idempotent
//! creates, and expiry.

use serde::{Deserialize, Serialize};

use super::attrs::Attrs;
use super::content_type::same_media_type;
use super::offset::Offset;

/// Everything the server keeps about a stream beside its records and producers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMeta {
    pub name: String,
    /// The content type exactly as the creator sent it (or the default).
    pub content_type: String,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub closed: bool,
    /// The producer tuple whose append closed the stream; a retry of it is acknowledged again.
    pub closed_by: Option<ClosingProducer>,
    /// The offset after the last record.
    pub tail: Offset,
    pub last_timestamp_ms: i64,
    /// The highest `Stream-Seq` accepted so far, compared byte-wise.
    pub last_stream_seq: Option<String>,
    pub fork: Option<ForkOrigin>,
    /// Deleted (or expired) while forks still read through it: gone for clients, data kept.
    pub soft_deleted: bool,
    pub created_ms: i64,
    /// Application attributes (seed 000 §5).
    #[serde(default)]
    pub attrs: Attrs,
    /// The visible snapshot, if one was published (its blob is stored apart).
    #[serde(default)]
    pub snapshot: Option<SnapshotInfo>,
    /// The first retained position: reads before it are gone (410).
    #[serde(default)]
    pub retained_from: Offset,
    /// S2's fencing token ("" until a fence command sets it).
    #[serde(default)]
    pub fencing_token: String,
    /// S2 stream configuration, as a JSON object that parses as `s2::StreamConfig`.
    #[serde(default)]
    pub s2_config: Option<serde_json::Value>,
    /// The cipher record bodies are sealed with (S2 streams in a basin with `stream_cipher`).
    #[serde(default)]
    pub cipher: Option<String>,
    /// Identifies the key the stream's records are sealed with (never the key itself).
    #[serde(default)]
    pub key_fingerprint: Option<String>,
    /// The upstream server (`scheme://host:port`) this stream is a read-only mirror of.
    #[serde(default)]
    pub mirror_of: Option<String>,
}

/// The visible snapshot of a stream: its offset, the blob's content type and digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub offset: Offset,
    pub content_type: String,
    pub digest: String,
}

/// What the server keeps about a bucket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketMeta {
    pub created_ms: i64,
    /// S2 basin configuration, as a JSON object that parses as `s2::BasinConfig`.
    #[serde(default)]
    pub s2_config: Option<serde_json::Value>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosingProducer {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

/// Where a fork branches off: it reads its source below `offset.seq` and its own records above.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    pub source_id: u64,
    pub source_name: String,
    pub offset: Offset,
    pub sub_offset: u64,
}

/// The configuration a create request asks for, after defaults and fork inheritance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestedConfig {
    pub content_type: String,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub closed: bool,
    pub fork: Option<RequestedFork>,
    pub attrs: Attrs,
    /// The cipher for record bodies; fixed at creation and not compared on repeats.
    pub cipher: Option<String>,
    /// The upstream of a mirrored stream; fixed at creation and not compared on repeats.
    pub mirror_of: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestedFork {
    pub source_name: String,
    /// Compared only when the request names it.
    pub offset: Option<Offset>,
    pub sub_offset: u64,
}

impl StreamMeta {
    /// An empty, open stream with no options: the starting point of every stream's metadata.
    pub fn new(name: &str, content_type: &str) -> StreamMeta {
        StreamMeta {
            name: name.to_string(),
            content_type: content_type.to_string(),
            ttl_secs: None,
            expires_at_ms: None,
            closed: false,
            closed_by: None,
            tail: Offset::START,
            last_timestamp_ms: 0,
            last_stream_seq: None,
            fork: None,
            soft_deleted: false,
            created_ms: 0,
            attrs: None,
            snapshot: None,
            retained_from: Offset::START,
            fencing_token: String::new(),
            s2_config: None,
            cipher: None,
            key_fingerprint: None,
            mirror_of: None,
        }
    }

    /// Why an existing stream does not match a repeated create, or `None` when it does.
    pub fn mismatch(&self, requested: &RequestedConfig) -> Option<&'static str> {
        if !same_media_type(&self.content_type, &requested.content_type) {
            return Some("stream exists with a different content type");
        }
        if self.ttl_secs != requested.ttl_secs {
            return Some("stream exists with a different Stream-TTL");
        }
        if self.expires_at_ms != requested.expires_at_ms {
            return Some("stream exists with a different Stream-Expires-At");
        }
        if self.closed != requested.closed {
            return Some("stream exists with a different closed state");
        }
        if self.attrs != requested.attrs {
            return Some("stream exists with different attributes");
        }
        match (&self.fork, &requested.fork) {
            (None, None) => None,
            (Some(have), Some(want)) => {
                let offset_differs = want.offset.is_some_and(|o| o != have.offset);
                if have.source_name != want.source_name
                    || offset_differs
                    || have.sub_offset != want.sub_offset
                {
                    Some("stream exists as a different fork")
                } else {
                    None
                }
            }
            _ => Some("stream exists with a different fork configuration"),
        }
    }

    /// When the stream expires, given when it was last accessed (for the sliding TTL).
    pub fn expiry_deadline_ms(&self, last_access_ms: i64) -> Option<i64> {
        let by_ttl = self.ttl_secs.map(|ttl| {
            last_access_ms.saturating_add(
                i64::try_from(ttl)
                    .unwrap_or(i64::MAX / 1000)
                    .saturating_mul(1000),
            )
        });
        match (by_ttl, self.expires_at_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn is_expired(&self, now_ms: i64, last_access_ms: i64) -> bool {
        self.expiry_deadline_ms(last_access_ms)
            .is_some_and(|deadline| deadline <= now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> StreamMeta {
        StreamMeta {
            ttl_secs: Some(60),
            ..StreamMeta::new("s", "text/plain")
        }
    }

    fn requested() -> RequestedConfig {
        RequestedConfig {
            content_type: "TEXT/PLAIN; charset=utf-8".into(),
            ttl_secs: Some(60),
            expires_at_ms: None,
            closed: false,
            fork: None,
            attrs: None,
            cipher: None,
            mirror_of: None,
        }
    }

    #[test]
    fn a_repeated_create_matches_on_media_type_ttl_expiry_and_closed_state() {
        assert_eq!(meta().mismatch(&requested()), None);
        assert!(
            meta()
                .mismatch(&RequestedConfig {
                    ttl_secs: Some(7200),
                    ..requested()
                })
                .is_some()
        );
        assert!(
            meta()
                .mismatch(&RequestedConfig {
                    closed: true,
                    ..requested()
                })
                .is_some()
        );
        assert!(
            meta()
                .mismatch(&RequestedConfig {
                    content_type: "text/html".into(),
                    ..requested()
                })
                .is_some()
        );
    }

    #[test]
    fn a_repeated_fork_compares_its_offset_only_when_named() {
        let fork = ForkOrigin {
            source_id: 1,
            source_name: "src".into(),
            offset: Offset::new(1, 5),
            sub_offset: 0,
        };
        let existing = StreamMeta {
            fork: Some(fork),
            ..meta()
        };
        let want = |offset, sub_offset| RequestedConfig {
            fork: Some(RequestedFork {
                source_name: "src".into(),
                offset,
                sub_offset,
            }),
            ..requested()
        };
        assert_eq!(existing.mismatch(&want(None, 0)), None);
        assert_eq!(existing.mismatch(&want(Some(Offset::new(1, 5)), 0)), None);
        assert!(
            existing
                .mismatch(&want(Some(Offset::new(0, 0)), 0))
                .is_some()
        );
        assert!(
            existing
                .mismatch(&want(Some(Offset::new(1, 5)), 2))
                .is_some()
        );
        assert!(existing.mismatch(&requested()).is_some());
    }

    #[test]
    fn ttl_slides_from_last_access_and_expires_at_is_absolute() {
        let m = meta();
        assert!(!m.is_expired(59_999, 0));
        assert!(m.is_expired(60_000, 0));
        let absolute = StreamMeta {
            ttl_secs: None,
            expires_at_ms: Some(1_000),
            ..meta()
        };
        assert!(!absolute.is_expired(999, 0));
        assert!(absolute.is_expired(1_000, 900));
    }
}
