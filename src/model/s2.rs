//! The S2 records model (seed 002): metering, record commands, timestamps; configurations in
//! [`config`]. Pure rules; the S2 face in `http/s2` translates the wire format and `service/`
//! applies them.

use base64::Engine as _;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

mod config;

pub use config::{
    BasinConfig, CheckedConfig, DeleteOnEmpty, RetentionPolicy, StorageClass, StreamConfig,
    Timestamping, TimestampingMode, merge_patch,
};

/// The most records one append may carry.
pub const MAX_BATCH_RECORDS: usize = 1000;
/// The most metered bytes one append (and one record) may carry.
pub const MAX_BATCH_METERED: u64 = 1 << 20;
/// The longest fencing token.
pub const MAX_FENCING_TOKEN: usize = 36;
/// Unary reads return at most this many records and metered bytes.
pub const UNARY_MAX_RECORDS: u64 = 1000;
pub const UNARY_MAX_BYTES: u64 = 1 << 20;
/// The longest a unary read waits for new records.
pub const UNARY_MAX_WAIT_SECS: u64 = 60;

/// A record as an S2 client sends it, decoded from its wire format.
#[derive(Clone, Debug, Default)]
pub struct S2Record {
    pub timestamp: Option<u64>,
    pub headers: Vec<(Bytes, Bytes)>,
    pub body: Bytes,
}

/// One append: a batch of records and its conditions.
#[derive(Clone, Debug, Default)]
pub struct S2Append {
    pub records: Vec<S2Record>,
    pub match_seq_num: Option<u64>,
    pub fencing_token: Option<String>,
}

/// An append that passed every check needing no stream, which S2 makes before it looks the
/// stream up (so a bad batch never auto-creates one): 1 to 1000 records, at most 1 MiB metered,
/// well-formed command records, a fencing token of at most 36 bytes.
#[derive(Clone, Debug, Default)]
pub struct CheckedAppend {
    pub records: Vec<CheckedRecord>,
    pub match_seq_num: Option<u64>,
    pub fencing_token: Option<String>,
}

/// A record of a checked append, with the command it carries, if any.
#[derive(Clone, Debug)]
pub struct CheckedRecord {
    pub record: S2Record,
    pub command: Option<Command>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("a batch holds 1 to {MAX_BATCH_RECORDS} records")]
    RecordCount,
    #[error("a batch holds at most 1 MiB of metered bytes")]
    TooLarge,
    #[error("a fencing token is at most {MAX_FENCING_TOKEN} bytes")]
    FencingToken,
    #[error(transparent)]
    Record(#[from] RecordError),
}

impl S2Append {
    /// Checks the batch on its own; see [`CheckedAppend`].
    pub fn check(self) -> Result<CheckedAppend, BatchError> {
        if self.records.is_empty() || self.records.len() > MAX_BATCH_RECORDS {
            return Err(BatchError::RecordCount);
        }
        if self
            .fencing_token
            .as_ref()
            .is_some_and(|token| token.len() > MAX_FENCING_TOKEN)
        {
            return Err(BatchError::FencingToken);
        }
        check_metered(&self.records)?;
        let mut records = Vec::with_capacity(self.records.len());
        for record in self.records {
            let command = command_of(&record.headers, &record.body)?;
            records.push(CheckedRecord { record, command });
        }
        Ok(CheckedAppend {
            records,
            match_seq_num: self.match_seq_num,
            fencing_token: self.fencing_token,
        })
    }
}

/// Checks the 1 MiB metered cap of a batch, which holds for each of its records too.
pub fn check_metered<'a>(
    records: impl IntoIterator<Item = &'a S2Record>,
) -> Result<(), BatchError> {
    let mut total = 0u64;
    for record in records {
        total += metered_size(&record.headers, &record.body);
        if total > MAX_BATCH_METERED {
            return Err(BatchError::TooLarge);
        }
    }
    Ok(())
}

/// How record bytes travel in JSON (the `s2-format` header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Header names, values and bodies are UTF-8 text; bytes read back as lossy UTF-8.
    Raw,
    /// Standard base64 with padding.
    Base64,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JsonInputError {
    /// Not JSON, or not an `AppendInput`.
    #[error("{0}")]
    Malformed(String),
    /// Well-formed JSON whose bytes do not decode in the chosen format.
    #[error("{0}")]
    Undecodable(String),
}

impl Format {
    /// The format an `s2-format` header value names (`None`: the header is absent).
    pub fn named(value: Option<&str>) -> Option<Format> {
        match value.map(str::trim) {
            None | Some("raw") | Some("json") => Some(Format::Raw),
            Some("base64") | Some("json-binsafe") => Some(Format::Base64),
            Some(_) => None,
        }
    }

