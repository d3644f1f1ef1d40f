//! Catch-up reads against a real on-disk server: large and small records come back whole and in
//! order, several large records to a response of about 4 MiB with an exact `Content-Length`,
//! and the same after a restart (reads then come from disk rather than the tail cache).

mod common;

use common::{Server, client, header};

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
