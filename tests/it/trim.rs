//! Trimming a long stream through the S2 trim command: readers never see the trimmed records
//! again, not even after the server is killed right after the trim (while their deletion is
//! still under way) and restarted; records after the trim point and other streams stay whole.

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{Client, Server};

const BASIN: &str = "trim-test-basin";
const RECORDS: u64 = 20_000;
const TRIM_TO: u64 = 15_000;

async fn s2(server: &Server, path: &str, body: Option<Value>, base64: bool) -> (u16, Value) {
    let http = Client::new(server);
    let mut request = match &body {
        Some(body) => http
            .s2(Method::POST, BASIN, path)
            .header("content-type", "application/json")
            .body(body.to_string()),
        None => http.s2(Method::GET, BASIN, path),
    };
    if base64 {
        request = request.header("s2-format", "base64");
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// The first record a read from seq 0 returns, and the stream's tail.
async fn first_and_tail(server: &Server, stream: &str) -> (u64, u64) {
    let (status, read) = s2(
        server,
        &format!("/v1/streams/{stream}/records?seq_num=0&count=3"),
        None,
        false,
    )
    .await;
    assert_eq!(status, 200, "{read}");
    let first = read["records"][0]["seq_num"].as_u64().unwrap();
    let (status, tail) = s2(
        server,
        &format!("/v1/streams/{stream}/records/tail"),
        None,
        false,
    )
    .await;
    assert_eq!(status, 200, "{tail}");
    (first, tail["tail"]["seq_num"].as_u64().unwrap())
}

/// What readers see of the trimmed stream and of its untouched neighbour.
async fn check(server: &Server) {
    assert_eq!(first_and_tail(server, "long").await, (TRIM_TO, RECORDS + 1));
    assert_eq!(first_and_tail(server, "other").await, (0, 1_000));
    // Durable Streams: an offset below the trim point is gone (410); one-byte bodies, so
    // record n starts at byte n.
    let gone = Client::new(server)
        .read(
            &format!("/{BASIN}/long"),
            "0000000000000001_0000000000000001",
        )
        .await;
    assert_eq!(gone.status(), 410);
    // Every record from the trim point on is still there, in order.
    let mut next = TRIM_TO;
    while next < RECORDS {
        let (status, read) = s2(
            server,
            &format!("/v1/streams/long/records?seq_num={next}&count=1000"),
            None,
            false,
        )
        .await;
        assert_eq!(status, 200);
        for record in read["records"].as_array().unwrap() {
            if next == RECORDS {
                break; // the trim command record itself
            }
            assert_eq!(record["seq_num"].as_u64(), Some(next));
            assert_eq!(record["body"], "x");
            next += 1;
        }
    }
}

#[tokio::test]
async fn a_trimmed_stream_reads_from_its_trim_point_before_and_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::on_disk(dir.path());
    let (status, _) = s2(
        &server,
        "/v1/basins",
        Some(json!({ "basin": BASIN })),
        false,
    )
    .await;
    assert_eq!(status, 201);
    for stream in ["long", "other"] {
        let (status, _) = s2(
            &server,
            "/v1/streams",
            Some(json!({ "stream": stream })),
            false,
        )
        .await;
        assert_eq!(status, 201);
    }
    let batch = json!({ "records": vec![json!({ "body": "x" }); 1000] });
    for _ in 0..RECORDS / 1000 {
        let (status, ack) = s2(
            &server,
            "/v1/streams/long/records",
            Some(batch.clone()),
            false,
        )
        .await;
        assert_eq!(status, 200, "{ack}");
    }
    let (status, _) = s2(&server, "/v1/streams/other/records", Some(batch), false).await;
    assert_eq!(status, 200);

    let point = base64::engine::general_purpose::STANDARD.encode(TRIM_TO.to_be_bytes());
    let trim = json!({ "records": [{ "headers": [["", "dHJpbQ=="]], "body": point }] });
    let (status, ack) = s2(&server, "/v1/streams/long/records", Some(trim), true).await;
    assert_eq!(status, 200, "{ack}");
    check(&server).await;

    // Killed at once: the trimmed records are most likely still being deleted.
    server.kill();
    let server = Server::on_disk(dir.path());
    check(&server).await;
    let more = json!({ "records": [{ "body": "y" }] });
    let (status, ack) = s2(&server, "/v1/streams/long/records", Some(more), false).await;
    assert_eq!(status, 200);
    assert_eq!(ack["start"]["seq_num"].as_u64(), Some(RECORDS + 1));
}