    pub fn decode(self, text: &str) -> Result<Bytes, JsonInputError> {
        match self {
            Format::Raw => Ok(Bytes::copy_from_slice(text.as_bytes())),
            Format::Base64 => base64::engine::general_purpose::STANDARD
                .decode(text)
                .map(Bytes::from)
                .map_err(|e| JsonInputError::Undecodable(format!("invalid base64: {e}"))),
        }
    }

    pub fn encode(self, bytes: &[u8]) -> String {
        self.encoded(bytes).into_owned()
    }

    /// [`Format::encode`], borrowing the bytes when they are already valid UTF-8 text.
    pub fn encoded(self, bytes: &[u8]) -> std::borrow::Cow<'_, str> {
        match self {
            Format::Raw => String::from_utf8_lossy(bytes),
            Format::Base64 => base64::engine::general_purpose::STANDARD
                .encode(bytes)
                .into(),
        }
    }
}

#[derive(Deserialize)]
struct JsonAppendInput {
    records: Vec<JsonAppendRecord>,
    #[serde(default)]
    match_seq_num: Option<u64>,
    #[serde(default)]
    fencing_token: Option<String>,
}

#[derive(Deserialize)]
struct JsonAppendRecord {
    #[serde(default)]
    timestamp: Option<u64>,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: Option<String>,
}

/// Parses a JSON `AppendInput`, its bytes decoded per `format`. Limits and record rules are
/// checked where the batch is sequenced, the same for every wire.
pub fn parse_append_json(body: &[u8], format: Format) -> Result<S2Append, JsonInputError> {
    let input: JsonAppendInput =
        serde_json::from_slice(body).map_err(|e| JsonInputError::Malformed(e.to_string()))?;
    let mut records = Vec::with_capacity(input.records.len());
    for record in input.records {
        let mut headers = Vec::with_capacity(record.headers.len());
        for (name, value) in &record.headers {
            headers.push((format.decode(name)?, format.decode(value)?));
        }
        records.push(S2Record {
            timestamp: record.timestamp,
            headers,
            body: format.decode(record.body.as_deref().unwrap_or_default())?,
        });
    }
    Ok(S2Append {
        records,
        match_seq_num: input.match_seq_num,
        fencing_token: input.fencing_token,
    })
}

/// S2's metered size of a record: 8 bytes of overhead, 2 per header, and every byte of the
/// header names, values and body.
pub fn metered_size(headers: &[(Bytes, Bytes)], body: &[u8]) -> u64 {
    metered_size_of(headers, body.len())
}

/// [`metered_size`] of a record whose body is `body_len` bytes.
pub fn metered_size_of(headers: &[(Bytes, Bytes)], body_len: usize) -> u64 {
    let header_bytes: usize = headers.iter().map(|(n, v)| 2 + n.len() + v.len()).sum();
    (8 + header_bytes + body_len) as u64
}

/// A command record: exactly one header, with an empty name; its value names the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Set the fencing token to the body.
    Fence(String),
    /// Trim records before this seq_num (capped at the trim record itself).
    Trim(u64),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("a header with an empty name is only allowed alone, in a command record")]
    EmptyHeaderName,
    #[error("unknown command {0:?}")]
    UnknownCommand(String),
    #[error("a fencing token is at most {MAX_FENCING_TOKEN} bytes of UTF-8")]
    BadFencingToken,
    #[error("a trim command carries an 8-byte big-endian sequence number")]
    BadTrim,
}

/// Recognises a command record; `Ok(None)` for an ordinary record.
pub fn command_of(headers: &[(Bytes, Bytes)], body: &[u8]) -> Result<Option<Command>, RecordError> {
    let empty_names = headers.iter().filter(|(name, _)| name.is_empty()).count();
    if empty_names == 0 {
        return Ok(None);
    }
    if headers.len() != 1 {
        return Err(RecordError::EmptyHeaderName);
    }
    match headers[0].1.as_ref() {
        b"fence" => {
            let token = std::str::from_utf8(body).map_err(|_| RecordError::BadFencingToken)?;
            if token.len() > MAX_FENCING_TOKEN {
                return Err(RecordError::BadFencingToken);
            }
            Ok(Some(Command::Fence(token.to_string())))
        }
        b"trim" => {
            let point: [u8; 8] = body.try_into().map_err(|_| RecordError::BadTrim)?;
            Ok(Some(Command::Trim(u64::from_be_bytes(point))))
        }
        other => Err(RecordError::UnknownCommand(shown_command(other))),
    }
}

/// The longest part of an unknown command's name an error repeats.
const SHOWN_COMMAND_BYTES: usize = 64;

