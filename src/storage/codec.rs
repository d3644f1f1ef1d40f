//! The on-disk encoding of keys and values.
//!
//! Keys are big-endian so one stream's records sort together by `seq`. Record values carry a
//! version byte so the layout can evolve. Producer states, written with every producer's append,
//! are a small fixed binary layout (earlier versions wrote JSON, which still reads); metadata is
//! JSON, which tolerates added fields.

use bytes::Bytes;

use super::{StorageError, StreamId};
use crate::model::Record;
use crate::model::producer::ProducerState;

/// Version 2 adds the arrival time; version 1 records (written before) arrived at their
/// timestamp.
const RECORD_VERSION: u8 = 2;
const RECORD_VERSION_WITHOUT_ARRIVAL: u8 = 1;
const FLAG_STARTS_UNIT: u8 = 1;
const FLAG_COMMAND: u8 = 2;

pub fn stream_key(id: StreamId) -> [u8; 8] {
    id.to_be_bytes()
}

pub fn record_key(id: StreamId, seq: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&id.to_be_bytes());
    key[8..].copy_from_slice(&seq.to_be_bytes());
    key
}

pub fn producer_key(id: StreamId, producer: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + producer.len());
    key.extend_from_slice(&id.to_be_bytes());
    key.extend_from_slice(producer.as_bytes());
    key
}

/// Splits a record or producer key into its stream id and the rest.
pub fn split_key(key: &[u8]) -> Result<(StreamId, &[u8]), StorageError> {
    let (id, rest) = key
        .split_first_chunk::<8>()
        .ok_or_else(|| StorageError::Corrupt(format!("key of {} bytes is too short", key.len())))?;
    Ok((u64::from_be_bytes(*id), rest))
}

/// The sequence number of a record key.
pub fn record_seq(key: &[u8]) -> Result<u64, StorageError> {
    let (_, seq) = split_key(key)?;
    let seq = seq
        .try_into()
        .map_err(|_| StorageError::Corrupt("record key length".into()))?;
    Ok(u64::from_be_bytes(seq))
}

const TRIM_VERSION: u8 = 1;

/// A stream's trim state: records below `before` are trimmed, those below `purged` are also
/// deleted. Layout: version, before (8), purged (8).
pub fn encode_trim(before: u64, purged: u64) -> [u8; 17] {
    let mut out = [0u8; 17];
    out[0] = TRIM_VERSION;
    out[1..9].copy_from_slice(&before.to_be_bytes());
    out[9..].copy_from_slice(&purged.to_be_bytes());
    out
}

/// The `(before, purged)` of an encoded trim state.
pub fn decode_trim(value: &[u8]) -> Result<(u64, u64), StorageError> {
    let corrupt = || StorageError::Corrupt(format!("trim state of {} bytes", value.len()));
    let [TRIM_VERSION, rest @ ..] = value else {
        return Err(corrupt());
    };
    let (before, purged) = rest.split_first_chunk::<8>().ok_or_else(corrupt)?;
    let purged: [u8; 8] = purged.try_into().map_err(|_| corrupt())?;
    Ok((u64::from_be_bytes(*before), u64::from_be_bytes(purged)))
}

/// Layout: version, flags, pos (8), timestamp (8), arrival (8), header count (4), then per header
/// name length (4), name, value length (4), value; then the body to the end.
pub fn encode_record(record: &Record) -> Vec<u8> {
    let header_bytes: usize = record
        .headers
        .iter()
        .map(|(n, v)| 8 + n.len() + v.len())
        .sum();
    let mut out = Vec::with_capacity(30 + header_bytes + record.body.len());
    out.push(RECORD_VERSION);
    let flag = |set: bool, bit: u8| if set { bit } else { 0 };
    out.push(flag(record.starts_unit, FLAG_STARTS_UNIT) | flag(record.command, FLAG_COMMAND));
    out.extend_from_slice(&record.pos.to_be_bytes());
    out.extend_from_slice(&record.timestamp_ms.to_be_bytes());
    out.extend_from_slice(&record.arrival_ms.to_be_bytes());
    out.extend_from_slice(&(record.headers.len() as u32).to_be_bytes());
    for (name, value) in &record.headers {
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value);
    }
    out.extend_from_slice(&record.body);
    out
}

