//! Catch-up bodies shared by readers of the same range. Clients loading a popular stream read
//! the same records from the same place: the first read renders its body and leaves it here,
//! and the next ones send that body as it is, without reading or rendering the records again.
//! When a second reader comes, the body is moved into in-memory files (`storage::file_bytes`),
//! so that each reader's socket is handed the file's pages rather than a copy of the bytes; a
//! body nobody reads again costs no more than before.
//!
//! A body is taken only while it shows what a read from its start would return now: a read that
//! stopped short of the tail for its size returns the same records however the stream grows,
//! one that reached the tail only until the tail moves. Once the bodies together pass their
//! budget, the oldest go first.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use super::read_memory::ReadLease;
use super::{Stream, StreamService};
use crate::model::Offset;
use crate::model::records::ReadView;
use crate::storage::{StreamId, file_bytes};

/// The records a shared body shows.
#[derive(Clone, Copy, Debug)]
pub struct BodyRange {
    pub start: Offset,
    pub next: Offset,
    /// The read stopped before the tail because the body was full.
    pub short_of_tail: bool,
    /// The first record the body shows (a face may leave some out).
    pub first_shown: u64,
}

/// A rendered catch-up body and the range of records it shows.
#[derive(Debug)]
pub struct SharedBody {
    pub range: BodyRange,
    /// As rendered, until a second reader comes; from then on the same bytes in files.
    pieces: Mutex<Arc<[Bytes]>>,
    /// [`RENDERED`], [`MOVING`] or [`IN_FILES`].
    state: AtomicU8,
    len: usize,
    /// The read memory of the records it was rendered from, held while anyone holds the body:
    /// a response being sent, or the bodies kept here.
    _lease: ReadLease,
}

impl SharedBody {
    pub fn new(range: BodyRange, pieces: Vec<Bytes>, lease: ReadLease) -> SharedBody {
        SharedBody {
            range,
            len: pieces.iter().map(Bytes::len).sum(),
            pieces: Mutex::new(pieces.into()),
            state: AtomicU8::new(RENDERED),
            _lease: lease,
        }
    }

