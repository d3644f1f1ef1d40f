//! An S2 read past its wire: where it starts, whether it follows the stream, and what it sends
//! at each step. A read session (SSE or S2S) is one follow of the stream (see
//! `docs/live-reads.md`): batches up to the tail, a heartbeat on catching up, then new records as
//! they come, heartbeating while idle, until a limit, the idle bound or an error ends it. Each
//! wire only renders the session's events.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream as FuturesStream;

use crate::model::cipher::RecordKey;
use crate::model::ledger::s2::S2Position;
use crate::model::s2::EventId;
use crate::service::{
    End, Ends, Event, Follow, FollowOptions, ReadLease, ReadLimits, RecordBatch, RecordStart,
    S2Reads, Stream, StreamError, StreamResult, StreamService,
};

/// How often an idle session hears a heartbeat (SSE's `ping`).
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);

/// An S2 read as its request asks for it.
#[derive(Clone, Copy, Debug, Default)]
pub struct S2ReadRequest {
    pub start: Option<RecordStart>,
    pub clamp: bool,
    pub limits: ReadLimits,
    /// Seconds to wait for records: for a unary read, before answering with none; for a
    /// session, before it ends as idle.
    pub wait: Option<u64>,
}

impl S2ReadRequest {
    /// Whether the read follows the stream past its tail. A session follows unless a limit
    /// bounds it and it was not asked to wait; a unary read is always bounded, so it follows
    /// only when asked to wait.
    pub fn may_follow(&self, session: bool) -> bool {
        let bounded = self.limits.count.is_some()
            || self.limits.bytes.is_some()
            || self.limits.until.is_some();
        let waits = self.wait.unwrap_or(0) > 0;
        if session { !bounded || waits } else { waits }
    }

    /// The read a client resumes (SSE's `Last-Event-ID`): from the record after the last one it
    /// got, with what its limits have left.
    pub fn resumed(mut self, from: EventId) -> Self {
        self.start = Some(RecordStart::SeqNum(from.last_seq.saturating_add(1)));
        self.limits.count = self.limits.count.map(|c| c.saturating_sub(from.count));
        self.limits.bytes = self.limits.bytes.map(|b| b.saturating_sub(from.bytes));
        self
    }
}

impl StreamService {
    /// The record an S2 read starts at. A read that starts at or past the tail is refused
    /// (`BeyondTail`, S2's 416) unless it follows the stream or its limits are spent already.
    pub async fn s2_read_start(
        &self,
        stream: &Arc<Stream>,
        request: &S2ReadRequest,
        may_follow: bool,
    ) -> StreamResult<u64> {
        let requested = request.start.unwrap_or(RecordStart::TailOffset(0));
        // An exhausted limit reads nothing even from a start that is not written yet, as in S2.
        let exhausted = request.limits.exhausted();
        let start = if exhausted {
            stream.durable().tail.seq
        } else {
            self.resolve_start(stream, requested, request.clamp).await?
        };
        let durable = stream.durable();
        // A start below the tail whose records were all trimmed reads nothing (the resolved
        // start moved up to the first retained record); only a start at or past the tail is 416.
        let asked = match requested {
            RecordStart::SeqNum(seq) => seq.min(start),
            RecordStart::TailOffset(back) => durable.tail.seq.saturating_sub(back).min(start),
            RecordStart::Timestamp(_) => start,
        };
        if asked >= durable.tail.seq && !may_follow && !exhausted {
            return Err(StreamError::BeyondTail {
                tail: durable.tail.seq,
                timestamp_ms: durable.last_timestamp_ms,
            });
        }
        Ok(start)
    }
}

