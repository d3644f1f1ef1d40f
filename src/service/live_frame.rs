//! Frames the live readers of a stream share. The readers an append wakes are mostly at the same
//! place, and each would read the same records and render the same bytes: the first one renders
//! and leaves its frame on the stream, and the others send that frame as it is.

use bytes::Bytes;

use super::Stream;
use super::read_memory::ReadLease;
use crate::model::Offset;

/// The most a shared frame holds. It stays on its stream until another replaces it or the last
/// live reader leaves, so frames are small enough that every stream may keep one.
const MAX_SHARED_FRAME: usize = 64 << 10;

/// What a live reader rendered for the records from `start` up to the durable tail `next`.
#[derive(Clone, Debug)]
pub struct LiveFrame {
    pub start: Offset,
    pub next: Offset,
    /// The stream is closed and `next` is its final offset.
    pub closed: bool,
    /// The rendered records, then what the face renders after them for `tag` alone (for
    /// Durable Streams SSE: the control event, which carries the reader's cursor).
    pub bytes: Bytes,
    /// Where the records end in `bytes`: a reader with another tag renders its own rest.
    pub records_len: usize,
    pub tag: u64,
}

/// A frame left on a stream, holding the read memory of the records it was rendered from.
pub(super) struct SharedFrame {
    frame: LiveFrame,
    _lease: ReadLease,
}

impl Stream {
    /// The frame another live reader left for readers at `start`, while it still reaches the
    /// durable tail (so it shows what a read from `start` would show now).
    pub fn shared_frame(&self, start: Offset) -> Option<LiveFrame> {
        // A lone reader (most streams' case) skips the lock: whatever frame is left, it would
        // have rendered itself.
        if self.live_reader_count() < 2 {
            return None;
        }
        let durable = self.durable();
        let state = self.lock();
        let frame = &state.shared_frame.as_ref()?.frame;
        (frame.start == start && frame.next == durable.tail && frame.closed == durable.closed)
            .then(|| frame.clone())
    }

    /// Leaves `frame`, rendered from a read that reached the durable tail, for the other live
    /// readers, taking over `lease`, the read memory of that read. Only while more than one
    /// reader waits: a lone reader has nobody to share with (and keeps its lease).
    pub fn share_frame(&self, frame: LiveFrame, lease: &mut ReadLease) {
        if frame.bytes.len() > MAX_SHARED_FRAME || self.live_reader_count() < 2 {
            return;
        }
        self.lock().shared_frame = Some(Box::new(SharedFrame {
            frame,
            _lease: std::mem::take(lease),
        }));
    }
}
