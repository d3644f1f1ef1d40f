//! The three wire faces the client can drive: Durable Streams at `/v1/stream/{name}`, the
//! bucketed surface at `/{bucket}/{name}`, and S2 records at `/v1/streams/{name}/records`.

use crate::client::{Conn, Target};
use anyhow::{Result, bail};
use bytes::Bytes;
use clap::ValueEnum;
use http::{Method, Request};
use http_body_util::Full;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Api {
    /// Durable Streams base protocol, `/v1/stream/{name}`.
    Ds,
    /// Runnel's bucketed surface, `/{bucket}/{name}` (append-batch, bootstrap).
    Bucket,
    /// S2 records API, `/v1/streams/{name}/records` with `s2-basin`.
    S2,
    /// The bucketed surface, read live through its StreamLD SSE binding
    /// (`/{bucket}/{name}/streamld`).
    Streamld,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::Ds => "ds",
            Api::Bucket => "bucket",
            Api::S2 => "s2",
            Api::Streamld => "streamld",
        }
    }
}

pub struct Ctx {
    pub target: Arc<Target>,
    pub api: Api,
    /// Bucket (bucket face) or basin (S2 face).
    pub bucket: String,
}

/// Statuses that mean "done" for a create: created, already there.
fn create_ok(status: u16) -> bool {
    matches!(status, 200 | 201 | 204 | 409)
}

impl Ctx {
    /// The stream's URL path (prefixed).
    pub fn stream_path(&self, name: &str) -> String {
        match self.api {
            Api::Ds => self.target.path(&format!("/v1/stream/{name}")),
            Api::Bucket | Api::Streamld => self.target.path(&format!("/{}/{name}", self.bucket)),
            Api::S2 => self.target.path(&format!("/v1/streams/{name}/records")),
        }
    }

