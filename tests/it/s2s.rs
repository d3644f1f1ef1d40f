//! The S2 face's binary wires, as S2's CLI and SDKs use them over HTTP/2 with prior knowledge:
//! S2S append and read sessions (`Content-Type: s2s/proto`), unary protobuf, and compressed
//! unary bodies. Frames are built and parsed with the `s2-api` crate, the same code S2's Rust
//! SDK uses.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use prost::Message as _;
use reqwest::Method;
use s2_api::v1::stream::proto;
use s2_api::v1::stream::s2s::{CompressionAlgorithm, FrameDecoder, SessionMessage};
use serde_json::{Value, json};
use tokio_util::codec::Decoder as _;

use crate::common::{Client, Server, header, json_of};

const BASIN: &str = "s2s-tests";

async fn server_with_stream(stream: &str) -> Server {
    let server = Server::start(&["--memory"]);
    let http = Client::h2(&server);
    let created = http.create_basin(BASIN).await;
    assert_eq!(created.status(), 201, "create basin");
    let created = http.create_s2_stream(BASIN, stream).await;
    assert_eq!(created.status(), 201, "create stream");
    server
}

/// The stream's tail, from `GET /v1/streams/{stream}/records/tail`.
async fn read_tail(http: &Client, stream: &str) -> Value {
    let path = format!("/v1/streams/{stream}/records/tail");
    json_of(http.s2(Method::GET, BASIN, &path).send().await.unwrap()).await
}

fn input(bodies: &[&str], match_seq_num: Option<u64>) -> proto::AppendInput {
    proto::AppendInput {
        records: bodies
            .iter()
            .map(|b| proto::AppendRecord {
                timestamp: None,
                headers: vec![],
                body: Bytes::copy_from_slice(b.as_bytes()),
            })
            .collect(),
        match_seq_num,
        fencing_token: None,
    }
}

fn frame(message: &impl prost::Message) -> Bytes {
    SessionMessage::regular(CompressionAlgorithm::None, message)
        .unwrap()
        .encode()
}

/// Reads frames from an S2S response body, one at a time.
struct Frames {
    response: reqwest::Response,
    buffer: BytesMut,
}

impl Frames {
    fn new(response: reqwest::Response) -> Frames {
        assert_eq!(response.status(), 200);
        assert_eq!(header(&response, "content-type"), Some("s2s/proto"));
        Frames {
            response,
            buffer: BytesMut::new(),
        }
    }

    /// The next frame, or None when the session ended.
    async fn next(&mut self) -> Option<SessionMessage> {
        loop {
            if let Some(message) = FrameDecoder.decode(&mut self.buffer).expect("valid frame") {
                return Some(message);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.response.chunk())
                .await
                .expect("a frame within 10 s")
                .expect("body");
            match chunk {
                Some(bytes) => self.buffer.extend_from_slice(&bytes),
                None => {
                    assert!(self.buffer.is_empty(), "session ended mid-frame");
                    return None;
                }
            }
        }
    }

    async fn next_regular<M: prost::Message + Default>(&mut self) -> M {
        match self.next().await {
            Some(SessionMessage::Regular(data)) => data.try_into_proto().expect("decodes"),
            other => panic!("expected a regular frame, got {other:?}"),
        }
    }

    async fn next_terminal(&mut self) -> (u16, Value) {
        match self.next().await {
            Some(SessionMessage::Terminal(t)) => {
                (t.status, serde_json::from_str(&t.body).expect("JSON body"))
            }
            other => panic!("expected a terminal frame, got {other:?}"),
        }
    }
}

async fn append_session(server: &Server, stream: &str, body: Vec<Bytes>) -> Frames {
    let chunks = futures::stream::iter(body.into_iter().map(Ok::<_, std::io::Error>));
    let path = format!("/v1/streams/{stream}/records");
    let response = Client::h2(server)
        .s2(Method::POST, BASIN, &path)
        .header("content-type", "s2s/proto")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    Frames::new(response)
}

async fn read_session(server: &Server, stream: &str, query: &str, accept_encoding: &str) -> Frames {
    let path = format!("/v1/streams/{stream}/records?{query}");
    let response = Client::h2(server)
        .s2(Method::GET, BASIN, &path)
        .header("content-type", "s2s/proto")
        .header("accept-encoding", accept_encoding)
        .send()
        .await
        .unwrap();
    Frames::new(response)
}

