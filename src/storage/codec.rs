//! The on-disk encoding of keys and values.
//!
//! Keys are big-endian so one stream's records sort together by `seq`. A record value holds one
//! record or a run of consecutive ones, and starts with a version byte so the layout can evolve.
//! Producer states, written with every producer's append, are a small fixed binary layout
//! (earlier versions wrote JSON, which still reads); metadata is JSON, which tolerates added
//! fields.

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

/// A value holding a run of records with consecutive seqs, written by one commit: version, the
/// first record's seq (8), the record count (4), then per record its fields, body length (4) and
/// body. Keyed by the run's last seq, so a range scan from any seq starts at the run holding it
/// and a trim deletes exactly the runs that end below it. A 512-frame append-batch is then a
/// few inserts into the engine instead of 512.
const RUN_VERSION: u8 = 3;

/// A run whose bodies lie in a staged file (`storage::staged`), not in the value: version, the
/// file's number (8), the first record's seq (8), the record count (4), then per record its
/// fields, its body's place in the file (8) and its length (8).
const FILED_RUN_VERSION: u8 = 4;

/// What a filed run stores per record besides its headers: the fields, a place and a length.
const FIXED_IN_FILED_RUN: usize = FIXED_IN_RUN - 4 + 16;

/// A run closes once its records take this many encoded bytes, which bounds what a read of one
/// record in it loads and decodes.
pub const RUN_BYTES: usize = 64 * 1024;

/// Consecutive records stored as one value, as [`runs`] splits them: never empty.
#[derive(Clone, Copy, Debug)]
pub struct Run<'a> {
    first: &'a Record,
    last: &'a Record,
    records: &'a [Record],
}

impl<'a> Run<'a> {
    pub fn records(&self) -> &'a [Record] {
        self.records
    }

    /// The key the run is stored under: its stream and its last seq.
    pub fn key(&self, id: StreamId) -> [u8; 16] {
        record_key(id, self.last.seq)
    }

    /// The stored value: the single-record layout for a lone record.
    pub fn encode(&self) -> Vec<u8> {
        if self.records.len() == 1 {
            return encode_record(self.first);
        }
        let mut out = Vec::with_capacity(13 + self.records.iter().map(encoded_len).sum::<usize>());
        out.push(RUN_VERSION);
        out.extend_from_slice(&self.first.seq.to_be_bytes());
        out.extend_from_slice(&(self.records.len() as u32).to_be_bytes());
        for record in self.records {
            put_fields(&mut out, record);
            out.extend_from_slice(&(record.body.len() as u32).to_be_bytes());
            out.extend_from_slice(&record.body);
        }
        out
    }

    /// The stored value of a run whose bodies lie in staged file `file`, at `places` (one per
    /// record of the run, in order). See [`FILED_RUN_VERSION`].
    pub fn encode_filed(&self, file: u64, places: &[u64]) -> Vec<u8> {
        let fields: usize = self
            .records
            .iter()
            .map(|r| encoded_len(r) - r.body.len())
            .sum();
        let mut out = Vec::with_capacity(21 + fields + 12 * self.records.len());
        out.push(FILED_RUN_VERSION);
        out.extend_from_slice(&file.to_be_bytes());
        out.extend_from_slice(&self.first.seq.to_be_bytes());
        out.extend_from_slice(&(self.records.len() as u32).to_be_bytes());
        for (record, place) in self.records.iter().zip(places) {
            put_fields(&mut out, record);
            out.extend_from_slice(&place.to_be_bytes());
            out.extend_from_slice(&(record.body.len() as u64).to_be_bytes());
        }
        out
    }
}

/// Splits records into the runs stored as one value each: consecutive seqs, closed at
/// [`RUN_BYTES`]. A record that is large on its own is a run by itself.
pub fn runs(records: &[Record]) -> impl Iterator<Item = Run<'_>> {
    runs_weighed(records, encoded_len)
}

/// [`runs`] of records whose bodies lie in a staged file: only their fields count towards
/// [`RUN_BYTES`], since only those are stored in the run.
pub fn filed_runs(records: &[Record]) -> impl Iterator<Item = Run<'_>> {
    runs_weighed(records, |record| {
        encoded_len(record) - record.body.len() + 12
    })
}

