//! The S2 records API over Runnel streams (seed 002): appends, whose rules are the ledger's
//! (`model::ledger::s2`); reads by sequence number, timestamp or tail offset with S2's limits.
//! Basins and streams as resources are in [`resources`]; what their configurations do over time
//! in [`retention`].

mod resources;
mod retention;

use std::sync::Arc;

use super::append::Awaited as _;
use super::{ReadLease, Stream, StreamError, StreamResult, StreamService, now_ms};
use crate::model::cipher::{self, RecordKey};
use crate::model::ledger::append::DurableBefore;
use crate::model::ledger::s2::{self as s2_ledger, S2Sequence, Sequenced, ms};
use crate::model::record::Record;
use crate::model::s2;

pub use crate::model::ledger::s2::{S2Ack, S2Position};
pub use crate::model::s2::{CheckedAppend, S2Append, S2Record};
pub use resources::{Ensured, basin_config_value, parse_config};

/// Where a read of records starts: a sequence number, a timestamp, or a distance back from the tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordStart {
    SeqNum(u64),
    Timestamp(u64),
    TailOffset(u64),
}

/// Bounds of a read of records (S2 limits), counted over the whole session.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadLimits {
    pub count: Option<u64>,
    /// Metered bytes.
    pub bytes: Option<u64>,
    /// Exclusive timestamp.
    pub until: Option<u64>,
}

impl ReadLimits {
    /// A count or byte limit of 0: the read is over before it starts, wherever it starts.
    pub fn exhausted(&self) -> bool {
        self.count == Some(0) || self.bytes == Some(0)
    }
}

/// Records read in one step, and why the read stopped there.
#[derive(Debug)]
pub struct RecordBatch {
    pub records: Vec<Record>,
    /// Where the next read continues.
    pub next_seq: u64,
    /// Metered bytes of `records`.
    pub metered: u64,
    /// A limit (count, bytes or until) was reached: the session is over.
    pub limit_reached: bool,
    /// The batch ends at the durable tail.
    pub at_tail: bool,
    pub tail: S2Position,
    /// The read memory its records count against (see `read_memory`): hold it while they, or
    /// what is rendered from them, are held.
    pub lease: ReadLease,
}

impl StreamService {
    pub fn tail_position(&self, stream: &Stream) -> S2Position {
        let durable = stream.durable();
        S2Position {
            seq_num: durable.tail.seq,
            timestamp: ms(durable.last_timestamp_ms),
        }
    }

    /// Appends an S2 batch atomically. On an encrypted stream, bodies are sealed with `key`.
    pub async fn append_records(
        self: &Arc<Self>,
        stream: &Arc<Stream>,
        append: CheckedAppend,
        key: Option<&RecordKey>,
    ) -> StreamResult<S2Ack> {
        self.sequence_records(stream, append, key).await?.await
    }

