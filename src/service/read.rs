//! Reads: resolving where a read starts, gathering records across a fork chain, and waiting for
//! the durable tail to move.

use std::sync::Arc;
use std::time::Duration;

use super::{Durable, Stream, StreamError, StreamResult, StreamService};
use crate::model::{Offset, ReadFrom, Record};

/// One read response's worth of records.
#[derive(Clone, Debug)]
pub struct ReadChunk {
    pub start: Offset,
    pub records: Vec<Record>,
    /// Where the next read continues.
    pub next: Offset,
    /// The chunk reaches the durable tail.
    pub up_to_date: bool,
    /// The stream is closed and this chunk reaches its final offset.
    pub closed: bool,
}

impl StreamService {
    /// Where a read that asks for `from` begins.
    pub async fn resolve(&self, stream: &Arc<Stream>, from: ReadFrom) -> StreamResult<Offset> {
        match from {
            ReadFrom::Start => Ok(Offset::START),
            ReadFrom::Now => Ok(stream.durable().tail),
            ReadFrom::At(offset) => self.boundary(stream, offset).await,
        }
    }

    /// Checks that `offset` is a record boundary of `stream` at or before its durable tail.
    pub(super) async fn boundary(
        &self,
        stream: &Arc<Stream>,
        offset: Offset,
    ) -> StreamResult<Offset> {
        let tail = stream.durable().tail;
        if offset.seq > tail.seq || (offset.seq == tail.seq && offset.pos > tail.pos) {
            return Err(StreamError::BadOffset(
                "offset is beyond the tail of the stream",
            ));
        }
        let actual = if offset.seq == tail.seq {
            tail
        } else {
            let record = self.collect(stream, offset.seq, offset.seq + 1, 0).await?;
            record.first().map_or(tail, Record::offset)
        };
        if actual == offset {
            Ok(offset)
        } else {
            Err(StreamError::BadOffset(
                "offset does not name a position in this stream",
            ))
        }
    }

    /// Reads the next chunk from `start`, which must be a resolved boundary.
    pub async fn read_at(&self, stream: &Arc<Stream>, start: Offset) -> StreamResult<ReadChunk> {
        let durable = stream.durable();
        let records = self
            .collect(
                stream,
                start.seq,
                durable.tail.seq,
                self.config.max_read_bytes,
            )
            .await?;
        let next = records.last().map_or(start, Record::next_offset).max(start);
        let up_to_date = next.seq >= durable.tail.seq;
        Ok(ReadChunk {
            start,
            records,
            next,
            up_to_date,
            closed: up_to_date && durable.closed,
        })
    }

    /// Records `from <= seq < until` of `stream`, following its fork chain into sources.
    pub(super) async fn collect(
        &self,
        stream: &Arc<Stream>,
        from: u64,
        until: u64,
        max_bytes: usize,
    ) -> StreamResult<Vec<Record>> {
        let mut out: Vec<Record> = Vec::new();
        let mut seq = from;
        let mut budget = max_bytes;
        while seq < until {
            let (owner, owner_until) = owner_of(stream, seq, until);
            let records = owner
                .read_own(&self.engine, seq, owner_until, budget)
                .await?;
            let Some(last) = records.last() else { break };
            seq = last.seq + 1;
            let bytes: usize = records.iter().map(|r| r.body.len()).sum();
            out.extend(records);
            if bytes >= budget {
                break;
            }
            budget -= bytes;
        }
        Ok(out)
    }

    /// Waits until the durable tail moves past `offset`, the stream closes or goes away, or the
    /// timeout passes. Returns the durable state it saw last.
    pub async fn wait_beyond(&self, stream: &Stream, offset: Offset, timeout: Duration) -> Durable {
        let mut rx = stream.subscribe();
        let moved = |d: &Durable| d.tail.seq > offset.seq || d.closed || d.removed;
        let waited = tokio::time::timeout(timeout, rx.wait_for(moved)).await;
        match waited {
            Ok(Ok(durable)) => *durable,
            _ => stream.durable(),
        }
    }
}

/// The stream in the chain that stores record `seq`, and the end of its part of `..until`.
fn owner_of(stream: &Arc<Stream>, seq: u64, until: u64) -> (&Arc<Stream>, u64) {
    let mut owner = stream;
    let mut until = until;
    while let Some(source) = &owner.source {
        let fork_start = owner.lock().meta.fork.as_ref().map_or(0, |f| f.offset.seq);
        if seq >= fork_start {
            break;
        }
        until = until.min(fork_start);
        owner = source;
    }
    (owner, until)
}