pub fn decode_record(seq: u64, value: Bytes) -> Result<Record, StorageError> {
    let corrupt = || StorageError::Corrupt(format!("record {seq} is truncated or malformed"));
    let mut reader = Reader {
        data: &value,
        at: 0,
    };
    let version = reader.take(1).ok_or_else(corrupt)?[0];
    if version != RECORD_VERSION && version != RECORD_VERSION_WITHOUT_ARRIVAL {
        return Err(StorageError::Corrupt(format!(
            "record {seq} has an unknown version"
        )));
    }
    let flags = reader.take(1).ok_or_else(corrupt)?[0];
    let pos = reader.u64().ok_or_else(corrupt)?;
    let timestamp_ms = reader.u64().ok_or_else(corrupt)? as i64;
    let arrival_ms = if version == RECORD_VERSION {
        reader.u64().ok_or_else(corrupt)? as i64
    } else {
        timestamp_ms
    };
    let count = reader.u32().ok_or_else(corrupt)?;
    let mut headers = Vec::new();
    for _ in 0..count {
        let name = reader.sized(&value).ok_or_else(corrupt)?;
        let header_value = reader.sized(&value).ok_or_else(corrupt)?;
        headers.push((name, header_value));
    }
    let body = value.slice(reader.at..);
    Ok(Record {
        seq,
        pos,
        timestamp_ms,
        arrival_ms,
        starts_unit: flags & FLAG_STARTS_UNIT != 0,
        headers,
        body,
        command: flags & FLAG_COMMAND != 0,
    })
}

/// Marks the binary producer layout; a JSON state starts with `{`.
const PRODUCER_VERSION: u8 = 1;

