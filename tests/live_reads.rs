//! Live reads against a real server: long-poll and SSE wake on appends, deliver an
//! append-and-close before the close, and the same routes answer over h2c.

mod common;

use std::time::Duration;

use common::{Server, client, header};
use futures::StreamExt;

async fn create_text(http: &reqwest::Client, url: &str) {
    let response = http
        .put(url)
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
}

#[tokio::test]
async fn a_waiting_long_poll_receives_the_data_of_an_append_and_close() {
    let server = Server::start(&["--memory", "--long-poll-timeout-ms", "10000"]);
    let http = client();
    let url = server.url("/v1/stream/lp");
    create_text(&http, &url).await;
    let head = http.head(&url).send().await.unwrap();
    let tail = header(&head, "stream-next-offset").unwrap().to_string();

    // Polling from the tail before the append, the answer is the same whether the poll parks
    // before the append (the wake-up path, usually) or arrives after it (the catch-up path).
    let poll = tokio::spawn({
        let http = http.clone();
        let url = url.clone();
        async move {
            http.get(format!("{url}?offset={tail}&live=long-poll"))
                .send()
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closing = http
        .post(&url)
        .header("content-type", "text/plain")
        .header("stream-closed", "true")
        .body("last words")
        .send()
        .await
        .unwrap();
    assert_eq!(closing.status(), 204);

    let response = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "stream-closed"), Some("true"));
    // Cacheable like a catch-up read, so revalidatable like one (base protocol §10.1).
    assert!(
        header(&response, "etag").is_some(),
        "a long-poll 200 has an ETag"
    );
    assert_eq!(response.text().await.unwrap(), "last words");
}

#[tokio::test]
async fn an_sse_tail_sees_each_append_then_the_close_and_ends() {
    let server = Server::start(&["--memory"]);
    let http = client();
    let url = server.url("/v1/stream/tail");
    create_text(&http, &url).await;

    let response = http
        .get(format!("{url}?offset=now&live=sse"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "content-type"), Some("text/event-stream"));
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    let mut next_event = async |seen: &mut String, want: &str| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !seen.contains(want) {
            let chunk = tokio::time::timeout_at(deadline, body.next())
                .await
                .expect("event in time");
            match chunk {
                Some(bytes) => seen.push_str(std::str::from_utf8(&bytes.unwrap()).unwrap()),
                None => break,
            }
        }
    };
    next_event(&mut seen, "\"upToDate\":true").await;

    for word in ["one", "two", "three", "four"] {
        let response = http
            .post(&url)
            .header("content-type", "text/plain")
            .body(word)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
        next_event(&mut seen, &format!("data:{word}\n")).await;
    }
    let response = http
        .post(&url)
        .header("stream-closed", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    next_event(&mut seen, "\"streamClosed\":true").await;
    next_event(&mut seen, "connection ends").await; // stops only when the body ends
    assert!(
        seen.ends_with("}\n\n"),
        "the close is the last event: {seen:?}"
    );
    // Without a client cursor every event's cursor is the current interval: it neither goes
    // back nor runs ahead event by event.
    let cursors: Vec<u64> = seen
        .split("\"streamCursor\":\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().parse().unwrap())
        .collect();
    assert!(cursors.len() >= 5, "{seen:?}");
    assert!(cursors.is_sorted(), "{cursors:?}");
    assert!(cursors[cursors.len() - 1] - cursors[0] <= 1, "{cursors:?}");
}

#[tokio::test]
async fn routes_answer_over_http2_with_prior_knowledge() {
    let server = Server::start(&["--memory"]);
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let url = server.url("/v1/stream/h2");
    let response = h2
        .put(&url)
        .header("content-type", "text/plain")
        .body("over h2")
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 201);
    let read = h2.get(format!("{url}?offset=-1")).send().await.unwrap();
    assert_eq!(read.text().await.unwrap(), "over h2");
}

#[tokio::test]
async fn a_stream_with_a_waiting_live_reader_does_not_expire_under_its_ttl() {
    // "A stream with active live readers will not expire" (base protocol, Stream-TTL).
    let server = Server::start(&["--memory", "--long-poll-timeout-ms", "2500"]);
    let http = client();
    let url = server.url("/v1/stream/kept-alive");
    let created = http
        .put(&url)
        .header("content-type", "text/plain")
        .header("stream-ttl", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let tail = header(&created, "stream-next-offset").unwrap().to_string();
    let poll = http
        .get(format!("{url}?offset={tail}&live=long-poll"))
        .send()
        .await
        .unwrap();
    assert_eq!(poll.status(), 204, "the poll ran its course");
    // Its TTL window starts again as the reader leaves.
    assert_eq!(http.head(&url).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn live_readers_of_a_stream_deleted_while_forks_hold_it_are_told_410_at_once() {
    let server = Server::start(&["--memory", "--long-poll-timeout-ms", "20000"]);
    let http = client();
    let source = server.url("/v1/stream/held");
    create_text(&http, &source).await;
    let fork = http
        .put(server.url("/v1/stream/holder"))
        .header("content-type", "text/plain")
        .header("stream-forked-from", "/v1/stream/held")
        .send()
        .await
        .unwrap();
    assert_eq!(fork.status(), 201);
    let tail = header(
        &http.head(&source).send().await.unwrap(),
        "stream-next-offset",
    )
    .unwrap()
    .to_string();
    let poll = tokio::spawn({
        let (http, source) = (http.clone(), source.clone());
        async move {
            http.get(format!("{source}?offset={tail}&live=long-poll"))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    let mut sse = http
        .get(format!("{source}?offset=-1&live=sse"))
        .send()
        .await
        .unwrap()
        .bytes_stream();
    sse.next().await.unwrap().unwrap(); // the first control event: attached
    tokio::time::sleep(Duration::from_millis(100)).await;

    assert_eq!(http.delete(&source).send().await.unwrap().status(), 204);
    let status = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .expect("the long-poll ends with the deletion, not its 20 s timeout")
        .unwrap();
    assert_eq!(status, 410);
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = sse.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the SSE response ends with the deletion");
}
