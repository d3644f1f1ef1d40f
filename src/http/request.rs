//! Reading HTTP requests: header values, query parameters and bodies, each with a clear 4xx.

use axum::body::Body;
use axum::http::header::AsHeaderName;
use axum::http::{HeaderMap, StatusCode};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt as _;

/// A request that cannot be served as sent: its status, a short reason for the client, and the
/// part of the request at fault (S2's error codes name it).
#[derive(Debug)]
pub struct Rejection {
    pub status: StatusCode,
    pub reason: String,
    pub part: Part,
}

/// Where in a request a [`Rejection`] found the fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Header,
    Query,
    Body,
    Other,
}

impl Rejection {
    pub fn bad_request(reason: impl Into<String>) -> Self {
        Rejection::bad(Part::Other, reason)
    }

    /// 413: the body is larger than the server takes.
    pub fn too_large(reason: impl Into<String>) -> Self {
        Rejection {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            reason: reason.into(),
            part: Part::Body,
        }
    }

    /// 408: the body stopped arriving.
    fn stalled(idle: std::time::Duration) -> Self {
        Rejection {
            status: StatusCode::REQUEST_TIMEOUT,
            reason: format!(
                "the request body stalled: no bytes for {} s",
                idle.as_secs_f64()
            ),
            part: Part::Body,
        }
    }

    fn bad(part: Part, reason: impl Into<String>) -> Self {
        Rejection {
            status: StatusCode::BAD_REQUEST,
            reason: reason.into(),
            part,
        }
    }
}

/// The value of a header sent at most once, as visible ASCII text.
pub fn header<N>(headers: &HeaderMap, name: N) -> Result<Option<&str>, Rejection>
where
    N: AsHeaderName + Copy + std::fmt::Display,
{
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::bad(
            Part::Header,
            format!("{name} must be sent at most once"),
        ));
    }
    value
        .to_str()
        .map(|v| Some(v.trim()))
        .map_err(|_| Rejection::bad(Part::Header, format!("{name} must be visible ASCII text")))
}

/// Query parameters by name; a parameter may appear at most once.
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    pub fn parse(raw: Option<&str>) -> Query {
        let pairs = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Query { pairs }
    }

    pub fn get(&self, name: &str) -> Result<Option<&str>, Rejection> {
        let mut values = self
            .pairs
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str());
        let first = values.next();
        if values.next().is_some() {
            return Err(Rejection::bad(
                Part::Query,
                format!("query parameter {name} must appear at most once"),
            ));
        }
        Ok(first)
    }
}

/// How much of a request body the server takes, and how long it waits for the next bytes.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    pub max_bytes: usize,
    /// A body that sends nothing for this long is cut off with 408, so a client that stalls
    /// mid-body does not hold its connection (and a connection slot) open.
    pub idle: std::time::Duration,
}

impl BodyLimits {
    /// The same limits, with the size limit lowered to `max_bytes` if it is higher: a route's
    /// own bound never lifts the server's.
    pub fn at_most(self, max_bytes: usize) -> BodyLimits {
        BodyLimits {
            max_bytes: self.max_bytes.min(max_bytes),
            ..self
        }
    }
}

/// Reads the whole body, refusing more than `limits.max_bytes` with 413 and a stalled body with
/// 408.
pub async fn body(headers: &HeaderMap, body: Body, limits: BodyLimits) -> Result<Bytes, Rejection> {
    let limit = limits.max_bytes;
    let too_large =
        || Rejection::too_large(format!("request body exceeds the limit of {limit} bytes"));
    let declared = header(headers, &axum::http::header::CONTENT_LENGTH)?
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| Rejection::bad(Part::Header, "Content-Length must be an integer"))
        })
        .transpose()?;
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    let expected = declared
        .and_then(|len| usize::try_from(len).ok())
        .unwrap_or(0);
    read_to_end(body, limits, expected)
        .await?
        .ok_or_else(too_large)
}