/// Layout: version, epoch, last seq, record start, record next, count of earlier appends, then
/// `(seq, start, next)` per earlier append; integers big-endian. Serialising JSON here showed in
/// the writer thread's profile, once per producer append.
pub fn encode_producer(state: &ProducerState) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 8 * 4 + 4 + state.earlier.len() * 24);
    out.push(PRODUCER_VERSION);
    for n in [
        state.epoch,
        state.last_seq,
        state.records.0,
        state.records.1,
    ] {
        out.extend_from_slice(&n.to_be_bytes());
    }
    out.extend_from_slice(&(state.earlier.len() as u32).to_be_bytes());
    for (seq, start, next) in &state.earlier {
        for n in [seq, start, next] {
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
    out
}

pub fn decode_producer(value: &[u8]) -> Result<ProducerState, StorageError> {
    if value.first() == Some(&b'{') {
        return serde_json::from_slice(value)
            .map_err(|e| StorageError::Corrupt(format!("producer state: {e}")));
    }
    let corrupt = || StorageError::Corrupt("producer state is truncated or malformed".into());
    let mut reader = Reader { data: value, at: 0 };
    if reader.take(1).ok_or_else(corrupt)?[0] != PRODUCER_VERSION {
        return Err(StorageError::Corrupt(
            "producer state has an unknown version".into(),
        ));
    }
    let mut field = || reader.u64().ok_or_else(corrupt);
    let (epoch, last_seq, start, next) = (field()?, field()?, field()?, field()?);
    let count = reader.u32().ok_or_else(corrupt)? as usize;
    if count > crate::model::producer::REMEMBERED_APPENDS {
        return Err(corrupt());
    }
    let mut earlier = Vec::with_capacity(count);
    for _ in 0..count {
        let mut field = || reader.u64().ok_or_else(corrupt);
        earlier.push((field()?, field()?, field()?));
    }
    if reader.at != value.len() {
        return Err(corrupt());
    }
    Ok(ProducerState {
        epoch,
        last_seq,
        records: (start, next),
        earlier,
    })
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let bytes = self.data.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    /// A length-prefixed field, as a zero-copy slice of `whole`.
    fn sized(&mut self, whole: &Bytes) -> Option<Bytes> {
        let len = self.u32()? as usize;
        let start = self.at;
        self.take(len)?;
        Some(whole.slice(start..start + len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_round_trip(
            seq in any::<u64>(), pos in any::<u64>(), ts in any::<i64>(), arrival in any::<i64>(),
            starts in any::<bool>(),
            command in any::<bool>(),
            headers in proptest::collection::vec((any::<Vec<u8>>(), any::<Vec<u8>>()), 0..4),
            body in any::<Vec<u8>>(),
        ) {
            let record = Record {
                seq, pos, timestamp_ms: ts, arrival_ms: arrival, starts_unit: starts,
                headers: headers.into_iter().map(|(n, v)| (Bytes::from(n), Bytes::from(v))).collect(),
                body: Bytes::from(body),
                command,
            };
            prop_assert_eq!(decode_record(seq, Bytes::from(encode_record(&record))).unwrap(), record);
        }

        #[test]
        fn garbage_never_panics(value in any::<Vec<u8>>()) {
            let _ = decode_record(0, Bytes::from(value.clone()));
            let _ = decode_producer(&value);
        }

        #[test]
        fn producer_states_round_trip(
            epoch in any::<u64>(), last_seq in any::<u64>(), records in any::<(u64, u64)>(),
            earlier in proptest::collection::vec(any::<(u64, u64, u64)>(), 0..=16),
        ) {
            let state = ProducerState { epoch, last_seq, records, earlier };
            prop_assert_eq!(decode_producer(&encode_producer(&state)).unwrap(), state);
        }
    }

    #[test]
    fn keys_of_one_stream_sort_by_seq() {
        assert!(record_key(1, 255) < record_key(1, 256));
        assert!(record_key(1, u64::MAX) < record_key(2, 0));
        assert_eq!(split_key(&record_key(7, 9)).unwrap().0, 7);
    }

    #[test]
    fn trim_states_round_trip_and_reject_garbage() {
        assert_eq!(
            decode_trim(&encode_trim(7, u64::MAX)).unwrap(),
            (7, u64::MAX)
        );
        assert!(decode_trim(&[]).is_err());
        assert!(decode_trim(&encode_trim(1, 2)[..16]).is_err());
        let mut future = encode_trim(1, 2);
        future[0] = 9;
        assert!(decode_trim(&future).is_err());
        assert_eq!(record_seq(&record_key(3, 258)).unwrap(), 258);
        assert!(record_seq(&[0; 12]).is_err());
    }

    #[test]
    fn records_written_before_arrival_times_read_as_arriving_at_their_timestamp() {
        let record = Record {
            seq: 3,
            pos: 0,
            timestamp_ms: 1_700,
            arrival_ms: 9_999,
            starts_unit: true,
            headers: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
            body: Bytes::from_static(b"body"),
            command: false,
        };
        let mut v1 = encode_record(&record);
        v1[0] = RECORD_VERSION_WITHOUT_ARRIVAL;
        v1.drain(18..26);
        let decoded = decode_record(3, Bytes::from(v1)).unwrap();
        assert_eq!(decoded.arrival_ms, 1_700);
        assert_eq!(decoded.body, record.body);
        assert_eq!(decoded.headers, record.headers);
    }

    #[test]
    fn producer_states_written_as_json_still_read() {
        let state = ProducerState {
            epoch: 2,
            last_seq: 9,
            records: (40, 41),
            earlier: vec![(8, 39, 40)],
        };
        let json = serde_json::to_vec(&state).unwrap();
        assert_eq!(decode_producer(&json).unwrap(), state);
    }
}
