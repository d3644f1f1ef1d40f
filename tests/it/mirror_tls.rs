//! A mirror follows an upstream served over TLS: discovery and snapshots over `https`, the
//! replication socket over `wss`, trusting the upstream's certificate through --mirror-ca-cert.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Client, Server, TlsServer};

const BUCKET: &str = "secured";

fn succeeded(response: reqwest::Response) {
    assert!(response.status().is_success(), "{}", response.status());
}

/// Waits until `path` reads `expected` from the start, within 20 s.
async fn wait_for_content(http: &Client, path: &str, expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let response = http.read(path, "-1").await;
        if response.status() == 200 && response.text().await.unwrap() == expected {
            return;
        }
        assert!(Instant::now() < deadline, "{path} never read {expected:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_mirror_follows_an_https_upstream_it_trusts_through_mirror_ca_cert() {
    let upstream = TlsServer::start(&["--memory"]);
    let https = upstream.client();
    succeeded(https.create_bucket(BUCKET).await);
    let stream = format!("/{BUCKET}/log");
    succeeded(https.create(&stream, "text/plain", "before;").await);

    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &https.url(&format!("/{BUCKET}")),
        "--mirror-ca-cert",
        upstream.cert_path.to_str().unwrap(),
    ]);
    let plain = Client::new(&mirror);
    wait_for_content(&plain, &stream, "before;").await;
    // Live over the wss socket.
    succeeded(https.append(&stream, "text/plain", "after;").await);
    wait_for_content(&plain, &stream, "before;after;").await;
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
