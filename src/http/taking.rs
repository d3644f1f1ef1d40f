//! Whether an HTTP/2 client takes the bodies it asked for.
//!
//! Over HTTP/1.1 a client that takes nothing fills its socket, which its connection watches
//! (`server::watched`). Over HTTP/2 its other streams and pings go on, and flow control lets it
//! leave a response untaken for ever, so each body is watched instead: how many frames the
//! connection has taken, and whether it holds the last one without asking for another. An
//! untaken live body ends, which frees its reader slot. An untaken finished response (a
//! catch-up, a long-poll answered at once, a bootstrap, a snapshot: up to a read's 4 MiB each)
//! costs its connection: hyper keeps what a stream it is not sending holds until the connection
//! goes, so the connection is closed, as an HTTP/1.1 one would be. Small responses too: one
//! costs little, but a client may hold as many as it may open streams, on every connection.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use http_body::{Frame, SizeHint};

use crate::service::sessions::OwnedTask;

/// How a body's frames are being taken: how many the connection has had, and whether it has
/// not asked for another since the last. A client that takes nothing leaves it so: the
/// connection holds that frame until the client opens its window, and asks for no more.
pub(super) struct Taking {
    frames: AtomicU64,
    holding: AtomicBool,
}

impl Taking {
    /// A body the connection has not asked for yet is held: a client that opens no window at
    /// all may never let it ask.
    pub(super) fn new() -> Arc<Taking> {
        Arc::new(Taking {
            frames: AtomicU64::new(0),
            holding: AtomicBool::new(true),
        })
    }

    /// Notes what the body answered the connection: a frame, or nothing yet (or the end).
    fn answered(&self, handed: bool) {
        if handed {
            self.frames.fetch_add(1, Ordering::Relaxed);
        }
        self.holding.store(handed, Ordering::Relaxed);
    }

    /// Passes `body`'s frames on, noting each; `watcher` lives as long as the body does.
    pub(super) fn track<S: Stream + Unpin>(
        self: Arc<Self>,
        mut body: S,
        watcher: OwnedTask,
    ) -> impl Stream<Item = S::Item> {
        futures::stream::poll_fn(move |cx| {
            let _held = &watcher;
            let next = body.poll_next_unpin(cx);
            self.answered(matches!(next, Poll::Ready(Some(_))));
            next
        })
    }

    /// Resolves once the connection has held the body's last frame, asking for no other, for
    /// longer than `timeout` (at most twice as long: it looks once per `timeout`). A body that
    /// waits for data is not held: the connection asked, and waits on it.
    pub(super) async fn stalled(&self, timeout: Duration) {
        let mut seen = None;
        loop {
            tokio::time::sleep(timeout).await;
            let frames = self.frames.load(Ordering::Relaxed);
            if seen == Some(frames) && self.holding.load(Ordering::Relaxed) {
                return;
            }
            seen = Some(frames);
        }
    }
}

/// Closes the connection a request came on.
pub trait CloseConnection: Send + Sync {
    fn close(&self);
}

/// The connection an HTTP/2 request came on, in the request's extensions.
#[derive(Clone)]
pub struct ConnectionHandle(pub Arc<dyn CloseConnection>);

/// The most a watched body hands the connection at once: HTTP/2's usual frame, so pieces add no
/// frames. The connection puts a piece in its send buffer once the client's window has room
/// (for at least a byte), and then asks for the next. Handed a whole record of megabytes, it
/// would buffer it all at the first room; in pieces it holds at most one beyond the window, and
/// a client taking a large record slowly shows progress with every piece: it must take 16 KiB
/// per send timeout.
const PIECE: usize = 16 << 10;

/// Watches a finished response's body over HTTP/2, closing `connection` once its client has
/// taken nothing of it for the send timeout.
pub(super) fn watch_finished(
    response: Response,
    send_timeout: Duration,
    connection: ConnectionHandle,
) -> Response {
    if http_body::Body::is_end_stream(response.body()) {
        return response;
    }
    let taking = Taking::new();
    let watcher = {
        let taking = taking.clone();
        OwnedTask::spawn(async move {
            taking.stalled(send_timeout).await;
            tracing::debug!("an HTTP/2 client took nothing of a response for the send timeout");
            connection.0.close();
        })
    };
    response.map(|inner| {
        Body::new(Watched {
            inner,
            piece: Bytes::new(),
            taking,
            _watcher: watcher,
        })
    })
}

/// A finished body handed over in pieces of at most [`PIECE`], each noted. The last byte of a
/// body that says where it ends is a piece of its own: the connection asks for it only once the
/// client's window covers all before it, so when the body ends (and with it the watch) the
/// connection holds at most that byte beyond the window. A body that learns of its end only when
/// it gets there (a bootstrap's stream) may leave its last piece held.
struct Watched {
    inner: Body,
    /// What is left of the inner body's current frame.
    piece: Bytes,
    taking: Arc<Taking>,
    _watcher: OwnedTask,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.piece.is_empty() {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.piece = data,
                    Err(other) => {
                        this.taking.answered(true);
                        return Poll::Ready(Some(Ok(other)));
                    }
                },
                ended_or_waiting => {
                    this.taking.answered(false);
                    return ended_or_waiting;
                }
            }
        }
        let len = this.piece.len();
        let take = if len > 1 && len <= PIECE && this.inner.is_end_stream() {
            len - 1
        } else {
            len.min(PIECE)
        };
        let next = this.piece.split_to(take);
        this.taking.answered(true);
        Poll::Ready(Some(Ok(Frame::data(next))))
    }

    fn is_end_stream(&self) -> bool {
        self.piece.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let piece = self.piece.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + piece);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + piece);
        }
        hint
    }
}
