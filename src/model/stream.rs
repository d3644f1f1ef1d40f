//! Stream and bucket metadata, their stored form, and expiry. (What a create, a change or a
//! deletion does to it is the ledger's: `model::ledger`.)

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::attrs::Attrs;
use super::content_type;
use super::offset::Offset;
use super::s2::{BasinConfig, StreamConfig};

/// Everything the server keeps about a stream beside its records and producers.
///
/// Every stream's metadata stays in memory, so it is laid out for the common stream, which sets
/// none of the rarer fields: those live apart in [`MetaExtra`], allocated only once one is set.
/// The stored form is unchanged by this: see [`Stored`].
#[derive(Clone, Debug)]
pub struct StreamMeta {
    /// Shared with the stream's handle and the registry's key.
    pub name: Arc<str>,
    /// The content type exactly as the creator sent it (or the default), interned.
    pub content_type: Arc<str>,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub closed: bool,
    /// Deleted (or expired) while forks still read through it: gone for clients, data kept.
    pub soft_deleted: bool,
    /// The offset after the last record.
    pub tail: Offset,
    pub last_timestamp_ms: i64,
    pub created_ms: i64,
    /// The first retained position: reads before it are gone (410).
    pub retained_from: Offset,
    /// Read and change through [`StreamMeta::extra`] and [`StreamMeta::extra_mut`]; `None` and
    /// an all-default `MetaExtra` mean the same.
    pub extra: Option<Box<MetaExtra>>,
}

/// The metadata fields most streams never set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaExtra {
    /// The producer tuple whose append closed the stream; a retry of it is acknowledged again.
    pub closed_by: Option<ClosingProducer>,
    /// The highest `Stream-Seq` accepted so far, compared byte-wise.
    pub last_stream_seq: Option<String>,
    pub fork: Option<ForkOrigin>,
    /// Application attributes (seed 000 §5).
    pub attrs: Attrs,
    /// The visible snapshot, if one was published (its blob is stored apart).
    pub snapshot: Option<SnapshotInfo>,
    /// S2's fencing token ("" until a fence command sets it).
    pub fencing_token: String,
    /// S2 stream configuration, parsed once as it is loaded or changed (stored as its JSON
    /// object).
    pub s2_config: Option<StreamConfig>,
    /// The cipher record bodies are sealed with (S2 streams in a basin with `stream_cipher`).
    pub cipher: Option<String>,
    /// Identifies the key the stream's records are sealed with (never the key itself).
    pub key_fingerprint: Option<String>,
    /// The upstream server (`scheme://host:port`) this stream is a read-only mirror of.
    pub mirror_of: Option<String>,
    /// The S2 create request that made the stream ([`crate::model::s2::creation_key`]), so a
    /// retry of that request succeeds instead of finding the stream already there.
    pub s2_creation: Option<String>,
    /// The point of an S2 trim command not yet applied, set as the command is sequenced and
    /// stored in the same commit as its record: a crash before the trim is applied cannot keep
    /// the record and lose its effect.
    pub pending_trim: Option<u64>,
}

/// What a stream without extra metadata reads as.
static NO_EXTRA: MetaExtra = MetaExtra {
    closed_by: None,
    last_stream_seq: None,
    fork: None,
    attrs: None,
    snapshot: None,
    fencing_token: String::new(),
    s2_config: None,
    cipher: None,
    key_fingerprint: None,
    mirror_of: None,
    s2_creation: None,
    pending_trim: None,
};

impl MetaExtra {
    fn is_empty(&self) -> bool {
        *self == NO_EXTRA
    }
}

impl PartialEq for StreamMeta {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.content_type == other.content_type
            && self.ttl_secs == other.ttl_secs
            && self.expires_at_ms == other.expires_at_ms
            && self.closed == other.closed
            && self.soft_deleted == other.soft_deleted
            && self.tail == other.tail
            && self.last_timestamp_ms == other.last_timestamp_ms
            && self.created_ms == other.created_ms
            && self.retained_from == other.retained_from
            && self.extra() == other.extra()
    }
}

impl Eq for StreamMeta {}

