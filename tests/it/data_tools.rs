//! `runnel backup`, `runnel restore` and `runnel verify`, run as an operator runs them: against
//! a data directory a server is writing to, and against one no server has; `runnel export`
//! against a running server.

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::common::{Client, Server, run_to_exit};

const WRITERS: u64 = 4;

fn runnel(args: &[&str]) -> Output {
    run_to_exit(args, &[])
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// A megabyte and more: staged in a file of its own, which the backup must carry too.
fn large_body() -> Vec<u8> {
    (0..(2 << 20)).map(|i| (i % 251) as u8).collect()
}

/// Appends `{"i": n}` with n counting up to stream `w{writer}` until `stop`; `acked` is how
/// many were acknowledged.
async fn write_until(client: Client, writer: u64, acked: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let stream = format!("/v1/stream/w{writer}");
    while !stop.load(Ordering::Relaxed) {
        let i = acked.load(Ordering::Relaxed);
        let response = client
            .append(&stream, "application/json", format!("{{\"i\":{i}}}"))
            .await;
        assert!(
            response.status().is_success(),
            "append {i}: {}",
            response.status()
        );
        acked.fetch_add(1, Ordering::Relaxed);
    }
}

/// The `i` of every message of JSON stream `stream`, in order.
async fn counts_in(client: &Client, stream: &str) -> Vec<u64> {
    let chunks = client.read_chunks(stream).await.expect("the stream reads");
    let mut counts = Vec::new();
    for chunk in chunks {
        let messages: Vec<Value> = serde_json::from_slice(&chunk).expect("a JSON array");
        counts.extend(messages.iter().map(|m| m["i"].as_u64().expect("an i")));
    }
    counts
}

async fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_backup_under_write_load_restores_every_append_acknowledged_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let (data, backup, restored) = (
        dir.path().join("data"),
        dir.path().join("backup.runnel"),
        dir.path().join("restored"),
    );
    let server = Server::on_disk(&data);
    let client = Client::new(&server);
    let large = large_body();
    let created = client
        .create(
            "/v1/stream/large",
            "application/octet-stream",
            large.clone(),
        )
        .await;
    assert_eq!(created.status(), 201);
    let stop = Arc::new(AtomicBool::new(false));
    let mut acked = Vec::new();
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let stream = format!("/v1/stream/w{writer}");
        assert_eq!(
            client
                .create(&stream, "application/json", "")
                .await
                .status(),
            201
        );
        let count = Arc::new(AtomicU64::new(0));
        acked.push(count.clone());
        writers.push(tokio::spawn(write_until(
            client.clone(),
            writer,
            count,
            stop.clone(),
        )));
    }
    until("every writer has appended", || {
        acked.iter().all(|a| a.load(Ordering::Relaxed) >= 50)
    })
    .await;

    let before: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let args = ["backup", "--data-dir", path(&data), path(&backup)];
    let args = args.map(str::to_owned);
    let output = tokio::task::spawn_blocking(move || {
        runnel(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("1 staged body files"),
        "{}",
        text(&output.stdout)
    );
    let after: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    assert!(
        after.iter().zip(&before).any(|(a, b)| a > b),
        "the writes went on during the backup"
    );
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    let verified = runnel(&["verify", "--data-dir", path(&data)]);
    assert!(verified.status.success(), "{}", text(&verified.stdout));
    assert!(
        text(&verified.stdout).ends_with(": 0 problems\n"),
        "{}",
        text(&verified.stdout)
    );
    drop(server);

    let output = runnel(&["restore", path(&backup), "--data-dir", path(&restored)]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let copy = Server::on_disk(&restored);
    let copy_client = Client::new(&copy);
    for (writer, &acked_before) in before.iter().enumerate() {
        let counts = counts_in(&copy_client, &format!("/v1/stream/w{writer}")).await;
        let expected: Vec<u64> = (0..counts.len() as u64).collect();
        assert_eq!(
            counts, expected,
            "stream w{writer} is a prefix of what was written"
        );
        assert!(
            counts.len() as u64 >= acked_before,
            "stream w{writer}: {} of the {acked_before} appends acknowledged before the backup",
            counts.len()
        );
    }
    let chunks = copy_client.read_chunks("/v1/stream/large").await.unwrap();
    assert_eq!(chunks.concat(), large);
}

#[tokio::test]
async fn verify_names_a_missing_body_file_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::on_disk(&data);
    let client = Client::new(&server);
    let created = client
        .create("/v1/stream/large", "application/octet-stream", large_body())
        .await;
    assert_eq!(created.status(), 201);
    server
        .terminate(Duration::from_secs(10))
        .expect("the server stops");
    let sound = runnel(&["verify", "--data-dir", path(&data)]);
    assert!(sound.status.success(), "{}", text(&sound.stdout));

    for file in std::fs::read_dir(data.join("bodies")).unwrap() {
        std::fs::remove_file(file.unwrap().path()).unwrap();
    }
    let damaged = runnel(&["verify", "--data-dir", path(&data)]);
    assert_eq!(damaged.status.code(), Some(1));
    let report = text(&damaged.stdout);
    assert!(report.starts_with("damaged: staged body file"), "{report}");
    assert!(
        text(&damaged.stderr).contains("1 problems"),
        "{}",
        text(&damaged.stderr)
    );
}

#[tokio::test]
async fn a_damaged_backup_is_refused_and_restores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (data, backup, restored) = (
        dir.path().join("data"),
        dir.path().join("backup.runnel"),
        dir.path().join("restored"),
    );
    let server = Server::on_disk(&data);
    let client = Client::new(&server);
    assert_eq!(
        client
            .create("/v1/stream/s", "text/plain", "hello")
            .await
            .status(),
        201
    );
    let output = runnel(&["backup", "--data-dir", path(&data), path(&backup)]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let checked = runnel(&["verify", "--backup", path(&backup)]);
    assert!(checked.status.success(), "{}", text(&checked.stderr));

    let mut bytes = std::fs::read(&backup).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&backup, &bytes).unwrap();
    let refused = runnel(&["restore", path(&backup), "--data-dir", path(&restored)]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("damaged"),
        "{}",
        text(&refused.stderr)
    );
    assert!(!restored.exists());
    let refused = runnel(&["verify", "--backup", path(&backup)]);
    assert!(!refused.status.success());
}

