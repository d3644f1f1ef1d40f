//! StreamLD replication end to end, between real servers: an upstream and mirrors of its buckets
//! or single streams, and raw replicas speaking the WebSocket protocol. The helpers here read
//! and compare what upstream and mirror serve.

mod downtime;
mod live;
mod refusals;
mod session;
mod sse_binding;

use std::time::Duration;

use crate::common::{Server, header};

const BUCKET: &str = "mirrored";

/// A client that reports redirects instead of following them.
fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn put(
    http: &reqwest::Client,
    url: &str,
    content_type: &str,
    body: &str,
) -> reqwest::Response {
    http.put(url)
        .header("content-type", content_type)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

async fn create_bucket(http: &reqwest::Client, server: &Server) {
    let response = http
        .put(server.url(&format!("/{BUCKET}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
}

async fn append(http: &reqwest::Client, url: &str, content_type: &str, body: &str) {
    let response = http
        .post(url)
        .header("content-type", content_type)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "append to {url}: {}",
        response.status()
    );
}

/// Everything a reader sees of a stream: HEAD's tail and first record, and the content.
async fn view(http: &reqwest::Client, url: &str) -> (String, Option<String>, Vec<u8>) {
    let seen = try_view(http, url).await;
    seen.unwrap_or_else(|status| panic!("read {url}: {status}"))
}

/// [`view`], or the status of a read that failed: a mirror rebuilding a stream after a gap swaps
/// in a copy that starts later, so a read that began on the old copy may find its offset gone.
async fn try_view(
    http: &reqwest::Client,
    url: &str,
) -> Result<(String, Option<String>, Vec<u8>), reqwest::StatusCode> {
    let head = http.head(url).send().await.unwrap();
    let tail = header(&head, "stream-next-offset")
        .unwrap_or_default()
        .to_string();
    let first = header(&head, "stream-record-first").map(str::to_string);
    let mut body = Vec::new();
    let mut offset = "-1".to_string();
    loop {
        let response = http
            .get(format!("{url}?offset={offset}"))
            .send()
            .await
            .unwrap();
        if response.status() != 200 {
            return Err(response.status());
        }
        let done = header(&response, "stream-up-to-date") == Some("true");
        offset = header(&response, "stream-next-offset").unwrap().to_string();
        body.extend_from_slice(&response.bytes().await.unwrap());
        if done {
            return Ok((tail, first, body));
        }
    }
}

async fn wait_until_mirrored(
    http: &reqwest::Client,
    upstream: &Server,
    mirror: &Server,
    streams: &[&str],
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut same = true;
        for stream in streams {
            let up = view(http, &upstream.url(&format!("/{BUCKET}/{stream}"))).await;
            let head = http
                .head(mirror.url(&format!("/{BUCKET}/{stream}")))
                .send()
                .await
                .unwrap();
            if head.status() != 200
                || try_view(http, &mirror.url(&format!("/{BUCKET}/{stream}"))).await != Ok(up)
            {
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
async fn s2_records(http: &reqwest::Client, server: &Server, stream: &str) -> (u16, String) {
    let name = stream.replace('/', "%2F");
    let response = http
        .get(server.url(&format!("/v1/streams/{name}/records?seq_num=0")))
        .header("s2-basin", BUCKET)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Waits (up to 30 s) until `url` answers HEAD with `status`.
async fn wait_for_status(http: &reqwest::Client, url: &str, status: u16) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = http.head(url).send().await.unwrap().status();
        if now == status {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{url} still answers {now}, not {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
