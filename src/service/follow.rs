//! Following a stream from a position: the one loop behind every live reader (Durable Streams
//! SSE and long-poll, S2 SSE, `wait` and S2S read sessions, the StreamLD SSE binding and the
//! replication pumps). A [`Follow`] reads what there is, waits on the stream's durable tail (its
//! watch channel, never by polling) and says what happened as an [`Event`]; a face only renders
//! the events. What every live reader needs lives here too: the stream kept from expiring while
//! it is followed, read memory leased per chunk (the chunk carries its lease), and frames shared
//! with the stream's other followers of the same view.
//!
//! `docs/live-reads.md` says how each face renders each event.

mod sources;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::live_frame::{FrameView, LiveFrame};
use super::read::{TailWatch, Wake};
use super::read_memory::ReadLease;
use super::{Durable, Stream, StreamError, StreamService};
use crate::model::Offset;
use crate::storage::StorageError;

pub use sources::{Chunks, S2Reads, Source, Step};

/// What a follower learns next. After `Gap`, `Closed`, `Deleted`, `Ended` and `Failed` nothing
/// follows: the face ends its response.
#[derive(Debug)]
pub enum Event<C> {
    /// Records from where the follower stood; it now stands after them.
    Records(C),
    /// What another follower of the same view rendered for exactly the records from here, to
    /// send as it is; the follower now stands at its end.
    Shared(LiveFrame),
    /// The follower reached the tail for the first time (the state it saw then).
    CaughtUp(Durable),
    /// Nothing was sent for the heartbeat period.
    Idle,
    /// The records from where the follower stood were trimmed or retained away; the retained
    /// ones start at `first`.
    Gap {
        first: Offset,
    },
    /// The stream is closed and the follower has all of it.
    Closed,
    /// The stream is gone for its readers.
    Deleted(Deletion),
    /// Only for followers of metadata (see [`Until::Deleted`]): at the tail, the stream's
    /// metadata, closure or retained start changed.
    Changed(Durable),
    Ended(End),
    /// A read failed.
    Failed(StreamError),
}

/// How a stream went away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// Deleted (or expired) for good.
    Removed,
    /// Deleted while forks still read through it: kept for them, gone for its own readers.
    SoftDeleted,
}

/// Why a follow ended without anything happening to the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Its deadline passed: the fixed one ([`Ends::At`]) or the idle bound ([`Ends::IdleFor`]).
    Deadline,
    /// The server is shutting down.
    Shutdown,
    /// The read's own limit (an S2 count, bytes or `until`) was reached.
    Limit,
    /// A follower that stops at the tail ([`FollowOptions::stops_at_tail`]) reached it.
    AtTail,
}

/// When a follow ends by itself.
#[derive(Clone, Copy, Debug)]
pub enum Ends {
    Never,
    /// At this instant, also while it is still catching up.
    At(Instant),
    /// After this long without new records (S2's `wait` on sessions), counted from when the
    /// last records were taken.
    IdleFor(Duration),
}

/// What a follow follows the stream until.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// The stream closes (or goes away).
    Closed,
    /// The stream goes away; closure and metadata changes are told as [`Event::Changed`].
    Deleted,
}

/// How a follower follows.
#[derive(Clone, Debug)]
pub struct FollowOptions {
    /// How long the follower may send nothing before it hears [`Event::Idle`].
    pub heartbeat: Duration,
    pub ends: Ends,
    pub until: Until,
    /// Whether it is a live reader of the stream: the stream does not expire while it follows
    /// (its TTL window starts again as it leaves), and frames are shared among live readers.
    pub live: bool,
    /// The view whose frames it takes from, and leaves for, the stream's other followers.
    pub frames: Option<FrameView>,
    /// Ends with [`End::AtTail`] at the tail rather than waiting there.
    pub stops_at_tail: bool,
}

/// A heartbeat period for followers that never want one.
const NO_HEARTBEAT: Duration = Duration::from_secs(86_400 * 365 * 30);

impl FollowOptions {
    /// A live reader heard every `heartbeat` while idle, until the stream closes.
    pub fn live(heartbeat: Duration) -> Self {
        FollowOptions {
            heartbeat,
            ends: Ends::Never,
            until: Until::Closed,
            live: true,
            frames: None,
            stops_at_tail: false,
        }
    }

    /// A replica's follower: not a live reader (it keeps no stream from expiring), never
    /// idle, told of closure and metadata changes until the stream goes.
    pub fn replica() -> Self {
        FollowOptions {
            heartbeat: NO_HEARTBEAT,
            until: Until::Deleted,
            live: false,
            ..FollowOptions::live(NO_HEARTBEAT)
        }
    }
}

/// One follower of one stream: see the module's documentation.
pub struct Follow<S: Source> {
    service: Arc<StreamService>,
    stream: Arc<Stream>,
    source: S,
    watch: TailWatch,
    options: FollowOptions,
    caught_up: bool,
    /// The durable state a step just saw, when it is good enough for the next look: one that
    /// lags only sends the follower to a wait that returns at once.
    seen: Option<Durable>,
    /// The state last told to a follower of metadata.
    told: Option<Durable>,
    /// An end decided with the last records (a limit reached), told at the next call.
    ending: Option<End>,
    /// The last event handed out carried records.
    gave_records: bool,
}

