//! StreamLD messages (seed 003 and the StreamLD core): JSON-LD objects with an `@type`, whose
//! terms live in the `https://openfaster.org/streamld#` namespace. Receivers accept the short
//! names, `streamld:`-prefixed names and full IRIs alike; senders use short names under an
//! `@context` that maps them.
//!
//! Runnel carries what a faithful mirror needs beyond the StreamLD envelope in `runnel:` terms
//! (see docs/streamld.md): the record's offset, timestamp, headers and kind, and whole-stream
//! state messages.

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Offset, Record};

pub const NAMESPACE: &str = "https://openfaster.org/streamld#";
pub const RUNNEL_NAMESPACE: &str = "https://runnel.dev/ns#";
/// `Link` relation of the WebSocket replication endpoint.
pub const REL_WEBSOCKET: &str = "https://openfaster.org/streamld#websocket-replication";
/// `Link` relation of the SSE binding endpoint.
pub const REL_SSE: &str = "https://openfaster.org/streamld#sse";

/// The `@context` every message Runnel sends carries: it maps the short names Runnel writes.
struct Context;

impl Serialize for Context {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("@vocab", NAMESPACE)?;
        map.serialize_entry("streamld", NAMESPACE)?;
        map.serialize_entry("runnel", RUNNEL_NAMESPACE)?;
        map.end()
    }
}

/// A StreamLD object as Runnel sends it: `body`'s members under its `@type`, and, at the top of
/// a message, the `@context`. Written straight out, with no JSON tree built in between.
#[derive(Serialize)]
struct Typed<'a, T> {
    #[serde(rename = "@context", skip_serializing_if = "Option::is_none")]
    context: Option<Context>,
    #[serde(rename = "@type")]
    kind: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

impl<'a, T: Serialize> Typed<'a, T> {
    fn message(kind: &'static str, body: &'a T) -> Self {
        Typed {
            context: Some(Context),
            kind,
            body,
        }
    }
}

/// An event inside a frame: typed, under the frame's `@context`.
fn typed_event<S: serde::Serializer>(
    event: &EventEnvelope,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    Typed {
        context: None,
        kind: EVENT_ENVELOPE,
        body: event,
    }
    .serialize(serializer)
}

const EVENT_ENVELOPE: &str = "EventEnvelope";

/// One event of the SSE binding: its cursor as the `id`, and as the `data` its envelope as a
/// message of its own, on one line (the JSON is compact).
pub fn write_sse_event(out: &mut Vec<u8>, event: &EventEnvelope) {
    use std::io::Write as _;
    write!(out, "id: {}\nevent: event\ndata: ", event.sequence).expect("written to memory");
    serde_json::to_writer(&mut *out, &Typed::message(EVENT_ENVELOPE, event))
        .expect("StreamLD objects are JSON objects with text keys");
    out.extend_from_slice(b"\n\n");
}

/// A subscriber asks for every event after `after` (absent or 0: from the beginning).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionRequest {
    pub stream: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// Runnel: per-stream cursors when `stream` names a bucket.
    #[serde(
        default,
        rename = "runnel:cursors",
        skip_serializing_if = "Option::is_none",
        deserialize_with = "bounded_map"
    )]
    pub cursors: Option<std::collections::BTreeMap<String, u64>>,
    /// Runnel: the timestamp of the replica's last record (the one before `after`), so that an
    /// upstream holding another record there (restored from an older backup, then written
    /// again) answers with a diverged [`GapSignal`] rather than continue a copy of something else.
    #[serde(
        default,
        rename = "runnel:lastTimestamp",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_timestamp: Option<i64>,
    /// Runnel: the same per stream, beside `cursors`.
    #[serde(
        default,
        rename = "runnel:lastTimestamps",
        skip_serializing_if = "Option::is_none",
        deserialize_with = "bounded_map"
    )]
    pub last_timestamps: Option<std::collections::BTreeMap<String, i64>>,
}

