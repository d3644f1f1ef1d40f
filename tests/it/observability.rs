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

#[tokio::test]
async fn every_metric_family_has_help_and_failure_counters_start_at_zero() {
    let server = Server::start(&["--memory"]);
    let http = Client::new(&server);
    assert_eq!(
        http.create("/v1/stream/m", "text/plain", "x")
            .await
            .status(),
        201
    );
    let text = http.metrics().await;
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(families.len() >= 20, "{text}");
    for family in &families {
        let help = format!("# HELP {family} ");
        assert!(
            text.lines()
                .any(|l| l.starts_with(&help) && l.len() > help.len()),
            "{family} has no help text:\n{text}"
        );
    }
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name}:\n{text}"))
    };
    assert_eq!(value("runnel_commit_failures_total"), 0.0);
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") >= 3.0);
    assert!(value("process_cpu_seconds_total") >= 0.0);
}
