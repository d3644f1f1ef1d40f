//! The replication WebSocket as a raw replica sees it: joins, what it answers to messages it
//! does not take, its limits, and the state a long session lets go of.

use std::time::Duration;

use crate::common::{Client, Server, header};

use super::{
    BUCKET, append, bucket_mirror, link_target, stream, wait_for_status, wait_until_mirrored,
    with_bucket,
};

/// The WebSocket replication endpoint a bucket advertises in its `Link` header.
async fn replication_endpoint(up: &Client) -> String {
    let response = up.get(&format!("/{BUCKET}")).await;
    let links = header(&response, "link")
        .expect("a Link header")
        .to_string();
    link_target(&links, "websocket-replication").expect("a websocket-replication Link")
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A raw StreamLD replica: a WebSocket to the upstream's replication endpoint.
async fn connect_replica(up: &Client) -> Socket {
    let endpoint = replication_endpoint(up).await;
    let (socket, _) = tokio_tungstenite::connect_async(endpoint.as_str())
        .await
        .expect("websocket");
    socket
}

async fn send_json(socket: &mut Socket, message: serde_json::Value) {
    use futures::SinkExt;
    socket
        .send(tokio_tungstenite::tungstenite::Message::Text(
            message.to_string().into(),
        ))
        .await
        .unwrap();
}

/// A SubscriptionRequest for `stream` of the bucket, or for the whole bucket when `stream` is
/// empty (with the replica's `cursors` per stream, unless null).
fn subscription(up: &Client, stream: &str, cursors: serde_json::Value) -> serde_json::Value {
    let path = match stream {
        "" => format!("/{BUCKET}"),
        name => format!("/{BUCKET}/{name}"),
    };
    let mut join = serde_json::json!({
        "@type": "SubscriptionRequest",
        "stream": up.url(&path),
    });
    if !cursors.is_null() {
        join["runnel:cursors"] = cursors;
    }
    join
}

/// The next JSON message from the upstream, or `None` when nothing arrives within `within`.
async fn next_json(socket: &mut Socket, within: Duration) -> Option<serde_json::Value> {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let message = tokio::time::timeout_at(deadline, socket.next())
            .await
            .ok()?;
        match message.expect("socket open").expect("websocket message") {
            tokio_tungstenite::tungstenite::Message::Text(text) => {
                return Some(serde_json::from_str(&text).unwrap());
            }
            tokio_tungstenite::tungstenite::Message::Close(_) => panic!("upstream closed"),
            _ => continue,
        }
    }
}

