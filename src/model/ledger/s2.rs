//! An S2 append: a checked batch, prepared for its stream outside the lock (JSON canonical form,
//! sealing), then sequenced against the stream's conditions in S2's order of precedence: the
//! stream is there, the key is the stream's, it is open, the fencing token, `match_seq_num`, and
//! each record's timestamp under the stream's timestamping mode.

use super::{Command, Ledger, Refusal};
use crate::model::cipher::RecordKey;
use crate::model::json;
use crate::model::record::Record;
use crate::model::s2::{self, CheckedRecord, Command as RecordCommand, Timestamping};

/// A sequence number with the timestamp of the record there (S2's `StreamPosition`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct S2Position {
    pub seq_num: u64,
    pub timestamp: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct S2Ack {
    pub start: S2Position,
    pub end: S2Position,
    pub tail: S2Position,
}

/// A timestamp as S2 reports it: milliseconds, never negative.
pub fn ms(timestamp: i64) -> u64 {
    u64::try_from(timestamp).unwrap_or(0)
}

/// What a stream does to an S2 batch's records before they are sequenced, which needs no lock:
/// a JSON stream stores each body as one canonical JSON value and takes no command records; an
/// encrypted stream's bodies are sealed with `key`, which must be given. Returns the fingerprint
/// of the key the records are sealed under.
pub fn prepare(
    records: &mut [CheckedRecord],
    json: bool,
    encrypted: bool,
    key: Option<&RecordKey>,
) -> Result<Option<String>, Refusal> {
    if json {
        canonical_json_bodies(records)?;
    }
    if !encrypted {
        return Ok(None);
    }
    let key = key.ok_or(Refusal::KeyRequired)?;
    for p in records.iter_mut().filter(|p| p.command.is_none()) {
        p.record.body = key.seal(&p.record.body);
    }
    Ok(Some(key.fingerprint()))
}

/// A JSON stream's bodies: one canonical JSON value each. Command records are refused there: each
/// would take a record ordinal that no JSON reader sees, and JSON record ordinals are consecutive
/// (seed 000 §6.1).
fn canonical_json_bodies(records: &mut [CheckedRecord]) -> Result<(), Refusal> {
    if records.iter().any(|r| r.command.is_some()) {
        return Err(Refusal::CommandOnJsonStream);
    }
    for checked in records.iter_mut() {
        checked.record.body = json::canonical_value(&checked.record.body)
            .map_err(|e| Refusal::NotOneJsonValue(e.to_string()))?;
    }
    // The canonical form may be longer than what was sent (numbers are written out anew): the
    // cap holds for what is stored and read back.
    s2::check_metered(records.iter().map(|r| &r.record)).map_err(Refusal::CanonicalTooLarge)
}

/// The command: a prepared batch and what it requires of its stream.
pub struct S2Sequence<'a> {
    pub records: Vec<CheckedRecord>,
    pub fencing_token: Option<&'a str>,
    pub match_seq_num: Option<u64>,
    /// The fingerprint of the key the records are sealed under, on an encrypted stream.
    pub fingerprint: Option<&'a str>,
}

/// An S2 batch, sequenced.
#[derive(Debug)]
pub struct Sequenced {
    pub ack: S2Ack,
    pub records: Vec<Record>,
    /// The trim point its trim commands ask for (also kept as the stream's pending trim until
    /// it is applied).
    pub trim: Option<u64>,
    /// Metadata beyond the tail changed (a command's effect, the stream's key) and is stored
    /// with the records.
    pub meta_changed: bool,
}

impl Command for S2Sequence<'_> {
    type Outcome = Result<Sequenced, Refusal>;

    fn apply(self, ledger: &mut Ledger<'_>, now_ms: i64) -> Result<Sequenced, Refusal> {
        let S2Sequence {
            records: prepared,
            fencing_token,
            match_seq_num,
            fingerprint,
        } = self;
        ledger.present()?;
        let extra = ledger.meta.extra();
        // The first key a stream is written with becomes its key; records under any other would
        // not open with it.
        let keyed = match (fingerprint, &extra.key_fingerprint) {
            (Some(_), None) => true,
            (Some(used), Some(known)) if used != known => return Err(Refusal::KeyMismatch),
            _ => false,
        };
        if ledger.meta.closed {
            return Err(Refusal::ClosedToS2);
        }
        if let Some(token) = fencing_token
            && token != extra.fencing_token
        {
            return Err(Refusal::FencingMismatch {
                current: extra.fencing_token.clone(),
            });
        }
        let tail = ledger.meta.tail;
        if match_seq_num.is_some_and(|expected| expected != tail.seq) {
            return Err(Refusal::SeqNumMismatch { next: tail.seq });
        }
        let default = Timestamping::default();
        let timestamping = (extra.s2_config.as_ref())
            .and_then(|config| config.timestamping.as_ref())
            .unwrap_or(&default);
        let arrival = ms(now_ms);
        let mut floor = ms(ledger.meta.last_timestamp_ms);
        let mut at = tail;
        let mut records = Vec::with_capacity(prepared.len());
        let mut fence = None;
        let mut trim = None;
        for (i, CheckedRecord { record, command }) in prepared.into_iter().enumerate() {
            let timestamp = s2::assign_timestamp(timestamping, record.timestamp, arrival, floor)?;
            floor = timestamp;
            let is_command = command.is_some();
            match command {
                Some(RecordCommand::Fence(token)) => fence = Some(token),
                Some(RecordCommand::Trim(point)) => {
                    // A trim never reaches past the trim record itself.
                    let point = point.min(at.seq + 1);
                    trim = Some(trim.map_or(point, |t: u64| t.max(point)));
                }
                None => {}
            }
            let stored = Record {
                seq: at.seq,
                pos: at.pos,
                timestamp_ms: i64::try_from(timestamp).unwrap_or(i64::MAX),
                arrival_ms: i64::try_from(arrival).unwrap_or(i64::MAX),
                starts_unit: i == 0,
                headers: record.headers,
                body: record.body,
                command: is_command,
            };
            at = stored.next_offset();
            records.push(stored);
        }
        let first_ts = records.first().map_or(floor, |r| ms(r.timestamp_ms));
        *ledger.last_access_ms = now_ms;
        let meta = &mut *ledger.meta;
        meta.tail = at;
        meta.last_timestamp_ms = i64::try_from(floor).unwrap_or(i64::MAX);
        // A command's effect (the fencing token, the pending trim) and the stream's key, fixed by
        // its first records, are stored with them.
        let commanded = fence.is_some() || trim.is_some();
        if let Some(token) = fence {
            meta.extra_mut().fencing_token = token;
        }
        if let Some(point) = trim {
            let pending = &mut meta.extra_mut().pending_trim;
            *pending = Some(pending.map_or(point, |p| p.max(point)));
        }
        if keyed {
            meta.extra_mut().key_fingerprint = fingerprint.map(str::to_string);
        }
        let end = S2Position {
            seq_num: at.seq,
            timestamp: floor,
        };
        let ack = S2Ack {
            start: S2Position {
                seq_num: tail.seq,
                timestamp: first_ts,
            },
            end,
            tail: end,
        };
        Ok(Sequenced {
            ack,
            records,
            trim,
            meta_changed: keyed || commanded,
        })
    }
}

#[cfg(test)]
mod tests;