    /// Checks and sequences an S2 batch, and returns its acknowledgement, which resolves once
    /// the batch is durable (and any trim it commands is applied). Batches sequenced one after
    /// another are acknowledged in that order, so an append session can sequence its next input
    /// while earlier ones become durable; `match_seq_num` is checked against the sequenced
    /// tail. The completion runs on its own task: the tail is published even if nobody waits.
    pub async fn sequence_records(
        self: &Arc<Self>,
        stream: &Arc<Stream>,
        append: CheckedAppend,
        key: Option<&RecordKey>,
    ) -> StreamResult<impl Future<Output = StreamResult<S2Ack>> + Send + 'static> {
        Self::writable(stream)?;
        self.engine.room()?;
        let mut prepared = append.records;
        let fingerprint = s2_ledger::prepare(&mut prepared, stream.json, stream.encrypted, key)?;
        let permit = Arc::clone(&self.commit_permits)
            .acquire_owned()
            .await
            .map_err(|_| crate::storage::StorageError::Failed)?;
        let sequenced = {
            let mut state = stream.lock();
            let batch = S2Sequence {
                records: prepared,
                fencing_token: append.fencing_token.as_deref(),
                match_seq_num: append.match_seq_num,
                fingerprint: fingerprint.as_deref(),
            };
            match state.ledger(stream).apply(batch, now_ms()) {
                Ok(Sequenced {
                    ack,
                    records,
                    trim,
                    meta_changed,
                }) => {
                    // An S2 batch is at most 1 MiB: too small to be worth staging.
                    let none = std::iter::empty();
                    let commit = self.submit(stream, &mut state, records, none, meta_changed, None);
                    Ok((ack, trim, commit))
                }
                Err(refusal) => Err((refusal, DurableBefore::seen(&state.meta))),
            }
        };
        let (ack, trim, commit) = match sequenced {
            Ok(sequenced) => sequenced,
            Err((refusal, seen)) => return Err(seen.refuse(stream, refusal.into()).await),
        };
        let (service, stream) = (Arc::clone(self), Arc::clone(stream));
        let completion = tokio::spawn(async move {
            commit.await?;
            drop(permit);
            if let Some(trim) = trim {
                service.trim(&stream, trim).await?;
            }
            Ok(ack)
        });
        Ok(async move {
            completion
                .await
                .map_err(|_| StreamError::from(crate::storage::StorageError::Failed))?
        })
    }

    /// Opens the sealed bodies of records read from an encrypted stream.
    pub fn open_sealed(
        &self,
        stream: &Stream,
        key: Option<&RecordKey>,
        records: &mut [Record],
    ) -> StreamResult<()> {
        if !stream.encrypted {
            return Ok(());
        }
        let key = key.ok_or(StreamError::KeyRequired)?;
        for record in records.iter_mut().filter(|r| !r.command) {
            record.body = key.open(&record.body)?;
        }
        Ok(())
    }

    /// Where an S2 read starts, as a sequence number; 416 (`BeyondTail`) past the tail unless
    /// `clamp`.
    pub async fn resolve_start(
        &self,
        stream: &Arc<Stream>,
        start: RecordStart,
        clamp: bool,
    ) -> StreamResult<u64> {
        let durable = stream.durable();
        let (first, tail) = (durable.first.seq, durable.tail.seq);
        let beyond = || StreamError::BeyondTail {
            tail,
            timestamp_ms: durable.last_timestamp_ms,
        };
        match start {
            RecordStart::SeqNum(seq) if seq > tail => {
                if clamp {
                    Ok(tail)
                } else {
                    Err(beyond())
                }
            }
            RecordStart::SeqNum(seq) => Ok(seq.max(first)),
            RecordStart::TailOffset(n) => Ok(tail.saturating_sub(n).max(first)),
            RecordStart::Timestamp(ts) => {
                let last_ts = ms(durable.last_timestamp_ms);
                if first == tail || ts > last_ts {
                    // No retained record is at or after `ts`: start at the tail, if allowed.
                    return if clamp || ts <= last_ts {
                        Ok(tail)
                    } else {
                        Err(beyond())
                    };
                }
                let (low, high) = self.narrow_to_timestamp(stream, ts, first, tail).await?;
                self.first_at_or_after(stream, ts, low, high, |r| r.timestamp_ms)
                    .await
            }
        }
    }

    /// The first record in `low..high` whose `time` (timestamp or arrival, both never
    /// decreasing) is at least `ts`.
    async fn first_at_or_after(
        &self,
        stream: &Arc<Stream>,
        ts: u64,
        mut low: u64,
        mut high: u64,
        time: fn(&Record) -> i64,
    ) -> StreamResult<u64> {
        while low < high {
            let mid = low + (high - low) / 2;
            let found = self.collect(stream, mid, mid + 1, 0).await?;
            // Retention passed it while this looked: it was older than anything left.
            let Some(record) = found.first() else {
                low = mid + 1;
                continue;
            };
            if ms(time(record)) >= ts {
                high = mid;
            } else {
                low = mid + 1;
            }
        }
        Ok(low)
    }

    /// Reads the next records from `from`, within `limits` (already reduced by what the session
    /// delivered) and at most `max_records` / `max_bytes` in this step.
    pub async fn read_records(
        &self,
        stream: &Arc<Stream>,
        from: u64,
        limits: ReadLimits,
        max_records: u64,
        max_bytes: u64,
    ) -> StreamResult<RecordBatch> {
        stream.renew();
        let durable = stream.durable();
        let tail = S2Position {
            seq_num: durable.tail.seq,
            timestamp: ms(durable.last_timestamp_ms),
        };
        let from = from.max(durable.first.seq);
        let count_cap = limits.count.unwrap_or(u64::MAX).min(max_records);
        let bytes_cap = limits.bytes.unwrap_or(u64::MAX).min(max_bytes);
        let until = durable.tail.seq.min(from.saturating_add(count_cap));
        // Fewer bytes while other reads hold most of the read memory: the reader then gets a
        // smaller batch, and reads on.
        let mut lease = self
            .read_memory
            .lease(usize::try_from(bytes_cap).unwrap_or(usize::MAX));
        let candidates = if from < until {
            self.collect(stream, from, until, lease.bytes()).await?
        } else {
            Vec::new()
        };
        let mut records = Vec::with_capacity(candidates.len());
        let mut metered = 0u64;
        let mut limit_reached =
            limits.count.is_some_and(|c| c == 0) || limits.bytes.is_some_and(|b| b == 0);
        for record in candidates {
            if limits
                .until
                .is_some_and(|until| ms(record.timestamp_ms) >= until)
            {
                limit_reached = true;
                break;
            }
            let size = s2_metered_size(stream, &record);
            if metered + size > bytes_cap {
                let past_limit = limits.bytes.is_some_and(|b| metered + size > b);
                // A record larger than one step (a Durable Streams append may be; S2 caps
                // records at 1 MiB) goes alone rather than never: a reader would wait on it
                // forever. The client's own limit still stops it.
                if !records.is_empty() || past_limit {
                    limit_reached |= past_limit;
                    break;
                }
            }
            metered += size;
            records.push(record);
        }
        lease.keep(records.iter().map(Record::held_len).sum());
        let delivered = records.len() as u64;
        limit_reached |= limits.count.is_some_and(|c| delivered >= c);
        limit_reached |= limits.bytes.is_some_and(|b| metered >= b);
        let next_seq = records.last().map_or(from, |r| r.seq + 1);
        Ok(RecordBatch {
            records,
            next_seq,
            metered,
            limit_reached,
            at_tail: next_seq >= durable.tail.seq,
            tail,
            lease,
        })
    }
}

/// A stored record's S2 metered size: of its plaintext, on an encrypted stream as on any other,
/// so that reads meter what appends did (read limits and SSE event ids count these sizes).
fn s2_metered_size(stream: &Stream, record: &Record) -> u64 {
    let sealed = stream.encrypted && !record.command;
    let body_len = if sealed {
        cipher::opened_len(record.body.len())
    } else {
        record.body.len()
    };
    s2::metered_size_of(&record.headers, body_len)
}

#[cfg(test)]
mod tests;
