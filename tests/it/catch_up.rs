//! Catch-up reads against a real on-disk server: large and small records come back whole and in
//! order, several large records to a response of about 4 MiB with an exact `Content-Length`,
//! and the same after a restart (reads then come from disk rather than the tail cache).

use crate::common::{Server, client, header};

const PATH: &str = "/v1/stream/big";
const MIB: usize = 1 << 20;
/// A catch-up response stops once it holds this much (always at least one whole record).
const CATCH_UP_BUDGET: usize = 4 * MIB;

/// Record `i`: large ones (1.1 MiB) filled with one letter each, a small one after every third.
fn records() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for i in 0..12u8 {
        out.push(vec![b'a' + i; MIB + MIB / 10]);
        if i % 3 == 2 {
            out.push(format!("small {i}").into_bytes());
        }
    }
    out
}

/// Reads the whole stream from the start; returns the bytes and how many responses it took.
async fn read_all(http: &reqwest::Client, url: &str) -> (Vec<u8>, usize) {
    let mut offset = "-1".to_string();
    let mut content = Vec::new();
    let mut responses = 0;
    loop {
        let response = http
            .get(format!("{url}?offset={offset}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let length: usize = header(&response, "content-length")
            .expect("a catch-up response has a Content-Length")
            .parse()
            .unwrap();
        let next = header(&response, "stream-next-offset").unwrap().to_string();
        let done = header(&response, "stream-up-to-date") == Some("true");
        let body = response.bytes().await.unwrap();
        assert_eq!(body.len(), length);
        assert!(
            body.len() < CATCH_UP_BUDGET + 2 * MIB,
            "a response stops after the record that reaches the budget: {} bytes",
            body.len()
        );
        content.extend_from_slice(&body);
        responses += 1;
        offset = next;
        if done {
            return (content, responses);
        }
    }
}

#[tokio::test]
async fn a_catch_up_read_returns_large_records_whole_and_in_order_several_to_a_response() {
    let dir = tempfile::tempdir().unwrap();
    let http = client();
    let written = records();
    let expected: Vec<u8> = written.concat();
    let mut server = Server::on_disk(dir.path());
    let url = server.url(PATH);
    let created = http
        .put(&url)
        .header("content-type", "application/octet-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    for body in &written {
        let appended = http
            .post(&url)
            .header("content-type", "application/octet-stream")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(appended.status(), 204);
    }

    for round in ["served from the running server", "after a restart"] {
        let (content, responses) = read_all(&http, &server.url(PATH)).await;
        assert!(content == expected, "the bytes read back differ ({round})");
        assert!(
            responses <= 5,
            "12 records of 1.1 MiB go about four to a response, not one each: {responses} responses ({round})"
        );
        server.terminate(std::time::Duration::from_secs(10));
        server = Server::on_disk(dir.path());
    }
}

/// One response to a catch-up read: status, body and the headers that say where it ends.
struct CatchUp {
    status: u16,
    body: Vec<u8>,
    next: Option<String>,
    up_to_date: bool,
    etag: Option<String>,
}

async fn catch_up(http: &reqwest::Client, url: &str, if_none_match: Option<&str>) -> CatchUp {
    let mut request = http.get(format!("{url}?offset=-1"));
    if let Some(tag) = if_none_match {
        request = request.header("if-none-match", tag);
    }
    let response = request.send().await.unwrap();
    CatchUp {
        status: response.status().as_u16(),
        next: header(&response, "stream-next-offset").map(str::to_string),
        up_to_date: header(&response, "stream-up-to-date") == Some("true"),
        etag: header(&response, "etag").map(str::to_string),
        body: response.bytes().await.unwrap().to_vec(),
    }
}

/// Creates a text stream at `url` holding 100 distinct records of 1 KiB: a catch-up body large
/// enough (100 KiB) to be shared with the next readers of its range.
async fn fill_shareable(http: &reqwest::Client, url: &str) -> Vec<u8> {
    let created = http
        .put(url)
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let mut written = Vec::new();
    for i in 0..100u32 {
        let record: Vec<u8> = (0..1024u32).map(|j| b'a' + ((i + j) % 26) as u8).collect();
        let appended = http
            .post(url)
            .header("content-type", "text/plain")
            .body(record.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(appended.status(), 204);
        written.extend_from_slice(&record);
    }
    written
}

async fn append_text(http: &reqwest::Client, url: &str, text: &'static str) {
    let appended = http
        .post(url)
        .header("content-type", "text/plain")
        .body(text)
        .send()
        .await
        .unwrap();
    assert_eq!(appended.status(), 204);
}

#[tokio::test]
async fn readers_of_the_same_range_share_its_body_only_until_the_stream_grows() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::on_disk(dir.path());
    let http = client();
    let url = server.url("/v1/stream/shared");
    let mut expected = fill_shareable(&http, &url).await;

    let first = catch_up(&http, &url, None).await;
    for _ in 0..3 {
        let again = catch_up(&http, &url, None).await;
        assert_eq!(again.status, 200);
        assert!(
            again.body == expected,
            "every reader of the range gets its bytes"
        );
        assert_eq!((&again.next, again.up_to_date), (&first.next, true));
        assert_eq!(again.etag, first.etag);
    }
    let revalidated = catch_up(&http, &url, first.etag.as_deref()).await;
    assert_eq!(
        revalidated.status, 304,
        "the shared body keeps its entity tag"
    );

    append_text(&http, &url, "and one more").await;
    expected.extend_from_slice(b"and one more");
    let grown = catch_up(&http, &url, first.etag.as_deref()).await;
    assert_eq!(
        grown.status, 200,
        "the range grew: the old tag no longer matches"
    );
    assert!(grown.body == expected, "a read after an append sees it");
    assert!(grown.up_to_date);
    assert_ne!(grown.next, first.next);
    let shared = catch_up(&http, &url, None).await;
    assert!(shared.body == expected);
    assert_eq!(shared.next, grown.next);
}

#[tokio::test]
async fn a_shared_body_arrives_whole_over_http2_and_over_tls() {
    let http2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let server = Server::start(&["--memory"]);
    let url = server.url("/v1/stream/shared");
    let expected = fill_shareable(&client(), &url).await;
    for round in ["renders it", "shares it"] {
        let read = catch_up(&http2, &url, None).await;
        assert!(
            read.status == 200 && read.body == expected,
            "HTTP/2: {round}"
        );
    }

    let tls = crate::common::TlsServer::start(&["--memory"]);
    let pem = std::fs::read(&tls.cert_path).unwrap();
    let https = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let url = format!("{}/v1/stream/shared", tls.https_base());
    let expected = fill_shareable(&https, &url).await;
    for round in ["renders it", "shares it"] {
        let read = catch_up(&https, &url, None).await;
        assert!(read.status == 200 && read.body == expected, "TLS: {round}");
    }
}