/// A unary read that waits (`wait`): the first records from where it starts, or none once
/// `timeout` passes without any (or the stream closes, or the server stops). A deleted stream is
/// answered as a new read would be: not found.
pub async fn wait_for_records(
    service: &Arc<StreamService>,
    stream: Arc<Stream>,
    source: S2Reads,
    timeout: Duration,
) -> StreamResult<RecordBatch> {
    let mut follow = Follow::new(service, stream, source, FollowOptions::live(timeout));
    loop {
        match follow.next().await {
            Event::Records(batch) => return Ok(batch),
            Event::CaughtUp(_) | Event::Shared(_) | Event::Changed(_) => {}
            Event::Idle | Event::Closed | Event::Ended(_) | Event::Gap { .. } => {
                return Ok(RecordBatch {
                    records: Vec::new(),
                    next_seq: follow.source().next(),
                    metered: 0,
                    limit_reached: false,
                    at_tail: true,
                    tail: service.tail_position(follow.stream()),
                    lease: ReadLease::default(),
                });
            }
            Event::Deleted(_) => return Err(StreamError::NotFound),
            Event::Failed(e) => return Err(e),
        }
    }
}

/// What a read session was asked for.
pub struct Session {
    pub start: u64,
    pub limits: ReadLimits,
    pub may_follow: bool,
    /// How long the session may go without a new record before it ends.
    pub idle: Option<Duration>,
    /// Where an SSE session resumes its counts (`Last-Event-ID`).
    pub resume: Option<EventId>,
    pub key: Option<RecordKey>,
}

/// One step of a read session.
pub enum SessionEvent {
    /// Records, with the session's running totals after them.
    Batch { batch: RecordBatch, id: EventId },
    /// Nothing new: the tail as it stands. Sent on catching up and while idle.
    Heartbeat(S2Position),
    /// The session is over: a limit was reached, the idle bound passed or the stream closed.
    End,
    /// The session failed; nothing follows.
    Failed(StreamError),
}

/// The events of a read session, ending with `End` or `Failed`, or with neither when the server
/// shuts down: `End` tells a client its read is over (SSE's `[DONE]`), which it is not.
pub fn events(
    service: Arc<StreamService>,
    stream: Arc<Stream>,
    session: Session,
) -> impl FuturesStream<Item = SessionEvent> + Send {
    let Session {
        start,
        limits,
        may_follow,
        idle,
        resume,
        key,
    } = session;
    let options = FollowOptions {
        ends: idle.map_or(Ends::Never, Ends::IdleFor),
        stops_at_tail: !may_follow,
        ..FollowOptions::live(HEARTBEAT_INTERVAL)
    };
    let source = S2Reads::from(start, limits, key);
    let mut follow = Follow::new(&service, stream, source, options);
    async_stream::stream! {
        // The totals start from the client's Last-Event-ID, which may be anything.
        let mut count = resume.map_or(0, |r| r.count);
        let mut bytes = resume.map_or(0, |r| r.bytes);
        loop {
            match follow.next().await {
                Event::Records(batch) => {
                    count = count.saturating_add(batch.records.len() as u64);
                    bytes = bytes.saturating_add(batch.metered);
                    let last_seq = batch.records.last().map_or(0, |r| r.seq);
                    let id = EventId { last_seq, count, bytes };
                    yield SessionEvent::Batch { batch, id };
                }
                Event::CaughtUp(_) | Event::Idle => {
                    yield SessionEvent::Heartbeat(service.tail_position(follow.stream()));
                }
                // Deleted, for good or while forks read through it: what a new read would
                // find, a stream not found.
                Event::Deleted(_) => {
                    yield SessionEvent::Failed(StreamError::NotFound);
                    return;
                }
                Event::Failed(e) => {
                    yield SessionEvent::Failed(e);
                    return;
                }
                Event::Ended(End::Shutdown) => return,
                // A limit, the idle bound or the tail of a session that does not follow; or
                // closed through Durable Streams: no record will ever follow.
                Event::Ended(_) | Event::Closed | Event::Gap { .. } => {
                    yield SessionEvent::End;
                    return;
                }
                Event::Shared(_) | Event::Changed(_) => {}
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
