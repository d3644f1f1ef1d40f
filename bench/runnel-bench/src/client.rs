//! A minimal keep-alive HTTP/1.1 (or, with `--http2`, h2c) client: one TCP connection per caller,
//! one request in flight.
//!
//! Each closed-loop worker owns a `Conn`, so "one request in flight per stream" is exact and no
//! pool or lock sits between the worker and its socket. A failed connection is re-dialled on the
//! next request.

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::Arc;
use tokio::net::TcpStream;

/// Where the load goes: `http://host:port[/prefix]`.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: String,
    pub authority: HeaderValue,
    pub prefix: String,
    /// Speak HTTP/2 with prior knowledge (h2c) rather than HTTP/1.1.
    pub http2: bool,
}

impl Target {
    pub fn parse(url: &str, http2: bool) -> Result<Arc<Target>> {
        let uri: Uri = url.parse().with_context(|| format!("bad --target {url}"))?;
        if uri.scheme_str() != Some("http") {
            bail!("--target must be an http:// URL");
        }
        let auth = uri
            .authority()
            .ok_or_else(|| anyhow!("--target needs host:port"))?;
        let port = auth.port_u16().unwrap_or(80);
        let host = auth.host().trim_start_matches('[').trim_end_matches(']');
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(Arc::new(Target {
            addr,
            authority: HeaderValue::from_str(auth.as_str())?,
            prefix,
            http2,
        }))
    }

    /// `prefix + path`, where `path` starts with `/`.
    pub fn path(&self, path: &str) -> String {
        format!("{}{}", self.prefix, path)
    }
}

pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// One keep-alive connection.
pub struct Conn {
    target: Arc<Target>,
    sender: Option<Sender>,
}

enum Sender {
    Http1(http1::SendRequest<Full<Bytes>>),
    Http2(http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    fn is_closed(&self) -> bool {
        match self {
            Sender::Http1(s) => s.is_closed(),
            Sender::Http2(s) => s.is_closed(),
        }
    }

    async fn ready(&mut self) -> hyper::Result<()> {
        match self {
            Sender::Http1(s) => s.ready().await,
            Sender::Http2(s) => s.ready().await,
        }
    }

    async fn send_request(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> hyper::Result<hyper::Response<Incoming>> {
        match self {
            Sender::Http1(s) => s.send_request(req).await,
            Sender::Http2(s) => s.send_request(req).await,
        }
    }
}

impl Conn {
    pub fn new(target: Arc<Target>) -> Conn {
        Conn {
            target,
            sender: None,
        }
    }

    async fn dial(&mut self) -> Result<&mut Sender> {
        if self.sender.as_ref().is_some_and(|s| s.is_closed()) {
            self.sender = None;
        }
        if self.sender.is_none() {
            let tcp = TcpStream::connect(&self.target.addr)
                .await
                .with_context(|| format!("connect {}", self.target.addr))?;
            tcp.set_nodelay(true)?;
            let io = TokioIo::new(tcp);
            self.sender = Some(if self.target.http2 {
                let (sender, conn) = http2::handshake(TokioExecutor::new(), io).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Sender::Http2(sender)
            } else {
                let (sender, conn) = http1::handshake(io).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Sender::Http1(sender)
            });
        }
        if self.sender.as_mut().unwrap().ready().await.is_err() {
            self.sender = None;
            bail!("connection closed");
        }
        Ok(self.sender.as_mut().unwrap())
    }

    /// Build a request for `path` (already prefixed) with `headers` and `body`.
    pub fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Request<Full<Bytes>> {
        // HTTP/2 carries the scheme and authority in the request line's place.
        let uri = if self.target.http2 {
            format!("http://{}{path}", self.target.addr)
        } else {
            path.to_string()
        };
        let mut req = Request::builder().method(method).uri(uri);
        let h = req.headers_mut().unwrap();
        h.insert(header::HOST, self.target.authority.clone());
        for (k, v) in headers {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("header name"),
                HeaderValue::from_str(v).expect("header value"),
            );
        }
        req.body(Full::new(body)).expect("request")
    }

    /// Send and read the whole response body.
    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<Response> {
        let resp = self.send_streaming(req).await?;
        let (parts, body) = resp.into_parts();
        let body = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                self.sender = None;
                return Err(e.into());
            }
        };
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// Send and count the response body's bytes as they arrive, keeping none of them (the
    /// returned body is empty): how a catch-up reader handles a large body, piece by piece,
    /// rather than gathering it into one buffer first.
    pub async fn send_counting(&mut self, req: Request<Full<Bytes>>) -> Result<(Response, u64)> {
        let resp = self.send_streaming(req).await?;
        let (parts, mut body) = resp.into_parts();
        let mut len = 0u64;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => len += frame.data_ref().map_or(0, |d| d.len() as u64),
                Err(e) => {
                    self.sender = None;
                    return Err(e.into());
                }
            }
        }
        let resp = Response {
            status: parts.status,
            headers: parts.headers,
            body: Bytes::new(),
        };
        Ok((resp, len))
    }

    /// Send and hand back the response with its body still streaming (for SSE).
    pub async fn send_streaming(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<Incoming>> {
        let sender = self.dial().await?;
        match sender.send_request(req).await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.sender = None;
                Err(e.into())
            }
        }
    }

    /// Convenience: method + path + headers + body, whole response.
    pub async fn call(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Response> {
        let req = self.request(method, path, headers, body);
        self.send(req).await
    }
}