/// An unknown command's name as an error shows it: its value may be a megabyte, and the error
/// goes back to the client, in an S2S session inside a frame of at most 2 MiB.
fn shown_command(name: &[u8]) -> String {
    let shown = String::from_utf8_lossy(&name[..name.len().min(SHOWN_COMMAND_BYTES)]);
    if name.len() > SHOWN_COMMAND_BYTES {
        format!("{shown}…")
    } else {
        shown.into_owned()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimestampError {
    #[error("this stream requires a client timestamp on every record")]
    Required,
}

/// The latest timestamp a record can hold: records keep milliseconds since the epoch in an `i64`.
pub const MAX_TIMESTAMP: u64 = i64::MAX as u64;

/// The timestamp a record gets: the client's or the arrival time per the stream's mode, capped at
/// the arrival time unless uncapped, never below `floor` (the stream's latest timestamp), and at
/// most [`MAX_TIMESTAMP`], so what an append acknowledges is what reads return.
pub fn assign_timestamp(
    timestamping: &Timestamping,
    client: Option<u64>,
    arrival: u64,
    floor: u64,
) -> Result<u64, TimestampError> {
    let chosen = match (timestamping.mode.unwrap_or_default(), client) {
        (TimestampingMode::Arrival, _) | (TimestampingMode::ClientPrefer, None) => arrival,
        (TimestampingMode::ClientRequire, None) => return Err(TimestampError::Required),
        (_, Some(client)) if timestamping.uncapped.unwrap_or(false) => client,
        (_, Some(client)) => client.min(arrival),
    };
    Ok(chosen.max(floor).min(MAX_TIMESTAMP))
}

/// The longest `s2-request-token` a create may carry.
pub const MAX_REQUEST_TOKEN: usize = 36;

/// What identifies one create request across its retries: the client's `s2-request-token` and the
/// configuration it asked for, hashed. The same token with another configuration is another
/// request.
pub fn creation_key(request_token: &str, config: Option<&Value>) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    // Length-prefixed, so no token and configuration run into each other.
    hash.update((request_token.len() as u64).to_be_bytes());
    hash.update(request_token.as_bytes());
    if let Some(config) = config {
        hash.update(config.to_string().as_bytes());
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// S2's basin name rule, as errors state it.
pub const BASIN_NAME_RULE: &str = "basin names are 8-48 characters of a-z, 0-9 and '-', starting and ending with a letter or digit";

/// Basin names created through S2: 8–48 bytes of `[a-z0-9-]`, starting and ending with a letter or
/// digit.
pub fn is_valid_basin_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (8..=48).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(|b| *b != b'-')
        && bytes.last().is_some_and(|b| *b != b'-')
}

/// The SSE event id `seq_num,count,bytes`: last record delivered and the session's totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventId {
    pub last_seq: u64,
    pub count: u64,
    pub bytes: u64,
}

impl EventId {
    pub fn parse(text: &str) -> Option<EventId> {
        let mut parts = text.split(',').map(|p| p.trim().parse::<u64>().ok());
        let id = EventId {
            last_seq: parts.next()??,
            count: parts.next()??,
            bytes: parts.next()??,
        };
        parts.next().is_none().then_some(id)
    }
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{},{},{}", self.last_seq, self.count, self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_creation_key_depends_on_both_the_token_and_the_configuration() {
        let config = serde_json::json!({"retention_policy": {"age": 60}});
        let key = creation_key("t1", Some(&config));
        assert_eq!(key, creation_key("t1", Some(&config)));
        assert_eq!(key.len(), 64);
        assert_ne!(key, creation_key("t2", Some(&config)));
        assert_ne!(key, creation_key("t1", None));
        assert_ne!(
            creation_key(
                "t1",
                Some(&serde_json::json!({"retention_policy": {"age": 61}}))
            ),
            key
        );
        // The token's length is part of the key: no token and config run together.
        assert_ne!(
            creation_key("a1", None),
            creation_key("a", Some(&serde_json::json!(1)))
        );
    }

    fn header(name: &str, value: &str) -> (Bytes, Bytes) {
        (
            Bytes::copy_from_slice(name.as_bytes()),
            Bytes::copy_from_slice(value.as_bytes()),
        )
    }

    #[test]
    fn metered_size_counts_overhead_headers_and_body() {
        assert_eq!(metered_size(&[], b""), 8);
        assert_eq!(metered_size(&[header("k", "vv")], b"body"), 8 + 2 + 3 + 4);
        assert_eq!(metered_size(&[header("", "trim")], &[0; 8]), 8 + 2 + 4 + 8);
    }

    #[test]
    fn command_records_have_one_empty_named_header() {
        assert_eq!(
            command_of(&[header("", "fence")], b"tok"),
            Ok(Some(Command::Fence("tok".into())))
        );
        assert_eq!(
            command_of(&[header("", "trim")], &10u64.to_be_bytes()),
            Ok(Some(Command::Trim(10)))
        );
        assert_eq!(command_of(&[header("k", "v")], b"x"), Ok(None));
        assert_eq!(
            command_of(&[header("", "fence"), header("k", "v")], b""),
            Err(RecordError::EmptyHeaderName)
        );
        assert!(matches!(
            command_of(&[header("", "nope")], b""),
            Err(RecordError::UnknownCommand(_))
        ));
        assert_eq!(
            command_of(&[header("", "trim")], b"short"),
            Err(RecordError::BadTrim)
        );
        assert_eq!(
            command_of(&[header("", "fence")], &[b'x'; 37]),
            Err(RecordError::BadFencingToken)
        );
    }

    #[test]
    fn timestamps_follow_the_mode_cap_and_floor() {
        let prefer = Timestamping::default();
        assert_eq!(assign_timestamp(&prefer, Some(5), 100, 0), Ok(5));
        assert_eq!(assign_timestamp(&prefer, None, 100, 0), Ok(100));
        assert_eq!(
            assign_timestamp(&prefer, Some(500), 100, 0),
            Ok(100),
            "capped at arrival"
        );
        assert_eq!(
            assign_timestamp(&prefer, Some(5), 100, 50),
            Ok(50),
            "never below the floor"
        );
        let uncapped = Timestamping {
            mode: None,
            uncapped: Some(true),
        };
        assert_eq!(assign_timestamp(&uncapped, Some(500), 100, 0), Ok(500));
        assert_eq!(
            assign_timestamp(&uncapped, Some(u64::MAX), 100, 0),
            Ok(MAX_TIMESTAMP),
            "no later than a record can hold"
        );
        let require = Timestamping {
            mode: Some(TimestampingMode::ClientRequire),
            uncapped: None,
        };
        assert_eq!(
            assign_timestamp(&require, None, 100, 0),
            Err(TimestampError::Required)
        );
        let arrival = Timestamping {
            mode: Some(TimestampingMode::Arrival),
            uncapped: None,
        };
        assert_eq!(assign_timestamp(&arrival, Some(5), 100, 0), Ok(100));
    }

    #[test]
    fn a_batch_is_checked_on_its_own_before_any_stream() {
        let record = |headers: Vec<(Bytes, Bytes)>, body: &'static [u8]| S2Record {
            timestamp: None,
            headers,
            body: Bytes::from_static(body),
        };
        let batch = |records: Vec<S2Record>, fencing_token: Option<&str>| S2Append {
            records,
            match_seq_num: None,
            fencing_token: fencing_token.map(str::to_string),
        };
        let plain = || record(Vec::new(), b"x");
        let command = |name: &'static [u8], body| {
            record(vec![(Bytes::new(), Bytes::from_static(name))], body)
        };
        assert_eq!(
            batch(vec![], None).check().unwrap_err(),
            BatchError::RecordCount
        );
        let too_many = vec![plain(); MAX_BATCH_RECORDS + 1];
        assert_eq!(
            batch(too_many, None).check().unwrap_err(),
            BatchError::RecordCount
        );
        let long_token = "t".repeat(MAX_FENCING_TOKEN + 1);
        assert_eq!(
            batch(vec![plain()], Some(&long_token)).check().unwrap_err(),
            BatchError::FencingToken
        );
        assert!(matches!(
            batch(vec![command(b"bogus", b"")], None).check(),
            Err(BatchError::Record(RecordError::UnknownCommand(_)))
        ));
        let big = Bytes::from(vec![0u8; MAX_BATCH_METERED as usize]);
        let oversized = S2Record {
            body: big,
            ..plain()
        };
        assert_eq!(
            batch(vec![oversized], None).check().unwrap_err(),
            BatchError::TooLarge
        );
        let checked = batch(vec![plain(), command(b"fence", b"me")], Some(""))
            .check()
            .unwrap();
        assert_eq!(checked.records[0].command, None);
        assert_eq!(
            checked.records[1].command,
            Some(Command::Fence("me".into()))
        );
    }

    #[test]
    fn basin_names_follow_s2_rules() {
        assert!(is_valid_basin_name("my-basin-1"));
        for bad in [
            "short",
            "-leading-dash",
            "trailing-dash-",
            "UPPERCASE",
            "under_score",
            &"x".repeat(49),
        ] {
            assert!(!is_valid_basin_name(bad), "{bad}");
        }
    }

    #[test]
    fn event_ids_round_trip() {
        let id = EventId {
            last_seq: 9,
            count: 10,
            bytes: 1530,
        };
        assert_eq!(EventId::parse(&id.to_string()), Some(id));
        assert_eq!(EventId::parse("1,2"), None);
        assert_eq!(EventId::parse("1,2,x"), None);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC*", body in proptest::collection::vec(any::<u8>(), 0..16)) {
            let _ = EventId::parse(&s);
            let _ = command_of(&[(Bytes::new(), Bytes::from(s.clone()))], &body);
            let _ = is_valid_basin_name(&s);
        }
    }
}