/// One event of a stream: its sequence number (from 1), the stream, and the payload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventEnvelope {
    pub sequence: u64,
    pub stream_id: String,
    pub is_snapshot: bool,
    pub payload: Value,
    /// Runnel: how `payload` encodes the record body.
    #[serde(
        default,
        rename = "runnel:encoding",
        skip_serializing_if = "Option::is_none"
    )]
    pub encoding: Option<PayloadEncoding>,
    /// Runnel: the Durable Streams offset at the record's first byte.
    #[serde(
        default,
        rename = "runnel:offset",
        skip_serializing_if = "Option::is_none"
    )]
    pub offset: Option<String>,
    #[serde(
        default,
        rename = "runnel:timestamp",
        skip_serializing_if = "Option::is_none"
    )]
    pub timestamp: Option<i64>,
    /// Runnel: S2 record headers, base64 name and value.
    #[serde(
        default,
        rename = "runnel:headers",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub headers: Vec<(String, String)>,
    /// Runnel: an S2 command record (fence, trim).
    #[serde(
        default,
        rename = "runnel:command",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub command: bool,
    /// Runnel: the record begins an append unit.
    #[serde(
        default,
        rename = "runnel:startsUnit",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub starts_unit: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadEncoding {
    /// The payload is the record's JSON value.
    Json,
    /// The payload is the record's UTF-8 text.
    Text,
    /// The payload is the record's bytes in standard base64.
    Base64,
}

/// An event delivered for replication, positioned by its cursor (= its sequence).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationFrame {
    pub cursor: u64,
    #[serde(serialize_with = "typed_event")]
    pub event: EventEnvelope,
    /// Runnel: the upstream's next sequence when the frame was sent, so a replica knows its lag.
    #[serde(
        default,
        rename = "runnel:upstreamNext",
        skip_serializing_if = "Option::is_none"
    )]
    pub upstream_next: Option<u64>,
}

/// The requested cursor cannot be served; events from `oldest_available` on still can.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GapSignal {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_available: Option<u64>,
    /// Runnel: the stream the gap is about (on a bucket subscription).
    #[serde(
        default,
        rename = "runnel:stream",
        skip_serializing_if = "Option::is_none"
    )]
    pub stream: Option<String>,
    /// Runnel: the replica's copy is not a copy of this stream any more (its last record is not
    /// the upstream's): it must be rebuilt, even where its cursor is among the records held.
    #[serde(
        default,
        rename = "runnel:diverged",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub diverged: bool,
}

/// Runnel: everything about a stream beside its records, sent on join and whenever it changes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamState {
    pub stream: String,
    pub content_type: String,
    pub closed: bool,
    #[serde(default)]
    pub attrs: Option<Map<String, Value>>,
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    /// The first retained offset and record.
    pub retained_from: String,
    pub first_sequence: u64,
    /// The upstream's tail: next offset and next sequence.
    pub tail: String,
    pub next_sequence: u64,
    #[serde(default)]
    pub snapshot: Option<SnapshotRef>,
    pub created_ms: i64,
    /// The cipher S2 record bodies are sealed with, and the fingerprint of the key that sealed
    /// them: frames carry the sealed bodies. (Absent from upstreams that predate them.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cipher: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_fingerprint: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRef {
    pub offset: String,
    pub content_type: String,
    pub digest: String,
}

/// Runnel: the stream is gone upstream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamDeleted {
    pub stream: String,
}

/// Any message of the replication binding.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Subscribe(SubscriptionRequest),
    Frame(Box<ReplicationFrame>),
    Gap(GapSignal),
    State(Box<StreamState>),
    Deleted(StreamDeleted),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("not a JSON object: {0}")]
    NotJson(String),
    #[error("unknown or missing @type {0:?}")]
    UnknownType(String),
    #[error("malformed {kind}: {reason}")]
    Malformed { kind: &'static str, reason: String },
    #[error(
        "a replica's message lists at most {MAX_CURSORS} cursors, and holds at most {} JSON values",
        super::json::MAX_VALUES
    )]
    TooLarge,
    #[error(
        "an upstream's message holds at most {} JSON values",
        MAX_UPSTREAM_VALUES
    )]
    TooManyValues,
}