#[tokio::test]
async fn append_session_acknowledges_pipelined_inputs_in_order() {
    let server = server_with_stream("pipelined").await;
    let inputs: Vec<Bytes> = (0..50)
        .map(|i| frame(&input(&[&format!("a{i}"), &format!("b{i}")], None)))
        .collect();
    let mut acks = append_session(&server, "pipelined", inputs).await;
    for i in 0..50u64 {
        let ack: proto::AppendAck = acks.next_regular().await;
        assert_eq!(ack.start.unwrap().seq_num, 2 * i, "ack {i} start");
        assert_eq!(ack.end.unwrap().seq_num, 2 * i + 2, "ack {i} end");
        assert!(ack.tail.unwrap().seq_num >= 2 * i + 2);
    }
    assert!(
        acks.next().await.is_none(),
        "the session ends with the inputs"
    );
}

#[tokio::test]
async fn append_session_failure_is_a_terminal_frame_after_the_earlier_acks() {
    let server = server_with_stream("failing").await;
    let inputs = vec![
        frame(&input(&["one"], None)),
        frame(&input(&["two"], Some(1))),
        frame(&input(&["three"], Some(7))),
        frame(&input(&["never"], None)),
    ];
    let mut acks = append_session(&server, "failing", inputs).await;
    let first: proto::AppendAck = acks.next_regular().await;
    let second: proto::AppendAck = acks.next_regular().await;
    assert_eq!(first.end.unwrap().seq_num, 1);
    assert_eq!(second.end.unwrap().seq_num, 2);
    let (status, body) = acks.next_terminal().await;
    assert_eq!(status, 412);
    assert_eq!(body, json!({ "seq_num_mismatch": 2 }));
    assert!(
        acks.next().await.is_none(),
        "nothing follows a terminal frame"
    );

    let tail = read_tail(&Client::h2(&server), "failing").await;
    assert_eq!(
        tail["tail"]["seq_num"], 2,
        "inputs after the failure are not appended"
    );
}

#[tokio::test]
async fn append_session_rejects_a_malformed_frame_with_a_terminal_400() {
    let server = server_with_stream("garbage").await;
    // A length that announces a flag byte and a payload that is not an AppendInput.
    let garbage = Bytes::from_static(&[0, 0, 3, 0, 0xff, 0xff]);
    let mut acks = append_session(&server, "garbage", vec![garbage]).await;
    let (status, body) = acks.next_terminal().await;
    assert_eq!(status, 400);
    assert_eq!(body["code"], "bad_proto");
}

