//! A mirror's `/readyz`: not ready until its upstream serves it, and not ready once it has been
//! without a session for longer than the grace (10 s); the reasons are in the body.

use std::time::Duration;

use crate::common::{Client, Server};

use super::{BUCKET, with_bucket};

/// Waits (up to `within`) until `/readyz` answers `status`, and returns its body.
async fn readyz_becomes(http: &Client, status: u16, within: Duration) -> String {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let response = http.get("/readyz").await;
        let now = response.status().as_u16();
        let body = response.text().await.unwrap();
        if now == status {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz still answers {now} ({body}), not {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_mirror_whose_upstream_cannot_be_reached_is_not_ready_and_says_why() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let upstream = format!("http://127.0.0.1:{port}/{BUCKET}");
    let mirror = Server::start(&["--memory", "--mirror-from", &upstream]);
    let http = Client::new(&mirror);
    let response = http.get("/readyz").await;
    assert_eq!(response.status(), 503);
    let body = response.text().await.unwrap();
    assert!(
        body.contains(&format!("mirror of {upstream}: not followed yet")),
        "{body}"
    );
    // Still not ready once the first attempt has failed, now with its reason.
    let body = readyz_becomes(&http, 503, Duration::from_secs(5)).await;
    assert!(body.contains("not followed yet"), "{body}");
    assert_eq!(
        http.get("/healthz").await.status(),
        200,
        "alive all the same"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_is_ready_while_it_follows_its_upstream_and_not_once_it_has_lost_it() {
    let upstream = Server::start(&["--memory"]);
    with_bucket(&upstream).await;
    let source = upstream.url(&format!("/{BUCKET}"));
    let mirror = Server::start(&["--memory", "--mirror-from", &source]);
    let http = Client::new(&mirror);
    readyz_becomes(&http, 200, Duration::from_secs(15)).await;
    let metrics = http.metrics().await;
    assert!(
        metrics.contains(&format!(
            "runnel_mirror_connected{{upstream=\"{source}\"}} 1"
        )) && metrics.contains("# HELP runnel_mirror_connected"),
        "{metrics}"
    );
    upstream.kill();
    // Within the grace, a lost session is a reconnect, not an outage.
    assert_eq!(http.get("/readyz").await.status(), 200);
    let body = readyz_becomes(&http, 503, Duration::from_secs(20)).await;
    assert!(
        body.contains(&format!("mirror of {source}: no session for")),
        "{body}"
    );
}