/// The most JSON values a message from an upstream may hold: one record (an append's body,
/// whose values the upstream bounded when it took it) and what comes with it, with room to spare.
const MAX_UPSTREAM_VALUES: usize = 2 * super::json::MAX_VALUES;

/// The most per-stream cursors (or last timestamps) a replica's join may list.
pub const MAX_CURSORS: usize = 1_000_000;

/// The members a `SubscriptionRequest` has as Runnel's replicas write it.
const PLAIN_JOIN_MEMBERS: [&str; 6] = [
    "@context",
    "stream",
    "after",
    "runnel:cursors",
    "runnel:lastTimestamp",
    "runnel:lastTimestamps",
];

/// A first look at a message: whether it is a `SubscriptionRequest` whose members all have
/// Runnel's own names, so that it can be parsed straight into its fields. The members' values
/// are skipped unparsed.
struct PlainJoin(bool);

impl<'de> Deserialize<'de> for PlainJoin {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Look;
        impl<'de> serde::de::Visitor<'de> for Look {
            type Value = PlainJoin;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<PlainJoin, A::Error> {
                let (mut join, mut plain) = (false, true);
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "@type" {
                        join = map.next_value::<std::borrow::Cow<'de, str>>()?
                            == "SubscriptionRequest";
                    } else {
                        plain &= PLAIN_JOIN_MEMBERS.contains(&key.as_ref());
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(PlainJoin(join && plain))
            }
        }
        deserializer.deserialize_map(Look)
    }
}

/// A map of at most [`MAX_CURSORS`] entries, refused as soon as it holds more.
fn bounded_map<'de, D, V>(
    deserializer: D,
) -> Result<Option<std::collections::BTreeMap<String, V>>, D::Error>
where
    D: serde::Deserializer<'de>,
    V: Deserialize<'de>,
{
    struct Bounded<V>(std::marker::PhantomData<V>);
    impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Bounded<V> {
        type Value = std::collections::BTreeMap<String, V>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a map of at most {MAX_CURSORS} entries")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = std::collections::BTreeMap::new();
            while let Some((key, value)) = map.next_entry::<String, V>()? {
                if out.len() == MAX_CURSORS {
                    return Err(serde::de::Error::custom(MessageError::TooLarge));
                }
                out.insert(key, value);
            }
            Ok(out)
        }
    }
    deserializer
        .deserialize_map(Bounded(std::marker::PhantomData))
        .map(Some)
}

/// Strips the StreamLD namespace from a term, in any of its three spellings.
fn short_term(term: &str) -> String {
    for prefix in [NAMESPACE, "streamld:"] {
        if let Some(short) = term.strip_prefix(prefix) {
            return short.to_string();
        }
    }
    if let Some(short) = term.strip_prefix(RUNNEL_NAMESPACE) {
        return format!("runnel:{short}");
    }
    term.to_string()
}

/// Members whose values are data, not vocabulary: a record's payload, a stream's attributes and
/// cursors keyed by stream name. They travel exactly as sent.
const DATA_TERMS: [&str; 4] = [
    "payload",
    "attrs",
    "runnel:cursors",
    "runnel:lastTimestamps",
];

/// Rewrites every key (and `@type` value) to its short name, recursively, dropping `@context`;
/// the values of data members are left as they are.
fn compact(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(key, _)| key != "@context")
                .map(|(key, value)| {
                    let key = short_term(&key);
                    let value = match (key.as_str(), value) {
                        ("@type", Value::String(t)) => Value::String(short_term(&t)),
                        (term, data) if DATA_TERMS.contains(&term) => data,
                        (_, other) => compact(other),
                    };
                    (key, value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(compact).collect()),
        other => other,
    }
}

fn typed<T: serde::de::DeserializeOwned>(
    kind: &'static str,
    value: Value,
) -> Result<T, MessageError> {
    // From text rather than `from_value`, which (with arbitrary_precision) turns `-0` into `0`.
    serde_json::from_str(&value.to_string()).map_err(|e| MessageError::Malformed {
        kind,
        reason: e.to_string(),
    })
}

