//! One live stream: its mutable state behind a short-held lock, the durable tail readers watch,
//! and the hot cache of its most recent records.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::watch;

use crate::model::ledger::retention::deletable_below;
use crate::model::ledger::{Ledger, Renew};
use crate::model::producer::ProducerState;
use crate::model::stream::StreamMeta;
use crate::model::{Offset, Record};
use crate::storage::{SharedEngine, StorageError, StreamId};

use super::arrivals::Arrivals;
use super::cache::TailCache;
use super::live_frame::{FrameView, LiveFrame, SharedFrames};
use super::read_memory::ReadLease;

/// What readers may see: only data that is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Durable {
    pub tail: Offset,
    /// The first retained position; reads before it are gone.
    pub first: Offset,
    /// The timestamp of the last durable record (S2's tail timestamp).
    pub last_timestamp_ms: i64,
    /// Counts durable changes of the stream's metadata (attributes, snapshot, retention), so
    /// replication sessions notice them.
    pub meta_version: u64,
    pub closed: bool,
    /// The stream's creation is durable.
    pub ready: bool,
    /// The stream is gone (deleted, expired, or its creation failed).
    pub removed: bool,
    /// The stream was deleted while forks still read through it: gone for its own readers
    /// (410), kept for its forks.
    pub soft_deleted: bool,
    /// A write to the stream failed in storage, which then takes no more writes: what was
    /// submitted after the durable tail never will be durable, and nothing waits for it.
    pub write_failed: bool,
    /// A change of the stream's metadata failed in storage: its metadata in memory may hold
    /// what is not on disk, which a restart would undo, so it is shown to no one until then.
    pub meta_write_failed: bool,
}

impl Durable {
    /// The stream is gone for its own readers: deleted for good, or kept only for its forks.
    pub fn deleted(&self) -> bool {
        self.removed || self.soft_deleted
    }
}

/// A server holds one of these for every stream it has, most of them idle, so it is kept small:
/// the name and content type are shared, rarely used state is allocated only when first used.
pub struct Stream {
    pub id: StreamId,
    /// Shared with the registry's key and the metadata.
    pub name: Arc<str>,
    /// The content type as created; it never changes.
    pub content_type: Arc<str>,
    pub json: bool,
    /// Created with a TTL or an expiry time (fixed at creation).
    pub may_expire: bool,
    /// Record bodies are sealed with the S2 client's key: only S2 reads with that key see them.
    pub encrypted: bool,
    /// The upstream server this stream mirrors (`scheme://host:port`): it is read-only here.
    pub mirror_of: Option<String>,
    /// On a mirror: the upstream's record tail as last reported, for the replication lag.
    pub upstream_tail: std::sync::atomic::AtomicU64,
    /// The stream this one was forked from: reads below the fork offset go there.
    pub source: Option<Arc<Stream>>,
    /// Live readers (long-poll, SSE) waiting on it now: a stream with one does not expire.
    live_readers: std::sync::atomic::AtomicU32,
    pub(super) state: Mutex<State>,
    durable: DurableCell,
}

/// A live reader waiting on a stream (see [`Stream::attach_reader`]). When it leaves, the
/// stream's TTL window starts again from then.
pub struct LiveReader(Arc<Stream>);

impl Drop for LiveReader {
    fn drop(&mut self) {
        self.0.renew();
        let before = self
            .0
            .live_readers
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if before == 1 {
            // Nobody is left to send it.
            self.0.lock().shared_frames = SharedFrames::default();
        }
    }
}

/// The writer-side view, which runs ahead of the durable one while commits are in flight.
pub(super) struct State {
    pub meta: StreamMeta,
    /// A `BTreeMap` because it costs nothing while empty, as it is for most streams.
    pub producers: BTreeMap<String, ProducerState>,
    /// The most recent records, contiguous up to the writer-side tail.
    pub recent: TailCache,
    /// Number of forks that read through this stream.
    pub forks: u32,
    pub last_access_ms: i64,
    pub removed: bool,
    /// Metadata changes (attributes, snapshot, retention, configuration) submitted so far;
    /// [`Durable::meta_version`] counts those committed. Readers of that metadata wait for the
    /// two to meet, so they never see what a crash could still undo.
    pub meta_submitted: u64,
    /// The producer appends in flight, in the order they arrived, while there are any (see
    /// `arrivals`).
    pub arrivals: Option<Box<Arrivals>>,
    /// The frames live readers rendered for the others (see `live_frame`).
    pub shared_frames: SharedFrames,
}