#[tokio::test]
async fn append_session_to_a_missing_stream_is_a_plain_404() {
    let server = server_with_stream("exists").await;
    let response = Client::h2(&server)
        .s2(Method::POST, BASIN, "/v1/streams/missing/records")
        .header("content-type", "s2s/proto")
        .body(frame(&input(&["x"], None)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let body = json_of(response).await;
    assert_eq!(body["code"], "stream_not_found");
}

#[tokio::test]
async fn read_session_sends_history_then_a_heartbeat_with_the_tail_then_live_records() {
    let server = server_with_stream("live").await;
    let mut acks = append_session(&server, "live", vec![frame(&input(&["h0", "h1"], None))]).await;
    let _: proto::AppendAck = acks.next_regular().await;

    let mut reader = read_session(&server, "live", "seq_num=0", "identity").await;
    let history: proto::ReadBatch = reader.next_regular().await;
    let bodies: Vec<&[u8]> = history.records.iter().map(|r| r.body.as_ref()).collect();
    assert_eq!(bodies, [b"h0".as_ref(), b"h1".as_ref()]);
    let heartbeat: proto::ReadBatch = reader.next_regular().await;
    assert!(heartbeat.records.is_empty(), "caught up: an empty batch");
    assert_eq!(heartbeat.tail.unwrap().seq_num, 2);

    let mut acks = append_session(&server, "live", vec![frame(&input(&["new"], None))]).await;
    let _: proto::AppendAck = acks.next_regular().await;
    let live: proto::ReadBatch = reader.next_regular().await;
    assert_eq!(live.records.len(), 1);
    assert_eq!(live.records[0].seq_num, 2);
    assert_eq!(live.records[0].body.as_ref(), b"new");
    assert_eq!(live.tail.unwrap().seq_num, 3);
}

#[tokio::test]
async fn read_session_ends_at_its_count_limit() {
    let server = server_with_stream("limited").await;
    let mut acks = append_session(
        &server,
        "limited",
        vec![frame(&input(&["a", "b", "c"], None))],
    )
    .await;
    let _: proto::AppendAck = acks.next_regular().await;
    let mut reader = read_session(&server, "limited", "seq_num=1&count=2", "identity").await;
    let batch: proto::ReadBatch = reader.next_regular().await;
    let seqs: Vec<u64> = batch.records.iter().map(|r| r.seq_num).collect();
    assert_eq!(seqs, [1, 2]);
    assert!(
        reader.next().await.is_none(),
        "the session ends at the limit"
    );
}

#[tokio::test]
async fn a_record_too_large_for_s2s_ends_a_read_session_with_a_422_after_the_records_before_it() {
    let server = server_with_stream("unused").await;
    let http = Client::h2(&server);
    let path = format!("/{BASIN}/large");
    let created = http.create(&path, "application/octet-stream", "").await;
    assert_eq!(created.status(), 201);
    for body in [vec![1u8; 10], vec![2u8; 3 << 20]] {
        let appended = http.append(&path, "application/octet-stream", body).await;
        assert_eq!(appended.status(), 204);
    }
    let mut reader = read_session(&server, "large", "seq_num=0", "identity").await;
    let first: proto::ReadBatch = reader.next_regular().await;
    assert_eq!(first.records.len(), 1);
    assert_eq!(first.records[0].body.len(), 10);
    let (status, body) = reader.next_terminal().await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("frame limit"),
        "{body}"
    );
    assert!(
        reader.next().await.is_none(),
        "nothing follows a terminal frame"
    );
}

#[tokio::test]
async fn read_session_frames_are_compressed_as_accept_encoding_asks() {
    let server = server_with_stream("compressed").await;
    let big = "x".repeat(4096);
    let mut acks = append_session(&server, "compressed", vec![frame(&input(&[&big], None))]).await;
    let _: proto::AppendAck = acks.next_regular().await;
    for (encoding, expected) in [
        ("zstd, gzip", CompressionAlgorithm::Zstd),
        ("gzip", CompressionAlgorithm::Gzip),
        ("identity", CompressionAlgorithm::None),
    ] {
        let mut reader = read_session(&server, "compressed", "seq_num=0&count=1", encoding).await;
        // The flag byte (after the 3-byte length) carries the compression in bits 5-6.
        let chunk = reader.response.chunk().await.unwrap().unwrap();
        reader.buffer.extend_from_slice(&chunk);
        let flag = reader.buffer[3];
        assert_eq!((flag >> 5) & 0b11, expected as u8, "{encoding}");
        let batch: proto::ReadBatch = reader.next_regular().await;
        assert_eq!(batch.records[0].body.len(), 4096, "{encoding}");
    }
}

#[tokio::test]
async fn unary_protobuf_append_and_read_round_trip_binary_records() {
    let server = server_with_stream("unary").await;
    let http = Client::h2(&server);
    let mut record = input(&[], None);
    record.records.push(proto::AppendRecord {
        timestamp: None,
        headers: vec![proto::Header {
            name: Bytes::from_static(b"k\xff"),
            value: Bytes::from_static(b"\x00v"),
        }],
        body: Bytes::from_static(b"\xff\xfe binary"),
    });
    let response = http
        .s2(Method::POST, BASIN, "/v1/streams/unary/records")
        .header("content-type", "application/x-protobuf")
        .header("accept", "application/protobuf")
        .body(record.encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "content-type"),
        Some("application/protobuf")
    );
    let ack = proto::AppendAck::decode(response.bytes().await.unwrap()).unwrap();
    assert_eq!(ack.end.unwrap().seq_num, 1);

    let response = http
        .s2(Method::GET, BASIN, "/v1/streams/unary/records?seq_num=0")
        .header("accept", "application/x-protobuf")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let batch = proto::ReadBatch::decode(response.bytes().await.unwrap()).unwrap();
    assert_eq!(batch.records.len(), 1);
    assert_eq!(batch.records[0].body.as_ref(), b"\xff\xfe binary");
    assert_eq!(batch.records[0].headers, record.records[0].headers);
    assert_eq!(batch.tail.unwrap().seq_num, 1);
}

#[tokio::test]
async fn unary_protobuf_that_does_not_decode_is_a_400_and_appends_nothing() {
    let server = server_with_stream("badproto").await;
    let http = Client::h2(&server);
    let response = http
        .s2(Method::POST, BASIN, "/v1/streams/badproto/records")
        .header("content-type", "application/protobuf")
        .body(vec![0x0a, 0xff, 0xff])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body = json_of(response).await;
    assert_eq!(body["code"], "bad_proto");
    let tail = read_tail(&http, "badproto").await;
    assert_eq!(tail["tail"]["seq_num"], 0);
}

