//! The table of `docs/live-reads.md`, cell by cell: each live face, opened at the tail of a
//! stream and waiting there, then the stream is deleted, soft-deleted or closed, or the reader's
//! token revoked or expired; each test checks what that face then does. (Records trimmed from
//! under a reader are checked by the unit tests the table names: over HTTP a reader cannot be
//! held behind the tail long enough for a trim to pass it.)

use std::time::Duration;

use bytes::BytesMut;
use futures::{SinkExt as _, StreamExt as _};
use reqwest::{Method, Response};
use s2_api::v1::stream::proto;
use s2_api::v1::stream::s2s::{FrameDecoder, SessionMessage};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_util::codec::Decoder as _;

use crate::common::{Client, Server, header, json_of};

const OPERATOR: &str = "live-table-operator-token";
const BUCKET: &str = "livetable";
const STREAM: &str = "/livetable/s";
/// How long a test waits for what a face does.
const WITHIN: Duration = Duration::from_secs(10);

/// The seven live faces.
#[derive(Clone, Copy, Debug)]
enum Face {
    DsSse,
    DsLongPoll,
    S2Sse,
    S2Wait,
    S2s,
    StreamLdSse,
    StreamLdWs,
}

/// What happens to the stream, or to the reader's token, while the reader waits at the tail.
#[derive(Clone, Copy, Debug)]
enum Happening {
    Deleted,
    SoftDeleted,
    Closed,
    Revoked,
    Expired,
}

/// What a face did.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// A streaming body ended; its last event or frame, as the face renders it (see
    /// `last_of`).
    Ended(String),
    /// A long-poll answered: its status, and `Stream-Closed` if it said so.
    Answered(u16, Option<String>),
    /// A replication session sent this message type, or closed (`"closed"`).
    Message(String),
}

/// A server with the bucket and its stream (one record), and a token that may read it.
struct Setup {
    server: Server,
    operator: Client,
    reader_token: String,
}

async fn setup(happening: Happening) -> Setup {
    let server = Server::start(&[
        "--memory",
        "--auth",
        "--auth-token",
        OPERATOR,
        "--sse-max-duration-secs",
        "600",
        "--long-poll-timeout-ms",
        "30000",
    ]);
    let operator = Client::new(&server).bearer(OPERATOR);
    assert_eq!(operator.create_bucket(BUCKET).await.status(), 201);
    assert_eq!(
        operator.create(STREAM, "text/plain", "a").await.status(),
        201
    );
    if let Happening::SoftDeleted = happening {
        let fork = operator
            .request(Method::PUT, "/livetable/fork")
            .header("content-type", "text/plain")
            .header("stream-forked-from", STREAM)
            .send()
            .await
            .unwrap();
        assert_eq!(fork.status(), 201, "a fork keeps the stream soft-deleted");
    }
    let scope = json!({
        "basins": {"exact": BUCKET},
        "streams": {"prefix": ""},
        "op_groups": {"stream": {"read": true}, "basin": {"read": true}}
    });
    let expires = matches!(happening, Happening::Expired).then(|| {
        let at = time::OffsetDateTime::now_utc() + time::Duration::seconds(2);
        at.format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    });
    let issued = operator
        .issue_token("reader", scope, expires.as_deref())
        .await;
    assert_eq!(issued.status(), 201);
    let body = json_of(issued).await;
    let reader_token = body["access_token"].as_str().unwrap().to_string();
    Setup {
        server,
        operator,
        reader_token,
    }
}