/// The stored form of [`StreamMeta`]: one flat JSON object, as it has always been written.
/// Fields at their default are left out (older data spells them as `null`, `""` or the start
/// offset, and reads back the same).
#[derive(Serialize, Deserialize)]
struct Stored<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    content_type: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<i64>,
    closed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    closed_by: Option<Cow<'a, ClosingProducer>>,
    tail: Offset,
    last_timestamp_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_stream_seq: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fork: Option<Cow<'a, ForkOrigin>>,
    soft_deleted: bool,
    created_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attrs: Option<Cow<'a, serde_json::Map<String, serde_json::Value>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    snapshot: Option<Cow<'a, SnapshotInfo>>,
    #[serde(default, skip_serializing_if = "is_start")]
    retained_from: Offset,
    #[serde(default, skip_serializing_if = "str::is_empty")]
    fencing_token: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    s2_config: Option<StoredConfig<'a>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cipher: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_fingerprint: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mirror_of: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    s2_creation: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending_trim: Option<u64>,
}

/// An S2 stream configuration as stored: written from the typed configuration, read back as
/// whatever JSON is there. Reading never fails on it: a stored configuration that no longer parses
/// (written by some other version) counts as one that sets nothing, as it always has, rather than
/// keeping its stream from loading.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StoredConfig<'a> {
    #[serde(skip_deserializing)]
    Typed(&'a StreamConfig),
    #[serde(skip_serializing)]
    Read(serde_json::Value),
}

impl StoredConfig<'_> {
    fn into_config(self) -> StreamConfig {
        match self {
            StoredConfig::Typed(config) => config.clone(),
            StoredConfig::Read(value) => StreamConfig::deserialize(value).unwrap_or_default(),
        }
    }
}

fn is_start(offset: &Offset) -> bool {
    *offset == Offset::START
}

