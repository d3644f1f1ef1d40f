//! A Durable Streams append or close, checked in the protocol's order of precedence: the stream
//! is there, not encrypted, not closed (unless this retries the close), the content type
//! matches, the producer's epoch and sequence, `Stream-Record-Match`, `Stream-Seq`, and only then
//! the body itself.

use bytes::Bytes;

use super::{Command, Ledger, Refusal};
use crate::model::content_type;
use crate::model::offset::Offset;
use crate::model::producer::{self, ProducerClaim, ProducerDecision, ProducerState};
use crate::model::record::{Record, lay_out_arrived};
use crate::model::stream::{ClosingProducer, StreamMeta};

/// An append (or close) request, with header syntax already checked by the face.
#[derive(Clone, Debug, Default)]
pub struct AppendRequest<'a> {
    pub content_type: Option<&'a str>,
    pub body: Bytes,
    pub close: bool,
    pub producer: Option<ProducerClaim>,
    pub stream_seq: Option<&'a str>,
    /// `Stream-Record-Match`: append only if the record tail is this.
    pub record_match: Option<u64>,
}

/// The acknowledgement of an append, a close, or a deduplicated retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendAck {
    pub tail: Offset,
    pub closed: bool,
    /// Producer epoch and sequence to report, when the request carried producer headers.
    pub producer: Option<(u64, u64)>,
    /// Nothing was written: the request repeated one already applied.
    pub duplicate: bool,
    /// Records `[start, next)` this append created; for a duplicate the original's, or `None`
    /// when it is older than the appends its producer's state remembers.
    pub records: Option<(u64, u64)>,
    /// The stream is a JSON stream, so `records` are record coordinates worth reporting.
    pub record_aware: bool,
    /// The timestamp of the stream's last record after this append.
    pub timestamp_ms: i64,
}

/// What must be durable before a retry's acknowledgement goes out: the original's records, and
/// for a repeated close the close itself (it adds no record, so the records alone say nothing of
/// it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DurableBefore {
    pub seq: u64,
    pub closed: bool,
}

impl DurableBefore {
    /// Both this and `other`.
    pub fn and(self, other: DurableBefore) -> DurableBefore {
        DurableBefore {
            seq: self.seq.max(other.seq),
            closed: self.closed || other.closed,
        }
    }

    /// What `meta` shows now: a refusal decided on it is sent only once this is durable, so it
    /// never reports a close, a tail or a producer's progress that a crash could still undo.
    pub fn seen(meta: &StreamMeta) -> DurableBefore {
        DurableBefore {
            seq: meta.tail.seq,
            closed: meta.closed,
        }
    }
}

/// A retry of an append already applied: acknowledged without writing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repeated {
    pub ack: AppendAck,
    pub durable_before: DurableBefore,
}

/// What an accepted append does.
#[derive(Debug)]
pub enum Appended {
    /// Write these records (and the producer's new state); the ledger already moved the tail.
    Write {
        ack: AppendAck,
        records: Vec<Record>,
        producer: Option<(String, ProducerState)>,
        /// Metadata beyond the tail changed (`Stream-Seq`, closure) and must be stored too.
        meta_changed: bool,
    },
    /// Acknowledge without writing.
    Repeated(Repeated),
}

/// The command: `request`, whose body was split into record bodies beforehand (outside the
/// stream's lock), or failed to split, which is reported in its place among the checks.
pub struct Append<'r, 'a> {
    pub request: &'r AppendRequest<'a>,
    pub bodies: Result<Vec<Bytes>, String>,
}

