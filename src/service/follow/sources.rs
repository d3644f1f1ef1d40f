//! Where a follower's records come from, and how it moves along them: Durable Streams chunks by
//! offset (the StreamLD faces read these too), or S2 batches by sequence number within the
//! read's limits.

use std::future::Future;
use std::sync::Arc;

use crate::model::cipher::RecordKey;
use crate::model::{Offset, s2};
use crate::service::{ReadChunk, ReadLimits, RecordBatch, Stream, StreamResult, StreamService};

/// What one read of a [`Source`] found.
pub struct Step<C> {
    /// The records read; `None` when there were none.
    pub chunk: Option<C>,
    /// The read reached the durable tail.
    pub at_tail: bool,
    /// The read's own limit was reached: nothing more is read.
    pub limit_reached: bool,
}

/// A follower's position and how it reads from there.
pub trait Source: Send {
    type Chunk: Send;
    /// Whether records trimmed from under the follower are a gap it is told of. Otherwise it
    /// moves on to the first retained record, as S2 readers do.
    const TELLS_GAPS: bool;

    /// The record it reads next.
    fn next_seq(&self) -> u64;

    /// Moves it to `at`: it took the records before from another follower's frame.
    fn skip_to(&mut self, at: Offset);

    /// Reads from where it stands and moves past what it read.
    fn read<'a>(
        &'a mut self,
        service: &'a StreamService,
        stream: &'a Arc<Stream>,
    ) -> impl Future<Output = StreamResult<Step<Self::Chunk>>> + Send + 'a;
}

/// Chunks of a live read from a resolved offset, `max_records` at most each when given.
pub struct Chunks {
    at: Offset,
    max_records: Option<u64>,
}

impl Chunks {
    pub fn from(at: Offset, max_records: Option<u64>) -> Self {
        Chunks { at, max_records }
    }

    /// Where the follower stands.
    pub fn at(&self) -> Offset {
        self.at
    }
}

impl Source for Chunks {
    type Chunk = ReadChunk;
    const TELLS_GAPS: bool = true;

    fn next_seq(&self) -> u64 {
        self.at.seq
    }

    fn skip_to(&mut self, at: Offset) {
        self.at = at;
    }

    async fn read(
        &mut self,
        service: &StreamService,
        stream: &Arc<Stream>,
    ) -> StreamResult<Step<ReadChunk>> {
        let chunk = service.read_at(stream, self.at, self.max_records).await?;
        self.at = chunk.next;
        Ok(Step {
            at_tail: chunk.up_to_date,
            limit_reached: false,
            chunk: (!chunk.records.is_empty()).then_some(chunk),
        })
    }
}

/// S2 batches from a sequence number, within what is left of the read's limits, their bodies
/// opened with the reader's key on an encrypted stream.
pub struct S2Reads {
    next: u64,
    remaining: ReadLimits,
    key: Option<RecordKey>,
}

impl S2Reads {
    pub fn from(start: u64, limits: ReadLimits, key: Option<RecordKey>) -> Self {
        S2Reads {
            next: start,
            remaining: limits,
            key,
        }
    }

    /// The record it reads next.
    pub fn next(&self) -> u64 {
        self.next
    }
}

impl Source for S2Reads {
    type Chunk = RecordBatch;
    const TELLS_GAPS: bool = false;

    fn next_seq(&self) -> u64 {
        self.next
    }

    fn skip_to(&mut self, at: Offset) {
        self.next = at.seq;
    }

    async fn read(
        &mut self,
        service: &StreamService,
        stream: &Arc<Stream>,
    ) -> StreamResult<Step<RecordBatch>> {
        let (max_records, max_bytes) = (s2::UNARY_MAX_RECORDS, s2::UNARY_MAX_BYTES);
        let mut batch = service
            .read_records(stream, self.next, self.remaining, max_records, max_bytes)
            .await?;
        service.open_sealed(stream, self.key.as_ref(), &mut batch.records)?;
        // Even with no records: a trim may have moved the start past where it stood.
        self.next = self.next.max(batch.next_seq);
        let count = batch.records.len() as u64;
        let remaining = &mut self.remaining;
        remaining.count = remaining.count.map(|c| c.saturating_sub(count));
        remaining.bytes = remaining.bytes.map(|b| b.saturating_sub(batch.metered));
        Ok(Step {
            at_tail: batch.at_tail,
            limit_reached: batch.limit_reached,
            chunk: (!batch.records.is_empty()).then_some(batch),
        })
    }
}