impl Serialize for StreamMeta {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let extra = self.extra();
        Stored {
            name: Cow::Borrowed(&self.name),
            content_type: Cow::Borrowed(&self.content_type),
            ttl_secs: self.ttl_secs,
            expires_at_ms: self.expires_at_ms,
            closed: self.closed,
            closed_by: extra.closed_by.as_ref().map(Cow::Borrowed),
            tail: self.tail,
            last_timestamp_ms: self.last_timestamp_ms,
            last_stream_seq: extra.last_stream_seq.as_deref().map(Cow::Borrowed),
            fork: extra.fork.as_ref().map(Cow::Borrowed),
            soft_deleted: self.soft_deleted,
            created_ms: self.created_ms,
            attrs: extra.attrs.as_ref().map(Cow::Borrowed),
            snapshot: extra.snapshot.as_ref().map(Cow::Borrowed),
            retained_from: self.retained_from,
            fencing_token: Cow::Borrowed(&extra.fencing_token),
            s2_config: extra.s2_config.as_ref().map(StoredConfig::Typed),
            cipher: extra.cipher.as_deref().map(Cow::Borrowed),
            key_fingerprint: extra.key_fingerprint.as_deref().map(Cow::Borrowed),
            mirror_of: extra.mirror_of.as_deref().map(Cow::Borrowed),
            s2_creation: extra.s2_creation.as_deref().map(Cow::Borrowed),
            pending_trim: extra.pending_trim,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StreamMeta {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let stored = Stored::deserialize(deserializer)?;
        let extra = MetaExtra {
            closed_by: stored.closed_by.map(Cow::into_owned),
            last_stream_seq: stored.last_stream_seq.map(Cow::into_owned),
            fork: stored.fork.map(Cow::into_owned),
            attrs: stored.attrs.map(Cow::into_owned),
            snapshot: stored.snapshot.map(Cow::into_owned),
            fencing_token: stored.fencing_token.into_owned(),
            s2_config: stored.s2_config.map(StoredConfig::into_config),
            cipher: stored.cipher.map(Cow::into_owned),
            key_fingerprint: stored.key_fingerprint.map(Cow::into_owned),
            mirror_of: stored.mirror_of.map(Cow::into_owned),
            s2_creation: stored.s2_creation.map(Cow::into_owned),
            pending_trim: stored.pending_trim,
        };
        let mut meta = StreamMeta {
            name: Arc::from(stored.name.as_ref()),
            content_type: content_type::intern(&stored.content_type),
            ttl_secs: stored.ttl_secs,
            expires_at_ms: stored.expires_at_ms,
            closed: stored.closed,
            soft_deleted: stored.soft_deleted,
            tail: stored.tail,
            last_timestamp_ms: stored.last_timestamp_ms,
            created_ms: stored.created_ms,
            retained_from: stored.retained_from,
            extra: None,
        };
        meta.set_extra(extra);
        Ok(meta)
    }
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
    /// S2 basin configuration, parsed once as it is loaded or changed (stored as its JSON
    /// object; one that no longer parses reads as one that sets nothing, as for streams).
    #[serde(default, deserialize_with = "basin_config_as_stored")]
    pub s2_config: Option<BasinConfig>,
    /// The S2 create request that made the basin ([`crate::model::s2::creation_key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s2_creation: Option<String>,
    /// An S2 delete of the basin and its streams has begun: it takes no new streams, and a
    /// delete the server stopped in the middle of is finished when it starts again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

impl BucketMeta {
    /// Its streams' records are sealed (S2 `stream_cipher`): only streams sealed too may be
    /// created in it.
    pub fn seals_streams(&self) -> bool {
        (self.s2_config.as_ref()).is_some_and(|config| config.stream_cipher.is_some())
    }
}

fn basin_config_as_stored<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<BasinConfig>, D::Error> {
    let stored = Option::<serde_json::Value>::deserialize(deserializer)?;
    Ok(stored.map(|value| BasinConfig::deserialize(value).unwrap_or_default()))
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

impl StreamMeta {
    /// An empty, open stream with no options: the starting point of every stream's metadata.
    pub fn new(name: &str, content_type: &str) -> StreamMeta {
        StreamMeta {
            name: Arc::from(name),
            content_type: content_type::intern(content_type),
            ttl_secs: None,
            expires_at_ms: None,
            closed: false,
            soft_deleted: false,
            tail: Offset::START,
            last_timestamp_ms: 0,
            created_ms: 0,
            retained_from: Offset::START,
            extra: None,
        }
    }

    /// The rarer fields (all at their defaults for most streams).
    pub fn extra(&self) -> &MetaExtra {
        self.extra.as_deref().unwrap_or(&NO_EXTRA)
    }

    /// The rarer fields, for changing them.
    pub fn extra_mut(&mut self) -> &mut MetaExtra {
        self.extra.get_or_insert_with(Box::default)
    }

    /// Replaces the rarer fields, allocating only when one of them is set.
    pub fn set_extra(&mut self, extra: MetaExtra) {
        self.extra = (!extra.is_empty()).then(|| Box::new(extra));
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

    /// Metadata as every earlier version stored it: each field spelled out.
    const STORED_BEFORE: &str = r#"{"name":"/bkt1/s","content_type":"text/plain","ttl_secs":null,"expires_at_ms":null,"closed":false,"closed_by":null,"tail":{"seq":2,"pos":9},"last_timestamp_ms":5,"last_stream_seq":null,"fork":null,"soft_deleted":false,"created_ms":1,"attrs":null,"snapshot":null,"retained_from":{"seq":0,"pos":0},"fencing_token":"","s2_config":null,"cipher":null,"key_fingerprint":null,"mirror_of":null}"#;

    #[test]
    fn metadata_stored_by_earlier_versions_reads_back() {
        let meta: StreamMeta = serde_json::from_str(STORED_BEFORE).unwrap();
        assert_eq!(
            meta,
            StreamMeta {
                tail: Offset::new(2, 9),
                last_timestamp_ms: 5,
                created_ms: 1,
                ..StreamMeta::new("/bkt1/s", "text/plain")
            }
        );
        assert!(meta.extra.is_none(), "nothing rare was set");
        let older: StreamMeta = serde_json::from_str(
            r#"{"name":"n","content_type":"a/b","ttl_secs":3,"expires_at_ms":null,"closed":true,"closed_by":{"id":"p","epoch":1,"seq":2},"tail":{"seq":0,"pos":0},"last_timestamp_ms":0,"last_stream_seq":"7","fork":null,"soft_deleted":false,"created_ms":0}"#,
        )
        .unwrap();
        assert_eq!(older.ttl_secs, Some(3));
        assert_eq!(older.extra().last_stream_seq.as_deref(), Some("7"));
        assert_eq!(older.extra().closed_by.as_ref().map(|c| c.seq), Some(2));
    }

    #[test]
    fn metadata_is_stored_without_its_defaults_and_reads_back_the_same() {
        let plain = StreamMeta::new("/bkt1/s", "text/plain");
        let stored = serde_json::to_string(&plain).unwrap();
        assert_eq!(
            stored,
            r#"{"name":"/bkt1/s","content_type":"text/plain","closed":false,"tail":{"seq":0,"pos":0},"last_timestamp_ms":0,"soft_deleted":false,"created_ms":0}"#
        );
        assert_eq!(serde_json::from_str::<StreamMeta>(&stored).unwrap(), plain);

        let mut full = StreamMeta {
            ttl_secs: Some(60),
            expires_at_ms: Some(9),
            retained_from: Offset::new(1, 1),
            ..plain
        };
        let extra = full.extra_mut();
        extra.closed_by = Some(ClosingProducer {
            id: "p".into(),
            epoch: 1,
            seq: 2,
        });
        extra.last_stream_seq = Some("a".into());
        extra.fork = Some(ForkOrigin {
            source_id: 3,
            source_name: "/bkt1/src".into(),
            offset: Offset::new(4, 4),
            sub_offset: 1,
        });
        extra.attrs = Some(serde_json::Map::from_iter([("title".into(), "t".into())]));
        extra.snapshot = Some(SnapshotInfo {
            offset: Offset::new(1, 1),
            content_type: "application/json".into(),
            digest: "d".into(),
        });
        extra.fencing_token = "f".into();
        extra.s2_config = Some(StreamConfig {
            storage_class: Some(crate::model::s2::StorageClass::Standard),
            ..StreamConfig::default()
        });
        extra.cipher = Some("aegis-256".into());
        extra.key_fingerprint = Some("k".into());
        extra.mirror_of = Some("http://up:1".into());
        extra.s2_creation = Some("c".into());
        let stored = serde_json::to_vec(&full).unwrap();
        assert_eq!(serde_json::from_slice::<StreamMeta>(&stored).unwrap(), full);
    }

    #[test]
    fn an_s2_configuration_is_stored_as_the_json_object_it_always_was() {
        let stored = r#"{"name":"/b/s","content_type":"application/octet-stream","closed":false,"tail":{"seq":0,"pos":0},"last_timestamp_ms":0,"soft_deleted":false,"created_ms":0,"s2_config":{"storage_class":"express","retention_policy":{"age":60},"timestamping":{"mode":"arrival","uncapped":false},"delete_on_empty":{"min_age_secs":0}}}"#;
        let meta: StreamMeta = serde_json::from_str(stored).unwrap();
        let config = meta.extra().s2_config.as_ref().unwrap();
        assert_eq!(
            config.retention_policy,
            Some(crate::model::s2::RetentionPolicy::Age(60)),
            "parsed once, as it is read"
        );
        assert_eq!(serde_json::to_string(&meta).unwrap(), stored);
    }

    #[test]
    fn a_stored_s2_configuration_that_no_longer_parses_still_loads_its_stream() {
        let stored = r#"{"name":"/b/s","content_type":"a/b","closed":false,"tail":{"seq":0,"pos":0},"last_timestamp_ms":0,"soft_deleted":false,"created_ms":0,"s2_config":{"storage_class":"bogus"}}"#;
        let meta: StreamMeta = serde_json::from_str(stored).unwrap();
        assert_eq!(meta.extra().s2_config, Some(StreamConfig::default()));
    }

    #[test]
    fn a_basin_configuration_is_read_typed_from_the_json_object_it_was_stored_as() {
        let stored = r#"{"created_ms":1,"s2_config":{"stream_cipher":"aegis-256","unknown":1}}"#;
        let meta: BucketMeta = serde_json::from_str(stored).unwrap();
        assert!(meta.seals_streams());
        let again: BucketMeta =
            serde_json::from_str(&serde_json::to_string(&meta).unwrap()).unwrap();
        assert_eq!(again, meta);
        let unset: BucketMeta =
            serde_json::from_str(r#"{"created_ms":1,"s2_config":null}"#).unwrap();
        assert_eq!(unset.s2_config, None);
        let foreign: BucketMeta =
            serde_json::from_str(r#"{"created_ms":1,"s2_config":{"stream_cipher":7}}"#).unwrap();
        assert_eq!(foreign.s2_config, Some(BasinConfig::default()));
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