    /// Once per run: the bucket or the basin.
    pub async fn setup(&self, conn: &mut Conn) -> Result<()> {
        match self.api {
            Api::Ds => Ok(()),
            Api::Bucket | Api::Streamld => {
                let path = self.target.path(&format!("/{}", self.bucket));
                let r = conn.call(Method::PUT, &path, &[], Bytes::new()).await?;
                if !create_ok(r.status.as_u16()) {
                    bail!(
                        "PUT bucket {path}: {} {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    );
                }
                Ok(())
            }
            Api::S2 => {
                let path = self.target.path("/v1/basins");
                let body = format!(r#"{{"basin":"{}"}}"#, self.bucket);
                let r = conn
                    .call(
                        Method::POST,
                        &path,
                        &[("content-type", "application/json")],
                        body.into(),
                    )
                    .await?;
                if !create_ok(r.status.as_u16()) {
                    bail!(
                        "create basin: {} {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    );
                }
                // A basin may take a moment to become active; wait until a stream list answers.
                for _ in 0..100 {
                    let r = conn
                        .call(
                            Method::GET,
                            &self.target.path("/v1/streams"),
                            &[("s2-basin", &self.bucket)],
                            Bytes::new(),
                        )
                        .await?;
                    if r.status.is_success() {
                        return Ok(());
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                bail!("basin {} never became ready", self.bucket)
            }
        }
    }

    /// Create one stream with `content_type` (ignored by S2, whose streams are bytes).
    pub async fn create_stream(
        &self,
        conn: &mut Conn,
        name: &str,
        content_type: &str,
    ) -> Result<()> {
        let r = match self.api {
            Api::Ds | Api::Bucket | Api::Streamld => {
                conn.call(
                    Method::PUT,
                    &self.stream_path(name),
                    &[("content-type", content_type)],
                    Bytes::new(),
                )
                .await?
            }
            Api::S2 => {
                let body = format!(r#"{{"stream":"{name}"}}"#);
                conn.call(
                    Method::POST,
                    &self.target.path("/v1/streams"),
                    &[
                        ("content-type", "application/json"),
                        ("s2-basin", &self.bucket),
                    ],
                    body.into(),
                )
                .await?
            }
        };
        if !create_ok(r.status.as_u16()) {
            bail!(
                "create stream {name}: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            );
        }
        Ok(())
    }

    /// One append of `payload` (plain bytes for DS; one record whose body is `payload`, which must
    /// be JSON-safe ASCII, for S2). `producer` = (id, seq) adds the idempotent-producer headers.
    pub fn append_req(
        &self,
        conn: &Conn,
        name: &str,
        content_type: &str,
        payload: &[u8],
        producer: Option<(&str, u64)>,
    ) -> Request<Full<Bytes>> {
        match self.api {
            Api::Ds | Api::Bucket | Api::Streamld => {
                let seq;
                let mut headers: Vec<(&str, &str)> = vec![("content-type", content_type)];
                if let Some((id, s)) = producer {
                    seq = s.to_string();
                    headers.push(("producer-id", id));
                    headers.push(("producer-epoch", "0"));
                    headers.push(("producer-seq", &seq));
                }
                conn.request(
                    Method::POST,
                    &self.stream_path(name),
                    &headers,
                    Bytes::copy_from_slice(payload),
                )
            }
            Api::S2 => {
                let body = s2_records_body(std::iter::once(payload));
                conn.request(
                    Method::POST,
                    &self.stream_path(name),
                    &[
                        ("content-type", "application/json"),
                        ("s2-basin", &self.bucket),
                    ],
                    body,
                )
            }
        }
    }

    /// A live SSE read from the tail (`offset` = None) or from a DS offset (for StreamLD: from
    /// the start, or after the last event id seen).
    pub fn sse_req(&self, conn: &Conn, name: &str, offset: Option<&str>) -> Request<Full<Bytes>> {
        match self.api {
            Api::Streamld => {
                let path = format!("{}/streamld", self.stream_path(name));
                let mut headers = vec![("accept", "text/event-stream")];
                if let Some(id) = offset {
                    headers.push(("last-event-id", id));
                }
                conn.request(Method::GET, &path, &headers, Bytes::new())
            }
            Api::Ds | Api::Bucket => {
                let path = format!(
                    "{}?offset={}&live=sse",
                    self.stream_path(name),
                    offset.unwrap_or("now")
                );
                conn.request(
                    Method::GET,
                    &path,
                    &[("accept", "text/event-stream")],
                    Bytes::new(),
                )
            }
            Api::S2 => conn.request(
                Method::GET,
                &self.stream_path(name),
                &[("accept", "text/event-stream"), ("s2-basin", &self.bucket)],
                Bytes::new(),
            ),
        }
    }
}

/// `{"records":[{"body":"…"},…]}`; bodies must be JSON-safe ASCII (they are, see `payload`).
pub fn s2_records_body<'a>(bodies: impl Iterator<Item = &'a [u8]>) -> Bytes {
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(br#"{"records":["#);
    for (i, b) in bodies.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"body":""#);
        out.extend_from_slice(b);
        out.extend_from_slice(br#""}"#);
    }
    out.extend_from_slice(b"]}");
    out.into()
}

/// `len` bytes of lowercase letters, varied by `tag` so streams do not all carry the same bytes.
pub fn payload(len: usize, tag: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + ((i + tag) % 26) as u8).collect()
}

/// A payload whose first 20 bytes are `sent_ns` in decimal, then a space, padding, and (for
/// line-oriented DS text streams) a trailing newline so each append is one SSE `data:` line.
pub fn stamped_payload(len: usize, sent_ns: u64, newline: bool) -> Vec<u8> {
    let mut p = format!("{sent_ns:020} ").into_bytes();
    let want = len.max(22);
    let pad = want - p.len() - usize::from(newline);
    p.extend((0..pad).map(|i| b'a' + (i % 26) as u8));
    if newline {
        p.push(b'\n');
    }
    p
}

/// The send time at the start of a stamped payload.
pub fn parse_stamp(b: &[u8]) -> Option<u64> {
    if b.len() < 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in &b[..20] {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(c - b'0');
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip() {
        let p = stamped_payload(256, 123_456_789, true);
        assert_eq!(p.len(), 256);
        assert_eq!(*p.last().unwrap(), b'\n');
        assert_eq!(parse_stamp(&p), Some(123_456_789));
        assert_eq!(stamped_payload(64, 7, false).len(), 64);
    }

    #[test]
    fn s2_body_is_json() {
        let b = s2_records_body([b"ab".as_slice(), b"cd".as_slice()].into_iter());
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["records"][1]["body"], "cd");
    }
}
