//! Connections under hostile or broken clients, TLS, and graceful shutdown: slowloris clients are
//! cut off, idle connections closed, oversized heads get 431, connections beyond the limit are
//! closed, a stalled live reader costs bounded memory, never slows writers and frees its slot
//! (over HTTP/2 too, where a client leaving a response untaken loses its connection),
//! SIGTERM drains cleanly, and the process faults its memory in base pages.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use reqwest::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Client, Server, TlsServer};

fn addr(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_string()
}

/// Reads until the peer closes the connection; true if it did within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

async fn create(server: &Server, path: &str) {
    let response = Client::new(server)
        .create(path, "application/octet-stream", "")
        .await;
    assert_eq!(response.status(), 201, "create {path}");
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A transparent huge page stalls the thread that first touches it while the kernel zeroes 2 MiB
/// (see `fault_memory_in_base_pages` in `main.rs`): the server turns them off for itself, and
/// unless the system puts them under every mapping, it has none at all.
#[cfg(target_os = "linux")]
#[test]
fn the_server_process_faults_its_memory_in_base_pages() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::on_disk(dir.path());
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let flag = status
        .lines()
        .find(|line| line.starts_with("THP_enabled:"))
        .expect("the kernel reports THP_enabled (Linux 5.0 and later)");
    assert_eq!(flag.split_whitespace().nth(1), Some("0"), "{flag}");

    let system =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !system.contains("[always]") {
        let rollup =
            std::fs::read_to_string(format!("/proc/{}/smaps_rollup", server.pid())).unwrap();
        let huge = rollup
            .lines()
            .find(|line| line.starts_with("AnonHugePages:"))
            .expect("smaps_rollup reports AnonHugePages");
        assert_eq!(huge.split_whitespace().nth(1), Some("0"), "{huge}");
    }
}

#[tokio::test]
async fn slowloris_clients_are_cut_off_and_others_are_still_served() {
    let server = Server::start(&["--memory", "--header-read-timeout-secs", "1"]);
    let mut slow = Vec::new();
    for _ in 0..50 {
        let mut stream = TcpStream::connect(addr(&server)).await.unwrap();
        // A request head that never ends.
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ")
            .await
            .unwrap();
        slow.push(stream);
    }
    let response = Client::new(&server).get("/healthz").await;
    assert_eq!(response.status(), 200, "others are served meanwhile");
    for stream in &mut slow {
        assert!(
            closed_within(stream, Duration::from_secs(5)).await,
            "a client that never finishes its head is disconnected"
        );
    }
}

#[tokio::test]
async fn a_connection_that_sends_no_request_is_closed_after_the_header_timeout() {
    let server = Server::start(&["--memory", "--header-read-timeout-secs", "1"]);
    let mut silent = TcpStream::connect(addr(&server)).await.unwrap();
    // The start of the HTTP/2 preface, while the server still tells the versions apart.
    let mut half_preface = TcpStream::connect(addr(&server)).await.unwrap();
    half_preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    for stream in [&mut silent, &mut half_preface] {
        assert!(
            closed_within(stream, Duration::from_secs(5)).await,
            "a connection that never begins a request gives its slot back"
        );
    }
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
    let server = Server::start(&["--memory", "--header-read-timeout-secs", "1"]);
    let mut stream = TcpStream::connect(addr(&server)).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = [0u8; 1024];
    let n = stream.read(&mut buffer).await.unwrap();
    assert!(buffer[..n].starts_with(b"HTTP/1.1 200"));
    assert!(closed_within(&mut stream, Duration::from_secs(5)).await);
}

/// Sends a GET for `path` on an HTTP/2 connection and takes its whole body.
async fn h2_get(h2: &mut h2::client::SendRequest<bytes::Bytes>, server: &Server, path: &str) {
    let request = axum::http::Request::get(server.url(path)).body(()).unwrap();
    let (response, _) = h2.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        let data = data.unwrap();
        body.flow_control().release_capacity(data.len()).unwrap();
    }
}

