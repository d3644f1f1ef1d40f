//! Catch-up reads against a real on-disk server: large and small records come back whole and in
//! order, several large records to a response of about 4 MiB with an exact `Content-Length`,
//! and the same after a restart (reads then come from disk rather than the tail cache).

use reqwest::Method;

use crate::common::{Client, Server, TlsServer, header};

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
async fn read_all(http: &Client, path: &str) -> (Vec<u8>, usize) {
    let mut offset = "-1".to_string();
    let mut content = Vec::new();
    let mut responses = 0;
    loop {
        let response = http.read(path, &offset).await;
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
    let written = records();
    let expected: Vec<u8> = written.concat();
    let mut server = Server::on_disk(dir.path());
    let http = Client::new(&server);
    let created = http.create(PATH, "application/octet-stream", "").await;
    assert_eq!(created.status(), 201);
    for body in &written {
        let appended = http
            .append(PATH, "application/octet-stream", body.clone())
            .await;
        assert_eq!(appended.status(), 204);
    }

    for round in ["served from the running server", "after a restart"] {
        let (content, responses) = read_all(&Client::new(&server), PATH).await;
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

async fn catch_up(http: &Client, path: &str, if_none_match: Option<&str>) -> CatchUp {
    let mut request = http.request(Method::GET, &format!("{path}?offset=-1"));
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

/// Creates a text stream at `path` holding 100 distinct records of 1 KiB: a catch-up body large
/// enough (100 KiB) to be shared with the next readers of its range.
async fn fill_shareable(http: &Client, path: &str) -> Vec<u8> {
    let created = http.create(path, "text/plain", "").await;
    assert_eq!(created.status(), 201);
    let mut written = Vec::new();
    for i in 0..100u32 {
        let record: Vec<u8> = (0..1024u32).map(|j| b'a' + ((i + j) % 26) as u8).collect();
        let appended = http.append(path, "text/plain", record.clone()).await;
        assert_eq!(appended.status(), 204);
        written.extend_from_slice(&record);
    }
    written
}

#[tokio::test]
async fn readers_of_the_same_range_share_its_body_only_until_the_stream_grows() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::on_disk(dir.path());
    let http = Client::new(&server);
    let path = "/v1/stream/shared";
    let mut expected = fill_shareable(&http, path).await;

    let first = catch_up(&http, path, None).await;
    for _ in 0..3 {
        let again = catch_up(&http, path, None).await;
        assert_eq!(again.status, 200);
        assert!(
            again.body == expected,
            "every reader of the range gets its bytes"
        );
        assert_eq!((&again.next, again.up_to_date), (&first.next, true));
        assert_eq!(again.etag, first.etag);
    }
    let revalidated = catch_up(&http, path, first.etag.as_deref()).await;
    assert_eq!(
        revalidated.status, 304,
        "the shared body keeps its entity tag"
    );

    let appended = http.append(path, "text/plain", "and one more").await;
    assert_eq!(appended.status(), 204);
    expected.extend_from_slice(b"and one more");
    let grown = catch_up(&http, path, first.etag.as_deref()).await;
    assert_eq!(
        grown.status, 200,
        "the range grew: the old tag no longer matches"
    );
    assert!(grown.body == expected, "a read after an append sees it");
    assert!(grown.up_to_date);
    assert_ne!(grown.next, first.next);
    let shared = catch_up(&http, path, None).await;
    assert!(shared.body == expected);
    assert_eq!(shared.next, grown.next);
}

#[tokio::test]
async fn a_shared_body_arrives_whole_over_http2_and_over_tls() {
    let server = Server::start(&["--memory"]);
    let path = "/v1/stream/shared";
    let expected = fill_shareable(&Client::new(&server), path).await;
    let http2 = Client::h2(&server);
    for round in ["renders it", "shares it"] {
        let read = catch_up(&http2, path, None).await;
        assert!(
            read.status == 200 && read.body == expected,
            "HTTP/2: {round}"
        );
    }

    let tls = TlsServer::start(&["--memory"]);
    let https = tls.client();
    let expected = fill_shareable(&https, path).await;
    for round in ["renders it", "shares it"] {
        let read = catch_up(&https, path, None).await;
        assert!(read.status == 200 && read.body == expected, "TLS: {round}");
    }
}