fn runs_weighed(records: &[Record], weight: fn(&Record) -> usize) -> impl Iterator<Item = Run<'_>> {
    let mut rest = records;
    std::iter::from_fn(move || {
        let (first, _) = rest.split_first()?;
        let mut last = first;
        let mut bytes = weight(first);
        let mut len = 1;
        while let Some(next) = rest.get(len) {
            bytes += weight(next);
            if next.seq != last.seq.wrapping_add(1) || bytes > RUN_BYTES {
                break;
            }
            last = next;
            len += 1;
        }
        let (records, after) = rest.split_at(len);
        rest = after;
        Some(Run {
            first,
            last,
            records,
        })
    })
}

/// A value holding one record: version, then the record's fields (see [`put_fields`]) and its
/// body to the end of the value. Keyed by the record's seq.
pub fn encode_record(record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + encoded_len(record));
    out.push(RECORD_VERSION);
    put_fields(&mut out, record);
    out.extend_from_slice(&record.body);
    out
}

/// The bytes of a record in a run without its headers and body: flags, pos, timestamp, arrival,
/// header count and body length.
const FIXED_IN_RUN: usize = 33;

/// What a record takes in a run: its fields, its headers, a length and its body.
fn encoded_len(record: &Record) -> usize {
    let headers: usize = record
        .headers
        .iter()
        .map(|(n, v)| 8 + n.len() + v.len())
        .sum();
    FIXED_IN_RUN + headers + record.body.len()
}

/// Flags, pos (8), timestamp (8), arrival (8), header count (4), then per header name length
/// (4), name, value length (4), value.
fn put_fields(out: &mut Vec<u8>, record: &Record) {
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
}

/// What one stored value holds.
#[derive(Debug)]
pub enum Stored {
    /// Records with their bodies: slices of the value, not copies.
    Held(Vec<Record>),
    /// Records whose bodies lie in a staged file, to be read from it.
    Filed(FiledRun),
}

/// A run of records whose bodies lie in staged file `file`.
#[derive(Debug)]
pub struct FiledRun {
    pub file: u64,
    pub records: Vec<Filed>,
}

/// A record whose `body` is empty until read from the file: it lies at `place`, `len` bytes.
#[derive(Debug)]
pub struct Filed {
    pub record: Record,
    pub place: u64,
    pub len: u64,
}

impl Filed {
    /// The offset just after the record, without reading its body.
    pub fn next_offset(&self) -> crate::model::Offset {
        // Decoding checked that this does not overflow.
        crate::model::Offset::new(self.record.seq + 1, self.record.pos + self.byte_len())
    }

    /// How many bytes of the canonical byte stream the record holds, as [`Record::byte_len`].
    fn byte_len(&self) -> u64 {
        if self.record.command { 0 } else { self.len }
    }
}

impl Stored {
    /// The offset just after the last record, and its timestamp, without reading any body.
    pub fn end(&self) -> Option<(crate::model::Offset, i64)> {
        match self {
            Stored::Held(records) => records.last().map(|r| (r.next_offset(), r.timestamp_ms)),
            Stored::Filed(run) => run
                .records
                .last()
                .map(|f| (f.next_offset(), f.record.timestamp_ms)),
        }
    }
}

/// The records of a stored value keyed by `key_seq`: one record, or a whole run, with their
/// bodies or where they lie.
pub fn decode_stored(key_seq: u64, value: Bytes) -> Result<Stored, StorageError> {
    // No record has the last seq: the offset after it could not be written.
    if key_seq == u64::MAX {
        return Err(StorageError::Corrupt(
            "a record stored at seq 2^64 - 1".into(),
        ));
    }
    match value.first() {
        Some(&RUN_VERSION) => decode_run(key_seq, value).map(Stored::Held),
        Some(&FILED_RUN_VERSION) => decode_filed_run(key_seq, value).map(Stored::Filed),
        _ => Ok(Stored::Held(vec![decode_record(key_seq, value)?])),
    }
}

