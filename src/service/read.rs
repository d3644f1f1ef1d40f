//! Reads: resolving where a read starts, gathering records across a fork chain, and waiting for
//! the durable tail to move.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Poll, Waker};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::read_memory::ReadLease;
use super::stream::LiveReader;
use super::{Durable, Stream, StreamError, StreamResult, StreamService};
use crate::model::records::RecordStart;
use crate::model::{Offset, ReadFrom, Record};

/// One read response's worth of records.
#[derive(Debug)]
pub struct ReadChunk {
    pub start: Offset,
    pub records: Vec<Record>,
    /// Where the next read continues.
    pub next: Offset,
    /// The chunk reaches the durable tail.
    pub up_to_date: bool,
    /// The stream is closed and this chunk reaches its final offset.
    pub closed: bool,
    /// The memory its records count against, until the response carrying them is gone.
    pub lease: ReadLease,
    /// The read was allowed less than a read normally is, because others held most of the read
    /// memory: a chunk that ends short of the tail may be shorter than usual.
    pub cut_for_memory: bool,
}

impl StreamService {
    /// Where a read that asks for `from` begins. A read that gets this far is accepted: it
    /// renews the stream's TTL window.
    pub async fn resolve(&self, stream: &Arc<Stream>, from: ReadFrom) -> StreamResult<Offset> {
        let start = self.start_of(stream, from).await?;
        stream.renew();
        Ok(start)
    }

    async fn start_of(&self, stream: &Arc<Stream>, from: ReadFrom) -> StreamResult<Offset> {
        if stream.encrypted {
            return Err(StreamError::Encrypted);
        }
        let durable = stream.durable();
        match from {
            ReadFrom::Start => Ok(durable.first),
            ReadFrom::Now => Ok(durable.tail),
            ReadFrom::At(offset) if offset < durable.first => Err(StreamError::Retained {
                first: durable.first,
            }),
            ReadFrom::At(offset) => self.boundary(stream, offset).await,
        }
    }

    /// Where a record-aware read begins (seed 000 §6.6), as an offset at a record boundary.
    /// Like [`Self::resolve`], it renews the stream's TTL window.
    pub async fn resolve_record(
        &self,
        stream: &Arc<Stream>,
        start: RecordStart,
    ) -> StreamResult<Offset> {
        let start = self.record_start_of(stream, start).await?;
        stream.renew();
        Ok(start)
    }

    async fn record_start_of(
        &self,
        stream: &Arc<Stream>,
        start: RecordStart,
    ) -> StreamResult<Offset> {
        if !stream.json {
            return Err(StreamError::NotRecordAware);
        }
        if stream.encrypted {
            return Err(StreamError::Encrypted);
        }
        let durable = stream.durable();
        let (first, next) = (durable.first.seq, durable.tail.seq);
        let record = match start {
            RecordStart::At(record) if record < first => {
                return Err(StreamError::RecordRetained { first, next });
            }
            RecordStart::At(record) if record > next => {
                return Err(StreamError::RecordBeyondTail { next });
            }
            RecordStart::At(record) => record,
            RecordStart::Now => next,
            RecordStart::Last(count) => next.saturating_sub(count).max(first),
        };
        self.record_offset(stream, record, durable.tail).await
    }

    /// The offset at the first byte of `record`, which must be retained and at most the tail.
    pub async fn record_offset(
        &self,
        stream: &Arc<Stream>,
        record: u64,
        tail: Offset,
    ) -> StreamResult<Offset> {
        if record >= tail.seq {
            return Ok(tail);
        }
        match self.locate(stream, record, tail).await? {
            Located::At(at) => Ok(at),
            Located::Retained(first) => Err(StreamError::RecordRetained {
                first: first.seq,
                next: stream.durable().tail.seq,
            }),
        }
    }

