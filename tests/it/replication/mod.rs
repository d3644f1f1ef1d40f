//! StreamLD replication end to end, between real servers: an upstream and mirrors of its buckets
//! or single streams, and raw replicas speaking the WebSocket protocol. The helpers here start
//! the pair, and read and compare what upstream and mirror serve.

mod downtime;
mod live;
mod readiness;
mod refusals;
mod session;
mod sse_binding;

use std::time::Duration;

use crate::common::{Client, Server, header};

const BUCKET: &str = "mirrored";

/// The path of the bucket's stream `name`.
fn stream(name: &str) -> String {
    format!("/{BUCKET}/{name}")
}

/// A client of `upstream`, once it made the bucket the tests mirror.
async fn with_bucket(upstream: &Server) -> Client {
    let http = Client::new(upstream);
    let response = http.create_bucket(BUCKET).await;
    assert_eq!(response.status(), 201);
    http
}

/// A mirror of the upstream's bucket that keeps its copy in memory.
fn bucket_mirror(upstream: &Server) -> Server {
    let source = upstream.url(&format!("/{BUCKET}"));
    Server::start(&["--memory", "--mirror-from", &source])
}

async fn append(http: &Client, path: &str, content_type: &str, body: impl Into<reqwest::Body>) {
    let response = http.append(path, content_type, body).await;
    assert!(
        response.status().is_success(),
        "append to {path}: {}",
        response.status()
    );
}

/// Everything a reader sees of a stream: HEAD's tail and first record, and the content.
async fn view(http: &Client, path: &str) -> (String, Option<String>, Vec<u8>) {
    let seen = try_view(http, path).await;
    seen.unwrap_or_else(|status| panic!("read {path}: {status}"))
}

/// [`view`], or the status of a read that failed: a mirror rebuilding a stream after a gap swaps
/// in a copy that starts later, so a read that began on the old copy may find its offset gone.
async fn try_view(
    http: &Client,
    path: &str,
) -> Result<(String, Option<String>, Vec<u8>), reqwest::StatusCode> {
    let head = http.head(path).await;
    let tail = header(&head, "stream-next-offset")
        .unwrap_or_default()
        .to_string();
    let first = header(&head, "stream-record-first").map(str::to_string);
    let body = http.read_chunks(path).await?.concat();
    Ok((tail, first, body))
}

async fn wait_until_mirrored(upstream: &Client, mirror: &Client, streams: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut same = true;
        for name in streams {
            let up = view(upstream, &stream(name)).await;
            let head = mirror.head(&stream(name)).await;
            if head.status() != 200 || try_view(mirror, &stream(name)).await != Ok(up) {
                same = false;
            }
        }
        if same {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "mirror did not catch up within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An S2 read of every record of a stream of the bucket, as JSON text (names may hold `/`, which
/// the bucketed Durable Streams surface does not address).
async fn s2_records(http: &Client, stream: &str) -> (u16, String) {
    let name = stream.replace('/', "%2F");
    let response = http.s2_read(BUCKET, &name, "seq_num=0").await;
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Waits (up to 30 s) until `path` answers HEAD with `status`.
async fn wait_for_status(http: &Client, path: &str, status: u16) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = http.head(path).await.status();
        if now == status {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} still answers {now}, not {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The URL a `Link` header value gives for `rel` (a StreamLD binding's relation suffix).
fn link_target(links: &str, rel: &str) -> Option<String> {
    links
        .split(',')
        .find(|l| l.contains(&format!("streamld#{rel}")))
        .and_then(|l| {
            l.split_once('<')?
                .1
                .split_once('>')
                .map(|(u, _)| u.to_string())
        })
}
