//! StreamLD replication end to end: two real servers, an upstream and a mirror of one of its
//! buckets. Appends flow live; the mirror survives SIGKILL and resumes from its own cursor; the
//! upstream restarts and the mirror reconnects; retention moved past the mirror's cursor takes
//! the gap path and rebuilds from the snapshot. At the end both sides hold the same bytes at the
//! same offsets.

use std::path::Path;
use std::time::Duration;

use crate::common::{Server, TlsServer, client, header};

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

fn joins(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("replication join"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_follows_live_resumes_after_crashes_and_rebuilds_after_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let (up_dir, down_dir) = (dir.path().join("up"), dir.path().join("down"));
    let (up_log, down_log) = (dir.path().join("up.log"), dir.path().join("down.log"));
    let http = client();
    let data = |p: &Path| p.to_str().unwrap().to_string();

    let upstream = Server::start_logged(&["--data-dir", &data(&up_dir)], &up_log);
    let listen = upstream.base.trim_start_matches("http://").to_string();
    create_bucket(&http, &upstream).await;
    let bin = upstream.url(&format!("/{BUCKET}/bin"));
    let json = upstream.url(&format!("/{BUCKET}/events"));
    assert_eq!(
        put(&http, &bin, "application/octet-stream", "\u{0}\u{1}binary")
            .await
            .status(),
        201
    );
    assert_eq!(
        put(&http, &json, "application/json", r#"[{"n":0},{"n":1}]"#)
            .await
            .status(),
        201
    );
    for n in 2..20 {
        append(&http, &json, "application/json", &format!(r#"{{"n":{n}}}"#)).await;
        append(
            &http,
            &bin,
            "application/octet-stream",
            &format!("chunk-{n};"),
        )
        .await;
    }

    let mirror_args = |dir: &str| {
        vec![
            "--data-dir".to_string(),
            dir.to_string(),
            "--mirror-from".to_string(),
            format!("{}/{BUCKET}", upstream.base),
        ]
    };
    let args = mirror_args(&data(&down_dir));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mirror = Server::start_logged(&args, &down_log);
    wait_until_mirrored(&http, &upstream, &mirror, &["bin", "events"]).await;

    // Live: new appends and a stream created later arrive on their own.
    append(&http, &json, "application/json", r#"{"live":true}"#).await;
    assert_eq!(
        put(
            &http,
            &upstream.url(&format!("/{BUCKET}/later")),
            "text/plain",
            "late"
        )
        .await
        .status(),
        201
    );
    wait_until_mirrored(&http, &upstream, &mirror, &["bin", "events", "later"]).await;

    // The mirror is read-only: a write is redirected to the same path upstream.
    let no_redirects = no_redirects();
    let refused = no_redirects
        .post(mirror.url(&format!("/{BUCKET}/events")))
        .header("content-type", "application/json")
        .body("1")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 307);
    assert_eq!(
        header(&refused, "location"),
        Some(format!("{}/{BUCKET}/events", upstream.base).as_str())
    );

    // SIGKILL the mirror mid-stream; the upstream keeps going; the restarted mirror resumes from
    // the cursors it persisted (its join carries them), not from the beginning.
    let writer = tokio::spawn({
        let (http, json) = (http.clone(), json.clone());
        async move {
            for n in 0..200 {
                append(
                    &http,
                    &json,
                    "application/json",
                    &format!(r#"{{"burst":{n}}}"#),
                )
                .await;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    mirror.kill();
    writer.await.unwrap();
    let joins_before = joins(&up_log).len();
    let mirror = Server::start_logged(&args, &down_log);
    wait_until_mirrored(&http, &upstream, &mirror, &["bin", "events", "later"]).await;
    let resumed = joins(&up_log)[joins_before..].join("\n");
    assert!(
        resumed.contains("\"events\": ") && !resumed.contains("\"events\": 0"),
        "resumed from its cursor: {resumed}"
    );
    assert!(
        resumed.contains("\"bin\": 19"),
        "the binary stream resumed at its 19 records: {resumed}"
    );

    // The upstream restarts on the same address; the mirror reconnects by itself.
    upstream.kill();
    let upstream = Server::start_logged(
        &["--data-dir", &data(&up_dir), "--listen", &listen],
        &up_log,
    );
    append(&http, &bin, "application/octet-stream", "after-restart;").await;
    wait_until_mirrored(&http, &upstream, &mirror, &["bin", "events", "later"]).await;

    // Retention moves past the mirror's cursor while it is down: on return it gets a gap and
    // rebuilds from the snapshot and the retained records.
    mirror.kill();
    for n in 0..5 {
        append(
            &http,
            &json,
            "application/json",
            &format!(r#"{{"after_gap":{n}}}"#),
        )
        .await;
    }
    let tail = header(
        &http.head(&json).send().await.unwrap(),
        "stream-next-offset",
    )
    .unwrap()
    .to_string();
    let snapshot = http
        .put(format!("{json}/snapshot/{tail}"))
        .header("content-type", "application/json")
        .body(r#"{"state":"folded"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(snapshot.status(), 204);
    let digest = header(&snapshot, "stream-snapshot-digest")
        .unwrap()
        .to_string();
    assert_eq!(
        http.put(format!("{json}/retention/{tail}"))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    append(
        &http,
        &json,
        "application/json",
        r#"{"after_retention":true}"#,
    )
    .await;
    let mirror = Server::start_logged(&args, &down_log);
    wait_until_mirrored(&http, &upstream, &mirror, &["bin", "events", "later"]).await;
    assert!(
        std::fs::read_to_string(&down_log)
            .unwrap()
            .contains("gap: rebuilding"),
        "the gap path was taken"
    );
    let mirrored_json = mirror.url(&format!("/{BUCKET}/events"));
    let head = http.head(&mirrored_json).send().await.unwrap();
    assert_eq!(
        header(&head, "stream-snapshot-digest"),
        Some(digest.as_str())
    );
    assert_eq!(
        http.get(format!(
            "{mirrored_json}?offset=0000000000000000_0000000000000000"
        ))
        .send()
        .await
        .unwrap()
        .status(),
        410
    );

    // Caught up, the mirror reports no lag, and which upstream it follows.
    let head = http.head(&mirrored_json).send().await.unwrap();
    assert_eq!(
        header(&head, "stream-replication-lag-records"),
        Some("0"),
        "{:?}",
        head.headers()
    );
    assert_eq!(
        header(&head, "stream-mirror-of"),
        Some(upstream.base.as_str())
    );

    let metrics = http
        .get(mirror.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!(
            "runnel_replication_lag_records{{stream=\"/{BUCKET}/events\",upstream=\"{}\"}} 0",
            upstream.base
        )),
        "{metrics}"
    );

    // Closing and new attributes reach the mirror too.
    let closed = http
        .post(&bin)
        .header("stream-closed", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 204);
    let attrs = http
        .put(format!("{bin}/attrs"))
        .header("content-type", "application/json")
        .body(r#"{"title":"mirrored"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(attrs.status(), 204);
    let mirrored_bin = mirror.url(&format!("/{BUCKET}/bin"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let head = http.head(&mirrored_bin).send().await.unwrap();
        let title = http
            .get(format!("{mirrored_bin}/attrs"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if header(&head, "stream-closed") == Some("true") && title.contains("mirrored") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "close and attrs did not reach the mirror"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A stream deleted upstream is removed from the mirror.
    assert_eq!(
        http.delete(upstream.url(&format!("/{BUCKET}/later")))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while http
        .head(mirror.url(&format!("/{BUCKET}/later")))
        .send()
        .await
        .unwrap()
        .status()
        != 404
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "deletion did not reach the mirror"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Record by record, both sides agree: same ordinals, same offsets, same bytes.
    for stream in ["events"] {
        let up = http
            .get(upstream.url(&format!(
                "/{BUCKET}/{stream}?tail_records=1000&record_view=envelope"
            )))
            .send()
            .await
            .unwrap();
        let down = http
            .get(mirror.url(&format!(
                "/{BUCKET}/{stream}?tail_records=1000&record_view=envelope"
            )))
            .send()
            .await
            .unwrap();
        assert_eq!(
            header(&up, "stream-record-start"),
            header(&down, "stream-record-start")
        );
        assert_eq!(up.text().await.unwrap(), down.text().await.unwrap());
    }
}

#[tokio::test]
async fn a_new_mirror_of_a_trimmed_stream_starts_at_the_retained_start_without_a_rebuild() {
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let trimmed = upstream.url(&format!("/{BUCKET}/trimmed"));
    assert_eq!(
        put(&http, &trimmed, "text/plain", "a;b;").await.status(),
        201
    );
    let head = http.head(&trimmed).send().await.unwrap();
    let tail = header(&head, "stream-next-offset").unwrap().to_string();
    for step in ["snapshot", "retention"] {
        let r = http
            .put(format!("{trimmed}/{step}/{tail}"))
            .body("a;b;")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{step}");
    }
    append(&http, &trimmed, "text/plain", "c;").await;

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("mirror.log");
    let mirror = Server::start_logged(
        &[
            "--memory",
            "--mirror-from",
            &upstream.url(&format!("/{BUCKET}")),
        ],
        &log,
    );
    wait_until_mirrored(&http, &upstream, &mirror, &["trimmed"]).await;
    append(&http, &trimmed, "text/plain", "d;").await;
    wait_until_mirrored(&http, &upstream, &mirror, &["trimmed"]).await;
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains("rebuilding"), "{logged}");
}

#[tokio::test]
async fn the_sse_binding_keeps_a_quiet_connection_alive_ends_at_its_max_duration_and_answers_204_once_closed()
 {
    // Tests run with a 500 ms long-poll timeout, which bounds the keep-alive interval.
    let server = Server::start(&["--memory", "--sse-max-duration-secs", "2"]);
    let http = client();
    create_bucket(&http, &server).await;
    let stream = server.url(&format!("/{BUCKET}/quiet"));
    assert_eq!(put(&http, &stream, "text/plain", "a;").await.status(), 201);
    let started = std::time::Instant::now();
    let response = http
        .get(format!("{stream}/streamld"))
        .header("last-event-id", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = futures::StreamExt::next(&mut body).await {
            seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
    })
    .await;
    assert!(ended.is_ok(), "the body ends at --sse-max-duration-secs");
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(seen.contains(": keep-alive\n\n"), "{seen:?}");
    assert!(!seen.contains("id:"), "nothing after cursor 1: {seen:?}");

    let closed = http
        .post(&stream)
        .header("content-type", "text/plain")
        .header("stream-closed", "true")
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    let done = http
        .get(format!("{stream}/streamld"))
        .header("last-event-id", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(
        done.status(),
        204,
        "a closed stream read to its end: stop reconnecting"
    );
}

#[tokio::test]
async fn the_sse_binding_sends_one_event_per_record_resumes_and_signals_gaps() {
    let server = Server::start(&["--memory"]);
    let http = client();
    assert_eq!(
        http.put(server.url("/feeds"))
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    let stream = server.url("/feeds/news");
    assert_eq!(
        put(
            &http,
            &stream,
            "application/json",
            r#"[{"n":1},{"n":2},{"n":3}]"#
        )
        .await
        .status(),
        201
    );
    let head = http.head(&stream).send().await.unwrap();
    let links = header(&head, "link").unwrap().to_string();
    let sse_url = links
        .split(',')
        .find(|l| l.contains("streamld#sse"))
        .and_then(|l| {
            l.split_once('<')?
                .1
                .split_once('>')
                .map(|(u, _)| u.to_string())
        })
        .expect("an SSE binding Link");

    // Resuming after cursor 1 delivers events 2 and 3, each with its cursor as id.
    let response = http
        .get(&sse_url)
        .header("last-event-id", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&response, "content-type"), Some("text/event-stream"));
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("\nid: 3\n") && !seen.starts_with("id: 3\n") {
        let chunk =
            tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut body))
                .await
                .unwrap();
        seen.push_str(std::str::from_utf8(&chunk.unwrap().unwrap()).unwrap());
    }
    assert!(seen.starts_with("id: 2\n"), "{seen}");
    assert!(seen.contains(r#""payload":{"n":3}"#), "{seen}");

    // Behind retention: 409 with a GapSignal, and no event stream.
    let tail = header(&head, "stream-next-offset").unwrap().to_string();
    assert_eq!(
        http.put(format!("{stream}/snapshot/{tail}"))
            .body("s")
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    assert_eq!(
        http.put(format!("{stream}/retention/{tail}"))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    let gap = http.get(format!("{sse_url}?after=1")).send().await.unwrap();
    assert_eq!(gap.status(), 409);
    let body: serde_json::Value = serde_json::from_slice(&gap.bytes().await.unwrap()).unwrap();
    assert_eq!(body["@type"], "GapSignal");
    assert_eq!(body["oldestAvailable"], 4);
}

#[tokio::test]
async fn a_single_stream_mirror_follows_only_that_stream() {
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let wanted = upstream.url(&format!("/{BUCKET}/wanted"));
    assert_eq!(
        put(&http, &wanted, "text/plain", "one;").await.status(),
        201
    );
    assert_eq!(
        put(
            &http,
            &upstream.url(&format!("/{BUCKET}/other")),
            "text/plain",
            "x"
        )
        .await
        .status(),
        201
    );
    let mirror = Server::start(&["--memory", "--mirror-from", &wanted]);
    append(&http, &wanted, "text/plain", "two;").await;
    wait_until_mirrored(&http, &upstream, &mirror, &["wanted"]).await;
    let other = http
        .head(mirror.url(&format!("/{BUCKET}/other")))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404, "only the named stream is mirrored");
}

/// The WebSocket replication endpoint a bucket advertises in its `Link` header.
async fn replication_endpoint(http: &reqwest::Client, server: &Server) -> String {
    let response = http
        .get(server.url(&format!("/{BUCKET}")))
        .send()
        .await
        .unwrap();
    let links = header(&response, "link")
        .expect("a Link header")
        .to_string();
    links
        .split(',')
        .find(|l| l.contains("streamld#websocket-replication"))
        .and_then(|l| {
            l.split_once('<')?
                .1
                .split_once('>')
                .map(|(u, _)| u.to_string())
        })
        .expect("a websocket-replication Link")
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A raw StreamLD replica: a WebSocket to the upstream's replication endpoint.
async fn connect_replica(http: &reqwest::Client, server: &Server) -> Socket {
    let endpoint = replication_endpoint(http, server).await;
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
fn subscription(upstream: &Server, stream: &str, cursors: serde_json::Value) -> serde_json::Value {
    let path = match stream {
        "" => format!("/{BUCKET}"),
        name => format!("/{BUCKET}/{name}"),
    };
    let mut join = serde_json::json!({
        "@type": "SubscriptionRequest",
        "stream": upstream.url(&path),
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
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let stream = upstream.url(&format!("/{BUCKET}/s"));
    assert_eq!(put(&http, &stream, "text/plain", "a;").await.status(), 201);

    let mut socket = connect_replica(&http, &upstream).await;
    let join = subscription(&upstream, "", serde_json::json!({"s": 1}));
    // Each join answers with the stream's state: once it is here, that join is live.
    send_json(&mut socket, join.clone()).await;
    read_until(&mut socket, is_state).await;
    send_json(&mut socket, join).await;
    read_until(&mut socket, is_state).await;

    append(&http, &stream, "text/plain", "b;").await;
    append(&http, &stream, "text/plain", "c;").await;
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
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
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
        let mut socket = connect_replica(&http, &upstream).await;
        socket.send(message).await.unwrap();
        let (got, why) = close_frame(&mut socket).await;
        assert_eq!(got, code, "{why}");
        assert!(why.contains(reason), "{why}");
    }

    // A bucket that does not exist is answered with a gap, as one the replica may not read,
    // after the deletion of each stream the replica holds of it.
    let mut socket = connect_replica(&http, &upstream).await;
    let missing = upstream.url("/no-such-bucket");
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
    let http = client();
    let upstream = Server::start(&["--memory", "--max-body-bytes", "4096"]);
    create_bucket(&http, &upstream).await;
    let created = put(
        &http,
        &upstream.url(&format!("/{BUCKET}/a")),
        "text/plain",
        "x",
    )
    .await;
    assert_eq!(created.status(), 201);
    // A join for the bucket whose cursors (for streams it does not hold) make it 8 KiB: well
    // formed, and taken when no limit applies.
    let cursors: serde_json::Map<String, serde_json::Value> = (0..600)
        .map(|i| (format!("stream-{i:05}"), serde_json::json!(1)))
        .collect();
    let join = subscription(&upstream, "", serde_json::Value::Object(cursors));
    assert!(join.to_string().len() > 8000);
    let mut socket = connect_replica(&http, &upstream).await;
    send_json(&mut socket, join).await;
    let (code, why) = close_frame(&mut socket).await;
    assert_eq!(code, 1009, "{why}");
    assert!(why.contains("4096"), "{why}");

    // A join under the limit is served.
    let mut socket = connect_replica(&http, &upstream).await;
    send_json(
        &mut socket,
        subscription(&upstream, "a", serde_json::Value::Null),
    )
    .await;
    let answer = next_json(&mut socket, Duration::from_secs(5))
        .await
        .expect("an answer");
    assert_ne!(answer["@type"], "GapSignal", "{answer}");
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

#[tokio::test]
async fn stream_names_travel_percent_encoded_so_a_bucket_mirror_keeps_every_name_apart() {
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    // `a%20b` and `a b` are two streams; so is the S2 name `dir/x`.
    let (percent, space) = ("a%2520b", "a%20b");
    for (stream, body) in [(percent, "percent;"), (space, "space;")] {
        let url = upstream.url(&format!("/{BUCKET}/{stream}"));
        assert_eq!(put(&http, &url, "text/plain", body).await.status(), 201);
    }
    let created = http
        .post(upstream.url("/v1/streams"))
        .header("s2-basin", BUCKET)
        .header("content-type", "application/json")
        .body(r#"{"stream":"dir/x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let s2_append = |body: &'static str| {
        http.post(upstream.url("/v1/streams/dir%2Fx/records"))
            .header("s2-basin", BUCKET)
            .header("content-type", "application/json")
            .body(format!(r#"{{"records":[{{"body":"{body}"}}]}}"#))
            .send()
    };
    assert_eq!(s2_append("one").await.unwrap().status(), 200);

    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &upstream.url(&format!("/{BUCKET}")),
    ]);
    wait_until_mirrored(&http, &upstream, &mirror, &[percent, space]).await;
    // Live appends land on the right copies too.
    for (stream, body) in [(percent, "percent-2;"), (space, "space-2;")] {
        append(
            &http,
            &upstream.url(&format!("/{BUCKET}/{stream}")),
            "text/plain",
            body,
        )
        .await;
    }
    assert_eq!(s2_append("two").await.unwrap().status(), 200);
    wait_until_mirrored(&http, &upstream, &mirror, &[percent, space]).await;
    let (_, _, body) = view(&http, &mirror.url(&format!("/{BUCKET}/{percent}"))).await;
    assert_eq!(body, b"percent;percent-2;");

    let upstream_records = s2_records(&http, &upstream, "dir/x").await;
    assert_eq!(upstream_records.0, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while s2_records(&http, &mirror, "dir/x").await != upstream_records {
        assert!(
            tokio::time::Instant::now() < deadline,
            "dir/x was not mirrored: {:?}",
            s2_records(&http, &mirror, "dir/x").await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

/// The flags of a mirror of the upstream's bucket that keeps its copy in `data`, so that it can
/// be killed and started again.
fn durable_bucket_mirror(data: &Path, upstream: &Server) -> Vec<String> {
    vec![
        "--data-dir".into(),
        data.to_str().unwrap().into(),
        "--mirror-from".into(),
        upstream.url(&format!("/{BUCKET}")),
    ]
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Starts a mirror with `args`, waits until its `streams` match the upstream's, and SIGKILLs it.
async fn mirror_then_kill(
    http: &reqwest::Client,
    upstream: &Server,
    args: &[String],
    streams: &[&str],
) {
    let mirror = Server::start(&strs(args));
    wait_until_mirrored(http, upstream, &mirror, streams).await;
    mirror.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_upstream_while_a_bucket_mirror_is_down_is_removed_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mirror");
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    for stream in ["doomed", "kept"] {
        let url = upstream.url(&format!("/{BUCKET}/{stream}"));
        assert_eq!(put(&http, &url, "text/plain", "one;").await.status(), 201);
    }
    let args = durable_bucket_mirror(&data, &upstream);
    mirror_then_kill(&http, &upstream, &args, &["doomed", "kept"]).await;

    let doomed = upstream.url(&format!("/{BUCKET}/doomed"));
    assert_eq!(http.delete(&doomed).send().await.unwrap().status(), 204);
    append(
        &http,
        &upstream.url(&format!("/{BUCKET}/kept")),
        "text/plain",
        "two;",
    )
    .await;

    let mirror = Server::start(&strs(&args));
    wait_until_mirrored(&http, &upstream, &mirror, &["kept"]).await;
    wait_for_status(&http, &mirror.url(&format!("/{BUCKET}/doomed")), 404).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_deleted_upstream_while_its_mirror_is_down_is_emptied_on_the_mirror_when_it_returns()
 {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mirror");
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    for stream in ["first", "second"] {
        let url = upstream.url(&format!("/{BUCKET}/{stream}"));
        assert_eq!(put(&http, &url, "text/plain", "one;").await.status(), 201);
    }
    let args = durable_bucket_mirror(&data, &upstream);
    mirror_then_kill(&http, &upstream, &args, &["first", "second"]).await;

    // A bucket is deleted once empty.
    for stream in ["first", "second"] {
        let url = upstream.url(&format!("/{BUCKET}/{stream}"));
        assert_eq!(http.delete(&url).send().await.unwrap().status(), 204);
    }
    let bucket = upstream.url(&format!("/{BUCKET}"));
    let deleted = http.delete(&bucket).send().await.unwrap().status();
    assert!(deleted.is_success(), "{deleted}");
    wait_for_status(&http, &bucket, 404).await;

    let mirror = Server::start(&strs(&args));
    for stream in ["first", "second"] {
        wait_for_status(&http, &mirror.url(&format!("/{BUCKET}/{stream}")), 404).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_recreated_upstream_while_a_bucket_mirror_is_down_is_rebuilt_and_the_bucket_keeps_flowing()
 {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mirror");
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let (reborn, other) = (
        upstream.url(&format!("/{BUCKET}/reborn")),
        upstream.url(&format!("/{BUCKET}/other")),
    );
    assert_eq!(
        put(&http, &reborn, "text/plain", "x1;x2;").await.status(),
        201
    );
    assert_eq!(put(&http, &other, "text/plain", "o1;").await.status(), 201);
    let args = durable_bucket_mirror(&data, &upstream);
    mirror_then_kill(&http, &upstream, &args, &["reborn", "other"]).await;

    // A new stream under the old name, with as many records as the mirror's cursor and longer
    // ones: nothing about the cursor alone tells the mirror its copy is stale.
    assert_eq!(http.delete(&reborn).send().await.unwrap().status(), 204);
    assert_eq!(
        put(&http, &reborn, "text/plain", "Y1;Y2;Y3;")
            .await
            .status(),
        201
    );

    let mirror = Server::start(&strs(&args));
    wait_until_mirrored(&http, &upstream, &mirror, &["reborn", "other"]).await;
    // It goes on following the new stream, and the rest of the bucket.
    append(&http, &reborn, "text/plain", "Y4;").await;
    append(&http, &other, "text/plain", "o2;").await;
    wait_until_mirrored(&http, &upstream, &mirror, &["reborn", "other"]).await;
    let (_, _, body) = view(&http, &mirror.url(&format!("/{BUCKET}/reborn"))).await;
    assert_eq!(body, b"Y1;Y2;Y3;Y4;");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_stream_mirror_follows_its_stream_deleted_and_recreated_and_drops_it_when_gone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mirror");
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let source = upstream.url(&format!("/{BUCKET}/single"));
    assert_eq!(
        put(&http, &source, "text/plain", "one;").await.status(),
        201
    );
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--mirror-from",
        &source,
    ];
    let mirror = Server::start(&args);
    let copy = mirror.url(&format!("/{BUCKET}/single"));
    wait_until_mirrored(&http, &upstream, &mirror, &["single"]).await;

    // Deleted and created again during the session: the mirror follows the new stream.
    assert_eq!(http.delete(&source).send().await.unwrap().status(), 204);
    wait_for_status(&http, &copy, 404).await;
    assert_eq!(
        put(&http, &source, "text/plain", "new-one;").await.status(),
        201
    );
    append(&http, &source, "text/plain", "new-two;").await;
    wait_until_mirrored(&http, &upstream, &mirror, &["single"]).await;
    let (_, _, body) = view(&http, &copy).await;
    assert_eq!(body, b"new-one;new-two;");

    // Deleted while the mirror is down: its upstream answers 404, and the copy goes too.
    mirror.kill();
    assert_eq!(http.delete(&source).send().await.unwrap().status(), 204);
    let mirror = Server::start(&args);
    wait_for_status(&http, &mirror.url(&format!("/{BUCKET}/single")), 404).await;
}

/// Answers every HTTP request on `listener` with a bare 404, as a proxy in front of a server
/// being redeployed may.
async fn answer_404_to_everything(listener: tokio::net::TcpListener) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let response =
                "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
            let _ = socket.write_all(response.as_bytes()).await;
        });
    }
}

/// Waits (up to 30 s) until the server log at `log` holds `needle` at least `times` times.
async fn wait_for_log(log: &Path, needle: &str, times: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches(needle).count() >= times {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the log never said {needle:?} {times} times:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_stream_mirror_keeps_its_copy_while_something_other_than_its_upstream_answers_404()
{
    let dir = tempfile::tempdir().unwrap();
    let (up_data, mirror_log) = (dir.path().join("up"), dir.path().join("mirror.log"));
    let http = client();
    let up_args = |listen: &str| {
        let data = up_data.to_str().unwrap().to_string();
        vec![
            "--data-dir".to_string(),
            data,
            "--listen".into(),
            listen.into(),
        ]
    };
    let upstream = Server::start(&strs(&up_args("127.0.0.1:0")));
    let listen = upstream.base.trim_start_matches("http://").to_string();
    create_bucket(&http, &upstream).await;
    let source = upstream.url(&format!("/{BUCKET}/kept"));
    assert_eq!(
        put(&http, &source, "text/plain", "one;").await.status(),
        201
    );
    let mirror = Server::start_logged(&["--memory", "--mirror-from", &source], &mirror_log);
    let copy = mirror.url(&format!("/{BUCKET}/kept"));
    wait_until_mirrored(&http, &upstream, &mirror, &["kept"]).await;

    // The upstream goes away and a proxy answers 404 in its place: the mirror keeps asking,
    // and keeps its copy meanwhile.
    upstream.kill();
    let proxy = tokio::net::TcpListener::bind(&listen).await.unwrap();
    let proxy = tokio::spawn(answer_404_to_everything(proxy));
    wait_for_log(&mirror_log, "does not exist (404", 2).await;
    let (_, _, body) = view(&http, &copy).await;
    assert_eq!(body, b"one;");

    // The upstream is back: the copy goes on from where it was.
    proxy.abort();
    let _ = proxy.await;
    let upstream = Server::start(&strs(&up_args(&listen)));
    append(&http, &source, "text/plain", "two;").await;
    wait_until_mirrored(&http, &upstream, &mirror, &["kept"]).await;
    let (_, _, body) = view(&http, &copy).await;
    assert_eq!(body, b"one;two;");
}

/// The first event a StreamLD SSE reader of `sse` gets, asking with `host` as its `Host`, and
/// its response, still open.
async fn first_sse_event(
    http: &reqwest::Client,
    sse: &str,
    host: &str,
) -> (String, impl futures::Stream + use<>) {
    let response = http.get(sse).header("host", host).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        let next = futures::StreamExt::next(&mut body);
        let chunk = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("an event within 5 s")
            .expect("the body goes on")
            .unwrap();
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    (seen, body)
}

#[tokio::test]
async fn sse_binding_readers_at_one_place_each_get_the_stream_named_under_their_own_origin() {
    let server = Server::start(&["--memory"]);
    let http = client();
    create_bucket(&http, &server).await;
    let stream = server.url(&format!("/{BUCKET}/shared"));
    assert_eq!(put(&http, &stream, "text/plain", "").await.status(), 201);
    let sse = format!("{stream}/streamld");
    // Two readers at the same place: whichever renders the event while the other is there
    // leaves it for the other (and for later readers at that place).
    let readers = [0, 1].map(|_| {
        let (http, sse) = (http.clone(), sse.clone());
        tokio::spawn(async move { first_sse_event(&http, &sse, "here.example:1").await })
    });
    append(&http, &stream, "text/plain", "hello").await;
    let here = format!("\"streamId\":\"http://here.example:1/{BUCKET}/shared\"");
    let mut open = Vec::new();
    for reader in readers {
        let (event, body) = reader.await.unwrap();
        assert!(event.contains(&here) && event.contains("hello"), "{event}");
        open.push(body);
    }
    // A reader at the same place under another origin, while the two are still there.
    let (there, _body) = first_sse_event(&http, &sse, "there.example:2").await;
    let named = format!("\"streamId\":\"http://there.example:2/{BUCKET}/shared\"");
    assert!(there.contains(&named), "{there}");
}

#[tokio::test]
async fn a_malformed_sse_cursor_is_refused_with_400_not_replayed_from_the_start() {
    let server = Server::start(&["--memory"]);
    let http = client();
    create_bucket(&http, &server).await;
    let stream = server.url(&format!("/{BUCKET}/news"));
    assert_eq!(
        put(&http, &stream, "application/json", r#"[{"n":1},{"n":2}]"#)
            .await
            .status(),
        201
    );
    let sse = format!("{stream}/streamld");
    for id in ["1x", "-1", "", "01"] {
        let refused = http
            .get(&sse)
            .header("last-event-id", id)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400, "Last-Event-ID {id:?}");
        assert!(
            refused.text().await.unwrap().contains("Last-Event-ID"),
            "the reason names the header"
        );
    }
    for after in ["1x", "-1", ""] {
        let refused = http
            .get(format!("{sse}?after={after}"))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400, "?after={after}");
        assert!(refused.text().await.unwrap().contains("after"));
    }
    // Last-Event-ID, a reconnecting EventSource's cursor, wins over ?after=.
    let resumed = http
        .get(format!("{sse}?after=0"))
        .header("last-event-id", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let mut body = resumed.bytes_stream();
    let chunk = tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut body))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        std::str::from_utf8(&chunk).unwrap().starts_with("id: 2\n"),
        "{chunk:?}"
    );
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

#[tokio::test]
async fn over_http2_the_streamld_links_name_the_authority_the_request_used() {
    let server = Server::start(&["--memory"]);
    let http = client();
    create_bucket(&http, &server).await;
    let stream = server.url(&format!("/{BUCKET}/h2"));
    assert_eq!(put(&http, &stream, "text/plain", "x").await.status(), 201);
    let authority = server.base.trim_start_matches("http://").to_string();

    // HTTP/2 carries the authority in the request URI (:authority), not in a Host header.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let head = h2.head(&stream).send().await.unwrap();
    assert_eq!(head.version(), reqwest::Version::HTTP_2);
    let links = header(&head, "link").unwrap().to_string();
    assert_eq!(
        link_target(&links, "websocket-replication").as_deref(),
        Some(format!("ws://{authority}/v1/streamld/replication").as_str()),
        "{links}"
    );
    assert_eq!(
        link_target(&links, "sse").as_deref(),
        Some(format!("http://{authority}/{BUCKET}/h2/streamld").as_str()),
        "{links}"
    );
    let bucket = h2
        .get(server.url(&format!("/{BUCKET}")))
        .send()
        .await
        .unwrap();
    let links = header(&bucket, "link").unwrap().to_string();
    assert_eq!(
        link_target(&links, "websocket-replication").as_deref(),
        Some(format!("ws://{authority}/v1/streamld/replication").as_str()),
        "{links}"
    );
}

#[tokio::test]
async fn over_tls_the_streamld_links_and_locations_use_https_and_wss() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tls_server = TlsServer::start(&["--memory"]);
    let server = &tls_server.server;
    let address = server.base.trim_start_matches("http://").to_string();
    let port = address.rsplit_once(':').unwrap().1.to_string();
    let connector = tls_server.connector(Vec::new());
    // One HTTP/1.1 request over its own TLS connection; the response head, lower-cased.
    let request = |method: &'static str, path: String, body: &'static str| {
        let (connector, address, port) = (connector.clone(), address.clone(), port.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(&address).await.unwrap();
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            let mut tls = connector.connect(name, tcp).await.unwrap();
            let head = format!(
                "{method} {path} HTTP/1.1\r\nhost: localhost:{port}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            tls.write_all(head.as_bytes()).await.unwrap();
            let mut response = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut response))
                .await
                .unwrap()
                .unwrap();
            let response = String::from_utf8_lossy(&response).to_string();
            response.split("\r\n\r\n").next().unwrap().to_lowercase()
        }
    };
    assert!(
        request("PUT", format!("/{BUCKET}"), "")
            .await
            .starts_with("http/1.1 201")
    );
    let created = request("PUT", format!("/{BUCKET}/secure"), "x").await;
    assert!(
        created.contains(&format!(
            "\r\nlocation: https://localhost:{port}/{BUCKET}/secure\r\n"
        )),
        "{created}"
    );
    let head = request("HEAD", format!("/{BUCKET}/secure"), "").await;
    assert!(
        head.contains(&format!("<wss://localhost:{port}/v1/streamld/replication>")),
        "{head}"
    );
    assert!(
        head.contains(&format!(
            "<https://localhost:{port}/{BUCKET}/secure/streamld>"
        )),
        "{head}"
    );
}

#[tokio::test]
async fn a_bucket_mirror_takes_no_local_streams_or_forks_and_copies_a_close_it_joined_behind() {
    let http = client();
    let no_redirects = no_redirects();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let s = upstream.url(&format!("/{BUCKET}/s"));
    assert_eq!(put(&http, &s, "text/plain", "one;").await.status(), 201);
    append(&http, &s, "text/plain", "two;").await;
    let close = http
        .post(&s)
        .header("stream-closed", "true")
        .send()
        .await
        .unwrap();
    assert!(close.status().is_success());

    // The mirror joins behind the close: it gets the records, then the closed state.
    let bucket = upstream.url(&format!("/{BUCKET}"));
    let mirror = Server::start(&["--memory", "--mirror-from", &bucket]);
    wait_until_mirrored(&http, &upstream, &mirror, &["s"]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let head = http
            .head(mirror.url(&format!("/{BUCKET}/s")))
            .send()
            .await
            .unwrap();
        if header(&head, "stream-closed") == Some("true") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the mirror's copy stays open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A stream made locally in the mirrored bucket would be deleted by the mirror: it goes to
    // the upstream instead.
    let local = no_redirects
        .put(mirror.url(&format!("/{BUCKET}/local")))
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(local.status(), 307);
    assert_eq!(
        header(&local, "location"),
        Some(upstream.url(&format!("/{BUCKET}/local")).as_str())
    );
    let bucket_delete = no_redirects
        .delete(mirror.url(&format!("/{BUCKET}")))
        .send()
        .await
        .unwrap();
    assert_eq!(
        bucket_delete.status(),
        307,
        "the mirrored bucket is the upstream's"
    );
    assert_eq!(
        header(&bucket_delete, "location"),
        Some(upstream.url(&format!("/{BUCKET}")).as_str())
    );
    // A fork would stop the mirror at the next rebuild of its source.
    let fork = http
        .put(mirror.url("/v1/stream/fork"))
        .header("content-type", "text/plain")
        .header("stream-forked-from", format!("/{BUCKET}/s"))
        .send()
        .await
        .unwrap();
    assert_eq!(fork.status(), 409);
}

#[tokio::test]
async fn an_encrypted_s2_stream_is_mirrored_sealed_and_reads_back_with_its_key() {
    let http = client();
    let upstream = Server::start(&["--memory"]);
    let json = |body: serde_json::Value| body.to_string();
    let basin = http
        .post(upstream.url("/v1/basins"))
        .header("content-type", "application/json")
        .body(json(serde_json::json!({
            "basin": BUCKET, "config": {"stream_cipher": "aes-256-gcm"}
        })))
        .send()
        .await
        .unwrap();
    assert_eq!(basin.status(), 201);
    let key = "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=";
    let s2 = |server: &Server, method: reqwest::Method, path: &str| {
        http.request(method, server.url(path))
            .header("content-type", "application/json")
            .header("s2-basin", BUCKET)
            .header("s2-encryption-key", key)
    };
    let created = s2(&upstream, reqwest::Method::POST, "/v1/streams")
        .body(json(serde_json::json!({"stream": "sec"})))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let appended = s2(&upstream, reqwest::Method::POST, "/v1/streams/sec/records")
        .body(json(
            serde_json::json!({"records": [{"body": "top secret"}]}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(appended.status(), 200);

    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &upstream.url(&format!("/{BUCKET}")),
    ]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let read = loop {
        let read = s2(
            &mirror,
            reqwest::Method::GET,
            "/v1/streams/sec/records?seq_num=0",
        )
        .send()
        .await
        .unwrap();
        if read.status() == 200 {
            let body: serde_json::Value =
                serde_json::from_slice(&read.bytes().await.unwrap()).unwrap();
            if body["records"].as_array().is_some_and(|r| !r.is_empty()) {
                break body;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not mirrored in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(read["records"][0]["body"], "top secret");
    // The copy is sealed as the original: no plain read of it.
    let plain = http
        .get(mirror.url(&format!("/{BUCKET}/sec?offset=-1")))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 409);
}

#[tokio::test]
async fn s2_writes_to_a_mirror_are_redirected_to_the_upstream_in_s2s_error_shape() {
    let http = client();
    let no_redirects = no_redirects();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let s = upstream.url(&format!("/{BUCKET}/s"));
    assert_eq!(put(&http, &s, "text/plain", "one;").await.status(), 201);
    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &upstream.url(&format!("/{BUCKET}")),
    ]);
    wait_until_mirrored(&http, &upstream, &mirror, &["s"]).await;

    let s2 = |method: reqwest::Method, path: &str, body: serde_json::Value| {
        no_redirects
            .request(method, mirror.url(path))
            .header("s2-basin", BUCKET)
            .header("content-type", "application/json")
            .body(body.to_string())
    };
    let refusals = [
        (
            "append",
            s2(
                reqwest::Method::POST,
                "/v1/streams/s/records",
                serde_json::json!({"records": [{"body": "two;"}]}),
            ),
            "/v1/streams/s/records",
        ),
        (
            "stream reconfiguration",
            s2(
                reqwest::Method::PATCH,
                "/v1/streams/s",
                serde_json::json!({"retention_policy": {"age": 60}}),
            ),
            "/v1/streams/s",
        ),
        (
            "stream creation",
            s2(
                reqwest::Method::POST,
                "/v1/streams",
                serde_json::json!({"stream": "local"}),
            ),
            "/v1/streams",
        ),
        (
            "basin reconfiguration",
            s2(
                reqwest::Method::PATCH,
                &format!("/v1/basins/{BUCKET}"),
                serde_json::json!({"create_stream_on_append": true}),
            ),
            &format!("/v1/basins/{BUCKET}"),
        ),
        (
            "basin deletion",
            s2(
                reqwest::Method::DELETE,
                &format!("/v1/basins/{BUCKET}"),
                serde_json::json!({}),
            ),
            &format!("/v1/basins/{BUCKET}"),
        ),
    ];
    for (what, request, path) in refusals {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 307, "{what}");
        assert_eq!(
            header(&response, "location"),
            Some(upstream.url(path).as_str()),
            "{what}"
        );
        let body: serde_json::Value =
            serde_json::from_str(&response.text().await.unwrap()).unwrap();
        assert_eq!(body["code"], "mirrored", "{what}: {body}");
    }

    // Nothing changed on the mirror, and the upstream still holds one record.
    let config = http
        .get(mirror.url("/v1/streams/s"))
        .header("s2-basin", BUCKET)
        .send()
        .await
        .unwrap();
    let config: serde_json::Value = serde_json::from_str(&config.text().await.unwrap()).unwrap();
    assert!(config["retention_policy"].get("age").is_none(), "{config}");
    let basin = http
        .get(mirror.url(&format!("/v1/basins/{BUCKET}")))
        .send()
        .await
        .unwrap();
    assert_eq!(basin.status(), 200, "the mirrored basin is still there");
    let (status, records) = s2_records(&http, &mirror, "s").await;
    assert_eq!(status, 200);
    assert!(!records.contains("two;"), "{records}");
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

/// Copies a stopped server's data directory, as a backup would.
fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success(), "cp -a {from:?} {to:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_whose_upstream_was_restored_from_an_older_backup_and_written_again_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let (up_data, backup) = (dir.path().join("up"), dir.path().join("backup"));
    let http = client();
    let start_upstream = |listen: Option<&str>| {
        let mut args = vec!["--data-dir", up_data.to_str().unwrap()];
        if let Some(listen) = listen {
            args.extend(["--listen", listen]);
        }
        Server::start(&args)
    };
    let mut upstream = start_upstream(None);
    let listen = upstream.base.trim_start_matches("http://").to_string();
    create_bucket(&http, &upstream).await;
    let stream = upstream.url(&format!("/{BUCKET}/s"));
    assert_eq!(put(&http, &stream, "text/plain", "r1;").await.status(), 201);
    append(&http, &stream, "text/plain", "r2;").await;
    upstream.terminate(Duration::from_secs(10)).unwrap();
    copy_dir(&up_data, &backup);
    let mut upstream = start_upstream(Some(&listen));
    append(&http, &stream, "text/plain", "r3;").await;

    let args = durable_bucket_mirror(&dir.path().join("mirror"), &upstream);
    mirror_then_kill(&http, &upstream, &args, &["s"]).await;

    // The upstream comes back from the backup and takes a record of the same length where the
    // mirror's copy has r3: same ordinals, same offsets, another record.
    upstream.terminate(Duration::from_secs(10)).unwrap();
    std::fs::remove_dir_all(&up_data).unwrap();
    copy_dir(&backup, &up_data);
    let upstream = start_upstream(Some(&listen));
    append(&http, &stream, "text/plain", "R3;").await;
    append(&http, &stream, "text/plain", "r4;").await;

    let mirror = Server::start(&strs(&args));
    wait_until_mirrored(&http, &upstream, &mirror, &["s"]).await;
    let (_, _, body) = view(&http, &mirror.url(&format!("/{BUCKET}/s"))).await;
    assert_eq!(body, b"r1;r2;R3;r4;");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_upstream_while_a_fork_holds_it_is_removed_from_a_live_mirror() {
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let source = upstream.url(&format!("/{BUCKET}/src"));
    assert_eq!(put(&http, &source, "text/plain", "abc").await.status(), 201);
    let fork = http
        .put(upstream.url(&format!("/{BUCKET}/fork")))
        .header("content-type", "text/plain")
        .header("stream-forked-from", format!("/{BUCKET}/src"))
        .send()
        .await
        .unwrap();
    assert_eq!(fork.status(), 201);
    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &upstream.url(&format!("/{BUCKET}")),
    ]);
    wait_until_mirrored(&http, &upstream, &mirror, &["src"]).await;

    // Soft: the fork still reads through it, but for everyone else it is gone (410 upstream).
    assert_eq!(http.delete(&source).send().await.unwrap().status(), 204);
    assert_eq!(http.head(&source).send().await.unwrap().status(), 410);
    wait_for_status(&http, &mirror.url(&format!("/{BUCKET}/src")), 404).await;
}

#[tokio::test]
async fn a_single_stream_mirror_refuses_to_create_the_stream_it_mirrors_locally() {
    // Whatever was written to a local stream of that name would be replaced by the upstream's
    // once it appears there: acknowledged writes silently lost.
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let target = upstream.url(&format!("/{BUCKET}/one"));
    let mirror = Server::start(&["--memory", "--mirror-from", &target]);
    let local = no_redirects()
        .put(mirror.url(&format!("/{BUCKET}/one")))
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(local.status(), 307);
    assert_eq!(header(&local, "location"), Some(target.as_str()));
}

#[test]
fn overlapping_mirror_targets_stop_the_server_at_start() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_runnel"))
        .args(["serve", "--memory", "--listen", "127.0.0.1:0"])
        .args(["--mirror-from", "http://127.0.0.1:9/docs"])
        .args(["--mirror-from", "http://127.0.0.1:9/docs/s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server started with overlapping --mirror-from targets");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("overlap"), "{stderr}");
}

/// A gauge's value on `server`'s `/metrics` (0 until it is first set).
async fn gauge(http: &reqwest::Client, server: &Server, name: &str) -> f64 {
    let text = (http.get(server.url("/metrics")).send().await.unwrap())
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Waits (up to 30 s) until `server`'s gauge `name` reads `value`.
async fn wait_for_gauge(http: &reqwest::Client, server: &Server, name: &str, value: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = gauge(http, server, name).await;
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
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let kept = upstream.url(&format!("/{BUCKET}/kept"));
    assert_eq!(put(&http, &kept, "text/plain", "k;").await.status(), 201);
    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &upstream.url(&format!("/{BUCKET}")),
    ]);
    wait_until_mirrored(&http, &upstream, &mirror, &["kept"]).await;
    wait_for_gauge(&http, &upstream, FOLLOWED, 1.0).await;

    // Streams come and go while the session lasts: it follows each, then lets it go, so a
    // session that lives for months holds nothing for the streams deleted meanwhile.
    let names: Vec<String> = (0..20).map(|i| format!("brief-{i}")).collect();
    for name in &names {
        let url = upstream.url(&format!("/{BUCKET}/{name}"));
        assert_eq!(put(&http, &url, "text/plain", "b;").await.status(), 201);
    }
    wait_for_gauge(&http, &upstream, FOLLOWED, 21.0).await;
    for name in &names {
        let url = upstream.url(&format!("/{BUCKET}/{name}"));
        assert_eq!(http.delete(&url).send().await.unwrap().status(), 204);
    }
    for name in &names {
        wait_for_status(&http, &mirror.url(&format!("/{BUCKET}/{name}")), 404).await;
    }
    wait_for_gauge(&http, &upstream, FOLLOWED, 1.0).await;

    // The session is still whole: the stream it kept goes on arriving.
    append(&http, &kept, "text/plain", "k2;").await;
    wait_until_mirrored(&http, &upstream, &mirror, &["kept"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_pump_ended_on_a_gap_is_forgotten_once_it_is_deleted() {
    const FOLLOWED: &str = "runnel_replication_streams_followed";
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let stream = upstream.url(&format!("/{BUCKET}/s"));
    assert_eq!(put(&http, &stream, "text/plain", "a;").await.status(), 201);

    // A cursor past the tail cannot be served: the stream's pump answers with a gap and ends,
    // while the stream lives on.
    let mut socket = connect_replica(&http, &upstream).await;
    let join = subscription(&upstream, "", serde_json::json!({"s": 99}));
    send_json(&mut socket, join).await;
    read_until(&mut socket, |m| m["@type"] == "GapSignal").await;
    wait_for_gauge(&http, &upstream, FOLLOWED, 1.0).await;

    assert_eq!(http.delete(&stream).send().await.unwrap().status(), 204);
    wait_for_gauge(&http, &upstream, FOLLOWED, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_forgets_single_stream_subscriptions_whose_streams_are_gone_and_still_says_so() {
    const SUBSCRIPTIONS: &str = "runnel_replication_subscriptions";
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let kept = upstream.url(&format!("/{BUCKET}/kept"));
    assert_eq!(put(&http, &kept, "text/plain", "k;").await.status(), 201);

    let mut socket = connect_replica(&http, &upstream).await;
    let join = |name: &str| subscription(&upstream, name, serde_json::Value::Null);
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
    wait_for_gauge(&http, &upstream, SUBSCRIPTIONS, 1.0).await;

    // The session is whole: the stream it follows goes on arriving.
    append(&http, &kept, "text/plain", "k2;").await;
    read_until(&mut socket, |m| frame_cursor(m) == Some(2)).await;
    drop(socket);
    wait_for_gauge(&http, &upstream, SUBSCRIPTIONS, 0.0).await;
}

#[tokio::test]
async fn a_session_follows_at_most_ten_thousand_targets() {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message as Ws;
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    // Streams that are there: a pump follows each for as long as the session lasts.
    let created = futures::stream::iter(0..=10_000)
        .map(|i| {
            let (http, url) = (&http, upstream.url(&format!("/{BUCKET}/s{i}")));
            async move { put(http, &url, "text/plain", "").await.status() }
        })
        .buffer_unordered(16)
        .filter(|status| std::future::ready(*status != 201))
        .count()
        .await;
    assert_eq!(created, 0, "every stream created");
    let mut socket = connect_replica(&http, &upstream).await;
    for i in 0..=10_000 {
        let join = subscription(&upstream, &format!("s{i}"), serde_json::Value::Null);
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