/// Reads until a message of `kind` arrives (within 10 s), returning every message read.
async fn read_until(
    socket: &mut Socket,
    mut done: impl FnMut(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let mut seen = Vec::new();
    loop {
        let message = next_json(socket, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("nothing more arrived; saw {seen:?}"));
        let stop = done(&message);
        seen.push(message);
        if stop {
            return seen;
        }
    }
}

fn is_state(message: &serde_json::Value) -> bool {
    message["@type"] == "runnel:StreamState"
}

fn frame_cursor(message: &serde_json::Value) -> Option<u64> {
    (message["@type"] == "ReplicationFrame").then(|| message["cursor"].as_u64().unwrap())
}

#[tokio::test]
async fn a_second_bucket_join_on_one_session_replaces_the_first_so_each_append_arrives_once() {
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let s = stream("s");
    assert_eq!(up.create(&s, "text/plain", "a;").await.status(), 201);

    let mut socket = connect_replica(&up).await;
    let join = subscription(&up, "", serde_json::json!({"s": 1}));
    // Each join answers with the stream's state: once it is here, that join is live.
    send_json(&mut socket, join.clone()).await;
    read_until(&mut socket, is_state).await;
    send_json(&mut socket, join).await;
    read_until(&mut socket, is_state).await;

    append(&up, &s, "text/plain", "b;").await;
    append(&up, &s, "text/plain", "c;").await;
    let mut seen = read_until(&mut socket, |m| frame_cursor(m) == Some(3)).await;
    // Whatever a second pump would send comes within a moment; a quiet second means nothing does.
    while let Some(message) = next_json(&mut socket, Duration::from_secs(1)).await {
        seen.push(message);
    }
    let cursors: Vec<u64> = seen.iter().filter_map(frame_cursor).collect();
    assert_eq!(cursors, [2, 3], "one frame per append: {seen:?}");
}

/// The close frame the upstream ends the session with, within 5 s.
async fn close_frame(socket: &mut Socket) -> (u16, String) {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message as Ws;
    let message = tokio::time::timeout(Duration::from_secs(5), socket.next())
        .await
        .expect("the session ends within 5 s");
    match message {
        Some(Ok(Ws::Close(Some(frame)))) => (u16::from(frame.code), frame.reason.to_string()),
        Some(Ok(Ws::Close(None))) | None | Some(Err(_)) => panic!("closed without a reason"),
        Some(Ok(other)) => panic!("expected a close frame, got {other:?}"),
    }
}

#[tokio::test]
async fn a_replica_that_sends_what_replication_does_not_take_is_told_why_it_is_closed() {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message as Ws;
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let cases: [(Ws, u16, &str); 4] = [
        (Ws::Text("not json".into()), 1007, "SubscriptionRequest"),
        (
            Ws::Text(r#"{"@type":"SubscriptionRequest","after":-1}"#.into()),
            1007,
            "SubscriptionRequest",
        ),
        (Ws::Text(r#"{"@type":"GapSignal"}"#.into()), 1008, "only"),
        (Ws::Binary(vec![1, 2, 3].into()), 1003, "binary"),
    ];
    for (message, code, reason) in cases {
        let mut socket = connect_replica(&up).await;
        socket.send(message).await.unwrap();
        let (got, why) = close_frame(&mut socket).await;
        assert_eq!(got, code, "{why}");
        assert!(why.contains(reason), "{why}");
    }

    // A bucket that does not exist is answered with a gap, as one the replica may not read,
    // after the deletion of each stream the replica holds of it.
    let mut socket = connect_replica(&up).await;
    let missing = up.url("/no-such-bucket");
    send_json(
        &mut socket,
        serde_json::json!({"@type": "SubscriptionRequest", "stream": missing,
            "runnel:cursors": {"a": 3, "b": 0}}),
    )
    .await;
    for stream in ["a", "b"] {
        let answer = next_json(&mut socket, Duration::from_secs(5))
            .await
            .expect("an answer");
        assert_eq!(answer["@type"], "runnel:StreamDeleted", "{answer}");
        assert_eq!(answer["stream"], format!("{missing}/{stream}"), "{answer}");
    }
    let answer = next_json(&mut socket, Duration::from_secs(5))
        .await
        .expect("an answer");
    assert_eq!(answer["@type"], "GapSignal", "{answer}");
}

#[tokio::test]
async fn a_replica_message_over_max_body_bytes_closes_the_session_with_1009() {
    let upstream = Server::start(&["--memory", "--max-body-bytes", "4096"]);
    let up = with_bucket(&upstream).await;
    let created = up.create(&stream("a"), "text/plain", "x").await;
    assert_eq!(created.status(), 201);
    // A join for the bucket whose cursors (for streams it does not hold) make it 8 KiB: well
    // formed, and taken when no limit applies.
    let cursors: serde_json::Map<String, serde_json::Value> = (0..600)
        .map(|i| (format!("stream-{i:05}"), serde_json::json!(1)))
        .collect();
    let join = subscription(&up, "", serde_json::Value::Object(cursors));
    assert!(join.to_string().len() > 8000);
    let mut socket = connect_replica(&up).await;
    send_json(&mut socket, join).await;
    let (code, why) = close_frame(&mut socket).await;
    assert_eq!(code, 1009, "{why}");
    assert!(why.contains("4096"), "{why}");

    // A join under the limit is served.
    let mut socket = connect_replica(&up).await;
    send_json(&mut socket, subscription(&up, "a", serde_json::Value::Null)).await;
    let answer = next_json(&mut socket, Duration::from_secs(5))
        .await
        .expect("an answer");
    assert_ne!(answer["@type"], "GapSignal", "{answer}");
}

#[tokio::test]
async fn a_replication_websocket_counts_against_max_connections_for_as_long_as_it_is_open() {
    let server = Server::start(&["--memory", "--max-connections", "2"]);
    let endpoint = server
        .url("/v1/streamld/replication")
        .replace("http://", "ws://");
    let connect = || tokio_tungstenite::connect_async(endpoint.clone());
    let (first, _) = connect().await.expect("the first websocket");
    let (second, _) = connect().await.expect("the second websocket");
    assert!(
        connect().await.is_err(),
        "a third connection is over the limit while two websockets are open"
    );
    drop((first, second));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while connect().await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slots came back once the websockets closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (up to 30 s) until the server's gauge `name` reads `value` (0 until it is first set).
async fn wait_for_gauge(http: &Client, name: &str, value: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = http.gauge(name).await.unwrap_or(0.0);
        if now == value {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} is still {now}, not {value}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_bucket_mirror_session_forgets_the_streams_deleted_upstream() {
    const FOLLOWED: &str = "runnel_replication_streams_followed";
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let kept = stream("kept");
    assert_eq!(up.create(&kept, "text/plain", "k;").await.status(), 201);
    let mirror = bucket_mirror(&upstream);
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["kept"]).await;
    wait_for_gauge(&up, FOLLOWED, 1.0).await;

    // Streams come and go while the session lasts: it follows each, then lets it go, so a
    // session that lives for months holds nothing for the streams deleted meanwhile.
    let names: Vec<String> = (0..20).map(|i| format!("brief-{i}")).collect();
    for name in &names {
        assert_eq!(
            up.create(&stream(name), "text/plain", "b;").await.status(),
            201
        );
    }
    wait_for_gauge(&up, FOLLOWED, 21.0).await;
    for name in &names {
        assert_eq!(up.delete(&stream(name)).await.status(), 204);
    }
    for name in &names {
        wait_for_status(&down, &stream(name), 404).await;
    }
    wait_for_gauge(&up, FOLLOWED, 1.0).await;

    // The session is still whole: the stream it kept goes on arriving.
    append(&up, &kept, "text/plain", "k2;").await;
    wait_until_mirrored(&up, &down, &["kept"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_pump_ended_on_a_gap_is_forgotten_once_it_is_deleted() {
    const FOLLOWED: &str = "runnel_replication_streams_followed";
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let s = stream("s");
    assert_eq!(up.create(&s, "text/plain", "a;").await.status(), 201);

    // A cursor past the tail cannot be served: the stream's pump answers with a gap and ends,
    // while the stream lives on.
    let mut socket = connect_replica(&up).await;
    let join = subscription(&up, "", serde_json::json!({"s": 99}));
    send_json(&mut socket, join).await;
    read_until(&mut socket, |m| m["@type"] == "GapSignal").await;
    wait_for_gauge(&up, FOLLOWED, 1.0).await;

    assert_eq!(up.delete(&s).await.status(), 204);
    wait_for_gauge(&up, FOLLOWED, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_forgets_single_stream_subscriptions_whose_streams_are_gone_and_still_says_so() {
    const SUBSCRIPTIONS: &str = "runnel_replication_subscriptions";
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let kept = stream("kept");
    assert_eq!(up.create(&kept, "text/plain", "k;").await.status(), 201);

    let mut socket = connect_replica(&up).await;
    let join = |name: &str| subscription(&up, name, serde_json::Value::Null);
    send_json(&mut socket, join("kept")).await;
    read_until(&mut socket, is_state).await;
    // Each join of a stream that is not there is answered that it is deleted, and then the
    // session keeps nothing for it: a replica asking for names by the thousand holds no memory.
    for i in 0..30 {
        send_json(&mut socket, join(&format!("absent-{i}"))).await;
        let answer = read_until(&mut socket, |m| m["@type"] == "runnel:StreamDeleted").await;
        let deleted = answer.last().unwrap();
        assert!(
            deleted["stream"]
                .as_str()
                .unwrap()
                .ends_with(&format!("absent-{i}"))
        );
    }
    wait_for_gauge(&up, SUBSCRIPTIONS, 1.0).await;

    // The session is whole: the stream it follows goes on arriving.
    append(&up, &kept, "text/plain", "k2;").await;
    read_until(&mut socket, |m| frame_cursor(m) == Some(2)).await;
    drop(socket);
    wait_for_gauge(&up, SUBSCRIPTIONS, 0.0).await;
}

#[tokio::test]
async fn a_session_follows_at_most_ten_thousand_targets() {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message as Ws;
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    // Streams that are there: a pump follows each for as long as the session lasts.
    let created = futures::stream::iter(0..=10_000)
        .map(|i| {
            let (up, path) = (&up, stream(&format!("s{i}")));
            async move { up.create(&path, "text/plain", "").await.status() }
        })
        .buffer_unordered(16)
        .filter(|status| std::future::ready(*status != 201))
        .count()
        .await;
    assert_eq!(created, 0, "every stream created");
    let mut socket = connect_replica(&up).await;
    for i in 0..=10_000 {
        let join = subscription(&up, &format!("s{i}"), serde_json::Value::Null);
        send_json(&mut socket, join).await;
    }
    // Each join is answered with its stream's state; the one past the bound ends the session.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut answered = 0;
    let closed = loop {
        let message = tokio::time::timeout_at(deadline, socket.next())
            .await
            .expect("the session ends within 30 s");
        match message {
            Some(Ok(Ws::Text(_))) => answered += 1,
            Some(Ok(Ws::Close(Some(frame)))) => break frame,
            Some(Ok(_)) => {}
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(u16::from(closed.code), 1008);
    assert!(closed.reason.contains("at most 10000"), "{}", closed.reason);
    assert!(answered <= 10_000, "{answered} joins answered");
}
