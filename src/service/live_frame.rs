//! Frames the live readers of a stream share. The readers an append wakes are mostly at the same
//! place, and each would read the same records and render the same bytes: the first one renders
//! and leaves its frame on the stream, and the others send that frame as it is. Each way of
//! rendering (a [`FrameView`]) has a frame of its own, so readers of one stream through two
//! faces do not take turns replacing each other's.

use std::sync::Arc;

use bytes::Bytes;

use super::read_memory::ReadLease;
use crate::model::Offset;

/// The most a shared frame holds. It stays on its stream until another of its view replaces it
/// or the last live reader leaves, so frames are small enough that every stream may keep some.
const MAX_SHARED_FRAME: usize = 64 << 10;

/// How a frame was rendered: a reader takes only a frame rendered as it would render it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameView {
    /// SSE events of the canonical view, each record as stored (Durable Streams SSE).
    Canonical,
    /// SSE events that name the stream by a URL under this origin (the StreamLD SSE binding).
    UnderOrigin(Arc<str>),
}

/// What a live reader rendered for the records from `start` up to the durable tail `next`.
#[derive(Clone, Debug)]
pub struct LiveFrame {
    pub view: FrameView,
    pub start: Offset,
    pub next: Offset,
    /// The stream is closed and `next` is its final offset.
    pub closed: bool,
    /// The rendered records, then what the face renders after them for `tag` alone (for
    /// Durable Streams SSE: the control event, which carries the reader's cursor; StreamLD
    /// renders nothing after them).
    pub bytes: Bytes,
    /// Where the records end in `bytes`: a reader with another tag renders its own rest.
    pub records_len: usize,
    pub tag: u64,
}

/// The frames left on a stream, one per view; one pointer while there are none, as on most
/// streams.
#[derive(Default)]
pub(super) struct SharedFrames(Option<Box<[Option<SharedFrame>; FrameView::COUNT]>>);

impl FrameView {
    const COUNT: usize = 2;

    /// Where a frame of this view is kept among a stream's frames.
    fn slot(&self) -> usize {
        match self {
            FrameView::Canonical => 0,
            FrameView::UnderOrigin(_) => 1,
        }
    }
}

impl SharedFrames {
    fn get(&self, view: &FrameView) -> Option<&SharedFrame> {
        self.0.as_deref()?[view.slot()].as_ref()
    }

    fn put(&mut self, shared: SharedFrame) {
        let slot = shared.frame.view.slot();
        self.0.get_or_insert_with(Box::default)[slot] = Some(shared);
    }
}

/// A frame left on a stream, holding the read memory of the records it was rendered from.
pub(super) struct SharedFrame {
    frame: LiveFrame,
    _lease: ReadLease,
}

impl SharedFrames {
    /// The frame another live reader of `view` left for readers at record `start`, while it
    /// still reaches the durable tail (`first`, `tail` and `closed` are the stream's durable
    /// state), so it shows what a read from `start` would show now.
    pub(super) fn current(
        &self,
        view: &FrameView,
        start: u64,
        (first, tail, closed): (Offset, Offset, bool),
    ) -> Option<LiveFrame> {
        let frame = &self.get(view)?.frame;
        // Not below a retention move: a read of its own would tell that reader its records
        // are gone (while the tail stays where the frame ends).
        let current = frame.start.seq == start
            && frame.start >= first
            && frame.next == tail
            && frame.closed == closed;
        (current && frame.view == *view).then(|| frame.clone())
    }

    /// Whether `frame` is small enough to be left for other readers.
    pub(super) fn takes(frame: &LiveFrame) -> bool {
        frame.bytes.len() <= MAX_SHARED_FRAME
    }

    /// Leaves `frame` for the other live readers, taking over `lease`, the read memory of the
    /// read it was rendered from.
    pub(super) fn leave(&mut self, frame: LiveFrame, lease: &mut ReadLease) {
        self.put(SharedFrame {
            frame,
            _lease: std::mem::take(lease),
        });
    }
}

#[cfg(test)]
mod tests;