#[tokio::test]
async fn an_idle_http2_connection_is_told_to_go_away_after_the_header_timeout() {
    let server = Server::start(&["--memory", "--header-read-timeout-secs", "1"]);
    let (mut h2, connection) = http2_client(&server, 65_535).await;
    h2_get(&mut h2, &server, "/healthz").await;
    // Busy: a request every quarter of a second keeps it open past the timeout.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        h2_get(&mut h2, &server, "/healthz").await;
    }
    assert!(!connection.is_finished(), "a busy connection stays open");
    let closed = tokio::time::timeout(Duration::from_secs(5), connection).await;
    let closed = closed.expect("an idle HTTP/2 connection stays open past the header timeout");
    assert!(matches!(closed, Ok(Ok(()))), "{closed:?}");
    // Told to go away, the client knows its next request needs a new connection.
    let refused = h2.ready().await.expect_err("no more requests on it");
    assert!(
        refused.is_go_away() && refused.reason() == Some(h2::Reason::NO_ERROR),
        "it is closed gracefully (GOAWAY), not dropped: {refused:?}"
    );
}

#[tokio::test]
async fn an_http2_connection_with_a_live_read_open_is_not_idle() {
    // A keep-alive event every 500 ms, and idle connections closed after 1 s (2 at most).
    let args = [
        "--memory",
        "--header-read-timeout-secs",
        "1",
        "--send-timeout-secs",
        "1",
        "--long-poll-timeout-ms",
        "500",
    ];
    let server = Server::start(&args);
    create(&server, "/v1/stream/h2-open").await;
    let (mut h2, connection) = http2_client(&server, 65_535).await;
    let url = server.url("/v1/stream/h2-open?offset=-1&live=sse");
    let (response, _) = h2
        .send_request(axum::http::Request::get(url).body(()).unwrap(), true)
        .unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let data = tokio::time::timeout(Duration::from_secs(2), body.data())
            .await
            .expect("events keep coming");
        let data = data.expect("the read goes on").unwrap();
        body.flow_control().release_capacity(data.len()).unwrap();
    }
    assert!(!connection.is_finished(), "the connection stays open");
}

#[tokio::test]
async fn a_request_body_that_stalls_gets_408_the_connection_closes_and_nothing_is_appended() {
    let server = Server::start(&["--memory", "--body-idle-timeout-secs", "1"]);
    create(&server, "/v1/stream/stalled").await;
    let mut stream = TcpStream::connect(addr(&server)).await.unwrap();
    // Three bytes of the hundred it announces, then nothing.
    stream
        .write_all(
            b"POST /v1/stream/stalled HTTP/1.1\r\nhost: x\r\n\
              content-type: application/octet-stream\r\ncontent-length: 100\r\n\r\nabc",
        )
        .await
        .unwrap();
    let mut buffer = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
        .await
        .expect("answered within the idle timeout and then some")
        .unwrap();
    let head = String::from_utf8_lossy(&buffer[..n]);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(head.contains("stalled"), "{head}");
    assert!(closed_within(&mut stream, Duration::from_secs(5)).await);
    let read = Client::new(&server).read("/v1/stream/stalled", "-1").await;
    assert_eq!(read.status(), 200);
    assert!(read.bytes().await.unwrap().is_empty(), "nothing appended");
}

#[tokio::test]
async fn an_oversized_request_head_gets_431_with_the_limit_named() {
    let server = Server::start(&["--memory", "--max-header-bytes", "16384"]);
    let response = Client::new(&server)
        .request(Method::GET, "/healthz")
        .header("x-big", "a".repeat(20 << 10))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 431);
    let reason = response.text().await.unwrap();
    assert!(reason.contains("--max-header-bytes 16384"), "{reason:?}");
    // One just within the limit is served.
    let response = Client::new(&server)
        .request(Method::GET, "/healthz")
        .header("x-big", "a".repeat(15 << 10))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // Past twice the limit the connection stops reading it: still 431.
    let response = Client::new(&server)
        .request(Method::GET, "/healthz")
        .header("x-big", "a".repeat(64 << 10))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 431);
}