impl AppendRequest<'_> {
    /// The checks of an append that change nothing: a refusal, a retry to acknowledge without
    /// writing, or `None` when the append writes.
    pub fn check(&self, ledger: &Ledger<'_>) -> Result<Option<Repeated>, Refusal> {
        ledger.present()?;
        if ledger.encrypted() {
            return Err(Refusal::Encrypted);
        }
        let meta = &*ledger.meta;
        let tail = meta.tail;
        if meta.closed {
            return self.retried_close(ledger).map(Some);
        }
        if !self.body.is_empty() {
            let given = self.content_type.unwrap_or_default();
            if !content_type::same_media_type(given, &meta.content_type) {
                return Err(Refusal::ContentTypeMismatch);
            }
        }
        if let Some(claim) = &self.producer {
            let known = ledger.producers.get(&claim.id);
            if let ProducerDecision::Duplicate { epoch, last_seq } = producer::decide(known, claim)?
            {
                let records = known.and_then(|p| p.records_of(claim.seq));
                let ack = AppendAck {
                    tail,
                    closed: false,
                    producer: Some((epoch, last_seq)),
                    duplicate: true,
                    records,
                    record_aware: ledger.json,
                    timestamp_ms: meta.last_timestamp_ms,
                };
                let durable_before = DurableBefore {
                    seq: records.map_or(tail.seq, |(_, next)| next),
                    closed: false,
                };
                return Ok(Some(Repeated {
                    ack,
                    durable_before,
                }));
            }
        }
        if let Some(expected) = self.record_match {
            if !ledger.json {
                return Err(Refusal::NotRecordAware);
            }
            if expected != tail.seq {
                return Err(Refusal::RecordMismatch {
                    expected,
                    next: tail.seq,
                    tail,
                });
            }
        }
        if let (Some(received), Some(last)) = (self.stream_seq, &meta.extra().last_stream_seq)
            && received.as_bytes() <= last.as_bytes()
        {
            return Err(Refusal::StreamSeqRegression {
                last: last.clone(),
                received: received.to_owned(),
            });
        }
        Ok(None)
    }

    /// On a closed stream, only a retry of the close is acknowledged: the closing producer's
    /// own append again, or a plain close without a body.
    fn retried_close(&self, ledger: &Ledger<'_>) -> Result<Repeated, Refusal> {
        let tail = ledger.meta.tail;
        let closing_retry = match (&self.producer, &ledger.meta.extra().closed_by) {
            (Some(claim), Some(by)) => {
                claim.id == by.id && claim.epoch == by.epoch && claim.seq == by.seq
            }
            _ => false,
        };
        let plain_close_retry = self.body.is_empty() && self.close && self.producer.is_none();
        if !(closing_retry || plain_close_retry) {
            return Err(Refusal::Closed { tail });
        }
        let records = (self.producer.as_ref())
            .and_then(|c| ledger.producers.get(&c.id))
            .map_or((tail.seq, tail.seq), |p| p.records);
        let ack = AppendAck {
            tail,
            closed: true,
            producer: self.producer.as_ref().map(|c| (c.epoch, c.seq)),
            duplicate: true,
            records: Some(records),
            record_aware: ledger.json,
            timestamp_ms: ledger.meta.last_timestamp_ms,
        };
        Ok(Repeated {
            ack,
            durable_before: DurableBefore {
                seq: tail.seq,
                closed: true,
            },
        })
    }
}

impl Command for Append<'_, '_> {
    type Outcome = Result<Appended, Refusal>;

    fn apply(self, ledger: &mut Ledger<'_>, now_ms: i64) -> Result<Appended, Refusal> {
        let Append { request, bodies } = self;
        if let Some(repeated) = request.check(ledger)? {
            *ledger.last_access_ms = now_ms;
            return Ok(Appended::Repeated(repeated));
        }
        let bodies = bodies.map_err(Refusal::MalformedBody)?;
        *ledger.last_access_ms = now_ms;
        let meta = &mut *ledger.meta;
        let tail = meta.tail;
        // Timestamps never go back along a stream, though the clock may (and an S2 client's
        // timestamp may be ahead of it).
        let timestamp = now_ms.max(meta.last_timestamp_ms);
        let records = lay_out_arrived(tail, timestamp, now_ms, bodies);
        let new_tail = records.last().map_or(tail, Record::next_offset);
        let range = (tail.seq, new_tail.seq);
        meta.tail = new_tail;
        if !records.is_empty() {
            // The timestamp of the last record: a close alone adds none.
            meta.last_timestamp_ms = timestamp;
        }
        if let Some(seq) = request.stream_seq {
            meta.extra_mut().last_stream_seq = Some(seq.to_owned());
        }
        if request.close {
            meta.closed = true;
            meta.extra_mut().closed_by = request.producer.as_ref().map(|c| ClosingProducer {
                id: c.id.clone(),
                epoch: c.epoch,
                seq: c.seq,
            });
        }
        let producer = request.producer.as_ref().map(|claim| {
            let producer = match ledger.producers.get_mut(&claim.id) {
                Some(known) => {
                    known.advance(claim.epoch, claim.seq, range);
                    known.clone()
                }
                None => {
                    let first = ProducerState::first(claim.epoch, claim.seq, range);
                    ledger.producers.insert(claim.id.clone(), first.clone());
                    first
                }
            };
            (claim.id.clone(), producer)
        });
        let ack = AppendAck {
            tail: new_tail,
            closed: request.close,
            producer: request.producer.as_ref().map(|c| (c.epoch, c.seq)),
            duplicate: false,
            records: Some(range),
            record_aware: ledger.json,
            timestamp_ms: ledger.meta.last_timestamp_ms,
        };
        Ok(Appended::Write {
            ack,
            records,
            producer,
            meta_changed: request.close || request.stream_seq.is_some(),
        })
    }
}

#[cfg(test)]
mod tests;
