//! The StreamLD SSE binding: one event per record with its cursor as id, resumption, gaps,
//! keep-alives, and the links and locations a client is told to use (over HTTP/2 and TLS too).

use std::time::Duration;

use reqwest::Method;

use crate::common::{Client, Server, TlsServer, client, header, json_of};

use super::{BUCKET, append, link_target, stream, with_bucket};

#[tokio::test]
async fn the_sse_binding_keeps_a_quiet_connection_alive_ends_at_its_max_duration_and_answers_204_once_closed()
 {
    // Tests run with a 500 ms long-poll timeout, which bounds the keep-alive interval.
    let server = Server::start(&["--memory", "--sse-max-duration-secs", "2"]);
    let http = with_bucket(&server).await;
    let quiet = stream("quiet");
    assert_eq!(http.create(&quiet, "text/plain", "a;").await.status(), 201);
    let started = std::time::Instant::now();
    let response = http
        .request(Method::GET, &format!("{quiet}/streamld"))
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
        .request(Method::POST, &quiet)
        .header("content-type", "text/plain")
        .header("stream-closed", "true")
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    let done = http
        .request(Method::GET, &format!("{quiet}/streamld"))
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
    let http = Client::new(&server);
    assert_eq!(http.create_bucket("feeds").await.status(), 201);
    let news = "/feeds/news";
    let created = http
        .create(news, "application/json", r#"[{"n":1},{"n":2},{"n":3}]"#)
        .await;
    assert_eq!(created.status(), 201);
    let head = http.head(news).await;
    let links = header(&head, "link").unwrap().to_string();
    let sse_url = link_target(&links, "sse").expect("an SSE binding Link");
    // The binding is read where the Link says, as a client that follows it would.
    let follow = client();

    // Resuming after cursor 1 delivers events 2 and 3, each with its cursor as id.
    let response = follow
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
    let snapshot = http
        .request(Method::PUT, &format!("{news}/snapshot/{tail}"))
        .body("s")
        .send()
        .await
        .unwrap();
    assert_eq!(snapshot.status(), 204);
    let retention = http
        .send(Method::PUT, &format!("{news}/retention/{tail}"))
        .await;
    assert_eq!(retention.status(), 204);
    let gap = follow
        .get(format!("{sse_url}?after=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(gap.status(), 409);
    let body = json_of(gap).await;
    assert_eq!(body["@type"], "GapSignal");
    assert_eq!(body["oldestAvailable"], 4);
}

/// The first event a StreamLD SSE reader of `sse` gets, asking with `host` as its `Host`, and
/// its response, still open.
async fn first_sse_event(
    http: &Client,
    sse: &str,
    host: &str,
) -> (String, impl futures::Stream + use<>) {
    let response = http
        .request(Method::GET, sse)
        .header("host", host)
        .send()
        .await
        .unwrap();
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
    let http = with_bucket(&server).await;
    let shared = stream("shared");
    assert_eq!(http.create(&shared, "text/plain", "").await.status(), 201);
    let sse = format!("{shared}/streamld");
    // Two readers at the same place: whichever renders the event while the other is there
    // leaves it for the other (and for later readers at that place).
    let readers = [0, 1].map(|_| {
        let (http, sse) = (http.clone(), sse.clone());
        tokio::spawn(async move { first_sse_event(&http, &sse, "here.example:1").await })
    });
    append(&http, &shared, "text/plain", "hello").await;
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
    let http = with_bucket(&server).await;
    let news = stream("news");
    let created = http
        .create(&news, "application/json", r#"[{"n":1},{"n":2}]"#)
        .await;
    assert_eq!(created.status(), 201);
    let sse = format!("{news}/streamld");
    for id in ["1x", "-1", "", "01"] {
        let refused = http
            .request(Method::GET, &sse)
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
        let refused = http.get(&format!("{sse}?after={after}")).await;
        assert_eq!(refused.status(), 400, "?after={after}");
        assert!(refused.text().await.unwrap().contains("after"));
    }
    // Last-Event-ID, a reconnecting EventSource's cursor, wins over ?after=.
    let resumed = http
        .request(Method::GET, &format!("{sse}?after=0"))
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

#[tokio::test]
async fn over_http2_the_streamld_links_name_the_authority_the_request_used() {
    let server = Server::start(&["--memory"]);
    let http = with_bucket(&server).await;
    assert_eq!(
        http.create(&stream("h2"), "text/plain", "x").await.status(),
        201
    );
    let authority = server.base.trim_start_matches("http://").to_string();

    // HTTP/2 carries the authority in the request URI (:authority), not in a Host header.
    let h2 = Client::h2(&server);
    let head = h2.head(&stream("h2")).await;
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
    let bucket = h2.get(&format!("/{BUCKET}")).await;
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
