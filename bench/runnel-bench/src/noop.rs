//! Floors: the least a server can do for each request, measured in the same run as the real
//! servers, with the same client.
//!
//! - Plain (`noop`): reads each request body and answers 204. This is the client's ceiling on
//!   this machine.
//! - Durable (`noop --sync-dir DIR`): the same, but each POST body is first appended to one file
//!   by one group-commit thread (write, `fsync`, then answer), as small as a durable server gets.
//!   It has none of a stream server's work: no streams, no producers, no index, no recovery.
//! - Both answer `GET …?live=sse` by holding the response open and sending every later POST body
//!   to every such subscriber as an SSE `data` event (after its `fsync` when durable): the floor
//!   of fan-out on this machine.

use anyhow::{Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, mpsc as std_mpsc};
use std::task::{Context as TaskContext, Poll};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

/// Events a subscriber may have queued before it counts as too slow and is dropped.
const SUBSCRIBER_QUEUE: usize = 1024;

struct Floor {
    log: Option<GroupLog>,
    subscribers: Mutex<Vec<mpsc::Sender<Bytes>>>,
}

/// One file, one thread: every body queued while the previous `fsync` ran goes into the next
/// write and shares its `fsync`. It does not linger for more.
struct GroupLog {
    queue: std_mpsc::Sender<(Bytes, oneshot::Sender<()>)>,
}

impl GroupLog {
    fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("noop.log");
        let mut file =
            File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let (queue, commits) = std_mpsc::channel::<(Bytes, oneshot::Sender<()>)>();
        std::thread::Builder::new()
            .name("noop-commit".into())
            .spawn(move || {
                let mut group = Vec::new();
                while let Ok(first) = commits.recv() {
                    group.push(first);
                    group.extend(commits.try_iter());
                    let mut buf = Vec::with_capacity(group.iter().map(|(b, _)| b.len()).sum());
                    for (body, _) in &group {
                        buf.extend_from_slice(body);
                    }
                    if let Err(e) = file.write_all(&buf).and_then(|()| file.sync_all()) {
                        eprintln!("noop: commit failed: {e}");
                        std::process::exit(1);
                    }
                    for (_, done) in group.drain(..) {
                        let _ = done.send(());
                    }
                }
            })?;
        Ok(GroupLog { queue })
    }

    async fn append(&self, body: Bytes) {
        let (done, committed) = oneshot::channel();
        if self.queue.send((body, done)).is_ok() {
            let _ = committed.await;
        }
    }
}

impl Floor {
    fn publish(&self, body: &[u8]) {
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        if subscribers.is_empty() {
            return;
        }
        let event = sse_data_event(body);
        subscribers.retain(|s| s.try_send(event.clone()).is_ok());
    }

    fn subscribe(&self) -> SseBody {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        SseBody { events: rx }
    }
}

/// `event: data`, then one `data:` line per line of the body.
fn sse_data_event(body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(body.len() + 32);
    out.put_slice(b"event: data\n");
    for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        out.put_slice(b"data: ");
        out.put_slice(line);
        out.put_u8(b'\n');
    }
    out.put_u8(b'\n');
    out.freeze()
}

/// A response body that is either empty or a live SSE stream.
enum FloorBody {
    Empty,
    Sse(SseBody),
}

struct SseBody {
    events: mpsc::Receiver<Bytes>,
}

impl Body for FloorBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            FloorBody::Empty => Poll::Ready(None),
            FloorBody::Sse(s) => s
                .events
                .poll_recv(cx)
                .map(|e| e.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, FloorBody::Empty)
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            FloorBody::Empty => SizeHint::with_exact(0),
            FloorBody::Sse(_) => SizeHint::default(),
        }
    }
}

async fn handle(
    floor: Arc<Floor>,
    req: Request<Incoming>,
) -> Result<Response<FloorBody>, Infallible> {
    let live_sse =
        req.method() == Method::GET && req.uri().query().is_some_and(|q| q.contains("live=sse"));
    if live_sse {
        let mut resp = Response::new(FloorBody::Sse(floor.subscribe()));
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/event-stream"),
        );
        return Ok(resp);
    }
    let is_append = req.method() == Method::POST;
    // Read the body whole so the connection stays reusable, as a real server would.
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    if is_append {
        if let Some(log) = &floor.log {
            log.append(body.clone()).await;
        }
        floor.publish(&body);
    }
    let mut resp = Response::new(FloorBody::Empty);
    *resp.status_mut() = StatusCode::NO_CONTENT;
    Ok(resp)
}

pub async fn serve(listen: &str, sync_dir: Option<&Path>) -> Result<()> {
    let floor = Arc::new(Floor {
        log: sync_dir.map(GroupLog::open).transpose()?,
        subscribers: Mutex::new(Vec::new()),
    });
    let listener = TcpListener::bind(listen).await?;
    println!("noop listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let floor = floor.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(floor.clone(), req));
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

/// Reads one connection to `addr` to its end; returns the bytes read and the time from
/// connecting to the end. Blocking: the floor's reader does nothing else.
pub fn drain(addr: &str) -> Result<(u64, std::time::Duration)> {
    use std::io::Read;
    let started = std::time::Instant::now();
    let mut socket =
        std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    let mut buf = Box::new(PageAligned([0; 128 << 10]));
    let mut total = 0u64;
    loop {
        match socket.read(&mut buf.0) {
            Ok(0) => return Ok((total, started.elapsed())),
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("reading"),
        }
    }
}

/// A read buffer that starts on a page boundary, as `cat`'s does: copies out of the socket
/// into a plain 128 KiB `Vec` (16 bytes past a page boundary) ran at half the rate here.
#[repr(C, align(4096))]
struct PageAligned([u8; 128 << 10]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sse_data_event_has_one_data_line_per_body_line() {
        let ev = sse_data_event(b"a b\ncd\n");
        assert_eq!(&ev[..], b"event: data\ndata: a b\ndata: cd\n\n");
    }
}