/// Reads a run's header: its first seq and record count, checked against its key and against
/// what its bytes can hold at `fixed` bytes per record at least (a count beyond that is
/// corrupt, and must not size an allocation).
fn run_header(
    reader: &mut Reader,
    key_seq: u64,
    fixed: usize,
) -> Option<std::ops::RangeInclusive<u64>> {
    let first = reader.u64()?;
    let count = reader.u32()?;
    let fits = reader.data.len() / fixed;
    if count == 0
        || count as usize > fits
        || first.checked_add(u64::from(count) - 1) != Some(key_seq)
    {
        return None;
    }
    Some(first..=key_seq)
}

fn decode_filed_run(key_seq: u64, value: Bytes) -> Result<FiledRun, StorageError> {
    let corrupt = || StorageError::Corrupt(format!("filed run ending at {key_seq} is malformed"));
    let mut reader = Reader {
        data: &value,
        at: 1,
    };
    let file = reader.u64().ok_or_else(corrupt)?;
    let seqs = run_header(&mut reader, key_seq, FIXED_IN_FILED_RUN).ok_or_else(corrupt)?;
    let mut records = Vec::with_capacity((key_seq - seqs.start() + 1) as usize);
    for seq in seqs {
        let mut record = read_fields(&mut reader, &value, RECORD_VERSION).ok_or_else(corrupt)?;
        record.seq = seq;
        let place = reader.u64().ok_or_else(corrupt)?;
        let len = reader.u64().ok_or_else(corrupt)?;
        place.checked_add(len).ok_or_else(corrupt)?;
        let filed = Filed { record, place, len };
        if !ends_in_range(filed.record.pos, filed.byte_len()) {
            return Err(corrupt());
        }
        records.push(filed);
    }
    if reader.at != value.len() {
        return Err(corrupt());
    }
    Ok(FiledRun { file, records })
}

fn decode_run(key_seq: u64, value: Bytes) -> Result<Vec<Record>, StorageError> {
    let corrupt = || StorageError::Corrupt(format!("run ending at {key_seq} is malformed"));
    let mut reader = Reader {
        data: &value,
        at: 1,
    };
    let seqs = run_header(&mut reader, key_seq, FIXED_IN_RUN).ok_or_else(corrupt)?;
    let mut records = Vec::with_capacity((key_seq - seqs.start() + 1) as usize);
    for seq in seqs {
        let mut record = read_fields(&mut reader, &value, RECORD_VERSION).ok_or_else(corrupt)?;
        record.seq = seq;
        record.body = reader.sized(&value).ok_or_else(corrupt)?;
        if !ends_in_range(record.pos, record.byte_len()) {
            return Err(corrupt());
        }
        records.push(record);
    }
    if reader.at != value.len() {
        return Err(corrupt());
    }
    Ok(records)
}

fn decode_record(seq: u64, value: Bytes) -> Result<Record, StorageError> {
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
    let mut record = read_fields(&mut reader, &value, version).ok_or_else(corrupt)?;
    record.seq = seq;
    record.body = value.slice(reader.at..);
    if !ends_in_range(record.pos, record.byte_len()) {
        return Err(corrupt());
    }
    Ok(record)
}

/// Whether the offset after a record of `bytes` bytes at `pos` exists. A stored `pos` that
/// would carry the stream's byte position past 2^64 is corrupt: taken as it is, the offsets
/// after it would wrap (or, in a debug build, panic while the server recovers).
fn ends_in_range(pos: u64, bytes: u64) -> bool {
    pos.checked_add(bytes).is_some()
}

/// The fields [`put_fields`] writes (without the arrival time in version 1), as a record with
/// seq 0 and an empty body.
fn read_fields(reader: &mut Reader, whole: &Bytes, version: u8) -> Option<Record> {
    let flags = reader.take(1)?[0];
    let pos = reader.u64()?;
    let timestamp_ms = reader.u64()? as i64;
    let arrival_ms = if version == RECORD_VERSION_WITHOUT_ARRIVAL {
        timestamp_ms
    } else {
        reader.u64()? as i64
    };
    let count = reader.u32()?;
    let mut headers = Vec::new();
    for _ in 0..count {
        headers.push((reader.sized(whole)?, reader.sized(whole)?));
    }
    Some(Record {
        seq: 0,
        pos,
        timestamp_ms,
        arrival_ms,
        starts_unit: flags & FLAG_STARTS_UNIT != 0,
        headers,
        body: Bytes::new(),
        command: flags & FLAG_COMMAND != 0,
    })
}