impl State {
    /// The ledger over this state (see `model::ledger`), of `stream`.
    pub fn ledger(&mut self, stream: &Stream) -> Ledger<'_> {
        Ledger {
            meta: &mut self.meta,
            producers: &mut self.producers,
            last_access_ms: &mut self.last_access_ms,
            removed: &mut self.removed,
            forks: &mut self.forks,
            json: stream.json,
        }
    }

    /// Counts a metadata change submitted now, under the lock; its committer bumps
    /// [`Durable::meta_version`] (see [`Stream::publish_meta_change`]) once the commit is over.
    pub fn submit_meta_change(&mut self) {
        self.meta_submitted += 1;
    }

    /// The deletion of the records below the retained offset, unless forks read through this
    /// stream: their history stays on disk (hidden from this stream's own readers by the
    /// retained offset) until the last of them goes, and is deleted then.
    pub fn trim_records(&self, id: StreamId) -> Option<crate::storage::Change> {
        deletable_below(self.meta.retained_from, self.forks)
            .map(|below| crate::storage::Change::TrimRecords(id, below))
    }
}

impl Stream {
    pub(super) fn new(
        id: StreamId,
        meta: StreamMeta,
        producers: BTreeMap<String, ProducerState>,
        source: Option<Arc<Stream>>,
        durable: Durable,
        now_ms: i64,
    ) -> Stream {
        Stream {
            id,
            name: meta.name.clone(),
            json: crate::model::content_type::is_json(&meta.content_type),
            // A mirror's copy goes when its upstream's stream does, never on its own clock: its
            // readers do not renew the upstream's TTL.
            may_expire: (meta.ttl_secs.is_some() || meta.expires_at_ms.is_some())
                && meta.extra().mirror_of.is_none(),
            encrypted: meta.extra().cipher.is_some(),
            mirror_of: meta.extra().mirror_of.clone(),
            upstream_tail: std::sync::atomic::AtomicU64::new(0),
            content_type: meta.content_type.clone(),
            source,
            live_readers: std::sync::atomic::AtomicU32::new(0),
            state: Mutex::new(State {
                meta,
                producers,
                recent: TailCache::new(),
                forks: 0,
                last_access_ms: now_ms,
                removed: false,
                meta_submitted: durable.meta_version,
                arrivals: None,
                shared_frames: SharedFrames::default(),
            }),
            durable: DurableCell::new(durable),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves State consistent before it can panic, so a poisoned lock
        // is still safe to use.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Locks the state to change it, refusing a stream removed since it was looked up: storing
    /// its metadata again would bring it back after a restart.
    pub(super) fn lock_present(&self) -> Result<MutexGuard<'_, State>, super::StreamError> {
        let state = self.lock();
        if state.removed {
            return Err(super::StreamError::NotFound);
        }
        Ok(state)
    }

    /// Its TTL or expiry time has passed (`state` is its state, locked). A stream with live
    /// readers has not: the base protocol keeps it while they wait, renewed as they leave.
    pub(super) fn expired(&self, state: &State, now_ms: i64) -> bool {
        self.may_expire
            && self.live_reader_count() == 0
            && state.meta.is_expired(now_ms, state.last_access_ms)
    }

    /// Live readers waiting on this stream now.
    pub(super) fn live_reader_count(&self) -> u32 {
        self.live_readers.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Marks a live reader waiting on this stream until the returned guard is dropped.
    pub(super) fn attach_reader(self: &Arc<Self>) -> LiveReader {
        self.live_readers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        LiveReader(self.clone())
    }

    /// Slides the TTL window: a read or an append was accepted (a rejected request, or a
    /// `HEAD`, does not keep a stream alive).
    pub fn renew(&self) {
        if self.may_expire {
            self.renew_locked(&mut self.lock());
        }
    }

    /// [`Self::renew`] under the lock already held.
    pub(super) fn renew_locked(&self, state: &mut State) {
        if self.may_expire {
            state.ledger(self).apply(Renew, super::now_ms());
        }
    }

    /// The frame another live reader of `view` left for readers at record `start`, while it
    /// still reaches the durable tail (see `live_frame`).
    pub fn shared_frame(&self, view: &FrameView, start: u64) -> Option<LiveFrame> {
        // A lone reader (most streams' case) skips the lock: whatever frame is left, it would
        // have rendered itself.
        if self.live_reader_count() < 2 {
            return None;
        }
        let d = self.durable();
        let state = self.lock();
        (state.shared_frames).current(view, start, (d.first, d.tail, d.closed))
    }

    /// Leaves `frame`, rendered from a read that reached the durable tail, for the other live
    /// readers, taking over `lease`, the read memory of that read. Only while more than one
    /// reader waits: a lone reader has nobody to share with (and keeps its lease).
    pub fn share_frame(&self, frame: LiveFrame, lease: &mut ReadLease) {
        if !SharedFrames::takes(&frame) || self.live_reader_count() < 2 {
            return;
        }
        self.lock().shared_frames.leave(frame, lease);
    }

    pub fn durable(&self) -> Durable {
        self.durable.get()
    }

    /// Completes once the stream is deleted (also when only soft-deleted).
    pub async fn until_deleted(&self) {
        let mut watch = self.subscribe();
        while !watch.borrow_and_update().deleted() {
            if watch.changed().await.is_err() {
                return;
            }
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<Durable> {
        self.durable.subscribe()
    }

    /// Makes a committed change visible and wakes the readers waiting on this stream.
    pub(super) fn publish(&self, change: impl FnOnce(&mut Durable)) {
        self.durable.publish(change);
    }

    /// Marks everything up to `tail` durable (commits complete in order, so later wins).
    pub(super) fn publish_tail(&self, tail: Offset, timestamp_ms: i64, closed: bool) {
        self.publish(|d| {
            d.tail = d.tail.max(tail);
            d.last_timestamp_ms = d.last_timestamp_ms.max(timestamp_ms);
            d.closed |= closed;
        });
    }

    /// Marks the stream's writes failed (see [`Durable::write_failed`]).
    pub(super) fn publish_write_failure(&self) {
        self.publish(|d| d.write_failed = true);
    }

    /// Marks a metadata change over, `committed` or failed in storage, waking replication
    /// sessions and the readers waiting in [`Self::meta_settled`]. `applied` makes what a
    /// committed change changes in the published state, in the same publication.
    pub(super) fn publish_meta_change(&self, committed: bool, applied: impl FnOnce(&mut Durable)) {
        self.publish(|d| {
            if committed {
                applied(d);
            }
            d.meta_version += 1;
            d.meta_write_failed |= !committed;
        });
    }

    /// Waits until the metadata changes submitted up to `submitted` (see
    /// [`State::meta_submitted`]) are durable; the stream going away first is `NotFound`, and
    /// a failed metadata write (see [`Durable::meta_write_failed`]) a storage error.
    pub(super) async fn meta_settled(&self, submitted: u64) -> Result<(), super::StreamError> {
        let now = self.durable();
        let settled = if now.meta_version >= submitted {
            now
        } else {
            let mut rx = self.subscribe();
            let waited = rx
                .wait_for(|d| d.meta_version >= submitted || d.removed)
                .await;
            match waited {
                Ok(d) if !d.removed => *d,
                _ => return Err(super::StreamError::NotFound),
            }
        };
        if settled.meta_write_failed {
            return Err(StorageError::Failed.into());
        }
        Ok(())
    }

    /// Waits until the stream's creation is durable; false if it never will be.
    pub(super) async fn wait_ready(&self) -> bool {
        let now = self.durable();
        if now.ready || now.removed {
            return !now.removed;
        }
        let mut rx = self.subscribe();
        match rx.wait_for(|d| d.ready || d.removed).await {
            Ok(d) => !d.removed,
            Err(_) => false,
        }
    }

    /// This stream's own records with `from <= seq < until`, from the hot cache when it has them.
    pub(super) async fn read_own(
        &self,
        engine: &SharedEngine,
        from: u64,
        until: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, StorageError> {
        if let Some(records) = self.lock().recent.read(from, until, max_bytes) {
            return Ok(records);
        }
        engine.read(self.id, from, until, max_bytes).await
    }
}

/// A stream's durable state, and the watch channel its readers wait on.
///
/// A watch channel is a few hundred bytes of its own, and most streams never have a reader
/// waiting on them, so the channel is made by the first subscriber. Until then the state lives
/// in `unwatched`; from then on the channel holds it. Both changes and subscriptions check for
/// the channel under the `unwatched` lock, so no change can slip between a subscriber's look at
/// the state and its channel: every waiter sees every change.
struct DurableCell {
    unwatched: Mutex<Durable>,
    watched: OnceLock<watch::Sender<Durable>>,
}

impl DurableCell {
    fn new(durable: Durable) -> Self {
        DurableCell {
            unwatched: Mutex::new(durable),
            watched: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Durable> {
        // A `Durable` is plain data, written whole; a poisoned lock still holds a valid one.
        self.unwatched
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn get(&self) -> Durable {
        if let Some(sender) = self.watched.get() {
            return *sender.borrow();
        }
        let unwatched = self.lock();
        match self.watched.get() {
            Some(sender) => *sender.borrow(),
            None => *unwatched,
        }
    }

    fn subscribe(&self) -> watch::Receiver<Durable> {
        if let Some(sender) = self.watched.get() {
            return sender.subscribe();
        }
        let unwatched = self.lock();
        self.watched
            .get_or_init(|| watch::Sender::new(*unwatched))
            .subscribe()
    }

    fn publish(&self, change: impl FnOnce(&mut Durable)) {
        let sender = match self.watched.get() {
            Some(sender) => sender,
            None => {
                let mut unwatched = self.lock();
                match self.watched.get() {
                    Some(sender) => sender,
                    None => return change(&mut unwatched),
                }
            }
        };
        sender.send_if_modified(|durable| {
            let before = *durable;
            change(durable);
            *durable != before
        });
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::Offset;

    /// An empty `text/plain` stream, alone (no service around it).
    pub(in crate::service) fn test_stream() -> Arc<Stream> {
        let meta = crate::model::stream::StreamMeta::new("s", "text/plain");
        Arc::new(Stream::new(1, meta, BTreeMap::new(), None, durable(0), 0))
    }

    fn durable(seq: u64) -> Durable {
        Durable {
            tail: Offset::new(seq, seq),
            first: Offset::START,
            last_timestamp_ms: 0,
            meta_version: 0,
            closed: false,
            ready: true,
            removed: false,
            soft_deleted: false,
            write_failed: false,
            meta_write_failed: false,
        }
    }

    #[tokio::test]
    async fn a_first_subscriber_sees_every_change_made_before_and_after_it_came() {
        let cell = DurableCell::new(durable(0));
        cell.publish(|d| d.tail = Offset::new(1, 1));
        assert!(
            cell.watched.get().is_none(),
            "no channel until a reader waits"
        );
        assert_eq!(cell.get().tail.seq, 1);

        let mut rx = cell.subscribe();
        assert_eq!(rx.borrow_and_update().tail.seq, 1);
        let waiter =
            tokio::spawn(async move { rx.wait_for(|d| d.tail.seq >= 2).await.map(|d| d.tail.seq) });
        tokio::task::yield_now().await;
        cell.publish(|d| d.tail = Offset::new(2, 2));
        assert_eq!(waiter.await.unwrap().unwrap(), 2);
        assert_eq!(cell.get().tail.seq, 2, "the channel holds the state now");
        assert_eq!(cell.subscribe().borrow().tail.seq, 2);
    }
}