#[tokio::test]
async fn connections_beyond_the_limit_are_closed_on_arrival() {
    let server = Server::start(&["--memory", "--max-connections", "3"]);
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(addr(&server)).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buffer = [0u8; 1024];
        let n = stream.read(&mut buffer).await.unwrap();
        assert!(buffer[..n].starts_with(b"HTTP/1.1 200"));
        held.push(stream);
    }
    let mut extra = TcpStream::connect(addr(&server)).await.unwrap();
    let _ = extra
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    assert!(
        closed_within(&mut extra, Duration::from_secs(5)).await,
        "the fourth connection is closed"
    );
    held.clear();
    // Once the held ones are gone, new connections are served again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Client::new(&server)
            .request(Method::GET, "/healthz")
            .send()
            .await
        {
            Ok(r) if r.status() == 200 => break,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("not served after the held connections closed: {other:?}"),
        }
    }
}

/// `/v1/stream/backlog` with 16 MiB in it: more than a socket's buffers hold.
async fn fill_backlog(server: &Server) {
    create(server, "/v1/stream/backlog").await;
    let http = Client::new(server);
    for _ in 0..64 {
        let appended = http
            .append(
                "/v1/stream/backlog",
                "application/octet-stream",
                vec![b'x'; 256 << 10],
            )
            .await;
        assert_eq!(appended.status(), 204);
    }
}

/// `runnel_live_readers` from `/metrics`.
async fn live_readers(server: &Server) -> u64 {
    let readers = Client::new(server).gauge("runnel_live_readers").await;
    readers.expect("runnel_live_readers") as u64
}