impl Message {
    pub fn parse(text: &str) -> Result<Message, MessageError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| MessageError::NotJson(e.to_string()))?;
        let Value::Object(mut object) = compact(value) else {
            return Err(MessageError::NotJson("expected an object".into()));
        };
        let kind = object
            .remove("@type")
            .and_then(|t| t.as_str().map(str::to_string))
            .unwrap_or_default();
        let body = Value::Object(object);
        match kind.as_str() {
            "SubscriptionRequest" => typed("SubscriptionRequest", body).map(Message::Subscribe),
            "ReplicationFrame" => {
                typed("ReplicationFrame", body).map(|f| Message::Frame(Box::new(f)))
            }
            "GapSignal" => typed("GapSignal", body).map(Message::Gap),
            "runnel:StreamState" => typed("StreamState", body).map(|s| Message::State(Box::new(s))),
            "runnel:StreamDeleted" => typed("StreamDeleted", body).map(Message::Deleted),
            _ => Err(MessageError::UnknownType(kind)),
        }
    }

    /// A message from an upstream. Its values are counted before it is parsed: a message of
    /// any size must not make the mirror build a JSON tree of that size.
    pub fn parse_from_upstream(text: &str) -> Result<Message, MessageError> {
        if super::json::more_values_than(text.as_bytes(), MAX_UPSTREAM_VALUES) {
            return Err(MessageError::TooManyValues);
        }
        Message::parse(text)
    }

    /// A message from a replica: its join. Runnel's own spelling is parsed directly; any other
    /// takes [`Self::parse`], after a cheap count of the values it could hold.
    pub fn parse_from_replica(text: &str) -> Result<Message, MessageError> {
        if serde_json::from_str::<PlainJoin>(text).is_ok_and(|PlainJoin(plain)| plain) {
            return serde_json::from_str::<SubscriptionRequest>(text)
                .map(Message::Subscribe)
                .map_err(|e| {
                    // The bound's own error, as serde_json reports it (a position after it).
                    if e.to_string()
                        .starts_with(&MessageError::TooLarge.to_string())
                    {
                        MessageError::TooLarge
                    } else {
                        MessageError::Malformed {
                            kind: "SubscriptionRequest",
                            reason: e.to_string(),
                        }
                    }
                });
        }
        super::json::check_value_count(text.as_bytes()).map_err(|_| MessageError::TooLarge)?;
        Message::parse(text)
    }

    pub fn to_json(&self) -> String {
        fn typed<T: Serialize>(kind: &'static str, body: &T) -> String {
            serde_json::to_string(&Typed::message(kind, body))
                .expect("StreamLD objects are JSON objects with text keys")
        }
        match self {
            Message::Subscribe(m) => typed("SubscriptionRequest", m),
            Message::Frame(m) => typed("ReplicationFrame", m),
            Message::Gap(m) => typed("GapSignal", m),
            Message::State(m) => typed("runnel:StreamState", m),
            Message::Deleted(m) => typed("runnel:StreamDeleted", m),
        }
    }
}

/// The IRI of the stream `key` on the server at `origin` (`scheme://authority`): the key's path
/// percent-encoded, so [`iri_path`] gives the key back whatever its name holds.
pub fn stream_iri(origin: &str, key: &str) -> String {
    format!("{origin}{}", super::names::url_path(key))
}

/// The decoded path an IRI names (a bare path is taken as one); `None` when it is not UTF-8.
pub fn iri_path(iri: &str) -> Option<String> {
    let path = iri
        .split_once("://")
        .map_or(iri, |(_, rest)| rest.find('/').map_or("", |i| &rest[i..]));
    let path = path.split(['?', '#']).next().unwrap_or_default();
    percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .ok()
        .map(|p| p.into_owned())
}

/// A cursor a subscriber sends back (SSE `Last-Event-ID`, `?after=`): a non-negative decimal
/// integer, written canonically (as Runnel writes event ids). Anything else is refused rather
/// than read as "from the beginning", which would replay what the subscriber already has.
pub fn parse_cursor(text: &str) -> Option<u64> {
    super::headers::parse_canonical_u64(text.trim())
}

