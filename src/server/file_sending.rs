//! Sockets that send file-backed buffers (see `storage::file_bytes`) from their files.
//!
//! hyper writes a response as a list of buffers. Where one lies in a file-backed buffer, the
//! socket is handed the file's pages (`sendfile`) rather than a copy of its bytes; the others are
//! written as before. Over TLS nothing changes: the socket is only ever given ciphertext.

use std::io;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use crate::storage::file_bytes::{self, FileSpan};

/// Spans shorter than this are copied like any other buffer: they cost less to copy than
/// another system call. It is above HTTP/2's usual frame size (16 KiB), where each frame would
/// take a `sendfile` of its own and one more write for the frame's header.
const SEND_FROM_FILE_AT: usize = 64 * 1024;

/// A TCP connection that sends file-backed buffers from their files.
pub struct FileSending {
    tcp: TcpStream,
    /// False under TLS, which gives the socket only ciphertext: nothing to look up.
    sends_files: bool,
}

impl FileSending {
    pub fn new(tcp: TcpStream) -> FileSending {
        FileSending {
            tcp,
            sends_files: true,
        }
    }

    /// A connection that writes only what it is given (for TLS).
    pub fn plain(tcp: TcpStream) -> FileSending {
        FileSending {
            tcp,
            sends_files: false,
        }
    }
}

/// Where each of `bufs` lies in a file, when at least one does.
fn file_spans(bufs: &[IoSlice<'_>]) -> Option<Vec<Option<FileSpan>>> {
    let mut spans: Option<Vec<Option<FileSpan>>> = None;
    for (i, buf) in bufs.iter().enumerate() {
        if buf.len() < SEND_FROM_FILE_AT {
            continue;
        }
        if let Some(span) = file_bytes::span_of(buf) {
            spans.get_or_insert_with(|| bufs.iter().map(|_| None).collect())[i] = Some(span);
        }
    }
    spans
}

/// Sends `bufs` in order, each with a span from its file and the others as they are, until
/// the socket takes no more; how many bytes went.
#[cfg(target_os = "linux")]
fn send(tcp: &TcpStream, bufs: &[IoSlice<'_>], spans: &[Option<FileSpan>]) -> io::Result<usize> {
    use rustix::io::Errno;
    use rustix::net::{SendAncillaryBuffer, SendFlags};

    let mut sent = 0;
    let mut i = 0;
    while i < bufs.len() {
        let (done, wanted) = match &spans[i] {
            Some(span) => {
                let mut offset = span.offset;
                let len = bufs[i].len();
                i += 1;
                let done = retry_interrupted(|| {
                    rustix::fs::sendfile(tcp, &*span.file, Some(&mut offset), len)
                });
                (done, len)
            }
            None => {
                let end = (i..bufs.len())
                    .find(|j| spans[*j].is_some())
                    .unwrap_or(bufs.len());
                let run = &bufs[i..end];
                i = end;
                // Held back while a span from a file follows, so the two leave as one segment.
                let flags = if end < bufs.len() {
                    SendFlags::NOSIGNAL | SendFlags::MORE
                } else {
                    SendFlags::NOSIGNAL
                };
                let done = retry_interrupted(|| {
                    rustix::net::sendmsg(tcp, run, &mut SendAncillaryBuffer::default(), flags)
                });
                (done, run.iter().map(|b| b.len()).sum())
            }
        };
        match done {
            Ok(n) => {
                sent += n;
                if n < wanted {
                    return Ok(sent);
                }
            }
            Err(Errno::WOULDBLOCK) if sent > 0 => return Ok(sent),
            Err(errno) => return Err(errno.into()),
        }
    }
    Ok(sent)
}

#[cfg(target_os = "linux")]
fn retry_interrupted(
    mut call: impl FnMut() -> rustix::io::Result<usize>,
) -> rustix::io::Result<usize> {
    loop {
        match call() {
            Err(rustix::io::Errno::INTR) => continue,
            done => return done,
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn send(_: &TcpStream, _: &[IoSlice<'_>], _: &[Option<FileSpan>]) -> io::Result<usize> {
    unreachable!("only Linux makes file-backed buffers")
}

impl AsyncRead for FileSending {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for FileSending {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let Some(spans) = self.sends_files.then(|| file_spans(bufs)).flatten() else {
            return Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
        };
        loop {
            ready!(self.tcp.poll_write_ready(cx))?;
            match self
                .tcp
                .try_io(Interest::WRITABLE, || send(&self.tcp, bufs, &spans))
            {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (FileSending, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap());
        let (near, far) = tokio::join!(near, listener.accept());
        (FileSending::new(near.unwrap()), far.unwrap().0)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[tokio::test]
    async fn heap_and_file_backed_buffers_arrive_whole_and_in_order() {
        let (mut near, mut far) = pair().await;
        let file_backed = file_bytes::in_memory_file([&pattern(3 << 20, 1)[..]]).unwrap();
        let head = pattern(300, 2);
        let middle = pattern(40_000, 3);
        let tail = pattern(7, 4);
        let mut expected = head.clone();
        expected.extend_from_slice(&file_backed[1000..]);
        expected.extend_from_slice(&middle);
        expected.extend_from_slice(&file_backed[..SEND_FROM_FILE_AT]);
        expected.extend_from_slice(&tail);
        let total = expected.len();
        let reader = tokio::spawn(async move {
            let mut got = vec![0; total];
            far.read_exact(&mut got).await.unwrap();
            got
        });
        // As hyper writes: the same list again from wherever the last write stopped.
        let parts: Vec<&[u8]> = vec![
            &head,
            &file_backed[1000..],
            &middle,
            &file_backed[..SEND_FROM_FILE_AT],
            &tail,
        ];
        let mut done = 0;
        while done < total {
            let mut skip = done;
            let mut slices = Vec::new();
            for part in &parts {
                if skip >= part.len() {
                    skip -= part.len();
                    continue;
                }
                slices.push(IoSlice::new(&part[skip..]));
                skip = 0;
            }
            done += near.write_vectored(&slices).await.unwrap();
        }
        assert_eq!(reader.await.unwrap(), expected);
    }

    #[tokio::test]
    async fn a_span_sent_from_its_file_is_found_there() {
        let body = file_bytes::in_memory_file([&pattern(1 << 20, 5)[..]]).unwrap();
        let slices = [IoSlice::new(b"head"), IoSlice::new(&body[10..])];
        let spans = file_spans(&slices).expect("the body is file-backed");
        assert!(spans[0].is_none());
        assert_eq!(spans[1].as_ref().map(|s| s.offset), Some(10));
        let heap = pattern(1 << 20, 6);
        assert!(file_spans(&[IoSlice::new(&heap)]).is_none());
    }
}