    /// The body's bytes, as a list of buffers.
    pub fn pieces(&self) -> Arc<[Bytes]> {
        self.pieces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The body's bytes for one more reader than the one that rendered them. The first such
    /// reader moves them into in-memory files; readers that come while it does send them as
    /// rendered.
    pub fn pieces_for_another_reader(&self) -> Arc<[Bytes]> {
        let claimed =
            self.state
                .compare_exchange(RENDERED, MOVING, Ordering::Acquire, Ordering::Relaxed);
        if claimed.is_ok() {
            // On this reader's task: a copy of at most a quarter of the budget (usually a few
            // hundred KiB), once per body. Where no file can be made the body stays as rendered,
            // and is not tried again.
            let moved: Arc<[Bytes]> = file_bytes::into_files(&self.pieces()).into();
            *self.pieces.lock().unwrap_or_else(PoisonError::into_inner) = moved.clone();
            self.state.store(IN_FILES, Ordering::Release);
            return moved;
        }
        self.pieces()
    }
}

/// A body's pieces are as rendered.
const RENDERED: u8 = 0;
/// A reader is moving them into files.
const MOVING: u8 = 1;
/// They are in files (or stay as rendered where no file could be made).
const IN_FILES: u8 = 2;

/// A shared body as it stands against its stream now.
pub struct SharedRead {
    pub body: Arc<SharedBody>,
    /// The body reaches the durable tail.
    pub up_to_date: bool,
    /// The stream is closed and the body reaches its final offset.
    pub closed: bool,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Key {
    stream: StreamId,
    start: Offset,
    view: ReadView,
}

pub(super) struct SharedBodies {
    budget: usize,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    bodies: HashMap<Key, Entry>,
    /// Keys in the order their bodies were left, each with its body's number: a key whose body
    /// was replaced appears again, and its older place no longer matches.
    order: VecDeque<(Key, u64)>,
    bytes: usize,
    numbered: u64,
}

struct Entry {
    number: u64,
    body: Arc<SharedBody>,
    len: usize,
}

impl SharedBodies {
    pub(super) fn new(budget: usize) -> SharedBodies {
        SharedBodies {
            budget,
            kept: Mutex::new(Kept::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn get(&self, key: &Key) -> Option<Arc<SharedBody>> {
        Some(self.lock().bodies.get(key)?.body.clone())
    }

    fn put(&self, key: Key, body: Arc<SharedBody>) {
        let len = body.len();
        if len > self.budget / 4 {
            return;
        }
        // Dropped once the lock is released: the last holder of a body unmaps and closes it.
        let mut gone = Vec::new();
        let mut kept = self.lock();
        kept.numbered += 1;
        let number = kept.numbered;
        let entry = Entry { number, body, len };
        if let Some(old) = kept.bodies.insert(key, entry) {
            kept.bytes -= old.len;
            gone.push(old);
        }
        kept.bytes += len;
        kept.order.push_back((key, number));
        while kept.bytes > self.budget {
            gone.extend(kept.evict_oldest());
        }
        // Keys replaced again and again (a stream whose tail keeps moving) leave old places.
        if kept.order.len() > 2 * kept.bodies.len() + 64 {
            let Kept { bodies, order, .. } = &mut *kept;
            order.retain(|(key, number)| bodies.get(key).is_some_and(|e| e.number == *number));
        }
        drop(kept);
        drop(gone);
    }

    /// Forgets the body kept under `key` if it is `body` (which the caller found stale).
    fn forget(&self, key: &Key, body: &Arc<SharedBody>) {
        let mut kept = self.lock();
        if kept
            .bodies
            .get(key)
            .is_some_and(|e| Arc::ptr_eq(&e.body, body))
            && let Some(gone) = kept.bodies.remove(key)
        {
            kept.bytes -= gone.len;
        }
    }
}

impl Kept {
    fn evict_oldest(&mut self) -> Option<Entry> {
        while let Some((key, number)) = self.order.pop_front() {
            if self.bodies.get(&key).is_some_and(|e| e.number == number) {
                let gone = self.bodies.remove(&key)?;
                self.bytes -= gone.len;
                return Some(gone);
            }
        }
        None
    }
}

impl StreamService {
    /// The body a read of `view` left for reads of `stream` from `start`, while it still shows
    /// what such a read returns now.
    pub fn shared_body(
        &self,
        stream: &Stream,
        start: Offset,
        view: ReadView,
    ) -> Option<SharedRead> {
        let key = Key {
            stream: stream.id,
            start,
            view,
        };
        let body = self.shared_bodies.get(&key)?;
        let durable = stream.durable();
        let range = body.range;
        if !range.short_of_tail && range.next != durable.tail {
            self.shared_bodies.forget(&key, &body);
            return None;
        }
        if start < durable.first {
            // Retention passed it since the read resolved: a fresh read says so, and retention
            // never moves back.
            self.shared_bodies.forget(&key, &body);
            return None;
        }
        let up_to_date = range.next.seq >= durable.tail.seq;
        Some(SharedRead {
            up_to_date,
            closed: up_to_date && durable.closed,
            body,
        })
    }

    /// Bytes of the bodies kept now.
    pub fn shared_body_bytes(&self) -> usize {
        self.shared_bodies.bytes()
    }

    /// Leaves `body`, rendered in `view` from a read of `stream`, for the next readers of its
    /// range.
    pub fn share_body(&self, stream: &Stream, view: ReadView, body: Arc<SharedBody>) {
        let key = Key {
            stream: stream.id,
            start: body.range.start,
            view,
        };
        self.shared_bodies.put(key, body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::service::snapshots::RetentionMove;
    use crate::service::tests::{create_text, one_text_stream, text};
    use crate::service::{AppendRequest, ServiceConfig};
    use crate::storage::MemoryEngine;

    fn key(stream: StreamId) -> Key {
        Key {
            stream,
            start: Offset::default(),
            view: ReadView::Canonical,
        }
    }

    fn body(len: usize) -> Arc<SharedBody> {
        let range = BodyRange {
            start: Offset::default(),
            next: Offset {
                seq: 1,
                pos: len as u64,
            },
            short_of_tail: false,
            first_shown: 0,
        };
        let pieces = vec![Bytes::from(vec![b'x'; len])];
        Arc::new(SharedBody::new(range, pieces, ReadLease::default()))
    }

    #[test]
    fn past_the_budget_the_oldest_bodies_go_first() {
        let bodies = SharedBodies::new(100);
        for stream in 0..4 {
            bodies.put(key(stream), body(25));
        }
        bodies.put(key(4), body(25));
        assert!(bodies.get(&key(0)).is_none(), "the oldest went");
        assert!((1..5).all(|stream| bodies.get(&key(stream)).is_some()));
        assert_eq!(bodies.lock().bytes, 100);
    }

    #[test]
    fn a_replaced_body_counts_once_and_keeps_its_new_place() {
        let bodies = SharedBodies::new(200);
        bodies.put(key(0), body(40));
        bodies.put(key(1), body(40));
        bodies.put(key(0), body(50));
        assert_eq!(bodies.lock().bytes, 90);
        // Key 1 is now the oldest: making room takes it, not the newer key 0.
        for stream in 2..5 {
            bodies.put(key(stream), body(50));
        }
        assert!(bodies.get(&key(1)).is_none());
        assert!(bodies.get(&key(0)).is_some());
        assert_eq!(bodies.lock().bytes, 200);
    }

    #[test]
    fn a_body_over_a_quarter_of_the_budget_is_not_kept() {
        let bodies = SharedBodies::new(100);
        bodies.put(key(0), body(26));
        assert!(bodies.get(&key(0)).is_none());
    }

    #[test]
    fn replacing_one_key_again_and_again_keeps_its_order_short() {
        let bodies = SharedBodies::new(1000);
        for _ in 0..10_000 {
            bodies.put(key(0), body(10));
        }
        assert!(bodies.lock().order.len() <= 2 + 64);
    }

    /// Leaves a body for the records a catch-up read of `stream` from `start` returns now, as a
    /// face would after rendering them.
    async fn share_read(
        service: &StreamService,
        stream: &Arc<Stream>,
        start: Offset,
    ) -> Arc<SharedBody> {
        let chunk = service.read_history_at(stream, start, None).await.unwrap();
        let range = BodyRange {
            start: chunk.start,
            next: chunk.next,
            short_of_tail: !chunk.up_to_date,
            first_shown: start.seq,
        };
        let pieces = chunk.records.iter().map(|r| r.body.clone()).collect();
        let body = Arc::new(SharedBody::new(range, pieces, chunk.lease));
        service.share_body(stream, ReadView::Canonical, body.clone());
        body
    }

    const CANONICAL: ReadView = ReadView::Canonical;

    #[tokio::test]
    async fn a_shared_body_that_reached_the_tail_is_taken_only_until_the_tail_moves() {
        let (service, stream) = one_text_stream().await;
        service.append("s", text("a")).await.unwrap();
        share_read(&service, &stream, Offset::START).await;
        let shared = service
            .shared_body(&stream, Offset::START, CANONICAL)
            .expect("the body is current");
        assert!(shared.up_to_date && !shared.closed);
        assert_eq!(&shared.body.pieces()[..], [Bytes::from_static(b"a")]);
        let elsewhere = shared.body.range.next;
        assert!(service.shared_body(&stream, elsewhere, CANONICAL).is_none());
        let records = ReadView::Records(crate::model::records::RecordView::Values);
        assert!(
            service
                .shared_body(&stream, Offset::START, records)
                .is_none(),
            "a body rendered in one view is not another's"
        );

        service.append("s", text("b")).await.unwrap();
        assert!(
            service
                .shared_body(&stream, Offset::START, CANONICAL)
                .is_none(),
            "once the tail moves, the body would leave out a record"
        );
        assert_eq!(service.shared_body_bytes(), 0, "a stale body is let go");
    }

    #[tokio::test]
    async fn a_shared_body_is_not_taken_once_retention_passes_its_start() {
        let (service, stream) = one_text_stream().await;
        for body in ["a", "b"] {
            service.append("s", text(body)).await.unwrap();
        }
        share_read(&service, &stream, Offset::START).await;
        assert!(
            service
                .shared_body(&stream, Offset::START, CANONICAL)
                .is_some()
        );
        service
            .move_retention(&stream, Offset::new(1, 1), RetentionMove::Trim(1))
            .await
            .unwrap();
        assert!(
            service
                .shared_body(&stream, Offset::START, CANONICAL)
                .is_none(),
            "a fresh read from there is refused as retained"
        );
        assert_eq!(service.shared_body_bytes(), 0, "and never will be again");
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_shared_body_moves_into_a_file_once_a_second_reader_comes() {
        use crate::storage::file_bytes::is_file_backed;
        let (service, stream) = one_text_stream().await;
        let record = "x".repeat(20_000);
        service.append("s", text(&record)).await.unwrap();
        let body = share_read(&service, &stream, Offset::START).await;
        assert!(
            !is_file_backed(&body.pieces()[0]),
            "the reader that rendered it sends it as it is"
        );
        let shared = service
            .shared_body(&stream, Offset::START, CANONICAL)
            .unwrap();
        let pieces = shared.body.pieces_for_another_reader();
        assert!(
            is_file_backed(&pieces[0]),
            "the next ones send it from a file"
        );
        assert_eq!(pieces.concat(), record.as_bytes());
        assert_eq!(
            shared.body.pieces_for_another_reader()[0].as_ptr(),
            pieces[0].as_ptr(),
            "moved once"
        );
    }

    #[tokio::test]
    async fn a_shared_body_that_stopped_short_of_the_tail_stays_as_the_stream_grows() {
        let config = ServiceConfig {
            catch_up_read_bytes: 100,
            ..ServiceConfig::default()
        };
        let service = StreamService::open(Arc::new(MemoryEngine::new()), config).unwrap();
        service.create(create_text("s")).await.unwrap();
        let stream = service.find("s", false).await.unwrap();
        for _ in 0..3 {
            service.append("s", text(&"x".repeat(60))).await.unwrap();
        }
        share_read(&service, &stream, Offset::START).await;
        service.append("s", text("more")).await.unwrap();
        let shared = service
            .shared_body(&stream, Offset::START, CANONICAL)
            .expect("a full body shows the same records however the stream grows");
        assert!(!shared.up_to_date && shared.body.range.short_of_tail);
        assert_eq!(
            shared.body.range.next.seq, 1,
            "100 bytes hold one record of 60"
        );
    }

    #[tokio::test]
    async fn a_shared_body_says_the_stream_closed_once_it_is() {
        let (service, stream) = one_text_stream().await;
        service.append("s", text("a")).await.unwrap();
        share_read(&service, &stream, Offset::START).await;
        let tail = stream.durable().tail;
        let close = AppendRequest {
            close: true,
            ..Default::default()
        };
        service.append("s", close).await.unwrap();
        assert_eq!(stream.durable().tail, tail, "closing adds no record");
        let shared = service
            .shared_body(&stream, Offset::START, CANONICAL)
            .expect("the records are the same");
        assert!(shared.up_to_date && shared.closed);
    }
}
