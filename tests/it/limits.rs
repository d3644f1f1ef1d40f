//! Configurable limits answer clearly: live readers beyond `--max-live-readers` get 503 with
//! `Retry-After`, streams beyond `--max-streams-per-bucket` get 409, and nothing changes.

use std::time::Duration;

use reqwest::Method;

use crate::common::{Client, Server, header, json_of};

#[tokio::test]
async fn live_readers_beyond_the_limit_get_503_with_retry_after() {
    let server = Server::start(&[
        "--memory",
        "--max-live-readers",
        "2",
        "--sse-max-duration-secs",
        "600",
    ]);
    let http = Client::new(&server);
    let created = http.create("/v1/stream/live", "text/plain", "").await;
    assert_eq!(created.status(), 201);
    let sse = || async {
        http.request(Method::GET, "/v1/stream/live?offset=-1&live=sse")
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap()
    };
    let first = sse().await;
    let second = sse().await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let third = http.get("/v1/stream/live?offset=now&live=long-poll").await;
    assert_eq!(third.status(), 503);
    assert_eq!(header(&third, "retry-after"), Some("1"));
    // On S2's routes the refusal takes S2's error shape.
    let s2 = http
        .s2(Method::GET, "some-basin", "/v1/streams/s/records?seq_num=0")
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(s2.status(), 503);
    assert_eq!(json_of(s2).await["code"], "unavailable");
    let catch_up = http.read("/v1/stream/live", "-1").await;
    assert_eq!(
        catch_up.status(),
        200,
        "catch-up reads are not live readers"
    );
    drop(first);
    // Once a live reader leaves, its slot is free again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let again = sse().await;
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
    let http = Client::new(&server);
    let put = |path: &'static str| http.create(path, "text/plain", "");
    assert_eq!(put("/limited").await.status(), 201);
    assert_eq!(put("/limited/a").await.status(), 201);
    assert_eq!(put("/limited/b").await.status(), 201);
    let refused = put("/limited/c").await;
    assert_eq!(refused.status(), 409);
    assert!(refused.text().await.unwrap().contains("limit of 2 streams"));
    let missing = http.read("/limited/c", "-1").await;
    assert_eq!(missing.status(), 404);
    // The base surface is not a bucket; it has no such limit.
    assert_eq!(put("/v1/stream/free").await.status(), 201);
}