/// The body's bytes, or `None` once they pass `limit`. A body that arrives as one frame (every
/// small append) is taken as it is, without the frame queue a general collector allocates; one
/// in several frames is joined into a buffer of the `expected` size (its Content-Length).
async fn read_to_end(
    mut body: Body,
    limits: BodyLimits,
    expected: usize,
) -> Result<Option<Bytes>, Rejection> {
    let limit = limits.max_bytes;
    let mut whole = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    loop {
        let next = tokio::time::timeout(limits.idle, body.frame())
            .await
            .map_err(|_| Rejection::stalled(limits.idle))?;
        let Some(frame) = next else { break };
        let frame = frame.map_err(|e| {
            Rejection::bad(Part::Body, format!("could not read the request body: {e}"))
        })?;
        // Trailers carry no body bytes.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let so_far = joined.as_ref().map_or(whole.len(), BytesMut::len);
        if so_far + data.len() > limit {
            return Ok(None);
        }
        match &mut joined {
            Some(buf) => buf.extend_from_slice(&data),
            None if whole.is_empty() => whole = data,
            None => {
                let so_far = whole.len() + data.len();
                let capacity = if expected >= so_far {
                    expected
                } else {
                    2 * so_far
                };
                let mut buf = BytesMut::with_capacity(capacity);
                buf.extend_from_slice(&whole);
                buf.extend_from_slice(&data);
                joined = Some(buf);
            }
        }
    }
    Ok(Some(match joined {
        // A body without a Content-Length may leave the buffer half empty; the bytes kept (in
        // the tail cache, say) should not hold on to that.
        Some(buf) if buf.capacity() - buf.len() > buf.len() / 4 => Bytes::copy_from_slice(&buf),
        Some(buf) => buf.freeze(),
        None => owned(whole),
    }))
}

/// Bodies below this size get their own allocation.
const SMALL_BODY: usize = 16 * 1024;

/// A small body arrives as a slice of the connection's read buffer; kept as it is (in the hot
/// tail cache, say), it would pin that whole buffer. Copying a few hundred bytes once is far
/// cheaper than the memory it frees.
fn owned(bytes: Bytes) -> Bytes {
    if bytes.len() < SMALL_BODY {
        Bytes::copy_from_slice(&bytes)
    } else {
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up_to(max_bytes: usize) -> BodyLimits {
        BodyLimits {
            max_bytes,
            idle: std::time::Duration::from_secs(30),
        }
    }

    fn chunked(parts: &[&'static [u8]]) -> Body {
        let frames = parts
            .iter()
            .map(|p| Ok::<_, std::io::Error>(Bytes::from_static(p)));
        Body::from_stream(futures::stream::iter(frames.collect::<Vec<_>>()))
    }

    #[tokio::test]
    async fn a_body_in_several_frames_is_read_whole_and_in_order() {
        let body = read_to_end(chunked(&[b"ab", b"", b"cde", b"f"]), up_to(6), 0).await;
        assert_eq!(body.unwrap(), Some(Bytes::from_static(b"abcdef")));
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_refused_in_any_frame() {
        assert_eq!(
            read_to_end(chunked(&[b"abcdefg"]), up_to(6), 0)
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            read_to_end(chunked(&[b"abc", b"defg"]), up_to(6), 0)
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            read_to_end(chunked(&[b"ab", b"cd", b"efg"]), up_to(6), 0)
                .await
                .unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn a_joined_body_keeps_no_more_memory_than_it_needs() {
        let unknown = read_to_end(chunked(&[b"abc", b"def"]), up_to(1 << 20), 0).await;
        let known = read_to_end(chunked(&[b"abc", b"def"]), up_to(1 << 20), 6).await;
        for body in [unknown.unwrap().unwrap(), known.unwrap().unwrap()] {
            assert_eq!(body, Bytes::from_static(b"abcdef"));
            let kept = BytesMut::from(body).capacity();
            assert!(kept <= 6 + 6 / 4, "{kept} bytes kept for 6");
        }
    }

    #[tokio::test]
    async fn an_empty_body_reads_as_empty() {
        assert_eq!(
            read_to_end(Body::empty(), up_to(6), 0).await.unwrap(),
            Some(Bytes::new())
        );
    }

    #[tokio::test]
    async fn a_small_body_does_not_keep_its_frame_alive() {
        let frame = Bytes::from(vec![7u8; 64 * 1024]);
        let small = frame.slice(..100);
        let body = Body::from(small);
        let read = read_to_end(body, up_to(1 << 20), 100)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.len(), 100);
        assert!(
            !std::ptr::eq(read.as_ptr(), frame.as_ptr()),
            "copied out of the frame"
        );
    }

    #[tokio::test]
    async fn a_broken_body_is_a_bad_request() {
        let frames = vec![
            Ok(Bytes::from_static(b"ab")),
            Err(std::io::Error::other("reset")),
        ];
        let body = Body::from_stream(futures::stream::iter(frames));
        let refusal = read_to_end(body, up_to(6), 0).await.unwrap_err();
        assert_eq!(refusal.status, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn a_body_that_stops_arriving_is_cut_off_after_its_idle_time() {
        use futures::StreamExt as _;
        let first = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"abc"))]);
        let body = Body::from_stream(first.chain(futures::stream::pending()));
        let limits = BodyLimits {
            max_bytes: 100,
            idle: std::time::Duration::from_millis(50),
        };
        let refusal = read_to_end(body, limits, 100).await.unwrap_err();
        assert_eq!(refusal.status, StatusCode::REQUEST_TIMEOUT);
        assert!(refusal.reason.contains("stalled"), "{}", refusal.reason);
    }
}