/// An open live reader, waiting at the stream's tail.
enum Reader {
    Body(Response),
    Pending(tokio::task::JoinHandle<Response>),
    Socket(Box<Socket>),
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens `face` at the tail with the reader's token, and returns once it waits there.
async fn open(setup: &Setup, face: Face) -> Reader {
    let reader = Client::new(&setup.server).bearer(&setup.reader_token);
    let h2 = Client::h2(&setup.server).bearer(&setup.reader_token);
    let records = "/v1/streams/s/records";
    match face {
        Face::DsSse => {
            let response = reader.get(&format!("{STREAM}?offset=now&live=sse")).await;
            assert_eq!(response.status(), 200);
            Reader::Body(read_until(response, "\"upToDate\":true").await)
        }
        Face::DsLongPoll => {
            let path = format!("{STREAM}?offset=now&live=long-poll");
            waiting(setup, async move { reader.get(&path).await }).await
        }
        Face::S2Sse => {
            let response = reader
                .s2(Method::GET, BUCKET, &format!("{records}?seq_num=1"))
                .header("accept", "text/event-stream")
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            Reader::Body(read_until(response, "event: ping").await)
        }
        Face::S2Wait => {
            let path = format!("{records}?seq_num=1&wait=30");
            let request = reader.s2(Method::GET, BUCKET, &path);
            waiting(setup, async move { request.send().await.unwrap() }).await
        }
        Face::S2s => {
            let mut response = h2
                .s2(Method::GET, BUCKET, &format!("{records}?seq_num=1"))
                .header("content-type", "s2s/proto")
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            // The heartbeat that tells the session caught up: a batch of no records.
            let mut buffer = BytesMut::new();
            loop {
                let chunk = tokio::time::timeout(WITHIN, response.chunk()).await;
                buffer.extend_from_slice(&chunk.unwrap().unwrap().expect("a heartbeat"));
                if let Some(SessionMessage::Regular(data)) =
                    FrameDecoder.decode(&mut buffer).unwrap()
                {
                    let batch: proto::ReadBatch = data.try_into_proto().unwrap();
                    assert!(batch.records.is_empty() && batch.tail.is_some());
                    break;
                }
            }
            Reader::Body(response)
        }
        Face::StreamLdSse => {
            let response = reader.get(&format!("{STREAM}/streamld?after=1")).await;
            assert_eq!(response.status(), 200);
            // It sends nothing on catching up: once counted, it follows.
            live_readers_reach(setup, 1).await;
            Reader::Body(response)
        }
        Face::StreamLdWs => {
            let url = setup
                .server
                .url("/v1/streamld/replication")
                .replacen("http", "ws", 1);
            let mut request = url.into_client_request().unwrap();
            let bearer = format!("Bearer {}", setup.reader_token);
            request
                .headers_mut()
                .insert("authorization", bearer.parse().unwrap());
            let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
            let join = json!({
                "@type": "SubscriptionRequest",
                "stream": setup.server.url(STREAM),
                "after": 1,
            });
            socket
                .send(WsMessage::Text(join.to_string().into()))
                .await
                .unwrap();
            assert_eq!(next_message(&mut socket).await, "StreamState");
            Reader::Socket(Box::new(socket))
        }
    }
}

/// Reads `response` until its text holds `wanted`, and hands it back.
async fn read_until(mut response: Response, wanted: &str) -> Response {
    let mut seen = String::new();
    while !seen.contains(wanted) {
        let chunk = tokio::time::timeout(WITHIN, response.chunk()).await;
        let chunk = chunk.expect("in time").unwrap().expect("the body goes on");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    response
}

/// Sends a request that waits (a long-poll), and returns once the server counts it as a live
/// reader.
async fn waiting(
    setup: &Setup,
    request: impl Future<Output = Response> + Send + 'static,
) -> Reader {
    let pending = tokio::spawn(request);
    live_readers_reach(setup, 1).await;
    Reader::Pending(pending)
}

async fn live_readers_reach(setup: &Setup, count: u64) {
    let counted = async {
        while setup.operator.gauge("runnel_live_readers").await != Some(count as f64) {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(WITHIN, counted)
        .await
        .expect("the reader is counted");
}

async fn happen(setup: &Setup, happening: Happening, face: Face) {
    let operator = &setup.operator;
    match happening {
        Happening::Deleted | Happening::SoftDeleted => {
            assert_eq!(operator.delete(STREAM).await.status(), 204);
        }
        Happening::Closed => {
            let close = operator
                .request(Method::POST, STREAM)
                .header("stream-closed", "true")
                .send()
                .await
                .unwrap();
            assert_eq!(close.status(), 204);
        }
        Happening::Revoked => {
            assert!(operator.revoke_token("reader").await.status().is_success());
            // A long-poll answers at once, and never with a record appended after the
            // revocation. (A streaming body ends through a task of its own, which a record
            // appended at once may beat.)
            if let Face::DsLongPoll | Face::S2Wait = face {
                let append = operator.append(STREAM, "text/plain", "after").await;
                assert_eq!(append.status(), 204);
            }
        }
        // It expires by itself, two seconds after it was issued, long before the reader's
        // timeout.
        Happening::Expired => {}
    }
}

/// What the reader does after the happening.
async fn seen(reader: Reader, face: Face) -> Seen {
    match reader {
        Reader::Pending(pending) => {
            let response = tokio::time::timeout(WITHIN, pending)
                .await
                .expect("answered in time")
                .unwrap();
            let closed = header(&response, "stream-closed").map(str::to_string);
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            assert!(
                !body.contains("after"),
                "{face:?} got a later record: {body}"
            );
            Seen::Answered(status, closed)
        }
        Reader::Body(mut response) => {
            let mut body = Vec::new();
            let ended = tokio::time::timeout(WITHIN, async {
                while let Some(chunk) = response.chunk().await.unwrap() {
                    body.extend_from_slice(&chunk);
                }
            })
            .await;
            assert!(
                ended.is_ok(),
                "the body ends: {:?}",
                String::from_utf8_lossy(&body)
            );
            Seen::Ended(last_of(face, &body))
        }
        Reader::Socket(mut socket) => Seen::Message(next_message(&mut socket).await),
    }
}

/// The last thing a streaming body said: the last SSE event (its `event:` type, or its `data`
/// for `[DONE]`, with an error's code), the last S2S frame (`terminal 404`, `batch`), or
/// `nothing`.
fn last_of(face: Face, body: &[u8]) -> String {
    if let Face::S2s = face {
        let mut buffer = BytesMut::from(body);
        let mut last = "nothing".to_string();
        while let Some(message) = FrameDecoder.decode(&mut buffer).unwrap() {
            last = match message {
                SessionMessage::Terminal(t) => format!("terminal {}", t.status),
                SessionMessage::Regular(data) => {
                    let batch: proto::ReadBatch = data.try_into_proto().unwrap();
                    assert!(batch.records.is_empty(), "no record after: {batch:?}");
                    "heartbeat".to_string()
                }
            };
        }
        return last;
    }
    let text = String::from_utf8_lossy(body);
    assert!(!text.contains("after"), "a record appended later: {text}");
    let Some(event) = text
        .trim_end()
        .rsplit("\n\n")
        .next()
        .filter(|e| !e.is_empty())
    else {
        return "nothing".to_string();
    };
    if event.contains("[DONE]") {
        return "[DONE]".to_string();
    }
    if event.starts_with("event: error") {
        let code = event
            .split("\"code\":\"")
            .nth(1)
            .and_then(|c| c.split('"').next());
        return format!("error {}", code.unwrap_or("?"));
    }
    if event.contains("\"streamClosed\":true") {
        return "control closed".to_string();
    }
    event
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("event: "))
        .unwrap_or("nothing")
        .to_string()
}

/// The type of the next replication message, or `closed`.
async fn next_message(socket: &mut Socket) -> String {
    loop {
        let message = tokio::time::timeout(WITHIN, socket.next())
            .await
            .expect("a message in time");
        match message {
            Some(Ok(WsMessage::Text(text))) => {
                let value: serde_json::Value = serde_json::from_str(&text).unwrap();
                let kind = value["@type"].as_str().unwrap_or("?");
                return kind.rsplit(':').next().unwrap_or(kind).to_string();
            }
            Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => {}
            Some(Ok(WsMessage::Close(_)) | Err(_)) | None => return "closed".to_string(),
            Some(Ok(other)) => panic!("unexpected {other:?}"),
        }
    }
}

async fn cell(face: Face, happening: Happening) -> Seen {
    let setup = setup(happening).await;
    let reader = open(&setup, face).await;
    happen(&setup, happening, face).await;
    seen(reader, face).await
}

fn ended(last: &str) -> Seen {
    Seen::Ended(last.to_string())
}

fn answered(status: u16) -> Seen {
    Seen::Answered(status, None)
}

fn message(kind: &str) -> Seen {
    Seen::Message(kind.to_string())
}

/// One test per cell of the table: `name`, the face, what happens, what the face then does.
macro_rules! cells {
    ($($name:ident: $face:ident, $happening:ident => $expected:expr;)*) => {$(
        #[tokio::test]
        async fn $name() {
            assert_eq!(cell(Face::$face, Happening::$happening).await, $expected);
        }
    )*};
}

cells! {
    a_deleted_stream_ends_a_ds_sse_response: DsSse, Deleted => ended("nothing");
    a_deleted_stream_answers_a_ds_long_poll_404: DsLongPoll, Deleted => answered(404);
    a_deleted_stream_ends_an_s2_sse_session_with_stream_not_found:
        S2Sse, Deleted => ended("error stream_not_found");
    a_deleted_stream_answers_an_s2_wait_404: S2Wait, Deleted => answered(404);
    a_deleted_stream_ends_an_s2s_session_with_a_terminal_404: S2s, Deleted => ended("terminal 404");
    a_deleted_stream_ends_a_streamld_sse_response: StreamLdSse, Deleted => ended("nothing");
    a_deleted_stream_is_told_to_a_replica_as_stream_deleted:
        StreamLdWs, Deleted => message("StreamDeleted");

    a_soft_deleted_stream_ends_a_ds_sse_response: DsSse, SoftDeleted => ended("nothing");
    a_soft_deleted_stream_answers_a_ds_long_poll_410: DsLongPoll, SoftDeleted => answered(410);
    a_soft_deleted_stream_ends_an_s2_sse_session_with_stream_not_found:
        S2Sse, SoftDeleted => ended("error stream_not_found");
    a_soft_deleted_stream_answers_an_s2_wait_404: S2Wait, SoftDeleted => answered(404);
    a_soft_deleted_stream_ends_an_s2s_session_with_a_terminal_404:
        S2s, SoftDeleted => ended("terminal 404");
    a_soft_deleted_stream_ends_a_streamld_sse_response: StreamLdSse, SoftDeleted => ended("nothing");
    a_soft_deleted_stream_is_told_to_a_replica_as_stream_deleted:
        StreamLdWs, SoftDeleted => message("StreamDeleted");

    a_closed_stream_ends_a_ds_sse_response_after_a_closed_control_event:
        DsSse, Closed => ended("control closed");
    a_closed_stream_answers_a_ds_long_poll_204_closed:
        DsLongPoll, Closed => Seen::Answered(204, Some("true".into()));
    a_closed_stream_ends_an_s2_sse_session_with_done: S2Sse, Closed => ended("[DONE]");
    a_closed_stream_answers_an_s2_wait_with_no_records: S2Wait, Closed => answered(200);
    a_closed_stream_ends_an_s2s_session_without_a_terminal: S2s, Closed => ended("nothing");
    a_closed_stream_ends_a_streamld_sse_response: StreamLdSse, Closed => ended("nothing");
    a_closed_stream_is_told_to_a_replica_as_its_state: StreamLdWs, Closed => message("StreamState");

    a_revoked_token_ends_a_ds_sse_response: DsSse, Revoked => ended("nothing");
    a_revoked_token_answers_a_waiting_ds_long_poll_401: DsLongPoll, Revoked => answered(401);
    a_revoked_token_ends_an_s2_sse_session_without_done: S2Sse, Revoked => ended("nothing");
    a_revoked_token_answers_a_waiting_s2_wait_401: S2Wait, Revoked => answered(401);
    a_revoked_token_ends_an_s2s_session_without_a_terminal: S2s, Revoked => ended("nothing");
    a_revoked_token_ends_a_streamld_sse_response: StreamLdSse, Revoked => ended("nothing");
    a_revoked_token_closes_a_replication_session: StreamLdWs, Revoked => message("closed");

    an_expired_token_answers_a_waiting_ds_long_poll_401: DsLongPoll, Expired => answered(401);
    an_expired_token_answers_a_waiting_s2_wait_401: S2Wait, Expired => answered(401);
}
