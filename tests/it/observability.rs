//! What operators see: Prometheus metrics per route and status, commit and live-reader figures,
//! and request ids on every response.

use reqwest::Method;

use crate::common::{Client, Server, header};

#[tokio::test]
async fn metrics_count_requests_per_route_and_show_commits_and_live_readers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::on_disk(dir.path());
    let http = Client::new(&server);
    let created = http.create("/v1/stream/observed", "text/plain", "").await;
    assert_eq!(created.status(), 201);
    for _ in 0..3 {
        let appended = http.append("/v1/stream/observed", "text/plain", "x").await;
        assert_eq!(appended.status(), 204);
    }
    let text = http.metrics().await;
    let has = |needle: &str| text.lines().any(|l| l.contains(needle));
    assert!(
        text.lines()
            .any(|l| l.starts_with("runnel_http_requests_total")
                && l.contains("route=\"/v1/stream/{*path}\"")
                && l.contains("method=\"POST\"")
                && l.contains("status=\"204\"")
                && l.ends_with(" 3")),
        "{text}"
    );
    assert!(has("runnel_http_request_duration_seconds_bucket"));
    assert!(has("runnel_commit_group_appends_bucket"));
    assert!(has("runnel_commit_seconds_bucket"));
    assert!(has("runnel_live_readers 0"));
    assert!(has("runnel_stream_bytes 3"));
}

#[tokio::test]
async fn every_response_carries_a_request_id_and_echoes_the_clients() {
    let server = Server::start(&["--memory"]);
    let http = Client::new(&server);
    let first = http.get("/healthz").await;
    let second = http.get("/healthz").await;
    let (a, b) = (
        header(&first, "x-request-id").unwrap().to_string(),
        header(&second, "x-request-id").unwrap().to_string(),
    );
    assert_ne!(a, b);
    let echoed = http
        .request(Method::GET, "/no/such/route/here")
        .header("x-request-id", "client-chosen-42")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&echoed, "x-request-id"), Some("client-chosen-42"));
}