/// Incremental `text/event-stream` parser: feed bytes, get each complete event once.
///
/// It allocates nothing per event: in `fanout` the client reads every delivery to 1,000
/// subscribers on one core, and its own time per delivery adds to the latency it measures.
#[derive(Default)]
pub struct SseParser {
    /// The start of an event that has not ended yet.
    partial: Vec<u8>,
}

/// One event: its lines, borrowed from the parser's input.
pub struct SseEvent<'a> {
    block: &'a [u8],
}

impl SseEvent<'_> {
    fn lines(&self) -> impl Iterator<Item = &[u8]> {
        self.block
            .split(|&b| b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
    }
    /// The `event:` field, trimmed; empty when there is none.
    pub fn name(&self) -> &[u8] {
        self.lines()
            .filter_map(|line| line.strip_prefix(b"event:"))
            .last()
            .map(|v| v.trim_ascii())
            .unwrap_or_default()
    }
    /// The `data:` lines, each without the field name and one optional leading space.
    pub fn data(&self) -> impl Iterator<Item = &[u8]> {
        self.lines()
            .filter_map(|line| line.strip_prefix(b"data:"))
            .map(|rest| rest.strip_prefix(b" ").unwrap_or(rest))
    }
}

impl SseParser {
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(SseEvent<'_>)) {
        if self.partial.is_empty() {
            let used = each_event(chunk, &mut on_event);
            self.partial.extend_from_slice(&chunk[used..]);
        } else {
            self.partial.extend_from_slice(chunk);
            let used = each_event(&self.partial, &mut on_event);
            self.partial.drain(..used);
        }
    }
}

/// Calls `on_event` for each complete event at the start of `bytes`; returns the bytes used.
fn each_event(bytes: &[u8], on_event: &mut impl FnMut(SseEvent<'_>)) -> usize {
    let mut used = 0;
    while let Some(end) = find_blank_line(&bytes[used..]) {
        on_event(SseEvent {
            block: &bytes[used..used + end],
        });
        used += end + 2;
    }
    used
}

fn find_blank_line(b: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = b[from..].iter().position(|&c| c == b'\n') {
        let at = from + at;
        if b.get(at + 1) == Some(&b'\n') {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_across_chunks() {
        let mut p = SseParser::default();
        let mut out: Vec<(Vec<u8>, Vec<Vec<u8>>)> = Vec::new();
        let mut take = |ev: SseEvent<'_>| {
            out.push((ev.name().to_vec(), ev.data().map(<[u8]>::to_vec).collect()))
        };
        p.feed(b"event: data\ndata:12 a\nda", &mut take);
        p.feed(
            b"ta:34 b\n\nevent: control\ndata: {}\n\nevent: da",
            &mut take,
        );
        p.feed(b"ta\ndata: x\n\n", &mut take);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].0, b"data");
        assert_eq!(out[0].1, vec![b"12 a".to_vec(), b"34 b".to_vec()]);
        assert_eq!(out[1].0, b"control");
        assert_eq!(out[1].1, vec![b"{}".to_vec()]);
        assert_eq!(out[2].1, vec![b"x".to_vec()]);
    }

    #[test]
    fn sse_events_whole_in_one_chunk_leave_nothing_behind() {
        let mut p = SseParser::default();
        let mut n = 0;
        p.feed(
            b"event: data\ndata: a\n\nevent: control\ndata: {}\n\n",
            |_| n += 1,
        );
        assert_eq!(n, 2);
        assert!(p.partial.is_empty());
    }

    #[test]
    fn target_with_prefix() {
        let t = Target::parse("http://127.0.0.1:8080/pre/", false).unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080");
        assert_eq!(t.path("/v1/stream/x"), "/pre/v1/stream/x");
    }
}
