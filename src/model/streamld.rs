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
mod tests;