#[tokio::test]
async fn a_reader_that_takes_nothing_is_cut_off_after_the_send_timeout_and_frees_its_slot() {
    let server = Server::start(&["--memory", "--send-timeout-secs", "1"]);
    fill_backlog(&server).await;
    // 16 MiB to send, more than the socket buffers hold, to a reader that never reads.
    let mut stalled = TcpStream::connect(addr(&server)).await.unwrap();
    stalled
        .write_all(b"GET /v1/stream/backlog?offset=-1&live=sse HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while live_readers(&server).await == 0 {
        assert!(Instant::now() < deadline, "the SSE reader never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    while live_readers(&server).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the stalled reader still holds its slot"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        closed_within(&mut stalled, Duration::from_secs(10)).await,
        "its connection was closed"
    );
}

#[tokio::test]
async fn a_slow_reader_that_keeps_reading_is_not_cut_off_by_the_send_timeout() {
    let server = Server::start(&["--memory", "--send-timeout-secs", "2"]);
    fill_backlog(&server).await;
    // A small receive buffer, as a slow client's is: the window it advertises opens as soon as
    // it reads (a large one stays shut until a sixteenth of it is free).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    let mut slow = socket
        .connect(addr(&server).parse().unwrap())
        .await
        .unwrap();
    slow.write_all(b"GET /v1/stream/backlog?offset=-1&live=sse HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // 64 KiB a second: far slower than the server writes, so its socket stays full, and the
    // socket becomes writable again only after megabytes drain, much later than the timeout.
    let mut buffer = vec![0u8; 16 << 10];
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(7) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let n = tokio::time::timeout(Duration::from_secs(5), slow.read(&mut buffer))
            .await
            .expect("data keeps coming")
            .unwrap();
        assert!(n > 0, "cut off after {:?}", started.elapsed());
    }
    // What it reads may be what the kernel had buffered before a cut: the server must still be
    // serving it.
    assert_eq!(live_readers(&server).await, 1, "the server still serves it");
}

/// Waits until `runnel_live_readers` is `count`, for at most `within`.
async fn live_readers_reach(server: &Server, count: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while live_readers(server).await != count {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

#[tokio::test]
async fn an_http2_reader_that_takes_nothing_frees_its_live_reader_slot_after_the_send_timeout() {
    let args = [
        "--memory",
        "--send-timeout-secs",
        "1",
        "--max-live-readers",
        "1",
    ];
    let server = Server::start(&args);
    create(&server, "/v1/stream/h2-stall").await;
    // Its streams open with no window: the server can send them headers but no data, while the
    // connection itself stays healthy (settings and pings go on), so it never looks stalled.
    let tcp = TcpStream::connect(addr(&server)).await.unwrap();
    let (h2, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let mut h2 = h2.ready().await.unwrap();
    let url = server.url("/v1/stream/h2-stall?offset=-1&live=sse");
    let request = axum::http::Request::get(url).body(()).unwrap();
    let (response, _) = h2.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(live_readers(&server).await, 1);
    assert!(
        live_readers_reach(&server, 0, Duration::from_secs(10)).await,
        "the reader that takes nothing still holds the only live-reader slot"
    );
    let next = Client::new(&server)
        .get("/v1/stream/h2-stall?offset=-1&live=long-poll")
        .await;
    assert_ne!(next.status(), 503, "a new live reader is served");
    assert!(
        !connection.is_finished(),
        "the connection itself is left open"
    );
    drop(response);
}

#[tokio::test]
async fn an_http2_reader_waiting_for_events_keeps_its_slot_past_the_send_timeout() {
    // A keep-alive event every 2.5 s: between two, the body waits for data longer than twice
    // the send timeout, and the connection waits on it, which is no stall.
    let args = [
        "--memory",
        "--send-timeout-secs",
        "1",
        "--long-poll-timeout-ms",
        "2500",
    ];
    let server = Server::start(&args);
    create(&server, "/v1/stream/h2-live").await;
    let response = Client::h2(&server)
        .get("/v1/stream/h2-live?offset=-1&live=sse")
        .await;
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let mut events = response.bytes_stream();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        let event = tokio::time::timeout(Duration::from_secs(4), events.next())
            .await
            .expect("events keep coming");
        assert!(
            event.is_some_and(|e| e.is_ok()),
            "ended after {:?}",
            started.elapsed()
        );
    }
    assert_eq!(live_readers(&server).await, 1, "it still holds its slot");
}

/// A stream holding one record of 1 MiB, and an HTTP/2 connection to the server whose streams
/// open with a window of `window` bytes.
async fn one_mebibyte_record_and_an_http2_client(
    server: &Server,
    path: &str,
    window: u32,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    create(server, path).await;
    let appended = Client::new(server)
        .append(path, "application/octet-stream", vec![7u8; 1 << 20])
        .await;
    assert_eq!(appended.status(), 204);
    http2_client(server, window).await
}

/// An HTTP/2 connection to the server whose streams open with a window of `window` bytes.
async fn http2_client(
    server: &Server,
    window: u32,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(addr(server)).await.unwrap();
    let (h2, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    (h2.ready().await.unwrap(), tokio::spawn(connection))
}

#[tokio::test]
async fn an_http2_client_that_takes_nothing_of_a_large_response_loses_its_connection() {
    let server = Server::start(&["--memory", "--send-timeout-secs", "1"]);
    let path = "/v1/stream/h2-untaken";
    // A catch-up, and a long-poll answered at once with the same record.
    for (n, query) in ["offset=-1", "offset=-1&live=long-poll"].iter().enumerate() {
        // A window of 16 KiB that it never opens further.
        let window = 16 << 10;
        let (mut h2, connection) = if n == 0 {
            one_mebibyte_record_and_an_http2_client(&server, path, window).await
        } else {
            http2_client(&server, window).await
        };
        // Its other streams and pings go on, so only the untaken body shows the stall.
        assert!(
            closes_when_left_untaken(&server, &mut h2, connection, &format!("{path}?{query}"))
                .await,
            "a connection holding a 1 MiB response it never takes stays open ({query})"
        );
    }
}

/// Asks for `path` on `h2`, takes none of the response, and tells whether the server then
/// closed the connection within 10 s.
async fn closes_when_left_untaken(
    server: &Server,
    h2: &mut h2::client::SendRequest<bytes::Bytes>,
    connection: tokio::task::JoinHandle<Result<(), h2::Error>>,
    path: &str,
) -> bool {
    let request = axum::http::Request::get(server.url(path)).body(()).unwrap();
    let (response, _) = h2.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let closed = tokio::time::timeout(Duration::from_secs(10), connection).await;
    drop(response);
    closed.is_ok()
}

#[tokio::test]
async fn an_http2_client_that_takes_nothing_of_a_small_response_loses_its_connection() {
    let server = Server::start(&["--memory", "--send-timeout-secs", "1"]);
    let path = "/v1/stream/h2-small-untaken";
    create(&server, path).await;
    let appended = Client::new(&server)
        .append(path, "application/octet-stream", vec![7u8; 100])
        .await;
    assert_eq!(appended.status(), 204);
    // Streams that open with no window: one client could hold as many such responses as it may
    // open streams, on each of its connections.
    let (mut h2, connection) = http2_client(&server, 0).await;
    assert!(
        closes_when_left_untaken(&server, &mut h2, connection, &format!("{path}?offset=-1")).await,
        "a connection holding a 100-byte response it never takes stays open"
    );
}

#[tokio::test]
async fn an_http2_client_that_takes_a_large_response_slowly_gets_it_whole() {
    let server = Server::start(&["--memory", "--send-timeout-secs", "1"]);
    let path = "/v1/stream/h2-slow";
    // 64 KiB every 300 ms: the 1 MiB record takes about 5 s, several times the timeout.
    let window = 64 << 10;
    let (mut h2, connection) = one_mebibyte_record_and_an_http2_client(&server, path, window).await;
    let request = axum::http::Request::get(server.url(&format!("{path}?offset=-1")))
        .body(())
        .unwrap();
    let (response, _) = h2.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut received = 0;
    let started = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), body.data()).await {
            Ok(Some(Ok(data))) => {
                received += data.len();
                tokio::time::sleep(Duration::from_millis(
                    300 * data.len() as u64 / window as u64,
                ))
                .await;
                body.flow_control().release_capacity(data.len()).unwrap();
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => panic!("the body ended with {e} after {received} bytes"),
            Err(_) => panic!("no data for 5 s after {received} bytes"),
        }
        assert!(started.elapsed() < Duration::from_secs(30));
    }
    assert_eq!(received, 1 << 20);
    assert!(!connection.is_finished(), "the connection stays open");
}

#[tokio::test]
async fn a_stalled_sse_reader_costs_bounded_memory_and_does_not_slow_writers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--sse-max-duration-secs",
        "600",
    ]);
    create(&server, "/v1/stream/firehose").await;
    let http = Client::new(&server);
    let chunk = vec![b'x'; 256 << 10];
    let write = |count: usize| {
        let (http, chunk) = (http.clone(), chunk.clone());
        async move {
            let mut slowest = Duration::ZERO;
            for _ in 0..count {
                let started = Instant::now();
                let response = http
                    .append(
                        "/v1/stream/firehose",
                        "application/octet-stream",
                        chunk.clone(),
                    )
                    .await;
                assert_eq!(response.status(), 204);
                slowest = slowest.max(started.elapsed());
            }
            slowest
        }
    };
    // Warm up first, so the caches and the storage engine's buffers are at their working size.
    write(400).await;
    let before = rss_kib(server.pid());

    // A reader that asks for a live SSE stream from the start and never reads a byte of it.
    let mut stalled = TcpStream::connect(addr(&server)).await.unwrap();
    stalled
        .write_all(b"GET /v1/stream/firehose?offset=-1&live=sse HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // 400 MiB: far more than the engine's memtables and the allocator keep on their own (up to
    // about 100 MiB here, depending on when a memtable flushes), so a reader that pinned what it
    // fell behind by would stand out.
    let slowest = write(1600).await;
    let grown_mib = rss_kib(server.pid()).saturating_sub(before) / 1024;
    assert!(
        slowest < Duration::from_secs(2),
        "a writer waited {slowest:?} behind the stalled reader"
    );
    // A reader that does read gets everything, with the stalled one still connected.
    let response = http.read("/v1/stream/firehose", "-1").await;
    assert_eq!(response.status(), 200);
    // The stalled reader may pin its socket buffers and one read's worth of records, not what it
    // falls behind by.
    eprintln!(
        "resident memory grew by {grown_mib} MiB while the stalled reader fell 400 MiB behind"
    );
    assert!(grown_mib < 200, "memory grew by {grown_mib} MiB");
    drop(stalled);
}

