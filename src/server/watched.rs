//! Clients that stop reading. A response waits on the client's socket while the client takes
//! nothing; past the send timeout the connection is closed, so a stalled reader cannot hold its
//! response buffers, its live-reader slot or its connection slot for good. Each socket also
//! carries its connection slot, so a connection upgraded to a WebSocket still counts against
//! `--max-connections` for as long as it lives.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, OwnedSemaphorePermit};

/// Whether a connection's writes are getting through.
#[derive(Default)]
pub struct Stall {
    /// Writes that went through (any bytes at all).
    progress: AtomicU64,
    /// The last write found the socket full.
    blocked: AtomicBool,
    /// Told when the socket fills up, so an idle connection needs no timer.
    filled: Notify,
}

impl Stall {
    fn wrote(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
        if self.blocked.load(Ordering::Relaxed) {
            self.blocked.store(false, Ordering::Relaxed);
        }
    }

    fn full(&self) {
        if !self.blocked.swap(true, Ordering::Relaxed) {
            self.filled.notify_one();
        }
    }

    /// Completes once a write has waited `timeout` without the client taking anything.
    pub async fn stalled(&self, timeout: Duration) {
        loop {
            if !self.blocked.load(Ordering::Relaxed) {
                self.filled.notified().await;
                continue;
            }
            let seen = self.progress.load(Ordering::Relaxed);
            tokio::time::sleep(timeout).await;
            if self.blocked.load(Ordering::Relaxed) && self.progress.load(Ordering::Relaxed) == seen
            {
                return;
            }
        }
    }
}

/// A socket that reports whether its writes get through, and holds its connection slot.
pub struct Watched<IO> {
    io: IO,
    stall: Arc<Stall>,
    _slot: OwnedSemaphorePermit,
}

impl<IO> Watched<IO> {
    pub fn new(io: IO, slot: OwnedSemaphorePermit) -> (Self, Arc<Stall>) {
        let stall = Arc::new(Stall::default());
        let watched = Watched {
            io,
            stall: stall.clone(),
            _slot: slot,
        };
        (watched, stall)
    }

    fn observe<T>(&self, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match &poll {
            Poll::Pending => self.stall.full(),
            Poll::Ready(_) => self.stall.wrote(),
        }
        poll
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.observe(poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.observe(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.observe(poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::sync::Semaphore;

    fn slot() -> OwnedSemaphorePermit {
        Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap()
    }

    #[tokio::test]
    async fn a_write_the_reader_never_takes_is_reported_stalled() {
        let (near, _far) = tokio::io::duplex(64);
        let (mut watched, stall) = Watched::new(near, slot());
        // Fill the pipe: the far end never reads.
        let writer = tokio::spawn(async move { watched.write_all(&[0u8; 1024]).await });
        tokio::time::timeout(
            Duration::from_secs(5),
            stall.stalled(Duration::from_millis(50)),
        )
        .await
        .expect("reported stalled");
        writer.abort();
    }

    #[tokio::test]
    async fn a_slow_reader_that_keeps_taking_is_not_stalled() {
        let (near, mut far) = tokio::io::duplex(64);
        let (mut watched, stall) = Watched::new(near, slot());
        let writer = tokio::spawn(async move { watched.write_all(&[0u8; 4096]).await });
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if tokio::io::AsyncReadExt::read(&mut far, &mut buf)
                    .await
                    .unwrap()
                    == 0
                {
                    break;
                }
            }
        });
        let stalled = tokio::time::timeout(
            Duration::from_millis(400),
            stall.stalled(Duration::from_millis(100)),
        )
        .await;
        assert!(stalled.is_err(), "progress every 10 ms is not a stall");
        writer.abort();
        reader.abort();
    }

    #[tokio::test]
    async fn the_connection_slot_lives_as_long_as_the_socket() {
        let slots = Arc::new(Semaphore::new(1));
        let (near, _far) = tokio::io::duplex(64);
        let (watched, _stall) = Watched::new(near, slots.clone().try_acquire_owned().unwrap());
        assert_eq!(slots.available_permits(), 0);
        drop(watched);
        assert_eq!(slots.available_permits(), 1);
    }
}
