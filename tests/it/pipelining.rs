//! A producer's pipelined appends, each on a connection of its own: they are ordered by when
//! their requests began, not by when their bodies finished arriving.

use std::time::Duration;

use reqwest::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Client, Server};

/// Reads from `stream` until `wanted` has arrived, for at most 10 s.
async fn read_until(stream: &mut TcpStream, wanted: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&seen).contains(wanted) {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {wanted:?} in {:?}", String::from_utf8_lossy(&seen)))
            .unwrap();
        assert!(n > 0, "closed before {wanted:?}");
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// A server with the empty stream `/v1/stream/p`, and on it an append of producer "w", sequence
/// 0, whose head and the first part of a 10-byte body are sent. It returns once the server
/// answers `100 Continue`: it starts reading that body only after it took the append's place.
async fn server_with_an_append_under_way(first_part: &str) -> (Server, TcpStream) {
    let server = Server::start(&["--memory"]);
    let created = Client::new(&server)
        .create("/v1/stream/p", "text/plain", "")
        .await;
    assert_eq!(created.status(), 201);
    let addr = server.base.trim_start_matches("http://");
    let mut under_way = TcpStream::connect(addr).await.unwrap();
    let head = "POST /v1/stream/p HTTP/1.1\r\nhost: x\r\ncontent-type: text/plain\r\n\
                producer-id: w\r\nproducer-epoch: 0\r\nproducer-seq: 0\r\n\
                expect: 100-continue\r\ncontent-length: 10\r\n\r\n";
    under_way.write_all(head.as_bytes()).await.unwrap();
    under_way.write_all(first_part.as_bytes()).await.unwrap();
    read_until(&mut under_way, "100 Continue").await;
    (server, under_way)
}

#[tokio::test]
async fn a_later_sequence_number_waits_for_an_earlier_append_whose_body_is_still_arriving() {
    // Producer-Seq 0 sends its head and half its body.
    let (server, mut first) = server_with_an_append_under_way("first").await;
    let (http, stream) = (Client::new(&server), "/v1/stream/p");

    // Producer-Seq 1, whole, on another connection: decided after 0, not refused as a gap.
    let second = tokio::spawn({
        let http = http.clone();
        async move {
            http.request(Method::POST, stream)
                .header("content-type", "text/plain")
                .header("producer-id", "w")
                .header("producer-epoch", "0")
                .header("producer-seq", "1")
                .body("second")
                .send()
                .await
                .unwrap()
        }
    });
    let early = tokio::time::timeout(Duration::from_millis(300), async {
        while !second.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(early.is_err(), "answered before the append ahead of it");

    first.write_all(b"_half").await.unwrap();
    let answer = read_until(&mut first, "\r\n\r\n").await;
    assert!(answer.contains("HTTP/1.1 200"), "{answer}");
    let second = second.await.unwrap();
    assert_eq!(second.status(), 200);
    let body = http.read(stream, "-1").await.text().await.unwrap();
    assert_eq!(body, "first_halfsecond");
}

#[tokio::test]
async fn another_producers_slow_body_holds_up_no_refusal() {
    let (server, mut slow) = server_with_an_append_under_way("slow").await;
    let http = Client::new(&server);

    // Another producer, out of sequence: refused at once, whatever "w" is still sending.
    let gap = http
        .request(Method::POST, "/v1/stream/p")
        .header("content-type", "text/plain")
        .header("producer-id", "v")
        .header("producer-epoch", "0")
        .header("producer-seq", "3")
        .body("gap")
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("answered while another producer's body is still arriving");
    assert_eq!(gap.status(), 409);
    slow.write_all(b"_rest!").await.unwrap();
    let answer = read_until(&mut slow, "\r\n\r\n").await;
    assert!(answer.contains("HTTP/1.1 200"), "{answer}");
}
