//! Bad input gets a clear 4xx, changes nothing, and never takes the server down.

use rand::{Rng, SeedableRng};
use reqwest::Method;

use crate::common::{Client, Server, header};

/// The stream's tail and content, to check that a rejected request changed nothing.
async fn snapshot(http: &Client, path: &str) -> (String, String) {
    let response = http.read(path, "-1").await;
    assert_eq!(response.status(), 200);
    let tail = header(&response, "stream-next-offset").unwrap().to_string();
    (tail, response.text().await.unwrap())
}

async fn expect_status(request: reqwest::RequestBuilder, status: u16, what: &str) {
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), status, "{what}");
    if status >= 400 {
        let reason = response.text().await.unwrap();
        assert!(!reason.trim().is_empty(), "{what}: a rejection says why");
    }
}

#[tokio::test]
async fn malformed_requests_get_4xx_and_change_nothing() {
    let server = Server::start(&["--memory", "--max-body-bytes", "1024"]);
    let http = Client::new(&server);
    let (text, json) = ("/v1/stream/text", "/v1/stream/json");
    for (path, content_type, body) in [
        (text, "text/plain", "hello"),
        (json, "application/json", "[1,2]"),
    ] {
        let response = http.create(path, content_type, body).await;
        assert_eq!(response.status(), 201);
    }
    let before = (snapshot(&http, text).await, snapshot(&http, json).await);

    // Offsets and query parameters.
    for query in [
        "offset=",
        "offset=-1&offset=-1",
        "offset=abc",
        "offset=0_0",
        "offset=..%2F",
        "offset=9999999999999999_9999999999999999",
        "offset=0000000000000000_0000000000000003",
        "offset=now&live=forever",
        "live=sse",
        "live=long-poll",
    ] {
        let read = http.request(Method::GET, &format!("{text}?{query}"));
        expect_status(read, 400, query).await;
    }

    // Create headers.
    let create = || http.request(Method::PUT, "/v1/stream/new");
    for (name, value) in [
        ("stream-ttl", "-1"),
        ("stream-ttl", "1e3"),
        ("stream-expires-at", "tomorrow"),
        ("stream-expires-at", "1970-01-01T00:00:00Z"),
        ("stream-fork-sub-offset", "1"),
        ("stream-fork-offset", "0000000000000000_0000000000000000"),
    ] {
        expect_status(create().header(name, value), 400, name).await;
    }
    expect_status(
        create()
            .header("stream-ttl", "60")
            .header("stream-expires-at", "2099-01-01T00:00:00Z"),
        400,
        "both TTL and Expires-At",
    )
    .await;
    expect_status(
        create()
            .header("stream-forked-from", "/v1/stream/text")
            .header("stream-fork-sub-offset", "05"),
        400,
        "non-canonical sub-offset",
    )
    .await;
    expect_status(
        create()
            .header("content-type", "application/json")
            .body("{not json"),
        400,
        "invalid JSON on create",
    )
    .await;
    expect_status(
        http.request(Method::GET, "/v1/stream/new"),
        404,
        "rejected creates create nothing",
    )
    .await;

    // Appends.
    let post = |path: &str| {
        http.request(Method::POST, path)
            .header("content-type", "text/plain")
    };
    expect_status(
        post(text).header("producer-id", "p").body("x"),
        400,
        "partial producer headers",
    )
    .await;
    expect_status(
        post(text)
            .header("producer-id", "p")
            .header("producer-epoch", "0")
            .header("producer-seq", "1abc")
            .body("x"),
        400,
        "non-numeric producer seq",
    )
    .await;
    expect_status(post(text), 400, "empty body without close").await;
    expect_status(
        http.request(Method::POST, text).body("x"),
        400,
        "body without content type",
    )
    .await;
    expect_status(
        http.request(Method::POST, text)
            .header("content-type", "application/json")
            .body("{}"),
        409,
        "content type mismatch",
    )
    .await;
    expect_status(
        post(text).body(vec![b'a'; 2048]),
        413,
        "declared length over the limit",
    )
    .await;
    let chunked = reqwest::Body::wrap_stream(futures::stream::iter(
        (0..4).map(|_| Ok::<_, std::io::Error>(vec![b'b'; 512])),
    ));
    expect_status(post(text).body(chunked), 413, "chunked body over the limit").await;
    let json_post = || {
        http.request(Method::POST, json)
            .header("content-type", "application/json")
    };
    expect_status(json_post().body("[]"), 400, "empty JSON array append").await;
    expect_status(json_post().body("[1,"), 400, "invalid JSON append").await;
    expect_status(
        json_post()
            .header("producer-id", "p")
            .header("producer-epoch", "0")
            .header("producer-seq", "0")
            .body("nope"),
        400,
        "invalid JSON with producer headers",
    )
    .await;
    // The failed producer append above must not have advanced the producer.
    let retry = json_post()
        .header("producer-id", "p")
        .header("producer-epoch", "0")
        .header("producer-seq", "1")
        .body("3")
        .send()
        .await
        .unwrap();
    assert_eq!(
        retry.status(),
        409,
        "producer state did not move on a rejected append"
    );
    assert_eq!(header(&retry, "producer-expected-seq"), Some("0"));

    // A '%' that starts no escape, on every surface (decoders would keep it, so `a%zz` and
    // `a%25zz` would name one stream).
    for path in ["/v1/stream/a%zz", "/bkt1/a%zz", "/v1/streams/a%2/records"] {
        expect_status(
            http.request(Method::PUT, path)
                .header("content-type", "text/plain"),
            400,
            path,
        )
        .await;
    }

    // Methods.
    let response = http.send(Method::PATCH, text).await;
    assert_eq!(response.status(), 405);
    assert!(header(&response, "allow").unwrap().contains("POST"));
    // A method a route does not take is explained, in S2's error shape on S2's routes.
    for (method, path, allow) in [
        (Method::DELETE, "/healthz", "GET"),
        (Method::POST, "/metrics", "GET"),
        (Method::DELETE, "/v1/basins", "GET"),
        (Method::POST, "/v1/streams/x/records/tail", "GET"),
    ] {
        let response = http.send(method.clone(), path).await;
        assert_eq!(response.status(), 405, "{method} {path}");
        assert!(header(&response, "allow").unwrap().contains(allow));
        let body = response.text().await.unwrap();
        if path.starts_with("/v1/") {
            let error: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert!(error["message"].as_str().unwrap().contains("not allowed"));
        } else {
            assert!(body.contains("not allowed"), "{method} {path}: {body:?}");
        }
    }

    assert_eq!(
        (snapshot(&http, text).await, snapshot(&http, json).await),
        before
    );
}

