//! A mirror follows an upstream served over TLS: discovery and snapshots over `https`, the
//! replication socket over `wss`, trusting the upstream's certificate through --mirror-ca-cert.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;

const BUCKET: &str = "secured";

/// An upstream serving TLS for `localhost` with a self-signed certificate, and that
/// certificate's PEM file (kept in `dir`).
fn tls_upstream(dir: &std::path::Path) -> (Server, std::path::PathBuf) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
    let server = Server::start(&[
        "--memory",
        "--tls-cert",
        cert_path.to_str().unwrap(),
        "--tls-key",
        key_path.to_str().unwrap(),
    ]);
    (server, cert_path)
}

/// `https://localhost:PORT`: the name the certificate is for.
fn https_base(server: &Server) -> String {
    let port = server.base.rsplit(':').next().unwrap();
    format!("https://localhost:{port}")
}

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
    let dir = tempfile::tempdir().unwrap();
    let (upstream, cert) = tls_upstream(dir.path());
    let base = https_base(&upstream);
    let https = trusting_client(&cert);
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