/// Whether a chunk of records read for a subscriber at cursor `next` (its next record ordinal)
/// continues it: it starts with record `next` exactly. A chunk that starts later means retention
/// trimmed records under the reader; delivering it would skip them silently.
pub fn continues(next: u64, first_read: Option<u64>) -> bool {
    first_read == Some(next)
}

/// StreamLD numbers events from 1; a record with ordinal `seq` is event `seq + 1`.
pub fn sequence_of(seq: u64) -> u64 {
    seq + 1
}

/// How deep a JSON record may nest to travel as JSON: a frame puts it two levels further down,
/// and every receiver must still parse the frame within serde_json's limit of 128 levels.
const MAX_PAYLOAD_DEPTH: usize = 100;

/// The envelope of one record: the JSON value on JSON streams, text on `text/*`, base64
/// otherwise (and for S2 command records), with Runnel's exact coordinates beside it. A record
/// that would not travel well as JSON or text goes as base64 too: JSON nested too deep for a
/// receiver to parse its frame, and text with control characters (other than tab and line
/// breaks), which JSON would write six bytes each: either would make a frame every receiver
/// refuses, and a mirror stop at that record for good.
pub fn envelope(url: &str, content_type: &str, record: &Record) -> EventEnvelope {
    let json = super::content_type::is_json(content_type);
    let is_text = super::content_type::media_type(content_type).starts_with("text/");
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let as_json = || {
        if super::json::nests_deeper_than(&record.body, MAX_PAYLOAD_DEPTH) {
            return None;
        }
        serde_json::from_slice(&record.body).ok()
    };
    let as_text = || {
        let text = std::str::from_utf8(&record.body).ok()?;
        let plain = |c: char| !c.is_ascii_control() || matches!(c, '\t' | '\n' | '\r');
        text.chars().all(plain).then(|| text.to_string())
    };
    let (encoding, payload) = if record.command {
        (PayloadEncoding::Base64, Value::String(b64(&record.body)))
    } else if let Some(value) = json.then(as_json).flatten() {
        (PayloadEncoding::Json, value)
    } else if let Some(text) = (!json && is_text).then(as_text).flatten() {
        (PayloadEncoding::Text, Value::String(text))
    } else {
        (PayloadEncoding::Base64, Value::String(b64(&record.body)))
    };
    EventEnvelope {
        sequence: sequence_of(record.seq),
        stream_id: url.to_string(),
        is_snapshot: false,
        payload,
        encoding: Some(encoding),
        offset: Some(record.offset().to_string()),
        timestamp: Some(record.timestamp_ms),
        headers: record
            .headers
            .iter()
            .map(|(n, v)| (b64(n), b64(v)))
            .collect(),
        command: record.command,
        starts_unit: record.starts_unit,
    }
}

/// The record an envelope carries, exactly as the upstream stores it.
pub fn record_of(event: &EventEnvelope) -> Option<Record> {
    let b64 = |text: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .ok()
            .map(Bytes::from)
    };
    let offset = Offset::parse_token(event.offset.as_deref()?).ok()?;
    let body = match (event.encoding?, &event.payload) {
        (PayloadEncoding::Json, value) => Bytes::from(serde_json::to_vec(value).ok()?),
        (PayloadEncoding::Text, Value::String(text)) => Bytes::copy_from_slice(text.as_bytes()),
        (PayloadEncoding::Base64, Value::String(text)) => b64(text)?,
        _ => return None,
    };
    let headers = event
        .headers
        .iter()
        .map(|(n, v)| Some((b64(n)?, b64(v)?)))
        .collect::<Option<Vec<_>>>()?;
    (event.sequence == sequence_of(offset.seq)).then_some(Record {
        seq: offset.seq,
        pos: offset.pos,
        timestamp_ms: event.timestamp?,
        // Mirrors follow their upstream's retention rather than apply ages themselves, so the
        // record's timestamp stands in for its arrival.
        arrival_ms: event.timestamp?,
        starts_unit: event.starts_unit,
        headers,
        body,
        command: event.command,
    })
}