    /// Where record `seq` (below `tail`) starts, or where the retained records start when
    /// retention passed it while this looked: below the tail only retention removes records,
    /// and the engine hides trimmed ones a moment before the retention is published.
    async fn locate(&self, stream: &Arc<Stream>, seq: u64, tail: Offset) -> StreamResult<Located> {
        // Up to the tail, not just `seq`: when retention passed it, the first record found is
        // where retention now starts.
        let found = self.collect(stream, seq, tail.seq, 0).await?;
        let first = stream.durable().first;
        Ok(match found.first() {
            Some(record) if record.seq == seq => Located::At(record.offset()),
            other => Located::Retained(other.map_or(first, Record::offset).max(first)),
        })
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
            match self.locate(stream, offset.seq, tail).await? {
                Located::At(at) => at,
                Located::Retained(first) => return Err(StreamError::Retained { first }),
            }
        };
        if actual == offset {
            Ok(offset)
        } else {
            Err(StreamError::BadOffset(
                "offset does not name a position in this stream",
            ))
        }
    }

    /// Reads the next chunk of a live read from `start`, which must be a resolved boundary, with
    /// at most `max_records` records when given.
    pub async fn read_at(
        &self,
        stream: &Arc<Stream>,
        start: Offset,
        max_records: Option<u64>,
    ) -> StreamResult<ReadChunk> {
        self.read_chunk(stream, start, max_records, self.config.max_read_bytes)
            .await
    }

    /// Like [`Self::read_at`], for a catch-up read: a larger chunk.
    pub async fn read_history_at(
        &self,
        stream: &Arc<Stream>,
        start: Offset,
        max_records: Option<u64>,
    ) -> StreamResult<ReadChunk> {
        self.read_chunk(stream, start, max_records, self.config.catch_up_read_bytes)
            .await
    }

    async fn read_chunk(
        &self,
        stream: &Arc<Stream>,
        start: Offset,
        max_records: Option<u64>,
        max_bytes: usize,
    ) -> StreamResult<ReadChunk> {
        let durable = stream.durable();
        // A reader still positioned below a retention move (a live reader, or one racing it):
        // the records it would read next are gone, and it is told so rather than skipped ahead.
        if start < durable.first {
            return Err(StreamError::Retained {
                first: durable.first,
            });
        }
        let until = match max_records {
            Some(n) => durable.tail.seq.min(start.seq.saturating_add(n)),
            None => durable.tail.seq,
        };
        let mut lease = self.read_memory.lease(max_bytes);
        let cut_for_memory = lease.bytes() < max_bytes;
        let records = self
            .collect(stream, start.seq, until, lease.bytes())
            .await?;
        lease.keep(records.iter().map(Record::held_len).sum());
        match records.first() {
            Some(first) if first.seq > start.seq => {
                return Err(StreamError::Retained {
                    first: first.offset(),
                });
            }
            None if start.seq < until => {
                return Err(StreamError::Retained {
                    first: stream.durable().first.max(start),
                });
            }
            _ => {}
        }
        let next = records.last().map_or(start, Record::next_offset).max(start);
        let up_to_date = next.seq >= durable.tail.seq;
        Ok(ReadChunk {
            start,
            records,
            next,
            up_to_date,
            closed: up_to_date && durable.closed,
            lease,
            cut_for_memory,
        })
    }

    /// Records `from <= seq < until` of `stream`, following its fork chain into sources. Records
    /// trimmed away are left out: the result may start later than `from`.
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
            let mut records = owner
                .read_own(&self.engine, seq, owner_until, budget)
                .await?;
            // Trimmed between two reads (the first ended early when a body file went with the
            // trim): what follows the gap is not part of this read, which must be contiguous.
            if !out.is_empty() && records.first().is_some_and(|r| r.seq > seq) {
                break;
            }
            if !out.is_empty() && !records.is_empty() {
                // Only the read's first record may go past the budget, not the first one this
                // part of the fork chain gave.
                let mut left = budget;
                let fits = records
                    .iter()
                    .take_while(|r| {
                        let fits = r.held_len() <= left;
                        left = left.saturating_sub(r.held_len());
                        fits
                    })
                    .count();
                if fits == 0 {
                    break;
                }
                records.truncate(fits);
            }
            let Some(last) = records.last() else {
                if owner_until < until {
                    // This source's part is gone (trimmed by a server that did not yet keep a
                    // fork's history): the rest of the chain may still hold records.
                    seq = owner_until;
                    continue;
                }
                break;
            };
            seq = last.seq + 1;
            let bytes: usize = records.iter().map(Record::held_len).sum();
            out.extend(records);
            // A read that stopped short of its part's end ran out of budget (or into a trim):
            // reading on would only fetch a record that does not fit, and throw it away.
            if bytes >= budget || seq < owner_until {
                break;
            }
            budget -= bytes;
        }
        Ok(out)
    }

    /// Waits until the durable tail moves past `offset`, the stream closes or goes away, or the
    /// timeout passes. Returns the durable state it saw last.
    pub async fn wait_beyond(
        &self,
        stream: &Arc<Stream>,
        offset: Offset,
        timeout: Duration,
    ) -> Durable {
        match self.watch_tail(stream, timeout, None).next(offset).await {
            Wake::Moved(seen) => seen,
            Wake::Idle | Wake::Ended => stream.durable(),
        }
    }

    /// A live reader's standing wait on `stream`'s durable tail: see [`TailWatch`].
    pub fn watch_tail(
        &self,
        stream: &Arc<Stream>,
        idle_after: Duration,
        deadline: Option<Instant>,
    ) -> TailWatch {
        self.watch_tail_as(stream, idle_after, deadline, true)
    }

    /// [`Self::watch_tail`]; `live`: whether the watcher counts as a live reader of the stream
    /// (which keeps it from expiring and shares frames with its other live readers).
    pub(super) fn watch_tail_as(
        &self,
        stream: &Arc<Stream>,
        idle_after: Duration,
        deadline: Option<Instant>,
        live: bool,
    ) -> TailWatch {
        let last_sent = Instant::now();
        let timer_at = wake_at(last_sent, idle_after, deadline);
        TailWatch {
            _reader: live.then(|| stream.attach_reader()),
            tail: stream.subscribe(),
            shutdown: Box::pin(self.shutdown.clone().cancelled_owned()),
            stopping: self.stopping.clone(),
            timer: Box::pin(tokio::time::sleep_until(timer_at)),
            timer_at,
            armed_for: None,
            idle_after,
            last_sent,
            deadline,
        }
    }

    /// Starts shutting down: every live wait ends at once (long-polls answer, sessions wind up)
    /// and the shutdown signal is cancelled from now on.
    pub fn begin_shutdown(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.shutdown.cancel();
    }

    /// Whether the server has begun shutting down: set before [`Self::shutdown_signal`] is
    /// cancelled, and before any live wait ends for it.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Cancelled once the server starts shutting down.
    pub fn shutdown_signal(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// What a live reader waits for, held for the whole connection: it subscribes to the tail once, and
/// its one timer is touched only when it fires, so a busy stream costs a reader no timer or
/// subscription work per event.
pub struct TailWatch {
    /// Keeps the stream from expiring while a live reader waits.
    _reader: Option<LiveReader>,
    tail: watch::Receiver<Durable>,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    stopping: Arc<AtomicBool>,
    timer: Pin<Box<Sleep>>,
    /// When `timer` fires.
    timer_at: Instant,
    /// The task the shutdown future and the timer were last polled for. Both keep that task's
    /// waker and wake it when they fire, so while the same task waits again they need no
    /// polling: the stopping flag and the clock say whether they fired. Polled on every event,
    /// they took a lock each, and looking at the timer's own state a cache miss, a few percent
    /// of a fan-out's CPU in all.
    armed_for: Option<Waker>,
    idle_after: Duration,
    last_sent: Instant,
    deadline: Option<Instant>,
}

/// What woke a [`TailWatch`] inside one wait.
enum Woke {
    Tail(Result<Durable, watch::error::RecvError>),
    Stopping,
    Timer,
}

/// Why a [`TailWatch`] woke.
#[derive(Debug)]
pub enum Wake {
    /// The tail moved past the offset, or the stream closed or went away.
    Moved(Durable),
    /// Nothing was sent for the idle period: time for a heartbeat.
    Idle,
    /// The deadline passed or the server is shutting down.
    Ended,
}

impl TailWatch {
    /// Notes that the reader just sent something: the idle period counts from now.
    pub fn sent(&mut self) {
        self.last_sent = Instant::now();
    }

    /// Moves the deadline (`None`: none). The timer catches up with it when it next fires, so a
    /// deadline may only move later between waits.
    pub fn extend_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// Whether the reader's time is up. A reader catching up reads on without waiting, so it
    /// asks this between reads: a long backlog, or writers faster than it, must not keep it
    /// open past its bound.
    pub fn past_deadline(&self) -> bool {
        self.deadline
            .is_some_and(|deadline| Instant::now() >= deadline)
    }

    /// Waits for the tail to move past `offset`, for an idle period to pass, or for the end.
    pub async fn next(&mut self, offset: Offset) -> Wake {
        self.next_when(|d: &Durable| d.tail.seq > offset.seq || d.closed || d.deleted())
            .await
    }

    /// Waits for the durable state to satisfy `moved`, for an idle period to pass, or for the
    /// end.
    pub(super) async fn next_when(&mut self, moved: impl Fn(&Durable) -> bool + Copy) -> Wake {
        loop {
            match self.wait(moved).await {
                // The stream's sender outlives every reader holding the stream.
                Woke::Stopping | Woke::Tail(Err(_)) => return Wake::Ended,
                // The tail is looked at before the timer: on a stream that moves faster than
                // its reader sends, the timer is never looked at, so the deadline is checked
                // here too, or the reader would outlive it for as long as the writes go on.
                Woke::Tail(Ok(_)) if self.past_deadline() => return Wake::Ended,
                Woke::Tail(Ok(durable)) => return Wake::Moved(durable),
                Woke::Timer => {}
            }
            if self.past_deadline() {
                return Wake::Ended;
            }
            let now = Instant::now();
            let idle = now >= self.last_sent + self.idle_after;
            if idle {
                self.last_sent = now;
            }
            self.timer_at = wake_at(self.last_sent, self.idle_after, self.deadline);
            self.timer.as_mut().reset(self.timer_at);
            // A reset timer is registered afresh at its next poll.
            self.armed_for = None;
            if idle {
                return Wake::Idle;
            }
        }
    }

    /// One wait for the tail to satisfy `moved`, for shutdown or for the timer. The stopping flag
    /// comes first (a reader whose tail keeps moving would never get to the shutdown future),
    /// then the tail: a woken reader of a busy stream returns without touching the others.
    async fn wait(&mut self, moved: impl FnMut(&Durable) -> bool) -> Woke {
        let TailWatch {
            tail,
            shutdown,
            stopping,
            timer,
            timer_at,
            armed_for,
            ..
        } = self;
        let changed = tail.wait_for(moved);
        tokio::pin!(changed);
        std::future::poll_fn(|cx| {
            // Set before the shutdown token is cancelled, whose waking brings the task here.
            if stopping.load(Ordering::Relaxed) {
                return Poll::Ready(Woke::Stopping);
            }
            if let Poll::Ready(seen) = changed.as_mut().poll(cx) {
                return Poll::Ready(Woke::Tail(seen.map(|durable| *durable)));
            }
            if armed_for
                .as_ref()
                .is_some_and(|waker| waker.will_wake(cx.waker()))
            {
                // The timer fires no earlier than its deadline.
                return if Instant::now() >= *timer_at {
                    Poll::Ready(Woke::Timer)
                } else {
                    Poll::Pending
                };
            }
            if shutdown.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woke::Stopping);
            }
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woke::Timer);
            }
            *armed_for = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// When a watch that last sent at `last_sent` must next wake.
fn wake_at(last_sent: Instant, idle_after: Duration, deadline: Option<Instant>) -> Instant {
    let idle_at = last_sent + idle_after;
    deadline.map_or(idle_at, |deadline| idle_at.min(deadline))
}

/// The stream in the chain that stores record `seq`, and the end of its part of `..until`.
fn owner_of(stream: &Arc<Stream>, seq: u64, until: u64) -> (&Arc<Stream>, u64) {
    let mut owner = stream;
    let mut until = until;
    while let Some(source) = &owner.source {
        let fork_start = owner
            .lock()
            .meta
            .extra()
            .fork
            .as_ref()
            .map_or(0, |f| f.offset.seq);
        if seq >= fork_start {
            break;
        }
        until = until.min(fork_start);
        owner = source;
    }
    (owner, until)
}

/// Where [`StreamService::locate`] found a record.
enum Located {
    At(Offset),
    /// Retention passed it; the retained records start here.
    Retained(Offset),
}

#[cfg(test)]
mod tests;