#[tokio::test]
async fn sigterm_answers_long_polls_ends_live_readers_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--long-poll-timeout-ms",
        "60000",
        "--sse-max-duration-secs",
        "600",
    ]);
    create(&server, "/v1/stream/drain").await;
    let http = Client::new(&server);
    let ready = http.get("/readyz").await;
    assert_eq!(ready.status(), 200);

    let long_poll = tokio::spawn(
        http.request(Method::GET, "/v1/stream/drain?offset=now&live=long-poll")
            .timeout(Duration::from_secs(30))
            .send(),
    );
    let mut sse = http
        .request(Method::GET, "/v1/stream/drain?offset=-1&live=sse")
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    // Wait until the SSE reader is live (its first event), so shutdown finds it mid-stream.
    let first = tokio::time::timeout(Duration::from_secs(10), sse.chunk())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_some());
    // And until the long-poll is waiting too: sent before the server stops accepting, not after.
    let deadline = Instant::now() + Duration::from_secs(10);
    while live_readers(&server).await < 2 {
        assert!(Instant::now() < deadline, "the long-poll never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let started = Instant::now();
    let status = tokio::task::spawn_blocking(move || {
        let status = server.terminate(Duration::from_secs(15));
        (status, server)
    });
    let answered = tokio::time::timeout(Duration::from_secs(10), long_poll)
        .await
        .expect("the long-poll is answered at shutdown")
        .unwrap()
        .unwrap();
    assert_eq!(answered.status(), 204);
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(_chunk) = sse.chunk().await.unwrap() {}
    })
    .await;
    assert!(ended.is_ok(), "the SSE body ends cleanly at shutdown");
    let (status, _server) = status.await.unwrap();
    let status = status.expect("the server exits within 15 s of SIGTERM");
    assert!(status.success(), "exit status {status:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn tls_serves_http1_and_offers_h2_by_alpn() {
    let tls_server = TlsServer::start(&["--memory"]);
    let server = &tls_server.server;
    let connect = |alpn: Vec<Vec<u8>>| tls_server.connector(alpn);
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();

    let tcp = TcpStream::connect(addr(server)).await.unwrap();
    let mut tls = connect(vec![b"http/1.1".to_vec()])
        .connect(name.clone(), tcp)
        .await
        .unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    tls.read_to_end(&mut response).await.unwrap();
    assert!(
        response.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&response)
    );

    let tcp = TcpStream::connect(addr(server)).await.unwrap();
    let tls = connect(vec![b"h2".to_vec(), b"http/1.1".to_vec()])
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(b"h2".as_ref()));

    let plain = Client::new(server)
        .request(Method::GET, "/healthz")
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP is not served on a TLS port");
}