/// The replication frame of one record.
pub fn frame(
    url: &str,
    content_type: &str,
    record: &Record,
    upstream_next: u64,
) -> ReplicationFrame {
    ReplicationFrame {
        cursor: sequence_of(record.seq),
        event: envelope(url, content_type, record),
        upstream_next: Some(upstream_next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn cursors_are_canonical_non_negative_integers() {
        assert_eq!(parse_cursor("0"), Some(0));
        assert_eq!(parse_cursor("42"), Some(42));
        assert_eq!(parse_cursor(" 7 "), Some(7));
        for bad in ["", "1x", "-1", "+1", "01", "1.0", "18446744073709551616"] {
            assert_eq!(parse_cursor(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_chunk_continues_a_reader_only_from_its_exact_next_record() {
        assert!(continues(5, Some(5)));
        assert!(
            !continues(5, Some(7)),
            "records 5 and 6 were trimmed under the reader"
        );
        assert!(!continues(5, None));
    }

    #[test]
    fn stream_iris_name_their_key_whatever_it_holds() {
        for key in [
            "/docs/a b",
            "/docs/a%20b",
            "/docs/users/42",
            "/docs/q?x#y",
            "/docs/\u{e9}",
        ] {
            let iri = stream_iri("http://up:1", key);
            assert!(!iri.contains(' '), "{iri}");
            assert_eq!(iri_path(&iri).as_deref(), Some(key), "{iri}");
        }
        assert_eq!(iri_path("/docs/x").as_deref(), Some("/docs/x"));
        assert_eq!(iri_path("http://up:1").as_deref(), Some(""));
        assert_eq!(
            iri_path("http://up:1/docs/x?y#z").as_deref(),
            Some("/docs/x")
        );
        assert_eq!(iri_path("http://up:1/docs/%FF"), None);
    }

    #[test]
    fn a_subscription_request_parses_with_short_names_and_context() {
        let text = r#"{"@context":{"@vocab":"https://openfaster.org/streamld#"},
            "@type":"SubscriptionRequest","stream":"http://up/b/s","after":41}"#;
        assert_eq!(
            Message::parse(text).unwrap(),
            Message::Subscribe(SubscriptionRequest {
                stream: "http://up/b/s".into(),
                after: Some(41),
                ..Default::default()
            })
        );
    }

    #[test]
    fn a_replicas_join_parses_the_same_by_the_direct_path_and_is_bounded() {
        let cursors: std::collections::BTreeMap<String, u64> =
            [("a".to_string(), 3), ("streamld:b".to_string(), 0)].into();
        let join = Message::Subscribe(SubscriptionRequest {
            stream: "http://up/b".into(),
            cursors: Some(cursors),
            last_timestamps: Some([("a".to_string(), -5)].into()),
            ..Default::default()
        });
        let text = join.to_json();
        assert_eq!(Message::parse_from_replica(&text).unwrap(), join);
        assert_eq!(
            Message::parse(&text).unwrap(),
            join,
            "stream names travel as sent"
        );
        // Other spellings take the general path, a mixed one included.
        let mixed =
            r#"{"@type":"SubscriptionRequest","stream":"http://up/b/s","streamld:after":4}"#;
        let Ok(Message::Subscribe(request)) = Message::parse_from_replica(mixed) else {
            panic!()
        };
        assert_eq!(request.after, Some(4));
        let prefixed =
            r#"{"@type":"streamld:SubscriptionRequest","streamld:stream":"http://up/b/s"}"#;
        assert!(matches!(
            Message::parse_from_replica(prefixed),
            Ok(Message::Subscribe(_))
        ));

        let many: String = (0..=MAX_CURSORS)
            .map(|i| format!("\"{i}\":0"))
            .collect::<Vec<_>>()
            .join(",");
        let text = format!(
            r#"{{"@type":"SubscriptionRequest","stream":"http://up/b","runnel:cursors":{{{many}}}}}"#
        );
        assert_eq!(
            Message::parse_from_replica(&text),
            Err(MessageError::TooLarge)
        );
        let spelled_otherwise = text.replace("\"stream\"", "\"streamld:stream\"");
        assert_eq!(
            Message::parse_from_replica(&spelled_otherwise),
            Err(MessageError::TooLarge)
        );
    }

    #[test]
    fn full_iris_and_prefixed_names_are_accepted_too() {
        let text = r#"{"@type":"https://openfaster.org/streamld#SubscriptionRequest",
            "https://openfaster.org/streamld#stream":"http://up/b/s","streamld:after":0}"#;
        let Message::Subscribe(request) = Message::parse(text).unwrap() else {
            panic!()
        };
        assert_eq!(request.after, Some(0));
        let gap =
            r#"{"@type":"streamld:GapSignal","https://openfaster.org/streamld#oldestAvailable":7}"#;
        assert_eq!(
            Message::parse(gap).unwrap(),
            Message::Gap(GapSignal {
                oldest_available: Some(7),
                ..Default::default()
            })
        );
    }

    #[test]
    fn a_frame_round_trips_with_its_envelope() {
        let frame = Message::Frame(Box::new(ReplicationFrame {
            upstream_next: Some(9),
            cursor: 3,
            event: EventEnvelope {
                sequence: 3,
                stream_id: "http://up/b/s".into(),
                is_snapshot: false,
                payload: json!({"n": 1}),
                encoding: Some(PayloadEncoding::Json),
                offset: Some("0000000000000002_0000000000000014".into()),
                timestamp: Some(5),
                headers: vec![("aw==".into(), "dg==".into())],
                command: false,
                starts_unit: true,
            },
        }));
        let text = frame.to_json();
        assert!(text.contains(r#""@type":"EventEnvelope""#) && text.contains("@context"));
        assert_eq!(Message::parse(&text).unwrap(), frame);
    }

    #[test]
    fn an_sse_event_is_its_envelope_on_one_line_under_its_cursor() {
        let event = EventEnvelope {
            sequence: 7,
            stream_id: "http://up/b/s".into(),
            is_snapshot: false,
            payload: json!({"text": "two\nlines"}),
            encoding: Some(PayloadEncoding::Json),
            offset: Some("0000000000000006_0000000000000090".into()),
            timestamp: Some(5),
            headers: vec![],
            command: false,
            starts_unit: true,
        };
        let mut out = b"earlier".to_vec();
        write_sse_event(&mut out, &event);
        let text = std::str::from_utf8(&out).unwrap();
        let rest = text.strip_prefix("earlier").unwrap();
        let lines: Vec<&str> = rest.split('\n').collect();
        assert_eq!(lines.len(), 5, "{rest:?}");
        assert_eq!(lines[..2], ["id: 7", "event: event"]);
        assert_eq!(lines[3..], ["", ""]);
        let data: Value = serde_json::from_str(lines[2].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(data["@type"], "EventEnvelope");
        assert_eq!(data["@context"]["@vocab"], NAMESPACE);
        assert_eq!(data["@context"]["runnel"], RUNNEL_NAMESPACE);
        let back: EventEnvelope = serde_json::from_value(data).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn records_that_would_not_travel_as_json_or_text_go_as_base64_and_come_back_exact() {
        // 126 levels parse on their own; inside a frame they would be 128, past serde_json's
        // limit, and no receiver could read the frame.
        let deep = format!("{}1{}", "[".repeat(126), "]".repeat(126));
        for (content_type, body, encoding) in [
            ("application/json", deep.as_str(), PayloadEncoding::Base64),
            ("application/json", "[[1]]", PayloadEncoding::Json),
            ("text/plain", "a\u{1}b", PayloadEncoding::Base64),
            ("text/plain", "tab\tand\nlines\r\n", PayloadEncoding::Text),
        ] {
            let record = crate::model::record::lay_out(
                Offset::START,
                1,
                vec![Bytes::copy_from_slice(body.as_bytes())],
            )
            .remove(0);
            let event = envelope("http://up/b/s", content_type, &record);
            assert_eq!(event.encoding, Some(encoding), "{content_type} {body:?}");
            let frame = Message::Frame(Box::new(ReplicationFrame {
                cursor: event.sequence,
                event,
                upstream_next: None,
            }));
            let Message::Frame(back) = Message::parse(&frame.to_json()).unwrap() else {
                panic!("not a frame")
            };
            assert_eq!(record_of(&back.event).unwrap().body, record.body);
        }
    }

    #[test]
    fn an_upstream_message_is_refused_before_it_is_parsed_when_it_holds_too_many_values() {
        let values = vec!["0"; MAX_UPSTREAM_VALUES + 1].join(",");
        let text = format!(r#"{{"@type":"GapSignal","j":[{values}]}}"#);
        assert_eq!(
            Message::parse_from_upstream(&text),
            Err(MessageError::TooManyValues)
        );
        let gap = Message::Gap(GapSignal::default());
        assert_eq!(Message::parse_from_upstream(&gap.to_json()), Ok(gap));
    }

    #[test]
    fn record_payloads_travel_exactly_even_when_they_look_like_vocabulary() {
        for payload in [
            json!({"@context": 1, "streamld:a": 1}),
            json!({"metadata": {"@type": "streamld:X"}}),
            serde_json::from_str::<serde_json::Value>("-0").unwrap(),
        ] {
            let frame = Message::Frame(Box::new(ReplicationFrame {
                upstream_next: None,
                cursor: 0,
                event: EventEnvelope {
                    sequence: 0,
                    stream_id: "http://up/b/s".into(),
                    is_snapshot: false,
                    payload: payload.clone(),
                    encoding: Some(PayloadEncoding::Json),
                    offset: None,
                    timestamp: None,
                    headers: vec![],
                    command: false,
                    starts_unit: true,
                },
            }));
            let Message::Frame(back) = Message::parse(&frame.to_json()).unwrap() else {
                panic!("not a frame")
            };
            assert_eq!(back.event.payload.to_string(), payload.to_string());
        }
    }

    #[test]
    fn invalid_messages_are_rejected_with_a_reason() {
        assert!(matches!(
            Message::parse("[1]"),
            Err(MessageError::NotJson(_))
        ));
        assert!(matches!(Message::parse("{"), Err(MessageError::NotJson(_))));
        assert!(matches!(
            Message::parse(r#"{"@type":"Nope"}"#),
            Err(MessageError::UnknownType(_))
        ));
        assert!(matches!(
            Message::parse(r#"{"stream":"x"}"#),
            Err(MessageError::UnknownType(_))
        ));
        assert!(matches!(
            Message::parse(r#"{"@type":"SubscriptionRequest","after":1}"#),
            Err(MessageError::Malformed { .. })
        ));
        assert!(matches!(
            Message::parse(r#"{"@type":"ReplicationFrame","cursor":-1,"event":{}}"#),
            Err(MessageError::Malformed { .. })
        ));
    }

    #[test]
    fn records_travel_in_envelopes_and_come_back_unchanged() {
        let record = |body: &[u8], command: bool| Record {
            seq: 4,
            pos: 10,
            timestamp_ms: 99,
            arrival_ms: 99,
            starts_unit: true,
            headers: vec![(Bytes::from("k"), Bytes::from_static(&[0, 255]))],
            body: Bytes::copy_from_slice(body),
            command,
        };
        for (content_type, body, encoding) in [
            (
                "application/json",
                &br#"{"a":[1,2.50]}"#[..],
                PayloadEncoding::Json,
            ),
            ("text/plain", b"caf\xc3\xa9", PayloadEncoding::Text),
            (
                "application/octet-stream",
                &[0u8, 1, 255][..],
                PayloadEncoding::Base64,
            ),
            ("text/plain", &[0xffu8, 0xfe][..], PayloadEncoding::Base64),
        ] {
            let original = record(body, false);
            let event = envelope("http://up/b/s", content_type, &original);
            assert_eq!(event.sequence, 5);
            assert_eq!(event.encoding, Some(encoding), "{content_type}");
            assert_eq!(record_of(&event), Some(original));
        }
        let command = record(b"tok", true);
        assert_eq!(
            record_of(&envelope("u", "application/json", &command)),
            Some(command)
        );
    }

    #[test]
    fn sequences_count_from_one() {
        assert_eq!(sequence_of(0), 1);
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC*") {
            let _ = Message::parse(&text);
        }
    }
}