impl<S: Source> Follow<S> {
    /// Starts following `stream` from where `source` stands. A live follower renews the
    /// stream's TTL window as it starts (and again as it leaves).
    pub fn new(
        service: &Arc<StreamService>,
        stream: Arc<Stream>,
        source: S,
        options: FollowOptions,
    ) -> Self {
        let deadline = match options.ends {
            Ends::Never => None,
            Ends::At(at) => Some(at),
            Ends::IdleFor(idle) => Some(Instant::now() + idle),
        };
        if options.live {
            stream.renew();
        }
        let watch = service.watch_tail_as(&stream, options.heartbeat, deadline, options.live);
        Follow {
            service: service.clone(),
            stream,
            source,
            watch,
            options,
            caught_up: false,
            seen: None,
            told: None,
            ending: None,
            gave_records: false,
        }
    }

    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    /// Leaves `frame`, rendered from records this follower just read up to the durable tail,
    /// for the stream's other followers of its view, with `lease`, the read memory of those
    /// records (see [`Stream::share_frame`]).
    pub fn share(&self, frame: LiveFrame, lease: &mut ReadLease) {
        self.stream.share_frame(frame, lease);
    }

    /// The next event. Called again once the face has sent the last one: the heartbeat period,
    /// and an idle bound, count from then.
    pub async fn next(&mut self) -> Event<S::Chunk> {
        self.watch.sent();
        if std::mem::take(&mut self.gave_records)
            && let Ends::IdleFor(idle) = self.options.ends
        {
            self.watch.extend_deadline(Some(Instant::now() + idle));
        }
        if let Some(end) = self.ending.take() {
            return Event::Ended(end);
        }
        loop {
            let durable = self.seen.take().unwrap_or_else(|| self.stream.durable());
            if durable.removed {
                return Event::Deleted(Deletion::Removed);
            }
            if durable.soft_deleted {
                return Event::Deleted(Deletion::SoftDeleted);
            }
            let next = self.source.next_seq();
            if next < durable.tail.seq {
                match self.step(next, durable).await {
                    Some(event) => return event,
                    None => continue,
                }
            }
            if self.options.stops_at_tail {
                return Event::Ended(End::AtTail);
            }
            if !self.caught_up {
                self.caught_up = true;
                self.told = Some(durable);
                return Event::CaughtUp(durable);
            }
            let told = self.told.unwrap_or(durable);
            match self.options.until {
                Until::Closed if durable.closed => return Event::Closed,
                Until::Deleted if changed(&durable, &told) => {
                    self.told = Some(durable);
                    return Event::Changed(durable);
                }
                _ => {}
            }
            let wake = match self.options.until {
                Until::Closed => self.watch.next(Offset::new(next, 0)).await,
                Until::Deleted => {
                    let moved = |d: &Durable| d.tail.seq > next || d.deleted() || changed(d, &told);
                    self.watch.next_when(moved).await
                }
            };
            match wake {
                Wake::Moved(seen) => self.seen = Some(seen),
                Wake::Idle => return Event::Idle,
                Wake::Ended if self.service.is_stopping() => return Event::Ended(End::Shutdown),
                Wake::Ended => return Event::Ended(End::Deadline),
            }
        }
    }

    /// One step of a follower behind the tail: a gap, its end, a shared frame or a read.
    /// `None`: the read found the tail and nothing before it.
    async fn step(&mut self, next: u64, durable: Durable) -> Option<Event<S::Chunk>> {
        if S::TELLS_GAPS && next < durable.first.seq {
            return Some(Event::Gap {
                first: durable.first,
            });
        }
        // A reader catching up reads on without waiting: a long backlog, or writers faster
        // than it, must not keep it past its bound.
        if matches!(self.options.ends, Ends::At(_)) && self.watch.past_deadline() {
            return Some(Event::Ended(End::Deadline));
        }
        if let Some(view) = &self.options.frames
            && let Some(frame) = self.stream.shared_frame(view, next)
        {
            self.source.skip_to(frame.next);
            self.seen = Some(durable);
            return Some(Event::Shared(frame));
        }
        let step = match self.source.read(&self.service, &self.stream).await {
            Ok(step) => step,
            Err(StreamError::Retained { first }) if S::TELLS_GAPS => {
                return Some(Event::Gap { first });
            }
            Err(e) => return Some(Event::Failed(e)),
        };
        if step.limit_reached {
            self.ending = Some(End::Limit);
        } else if step.at_tail && self.options.stops_at_tail {
            self.ending = Some(End::AtTail);
        }
        match step.chunk {
            Some(chunk) => {
                if step.at_tail {
                    self.seen = Some(durable);
                }
                self.gave_records = true;
                Some(Event::Records(chunk))
            }
            None => match self.ending.take() {
                Some(end) => Some(Event::Ended(end)),
                None if step.at_tail => None,
                // Reading again from the same place would return nothing again, forever.
                None => {
                    let missing = format!("no records readable at {next}, below the tail");
                    Some(Event::Failed(StorageError::Corrupt(missing).into()))
                }
            },
        }
    }
}

/// Whether a follower of metadata has news: the metadata, the closure or the retained start
/// changed.
fn changed(now: &Durable, told: &Durable) -> bool {
    (now.meta_version, now.closed, now.first) != (told.meta_version, told.closed, told.first)
}

#[cfg(test)]
mod tests;
