//! Live reads against a real server: long-poll and SSE wake on appends, deliver an
//! append-and-close before the close, and the same routes answer over h2c.

use std::time::Duration;

use futures::StreamExt;

use reqwest::Method;

use crate::common::{Client, Server, header};

async fn create_text(http: &Client, path: &str) {
    let response = http.create(path, "text/plain", "").await;
    assert_eq!(response.status(), 201);
}

#[tokio::test]
async fn a_waiting_long_poll_receives_the_data_of_an_append_and_close() {
    let server = Server::start(&["--memory", "--long-poll-timeout-ms", "10000"]);
    let http = Client::new(&server);
    let path = "/v1/stream/lp";
    create_text(&http, path).await;
    let tail = http.next_offset(path).await;

    // Polling from the tail before the append, the answer is the same whether the poll parks
    // before the append (the wake-up path, usually) or arrives after it (the catch-up path).
    let poll = tokio::spawn({
        let http = http.clone();
        async move {
            http.get(&format!("{path}?offset={tail}&live=long-poll"))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closing = http
        .request(Method::POST, path)
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
    let http = Client::new(&server);
    let path = "/v1/stream/tail";
    create_text(&http, path).await;

    let response = http.get(&format!("{path}?offset=now&live=sse")).await;
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
        let response = http.append(path, "text/plain", word).await;
        assert_eq!(response.status(), 204);
        next_event(&mut seen, &format!("data:{word}\n")).await;
    }
    let response = http
        .request(Method::POST, path)
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

/// The data and the cursors of an SSE body, read until its `want`-th byte of data.
struct SseSeen {
    data: String,
    cursors: Vec<u64>,
}

async fn read_sse_until(response: reqwest::Response, want: usize) -> SseSeen {
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let mut seen = SseSeen {
        data: String::new(),
        cursors: Vec::new(),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.data.len() < want {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("every record in time")
            .expect("the body goes on");
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        while let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            if let Some(data) = event.strip_prefix("event: data\n") {
                for line in data.lines().filter(|line| !line.is_empty()) {
                    seen.data.push_str(line.strip_prefix("data:").unwrap());
                }
            } else if let Some((_, rest)) = event.split_once("\"streamCursor\":\"") {
                seen.cursors
                    .push(rest.split('"').next().unwrap().parse().unwrap());
            }
        }
    }
    seen
}

#[tokio::test]
async fn sse_readers_woken_together_each_get_every_record_once_with_their_own_cursor() {
    let server = Server::start(&["--memory"]);
    let http = Client::new(&server);
    let path = "/v1/stream/shared";
    create_text(&http, path).await;
    // Records of fixed width, so the data read shows each exactly once and in order; one large
    // enough that a reader with another cursor sends the shared part of its frame as it is.
    let records: Vec<String> = (0..200)
        .map(|i| match i {
            100 => format!("{i:05}{}", "x".repeat(20_000)),
            _ => format!("{i:05};"),
        })
        .collect();
    let all: String = records.concat();

    // Half the readers carry a cursor far ahead of the clock: each of their events carries a
    // cursor past it, while the others' carry the current interval.
    let ahead: u64 = 1 << 40;
    let mut readers = Vec::new();
    for i in 0..8 {
        let query = if i % 2 == 0 {
            "offset=now&live=sse".to_string()
        } else {
            format!("offset=now&live=sse&cursor={ahead}")
        };
        let response = http.get(&format!("{path}?{query}")).await;
        assert_eq!(response.status(), 200);
        let want = all.len();
        readers.push((i % 2 == 1, tokio::spawn(read_sse_until(response, want))));
    }
    // Every reader waits on the tail before the first append.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = http.metrics().await;
        if text
            .lines()
            .any(|l| l.starts_with("runnel_live_readers ") && l.ends_with(" 8"))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readers did not attach: {text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for record in &records {
        let response = http.append(path, "text/plain", record.clone()).await;
        assert_eq!(response.status(), 204);
    }
    for (with_cursor, reader) in readers {
        let seen = reader.await.unwrap();
        assert!(
            seen.data == all,
            "a reader saw {} bytes, not the {} appended",
            seen.data.len(),
            all.len()
        );
        assert!(!seen.cursors.is_empty());
        if with_cursor {
            assert!(
                seen.cursors.iter().all(|c| *c > ahead),
                "{:?}",
                seen.cursors
            );
        } else {
            assert!(
                seen.cursors.iter().all(|c| *c < ahead),
                "{:?}",
                seen.cursors
            );
        }
    }
}

#[tokio::test]
async fn routes_answer_over_http2_with_prior_knowledge() {
    let server = Server::start(&["--memory"]);
    let h2 = Client::h2(&server);
    let response = h2.create("/v1/stream/h2", "text/plain", "over h2").await;
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 201);
    let read = h2.read("/v1/stream/h2", "-1").await;
    assert_eq!(read.text().await.unwrap(), "over h2");
}

#[tokio::test]
async fn a_stream_with_a_waiting_live_reader_does_not_expire_under_its_ttl() {
    // "A stream with active live readers will not expire" (base protocol, Stream-TTL).
    let server = Server::start(&["--memory", "--long-poll-timeout-ms", "2500"]);
    let http = Client::new(&server);
    let path = "/v1/stream/kept-alive";
    let created = http
        .request(Method::PUT, path)
        .header("content-type", "text/plain")
        .header("stream-ttl", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let tail = header(&created, "stream-next-offset").unwrap().to_string();
    let poll = http
        .get(&format!("{path}?offset={tail}&live=long-poll"))
        .await;
    assert_eq!(poll.status(), 204, "the poll ran its course");
    // Its TTL window starts again as the reader leaves.
    assert_eq!(http.head(path).await.status(), 200);
}

#[tokio::test]
async fn live_readers_of_a_stream_deleted_while_forks_hold_it_are_told_410_at_once() {
    let server = Server::start(&["--memory", "--long-poll-timeout-ms", "20000"]);
    let http = Client::new(&server);
    let source = "/v1/stream/held";
    create_text(&http, source).await;
    let fork = http
        .request(Method::PUT, "/v1/stream/holder")
        .header("content-type", "text/plain")
        .header("stream-forked-from", "/v1/stream/held")
        .send()
        .await
        .unwrap();
    assert_eq!(fork.status(), 201);
    let tail = http.next_offset(source).await;
    let poll = tokio::spawn({
        let http = http.clone();
        async move {
            http.get(&format!("{source}?offset={tail}&live=long-poll"))
                .await
                .status()
        }
    });
    let mut sse = http
        .get(&format!("{source}?offset=-1&live=sse"))
        .await
        .bytes_stream();
    sse.next().await.unwrap().unwrap(); // the first control event: attached
    tokio::time::sleep(Duration::from_millis(100)).await;

    assert_eq!(http.delete(source).await.status(), 204);
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
