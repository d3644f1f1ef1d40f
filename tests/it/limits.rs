//! Configurable limits answer clearly: live readers beyond `--max-live-readers` get 503 with
//! `Retry-After`, streams beyond `--max-streams-per-bucket` get 409, and nothing changes.

use std::time::Duration;

use crate::common::{Server, client, header};

async fn put(server: &Server, path: &str) -> reqwest::Response {
    client()
        .put(server.url(path))
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn live_readers_beyond_the_limit_get_503_with_retry_after() {
    let server = Server::start(&[
        "--memory",
        "--max-live-readers",
        "2",
        "--sse-max-duration-secs",
        "600",
    ]);
    assert_eq!(put(&server, "/v1/stream/live").await.status(), 201);
    let sse = |url: String| async move {
        client()
            .get(url)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap()
    };
    let first = sse(server.url("/v1/stream/live?offset=-1&live=sse")).await;
    let second = sse(server.url("/v1/stream/live?offset=-1&live=sse")).await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let third = client()
        .get(server.url("/v1/stream/live?offset=now&live=long-poll"))
        .send()
        .await
        .unwrap();
    assert_eq!(third.status(), 503);
    assert_eq!(header(&third, "retry-after"), Some("1"));
    // On S2's routes the refusal takes S2's error shape.
    let s2 = client()
        .get(server.url("/v1/streams/s/records?seq_num=0"))
        .header("s2-basin", "some-basin")
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(s2.status(), 503);
    let error: serde_json::Value = serde_json::from_slice(&s2.bytes().await.unwrap()).unwrap();
    assert_eq!(error["code"], "unavailable");
    let catch_up = client()
        .get(server.url("/v1/stream/live?offset=-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        catch_up.status(),
        200,
        "catch-up reads are not live readers"
    );
    drop(first);
    // Once a live reader leaves, its slot is free again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let again = client()
            .get(server.url("/v1/stream/live?offset=-1&live=sse"))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap();
        if again.status() == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn streams_beyond_the_bucket_limit_get_409_and_are_not_created() {
    let server = Server::start(&["--memory", "--max-streams-per-bucket", "2"]);
    assert_eq!(put(&server, "/limited").await.status(), 201);
    assert_eq!(put(&server, "/limited/a").await.status(), 201);
    assert_eq!(put(&server, "/limited/b").await.status(), 201);
    let refused = put(&server, "/limited/c").await;
    assert_eq!(refused.status(), 409);
    assert!(refused.text().await.unwrap().contains("limit of 2 streams"));
    let missing = client()
        .get(server.url("/limited/c?offset=-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    // The base surface is not a bucket; it has no such limit.
    assert_eq!(put(&server, "/v1/stream/free").await.status(), 201);
}