/// The first binary producer layout: fixed-width fields. Still read; no longer written.
const PRODUCER_FIXED: u8 = 1;
/// The binary producer layout written now: varints and deltas. A JSON state starts with `{`.
const PRODUCER_VERSION: u8 = 2;

/// Layout: version, then varints: epoch, last seq, record start, record count, the number of
/// earlier appends, and per earlier append, newest first, how far its seq and its record start
/// lie below the append after it, and its record count. Differences wrap, so any values
/// encode; consecutive appends of one record each take three bytes apiece.
///
/// Every producer append writes its state, so its size is paid in the journal and the memtable
/// on every append: the fixed layout took 397 bytes with 15 earlier appends (more than a
/// 256-byte record), this one about 60. JSON, before that, showed in the writer's profile.
pub fn encode_producer(state: &ProducerState) -> Vec<u8> {
    use prost::encoding::encode_varint as put;
    let mut out = Vec::with_capacity(16 + state.earlier.len() * 3);
    out.push(PRODUCER_VERSION);
    put(state.epoch, &mut out);
    put(state.last_seq, &mut out);
    put(state.records.0, &mut out);
    put(state.records.1.wrapping_sub(state.records.0), &mut out);
    put(state.earlier.len() as u64, &mut out);
    let (mut seq_after, mut start_after) = (state.last_seq, state.records.0);
    for &(seq, start, next) in state.earlier.iter().rev() {
        put(seq_after.wrapping_sub(seq), &mut out);
        put(start_after.wrapping_sub(start), &mut out);
        put(next.wrapping_sub(start), &mut out);
        (seq_after, start_after) = (seq, start);
    }
    out
}

pub fn decode_producer(value: &[u8]) -> Result<ProducerState, StorageError> {
    let corrupt = || StorageError::Corrupt("producer state is truncated or malformed".into());
    match value.first() {
        Some(b'{') => serde_json::from_slice(value)
            .map_err(|e| StorageError::Corrupt(format!("producer state: {e}"))),
        Some(&PRODUCER_VERSION) => decode_producer_varints(&value[1..]).ok_or_else(corrupt),
        Some(&PRODUCER_FIXED) => decode_producer_fixed(value).ok_or_else(corrupt),
        _ => Err(StorageError::Corrupt(
            "producer state has an unknown version".into(),
        )),
    }
}

fn decode_producer_varints(mut data: &[u8]) -> Option<ProducerState> {
    let mut field = || prost::encoding::decode_varint(&mut data).ok();
    let (epoch, last_seq, start, count) = (field()?, field()?, field()?, field()?);
    let records = (start, start.wrapping_add(count));
    let remembered = usize::try_from(field()?).ok()?;
    if remembered > crate::model::producer::REMEMBERED_APPENDS {
        return None;
    }
    let mut earlier = Vec::with_capacity(remembered);
    let (mut seq_after, mut start_after) = (last_seq, start);
    for _ in 0..remembered {
        let seq = seq_after.wrapping_sub(field()?);
        let start = start_after.wrapping_sub(field()?);
        earlier.push((seq, start, start.wrapping_add(field()?)));
        (seq_after, start_after) = (seq, start);
    }
    if !data.is_empty() {
        return None;
    }
    earlier.reverse();
    Some(ProducerState {
        epoch,
        last_seq,
        records,
        earlier,
    })
}

/// The layout of [`PRODUCER_FIXED`]: version, epoch, last seq, record start, record next,
/// count of earlier appends, then `(seq, start, next)` per earlier append; big-endian.
fn decode_producer_fixed(value: &[u8]) -> Option<ProducerState> {
    let mut reader = Reader { data: value, at: 1 };
    let mut field = || reader.u64();
    let (epoch, last_seq, start, next) = (field()?, field()?, field()?, field()?);
    let count = reader.u32()? as usize;
    if count > crate::model::producer::REMEMBERED_APPENDS {
        return None;
    }
    let mut earlier = Vec::with_capacity(count);
    for _ in 0..count {
        let mut field = || reader.u64();
        earlier.push((field()?, field()?, field()?));
    }
    if reader.at != value.len() {
        return None;
    }
    Some(ProducerState {
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
mod tests;