#[tokio::test]
async fn random_garbage_never_gets_a_5xx() {
    let server = Server::start(&["--memory", "--max-body-bytes", "4096"]);
    let http = Client::new(&server);
    let response = http
        .create("/v1/stream/target", "application/json", "")
        .await;
    assert_eq!(response.status(), 201);

    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let names = [
        "content-type",
        "stream-ttl",
        "stream-expires-at",
        "stream-closed",
        "stream-seq",
        "producer-id",
        "producer-epoch",
        "producer-seq",
        "stream-forked-from",
        "stream-fork-offset",
        "stream-fork-sub-offset",
        "if-none-match",
    ];
    let values = [
        "",
        "0",
        "-1",
        "true",
        "application/json",
        "text/plain",
        "1e999",
        "0000000000000000_0000000000000000",
        "/v1/stream/target",
        "/v1/stream/../target",
        "http://x/v1/stream/target",
        "9007199254740992",
        "2030-01-01T00:00:00Z",
        "[]",
        "{}",
    ];
    let queries = [
        "",
        "offset=-1",
        "offset=now&live=sse",
        "offset=%00",
        "offset=now&live=long-poll&cursor=x",
        "live=",
        "a=%ZZ",
    ];
    let bodies: [&[u8]; 6] = [
        b"",
        b"[]",
        b"{\"a\":1}",
        b"[1,[2]]",
        b"\xff\xfe",
        b"not json",
    ];
    let methods = [
        Method::GET,
        Method::PUT,
        Method::POST,
        Method::HEAD,
        Method::DELETE,
    ];

    for i in 0..300 {
        let method = methods[rng.random_range(0..methods.len())].clone();
        let stream = if rng.random_bool(0.7) {
            "target"
        } else {
            "other"
        };
        let query = queries[rng.random_range(0..queries.len())];
        let mut request = http.request(method.clone(), &format!("/v1/stream/{stream}?{query}"));
        for _ in 0..rng.random_range(0..4) {
            request = request.header(
                names[rng.random_range(0..names.len())],
                values[rng.random_range(0..values.len())],
            );
        }
        let body = bodies[rng.random_range(0..bodies.len())];
        let response = request.body(body.to_vec()).send().await.unwrap();
        assert!(
            response.status().as_u16() < 500,
            "request {i} ({method} {stream}?{query}) got {}",
            response.status()
        );
        if query.contains("live=sse") && response.status() == 200 {
            continue; // a live SSE read stays open; dropping it is enough
        }
    }
    let non_ascii = reqwest::header::HeaderValue::from_bytes(b"caf\xe9").unwrap();
    let response = http
        .request(Method::POST, "/v1/stream/target")
        .header("content-type", non_ascii)
        .body("1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "a header that is not ASCII text");
    let health = http.get("/healthz").await;
    assert_eq!(health.status(), 200);
}

/// Appends on the base route skip the router (`http::Handler`); they must name streams exactly
/// as the routed requests do.
#[tokio::test]
async fn appends_decode_the_stream_path_as_every_other_request_does() {
    let server = Server::start(&["--memory"]);
    let http = Client::new(&server);
    let created = "/v1/stream/caf%C3%A9%20au%20lait";
    let create = http
        .request(Method::PUT, created)
        .header("content-type", "text/plain");
    expect_status(create, 201, "create").await;
    let append = http
        .request(Method::POST, "/v1/stream/caf%c3%a9%20au%20lait")
        .header("content-type", "text/plain")
        .body("x");
    expect_status(append, 204, "append with lower-case escapes").await;
    let (_, content) = snapshot(&http, created).await;
    assert_eq!(
        content, "x",
        "the append reached the stream the create made"
    );

    for method in [Method::POST, Method::GET] {
        let not_utf8 = http.request(method.clone(), "/v1/stream/%FF");
        expect_status(
            not_utf8,
            400,
            &format!("{method} on a path that is not UTF-8"),
        )
        .await;
        let no_name = http.request(method.clone(), "/v1/stream/");
        expect_status(no_name, 404, &format!("{method} with no stream name")).await;
    }
}

#[tokio::test]
async fn an_append_batch_over_the_servers_body_limit_gets_413_and_writes_nothing() {
    // The batch route's own bound (32 MiB) is higher than this server's limit: the lower holds.
    let server = Server::start(&["--memory", "--max-body-bytes", "1024"]);
    let http = Client::new(&server);
    let bucket = http.create_bucket("docs").await;
    assert_eq!(bucket.status(), 201);
    let stream = "/docs/s";
    let created = http.create(stream, "text/plain", "").await;
    assert_eq!(created.status(), 201);
    let frame = vec![b'x'; 2048];
    let mut batch = (frame.len() as u32).to_be_bytes().to_vec();
    batch.extend_from_slice(&frame);
    expect_status(
        http.request(Method::POST, &format!("{stream}/append-batch"))
            .header("content-type", "text/plain")
            .body(batch),
        413,
        "a 2 KiB batch on a server that takes 1 KiB bodies",
    )
    .await;
    let (tail, content) = snapshot(&http, stream).await;
    assert_eq!(
        (tail.as_str(), content.as_str()),
        ("0000000000000000_0000000000000000", "")
    );
}

#[tokio::test]
async fn a_read_refused_for_its_headers_does_not_renew_the_streams_ttl() {
    let server = Server::start(&["--memory"]);
    let http = Client::new(&server);
    let stream = "/v1/stream/short-lived";
    let created = http
        .request(Method::PUT, stream)
        .header("content-type", "text/plain")
        .header("stream-ttl", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    expect_status(
        http.request(Method::GET, &format!("{stream}?offset=-1"))
            .header("if-none-match", "\"a\"")
            .header("if-none-match", "\"b\""),
        400,
        "If-None-Match sent twice",
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let gone = http.head(stream).await;
    assert_eq!(
        gone.status(),
        404,
        "expired: the refused read renewed nothing"
    );
}

/// Sends `head` as it is, on a connection of its own (HTTP clients normalise `..` and `.` away
/// before sending), and returns the response's status line.
async fn raw_status_line(server: &Server, head: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = server.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut response),
    );
    read.await.expect("a response within 10 s").unwrap();
    let text = String::from_utf8_lossy(&response);
    text.lines().next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_base_stream_name_with_a_dot_dot_dot_or_empty_segment_is_refused() {
    let server = Server::start(&["--memory"]);
    let http = Client::new(&server);
    for path in [
        "/v1/stream/a/../b",
        "/v1/stream/a/./b",
        "/v1/stream/a//b",
        "/v1/stream/a/%2E%2E/b",
    ] {
        let head = format!(
            "PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let status = raw_status_line(&server, &head).await;
        assert!(status.starts_with("HTTP/1.1 400"), "{path}: {status}");
    }
    // Nothing was created under any spelling a client could reach.
    for path in ["/v1/stream/b", "/v1/stream/a/b"] {
        assert_eq!(http.read(path, "-1").await.status(), 404, "{path}");
    }
}
