//! Clients that stop reading. A response waits on the client's socket while the client takes
//! nothing; past the send timeout the connection is reset, so a stalled reader cannot hold its
//! response buffers, its live-reader slot or its connection slot for good. A slow reader is not
//! stalled: the data it acknowledges leaves the socket's queue, which is watched as well as the
//! writes (a full socket becomes writable again only once much of its buffer has drained). Each socket also
//! carries its connection slot, so a connection upgraded to a WebSocket still counts against
//! `--max-connections` for as long as it lives.

use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;

/// Whether a connection's writes are getting through.
#[derive(Default)]
pub struct Stall {
    /// How often a write went through after the socket was full: a stalled reader's socket
    /// stays full, so writes while it is not full need not count. Only the connection's own
    /// task writes it.
    progress: AtomicU64,
    /// The last write found the socket full.
    blocked: AtomicBool,
    /// A response on it was left untaken (see `http::taking`): close it at once.
    abandoned: AtomicBool,
    /// Woken when the socket fills up, so an idle connection needs no timer. The watch is polled
    /// every time its connection's task wakes (once per event to a live reader), so it is
    /// an atomic waker rather than a `Notify`, whose every poll takes a lock.
    filled: AtomicWaker,
    /// The TCP socket: a full socket whose client reads slowly only becomes writable again
    /// once much of its buffer has drained, so what the kernel still holds is watched too.
    socket: Option<RawFd>,
}

impl Stall {
    /// A write went through after the socket was full.
    fn unblocked(&self) {
        // One writer (the connection's task): no read-modify-write needed.
        let progress = self.progress.load(Ordering::Relaxed);
        self.progress
            .store(progress.wrapping_add(1), Ordering::Relaxed);
        self.blocked.store(false, Ordering::Relaxed);
    }

    fn full(&self) {
        self.blocked.store(true, Ordering::Relaxed);
        self.filled.wake();
    }

    /// Completes once `due` holds, looked at again whenever the socket fills up or the
    /// connection is abandoned.
    async fn until(&self, due: impl Fn() -> bool) {
        std::future::poll_fn(|cx| {
            if due() {
                return Poll::Ready(());
            }
            self.filled.register(cx.waker());
            // Due between the first look and the registration: that wake may be lost.
            if due() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed)
    }

    /// Completes once a write has waited `timeout` while the client took nothing at all (no
    /// write went through, and the socket's queue did not shrink), or once a response on the
    /// connection is abandoned. The connection is then reset rather than closed, so the kernel
    /// does not keep its unsent data either.
    pub async fn stalled(&self, timeout: Duration) {
        loop {
            self.until(|| self.blocked.load(Ordering::Relaxed) || self.is_abandoned())
                .await;
            if self.is_abandoned() {
                break;
            }
            let seen = self.progress.load(Ordering::Relaxed);
            let queued = self.socket.and_then(unsent);
            tokio::select! {
                () = tokio::time::sleep(timeout) => {}
                () = self.until(|| self.is_abandoned()) => break,
            }
            let wrote = self.progress.load(Ordering::Relaxed) != seen;
            let drained = match (queued, self.socket.and_then(unsent)) {
                (Some(before), Some(now)) => now < before,
                _ => false,
            };
            if self.blocked.load(Ordering::Relaxed) && !wrote && !drained {
                break;
            }
        }
        if let Some(socket) = self.socket {
            reset_on_close(socket);
        }
    }
}

impl crate::http::CloseConnection for Stall {
    fn close(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
        self.filled.wake();
    }
}

/// Bytes the kernel holds for the socket that the peer has not acknowledged.
#[cfg(target_os = "linux")]
fn unsent(socket: RawFd) -> Option<usize> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int through the pointer; `socket` is open for as
    // long as its connection is being served, which is when this runs.
    let done = unsafe { libc::ioctl(socket, libc::TIOCOUTQ, &mut bytes) };
    (done == 0).then(|| usize::try_from(bytes).unwrap_or(0))
}

#[cfg(not(target_os = "linux"))]
fn unsent(_: RawFd) -> Option<usize> {
    None
}

/// Makes closing the socket send a reset and drop its unsent data.
fn reset_on_close(socket: RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: SO_LINGER reads one `linger` from the pointer, of the length given; `socket` is
    // open (see `unsent`).
    unsafe {
        libc::setsockopt(
            socket,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_ref(&linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// A socket that reports whether its writes get through, and holds its connection slot.
pub struct Watched<IO> {
    io: IO,
    stall: Arc<Stall>,
    /// The last write found the socket full: [`Stall`]'s flag, kept here too so that a write
    /// to a socket that is not full touches nothing else.
    blocked: bool,
    _slot: OwnedSemaphorePermit,
}

impl<IO> Watched<IO> {
    /// `socket` is the TCP socket under `io`, when there is one.
    pub fn new(io: IO, socket: Option<RawFd>, slot: OwnedSemaphorePermit) -> (Self, Arc<Stall>) {
        let stall = Arc::new(Stall {
            socket,
            ..Stall::default()
        });
        let watched = Watched {
            io,
            stall: stall.clone(),
            blocked: false,
            _slot: slot,
        };
        (watched, stall)
    }

    fn observe<T>(&mut self, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        let blocked = poll.is_pending();
        if blocked != self.blocked {
            self.blocked = blocked;
            if blocked {
                self.stall.full();
            } else {
                self.stall.unblocked();
            }
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
        let (mut watched, stall) = Watched::new(near, None, slot());
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
        let (mut watched, stall) = Watched::new(near, None, slot());
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
        let (watched, _stall) =
            Watched::new(near, None, slots.clone().try_acquire_owned().unwrap());
        assert_eq!(slots.available_permits(), 0);
        drop(watched);
        assert_eq!(slots.available_permits(), 1);
    }
}
