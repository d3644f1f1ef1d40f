//! A mirror follows an upstream served over TLS: discovery and snapshots over `https`, the
//! replication socket over `wss`, trusting the upstream's certificate through --mirror-ca-cert.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Server, TlsServer};

const BUCKET: &str = "secured";

fn trusting_client(cert: &std::path::Path) -> reqwest::Client {
    let pem = std::fs::read(cert).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn send(request: reqwest::RequestBuilder) {
    let response = request.send().await.unwrap();
    assert!(response.status().is_success(), "{}", response.status());
}

/// Waits until `url` reads `expected` from the start, within 20 s.
async fn wait_for_content(http: &reqwest::Client, url: &str, expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let response = http.get(format!("{url}?offset=-1")).send().await.unwrap();
        if response.status() == 200 && response.text().await.unwrap() == expected {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never read {expected:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_mirror_follows_an_https_upstream_it_trusts_through_mirror_ca_cert() {
    let upstream = TlsServer::start(&["--memory"]);
    let (base, cert) = (upstream.https_base(), &upstream.cert_path);
    let https = trusting_client(cert);
    send(https.put(format!("{base}/{BUCKET}"))).await;
    let stream = format!("{base}/{BUCKET}/log");
    send(
        https
            .put(&stream)
            .header("content-type", "text/plain")
            .body("before;"),
    )
    .await;

    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &format!("{base}/{BUCKET}"),
        "--mirror-ca-cert",
        cert.to_str().unwrap(),
    ]);
    let plain = reqwest::Client::new();
    let mirrored = mirror.url(&format!("/{BUCKET}/log"));
    wait_for_content(&plain, &mirrored, "before;").await;
    // Live over the wss socket.
    send(
        https
            .post(&stream)
            .header("content-type", "text/plain")
            .body("after;"),
    )
    .await;
    wait_for_content(&plain, &mirrored, "before;after;").await;
}

#[test]
fn a_mirror_ca_cert_that_holds_no_certificate_stops_startup_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("bogus.pem");
    std::fs::write(&bogus, "not a certificate\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_runnel"))
        .args(["serve", "--memory", "--listen", "127.0.0.1:0"])
        .args(["--mirror-from", "https://localhost:1/bucket"])
        .arg("--mirror-ca-cert")
        .arg(&bogus)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bogus.pem"), "{stderr}");
}