#[tokio::test]
async fn unary_bodies_are_compressed_both_ways_as_negotiated() {
    let server = server_with_stream("gzip").await;
    let http = Client::h2(&server);
    let big = "y".repeat(2000);
    let body = json!({ "records": [{ "body": big }] }).to_string();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(body.as_bytes()).unwrap();
    let response = http
        .s2(Method::POST, BASIN, "/v1/streams/gzip/records")
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(gz.finish().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "a gzip request body is accepted");

    let response = http
        .s2(Method::GET, BASIN, "/v1/streams/gzip/records?seq_num=0")
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "content-encoding"), Some("gzip"));
    let mut json = String::new();
    flate2::read::GzDecoder::new(response.bytes().await.unwrap().as_ref())
        .read_to_string(&mut json)
        .unwrap();
    let batch: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(batch["records"][0]["body"].as_str().unwrap().len(), 2000);

    let small = http
        .s2(Method::GET, BASIN, "/v1/streams/gzip/records/tail")
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(
        header(&small, "content-encoding"),
        None,
        "small responses stay uncompressed"
    );
}

/// The most memory the server has held so far (`VmHWM`), in MiB.
fn peak_mib(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib / 1024
}

/// `count` records with nothing in them: two bytes each on the wire.
fn empty_records(count: usize) -> Vec<u8> {
    [0x0a, 0x00].repeat(count)
}

#[tokio::test]
async fn a_unary_protobuf_append_of_millions_of_empty_records_is_refused_before_it_is_decoded() {
    let server = server_with_stream("manyempty").await;
    let before = peak_mib(&server);
    // Decoded, 8 million empty records would take about 600 MB.
    let response = Client::h2(&server)
        .s2(Method::POST, BASIN, "/v1/streams/manyempty/records")
        .header("content-type", "application/protobuf")
        .body(empty_records(8_000_000))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    assert_eq!(json_of(response).await["code"], "invalid");
    let grown = peak_mib(&server).saturating_sub(before);
    assert!(grown < 150, "the server's peak memory grew by {grown} MiB");
}

#[tokio::test]
async fn an_append_session_frame_of_a_million_empty_records_is_refused_before_it_is_decoded() {
    let server = server_with_stream("frameofempty").await;
    let before = peak_mib(&server);
    // A frame's payload is at most 2 MiB: a million empty records, about 72 MB decoded.
    let payload = empty_records(1_000_000);
    let mut frame = BytesMut::new();
    frame.extend_from_slice(&((payload.len() + 1) as u32).to_be_bytes()[1..]);
    frame.extend_from_slice(&[0]);
    frame.extend_from_slice(&payload);
    let mut acks = append_session(&server, "frameofempty", vec![frame.freeze()]).await;
    let (status, body) = acks.next_terminal().await;
    assert_eq!(status, 422);
    assert_eq!(body["code"], "invalid");
    let grown = peak_mib(&server).saturating_sub(before);
    assert!(grown < 40, "the server's peak memory grew by {grown} MiB");
}

#[tokio::test]
async fn an_unknown_command_of_a_megabyte_ends_an_append_session_with_a_short_terminal_422() {
    let server = server_with_stream("bigcommand").await;
    // Each quote is escaped twice in the error (Debug, then JSON): 4 MB if repeated whole,
    // more than a frame can carry.
    let command = proto::AppendInput {
        records: vec![proto::AppendRecord {
            timestamp: None,
            headers: vec![proto::Header {
                name: Bytes::new(),
                value: Bytes::from(vec![b'"'; 1_000_000]),
            }],
            body: Bytes::new(),
        }],
        match_seq_num: None,
        fencing_token: None,
    };
    let mut acks = append_session(&server, "bigcommand", vec![frame(&command)]).await;
    let (status, body) = acks.next_terminal().await;
    assert_eq!(status, 422);
    assert_eq!(body["code"], "invalid");
    let message = body["message"].as_str().expect("a message");
    assert!(message.starts_with("unknown command"), "{message}");
    assert!(message.len() < 1000, "a message of {} bytes", message.len());
    assert!(
        acks.next().await.is_none(),
        "nothing follows a terminal frame"
    );
}