fn export(server: &Server, args: &[&str]) -> Output {
    let mut all = vec!["export", "--server", &server.base];
    all.extend_from_slice(args);
    runnel(&all)
}

#[tokio::test]
async fn export_writes_a_json_stream_as_json_lines_and_any_stream_as_its_bytes() {
    let server = Server::start(&["--memory"]);
    let client = Client::new(&server);
    assert_eq!(
        client
            .create("/v1/stream/j", "application/json", "")
            .await
            .status(),
        201
    );
    for i in 0..3 {
        let appended = client
            .append("/v1/stream/j", "application/json", format!("{{\"i\":{i}}}"))
            .await;
        assert!(appended.status().is_success());
    }
    let lines = export(&server, &["/v1/stream/j", "--format", "jsonl"]);
    assert!(lines.status.success(), "{}", text(&lines.stderr));
    assert_eq!(text(&lines.stdout), "{\"i\":0}\n{\"i\":1}\n{\"i\":2}\n");

    assert_eq!(client.create_bucket("books").await.status(), 201);
    assert_eq!(
        client
            .create("/books/t", "text/plain", "hello ")
            .await
            .status(),
        201
    );
    assert!(
        client
            .append("/books/t", "text/plain", "world")
            .await
            .status()
            .is_success()
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.txt");
    let raw = export(&server, &["books/t", "--out", path(&file)]);
    assert!(raw.status.success(), "{}", text(&raw.stderr));
    assert_eq!(std::fs::read(&file).unwrap(), b"hello world");

    let refused = export(&server, &["books/t", "--format", "jsonl"]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("not a JSON stream"),
        "{}",
        text(&refused.stderr)
    );
    let missing = export(&server, &["books/none"]);
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("404"),
        "{}",
        text(&missing.stderr)
    );
}
